//! Token trees on the wire of `cipherlora.split.v1` (lookahead decoding, Fu et al., ICML 2024, §3):
//! a `Forward` call's `tree_parents` (0: off the cached prefix, `p + 1`: earlier row `p`) and the
//! `keep` compaction, checked before any arithmetic.

use crate::ProtoError;

/// The wire form of a parent array (`None`: off the cached prefix).
#[must_use]
pub fn encode_parents(parents: &[Option<usize>]) -> Vec<u32> {
    parents
        .iter()
        .map(|p| p.map_or(0, |p| u32::try_from(p + 1).unwrap_or(u32::MAX)))
        .collect()
}

/// Decodes the `tree_parents` of a call of `positions` rows (empty: causal, `None`). Errors:
/// [`ProtoError::TreeLength`] unless empty or `positions` long; [`ProtoError::TreeParent`] for an
/// entry naming the row itself or a later one.
pub fn decode_parents(
    raw: &[u32],
    positions: usize,
) -> Result<Option<Vec<Option<usize>>>, ProtoError> {
    if raw.is_empty() {
        return Ok(None);
    }
    if raw.len() != positions {
        return Err(ProtoError::TreeLength {
            got: raw.len(),
            positions,
        });
    }
    raw.iter()
        .enumerate()
        .map(|(index, &entry)| match entry as usize {
            0 => Ok(None),
            e if e <= index => Ok(Some(e - 1)),
            _ => Err(ProtoError::TreeParent { index, entry }),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// Checks a `keep` list against the `held` rows from `start` and returns it as indices. Errors:
/// [`ProtoError::KeepOrder`] for a non-increasing entry, [`ProtoError::KeepRange`] for one ≥
/// `held`.
pub fn check_keep(raw: &[u32], held: usize) -> Result<Vec<usize>, ProtoError> {
    let mut out = Vec::with_capacity(raw.len().min(held));
    for (index, &value) in raw.iter().enumerate() {
        if index > 0 && value <= raw[index - 1] {
            return Err(ProtoError::KeepOrder { index, value });
        }
        if value as usize >= held {
            return Err(ProtoError::KeepRange { index, value, held });
        }
        out.push(value as usize);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_round_trip_and_bad_ones_are_typed() {
        let parents = vec![None, Some(0), Some(0), Some(1), None];
        let wire = encode_parents(&parents);
        assert_eq!(wire, vec![0, 1, 1, 2, 0]);
        assert_eq!(decode_parents(&wire, 5).unwrap(), Some(parents));
        assert_eq!(decode_parents(&[], 5).unwrap(), None);
        assert_eq!(
            decode_parents(&wire, 4),
            Err(ProtoError::TreeLength {
                got: 5,
                positions: 4
            })
        );
        // Row 2 naming itself (entry 3) or a later row.
        assert_eq!(
            decode_parents(&[0, 1, 3], 3),
            Err(ProtoError::TreeParent { index: 2, entry: 3 })
        );
        assert!(decode_parents(&[1], 1).is_err());
        assert!(decode_parents(&[0, u32::MAX], 2).is_err());
    }

    #[test]
    fn keep_lists_must_increase_within_the_held_rows() {
        assert_eq!(check_keep(&[0, 2, 5], 6).unwrap(), vec![0, 2, 5]);
        assert_eq!(check_keep(&[], 0).unwrap(), Vec::<usize>::new());
        assert_eq!(
            check_keep(&[0, 2, 2], 6),
            Err(ProtoError::KeepOrder { index: 2, value: 2 })
        );
        assert_eq!(
            check_keep(&[3, 1], 6),
            Err(ProtoError::KeepOrder { index: 1, value: 1 })
        );
        assert_eq!(
            check_keep(&[0, 6], 6),
            Err(ProtoError::KeepRange {
                index: 1,
                value: 6,
                held: 6
            })
        );
        assert!(check_keep(&[0], 0).is_err());
    }
}

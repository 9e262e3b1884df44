//! Token trees on the wire of `cipherlora.split.v1`: the tree attention
//! mask of a `Forward` call (`tree_parents`) and the compaction of the
//! previous call's rows (`keep`), both checked before any arithmetic.
//!
//! Lookahead decoding (Fu et al., ICML 2024, "Break the Sequential
//! Dependency of LLM Inference Using Lookahead Decoding", §3) runs its
//! lookahead branch and its verification branch in one pass whose rows form
//! a token tree; the client then keeps the accepted root-to-node path. Wire
//! form of a parent: 0 for a row hanging off the cached prefix, `p + 1` for
//! row `p` (which must be an earlier row).

use crate::ProtoError;

/// The wire form of a parent array (`None`: off the cached prefix).
#[must_use]
pub fn encode_parents(parents: &[Option<usize>]) -> Vec<u32> {
    parents
        .iter()
        .map(|p| p.map_or(0, |p| u32::try_from(p + 1).unwrap_or(u32::MAX)))
        .collect()
}

/// Decodes the `tree_parents` of a call of `positions` rows: empty is the
/// causal mask (`None` returned), else one parent per row.
///
/// # Errors
/// [`ProtoError::TreeLength`] unless `raw` is empty or has `positions`
/// entries; [`ProtoError::TreeParent`] for an entry naming the row itself
/// or a later one.
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

/// Checks a `keep` list against the `held` rows cached from `start` on and
/// returns it as indices (relative to `start`).
///
/// # Errors
/// [`ProtoError::KeepOrder`] for an entry not above the previous one;
/// [`ProtoError::KeepRange`] for an entry ≥ `held`.
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

//! Envelope checks on layer-group requests, run before any HE work.

use prost::Message;

use crate::v1::{GroupRequest, MaskedRows};
use crate::{ProtoError, SessionId};

/// Size limits on one [`GroupRequest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// Most ciphertexts one request may carry.
    pub max_ciphertexts: usize,
    /// Most bytes one serialised ciphertext may have.
    pub max_ciphertext_bytes: usize,
    /// Most rows one masked online request may carry.
    pub max_masked_rows: usize,
}

impl Default for RequestLimits {
    /// 64 ciphertexts of at most 8 MiB each; 4,096 masked rows.
    fn default() -> Self {
        Self {
            max_ciphertexts: 64,
            max_ciphertext_bytes: 8 << 20,
            max_masked_rows: 4096,
        }
    }
}

/// Checks a decoded request's envelope and returns its session id. Errors:
/// [`ProtoError::SessionIdLength`], [`ProtoError::NoCiphertexts`],
/// [`ProtoError::TooManyCiphertexts`], [`ProtoError::EmptyCiphertext`],
/// [`ProtoError::CiphertextTooLarge`].
pub fn validate_group_request(
    req: &GroupRequest,
    limits: &RequestLimits,
) -> Result<SessionId, ProtoError> {
    let id = SessionId::from_slice(&req.session_id)?;
    if let Some(rows) = &req.masked {
        return validate_masked_rows(rows, req.ciphertexts.len(), limits).map(|()| id);
    }
    if req.ciphertexts.is_empty() {
        return Err(ProtoError::NoCiphertexts);
    }
    if req.ciphertexts.len() > limits.max_ciphertexts {
        return Err(ProtoError::TooManyCiphertexts {
            got: req.ciphertexts.len(),
            limit: limits.max_ciphertexts,
        });
    }
    for (index, ct) in req.ciphertexts.iter().enumerate() {
        if ct.is_empty() {
            return Err(ProtoError::EmptyCiphertext { index });
        }
        if ct.len() > limits.max_ciphertext_bytes {
            return Err(ProtoError::CiphertextTooLarge {
                index,
                got: ct.len(),
                limit: limits.max_ciphertext_bytes,
            });
        }
    }
    Ok(id)
}

/// The envelope of a masked online request: rows paired, at most
/// [`RequestLimits::max_masked_rows`], values within the bytes of the ciphertexts a request may
/// carry, and no ciphertexts.
fn validate_masked_rows(
    rows: &MaskedRows,
    ciphertexts: usize,
    limits: &RequestLimits,
) -> Result<(), ProtoError> {
    if ciphertexts > 0 {
        return Err(ProtoError::MaskedWithCiphertexts { ciphertexts });
    }
    let n = rows.batches.len();
    if n != rows.positions.len() || n == 0 || n > limits.max_masked_rows {
        return Err(ProtoError::MaskRows {
            batches: n,
            positions: rows.positions.len(),
        });
    }
    let limit = limits
        .max_ciphertexts
        .saturating_mul(limits.max_ciphertext_bytes);
    if rows.values.len() > limit {
        return Err(ProtoError::CiphertextTooLarge {
            index: 0,
            got: rows.values.len(),
            limit,
        });
    }
    Ok(())
}

/// Decodes a [`GroupRequest`] from untrusted bytes (never panics) and checks its envelope. Errors:
/// [`ProtoError::Decode`], then those of [`validate_group_request`].
pub fn decode_group_request(
    buf: bytes::Bytes,
    limits: &RequestLimits,
) -> Result<(SessionId, GroupRequest), ProtoError> {
    let req = GroupRequest::decode(buf).map_err(ProtoError::Decode)?;
    let id = validate_group_request(&req, limits)?;
    Ok((id, req))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use proptest::prelude::*;

    fn request(cts: Vec<Bytes>) -> GroupRequest {
        GroupRequest {
            batch: 0,
            session_id: Bytes::from_static(&[1; 16]),
            round: 3,
            layer: 1,
            group: 0,
            ciphertexts: cts,
            plan_id: 7,
            response_bits: 12,
            masked: None,
        }
    }

    #[test]
    fn a_valid_request_round_trips_through_the_decoder() {
        let req = request(vec![Bytes::from_static(b"ct0"), Bytes::from_static(b"ct1")]);
        let (id, back) =
            decode_group_request(req.encode_to_vec().into(), &RequestLimits::default()).unwrap();
        assert_eq!(id, SessionId([1; 16]));
        assert_eq!(back, req);
    }

    #[test]
    fn masked_rows_replace_ciphertexts_within_limits() {
        let limits = RequestLimits {
            max_ciphertexts: 2,
            max_ciphertext_bytes: 4,
            max_masked_rows: 2,
        };
        let rows = |n: usize, bytes: usize| MaskedRows {
            batches: vec![1; n],
            positions: vec![0; n],
            values: Bytes::from(vec![0; bytes]),
        };
        let mut req = request(vec![]);
        req.masked = Some(rows(2, 8));
        assert!(validate_group_request(&req, &limits).is_ok());
        req.masked = Some(rows(3, 8));
        assert!(matches!(
            validate_group_request(&req, &limits),
            Err(ProtoError::MaskRows { batches: 3, .. })
        ));
        req.masked = Some(rows(1, 9));
        assert!(matches!(
            validate_group_request(&req, &limits),
            Err(ProtoError::CiphertextTooLarge { got: 9, .. })
        ));
        let mut both = request(vec![Bytes::from_static(b"a")]);
        both.masked = Some(rows(1, 1));
        assert_eq!(
            validate_group_request(&both, &limits),
            Err(ProtoError::MaskedWithCiphertexts { ciphertexts: 1 })
        );
    }

    #[test]
    fn envelope_errors_are_typed() {
        let limits = RequestLimits {
            max_ciphertexts: 2,
            max_ciphertext_bytes: 4,
            max_masked_rows: 1,
        };
        let check = |r: &GroupRequest| validate_group_request(r, &limits);
        assert_eq!(check(&request(vec![])), Err(ProtoError::NoCiphertexts));
        assert_eq!(
            check(&request(vec![Bytes::from_static(b"a"); 3])),
            Err(ProtoError::TooManyCiphertexts { got: 3, limit: 2 })
        );
        assert_eq!(
            check(&request(vec![Bytes::from_static(b"a"), Bytes::new()])),
            Err(ProtoError::EmptyCiphertext { index: 1 })
        );
        assert_eq!(
            check(&request(vec![Bytes::from_static(b"abcde")])),
            Err(ProtoError::CiphertextTooLarge {
                index: 0,
                got: 5,
                limit: 4
            })
        );
        let mut short_id = request(vec![Bytes::from_static(b"a")]);
        short_id.session_id = Bytes::from_static(&[0; 3]);
        assert_eq!(
            check(&short_id),
            Err(ProtoError::SessionIdLength { got: 3 })
        );
    }

    #[test]
    fn truncated_encoding_is_a_decode_error() {
        let bytes = request(vec![Bytes::from_static(b"ciphertext")]).encode_to_vec();
        let cut = Bytes::copy_from_slice(&bytes[..bytes.len() - 3]);
        assert!(matches!(
            decode_group_request(cut, &RequestLimits::default()),
            Err(ProtoError::Decode(_))
        ));
    }

    proptest! {
        // Fuzzing the request decoder: random bytes give an error or a request whose envelope
        // passed the checks, never a panic.
        #[test]
        fn random_bytes_never_panic_the_decoder(buf in proptest::collection::vec(any::<u8>(), 0..512)) {
            let limits = RequestLimits { max_ciphertexts: 4, max_ciphertext_bytes: 64, max_masked_rows: 1 };
            if let Ok((id, req)) = decode_group_request(buf.into(), &limits) {
                prop_assert_eq!(&id.0[..], &req.session_id[..]);
                prop_assert!(!req.ciphertexts.is_empty() && req.ciphertexts.len() <= 4);
            }
        }

        // Mutating a valid encoding (flip/cut bytes) never panics either.
        #[test]
        fn mutated_requests_never_panic_the_decoder(
            n_cts in 1usize..4,
            ct_len in 1usize..40,
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
            cut in any::<prop::sample::Index>(),
        ) {
            let req = request(vec![Bytes::from(vec![0xAB; ct_len]); n_cts]);
            let mut bytes = req.encode_to_vec();
            for (i, v) in flips {
                let i = i.index(bytes.len());
                bytes[i] ^= v;
            }
            bytes.truncate(cut.index(bytes.len() + 1));
            let _ = decode_group_request(bytes.into(), &RequestLimits::default());
        }
    }
}

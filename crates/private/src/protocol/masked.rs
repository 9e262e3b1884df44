//! Masked ring values' messages beside their wire form (`MaskOfflineRequest`,
//! `MaskedGroupRequest` and their responses in `adapter.proto`): the offline batch of one group
//! and the online rows of one pass, with the checks both halves share. The design is in
//! docs/design/wire.md, "Masked ring values".

use bytes::Bytes;
use cipherlora_helora::masks::{GroupKey, MaskRef};
use cipherlora_proto::ProtoError;
use cipherlora_proto::ring_values::{INPUT_BITS, RESPONSE_BITS, pack, unpack};
use cipherlora_proto::v1::{
    MaskOfflineRequest, MaskOfflineResponse, MaskedGroupRequest, MaskedGroupResponse,
};

use crate::{PrivateError, ProtocolFault};

/// The online rows of one group as the server reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaskedRows {
    /// The group.
    pub key: GroupKey,
    /// Each row's mask.
    pub refs: Vec<MaskRef>,
    /// Rows × input width masked values (each below 2^60; the ring checks `< p`).
    pub masked: Vec<u64>,
}

/// The online request of `rows` (each `width` values of `masked`) for group `key`.
#[must_use]
pub fn masked_request(
    session_id: Bytes,
    round: u64,
    key: GroupKey,
    refs: &[MaskRef],
    masked: &[u64],
) -> MaskedGroupRequest {
    MaskedGroupRequest {
        session_id,
        round,
        layer: key.layer,
        group: key.group,
        batches: refs.iter().map(|r| r.batch).collect(),
        positions: refs.iter().map(|r| r.position).collect(),
        values: pack(masked, INPUT_BITS),
    }
}

/// Reads an online request for a group of input width `width`. Errors:
/// [`ProtoError::MaskRows`] for unpaired rows or none; [`ProtoError::PackedLength`].
pub fn read_masked_request(
    req: &MaskedGroupRequest,
    width: usize,
) -> Result<MaskedRows, PrivateError> {
    if req.batches.len() != req.positions.len() || req.batches.is_empty() {
        return Err(ProtoError::MaskRows {
            batches: req.batches.len(),
            positions: req.positions.len(),
        }
        .into());
    }
    let refs: Vec<MaskRef> = req
        .batches
        .iter()
        .zip(&req.positions)
        .map(|(&batch, &position)| MaskRef { batch, position })
        .collect();
    let count = refs.len().saturating_mul(width);
    let masked = unpack("masked values", &req.values, count, INPUT_BITS)?;
    Ok(MaskedRows {
        key: GroupKey {
            layer: req.layer,
            group: req.group,
        },
        refs,
        masked,
    })
}

/// The response to `req`: `values` at 32 bits each.
#[must_use]
pub fn masked_response(
    req: &MaskedGroupRequest,
    values: &[u32],
    micros: u64,
) -> MaskedGroupResponse {
    let wide: Vec<u64> = values.iter().map(|&v| u64::from(v)).collect();
    MaskedGroupResponse {
        round: req.round,
        layer: req.layer,
        group: req.group,
        values: pack(&wide, RESPONSE_BITS),
        server_micros: micros,
    }
}

/// Reads the response to `req`: `count` values. Errors: [`ProtocolFault::ResponseMismatch`] for
/// another round, layer or group; [`ProtoError::PackedLength`].
pub fn read_masked_response(
    req: &MaskedGroupRequest,
    resp: &MaskedGroupResponse,
    count: usize,
) -> Result<Vec<u32>, PrivateError> {
    if (resp.round, resp.layer, resp.group) != (req.round, req.layer, req.group) {
        return Err(PrivateError::Protocol {
            what: ProtocolFault::ResponseMismatch,
        });
    }
    Ok(
        unpack("response values", &resp.values, count, RESPONSE_BITS)?
            .into_iter()
            .map(|v| v as u32)
            .collect(),
    )
}

/// The offline request of batch `batch` for group `key`: its serialised seeded ciphertexts.
#[must_use]
pub fn offline_request(
    session_id: Bytes,
    key: GroupKey,
    batch: u64,
    ciphertexts: Vec<Bytes>,
) -> MaskOfflineRequest {
    MaskOfflineRequest {
        session_id,
        layer: key.layer,
        group: key.group,
        batch,
        ciphertexts,
    }
}

/// The response to offline request `req`.
#[must_use]
pub fn offline_response(
    req: &MaskOfflineRequest,
    ciphertexts: Vec<Bytes>,
    micros: u64,
) -> MaskOfflineResponse {
    MaskOfflineResponse {
        layer: req.layer,
        group: req.group,
        batch: req.batch,
        ciphertexts,
        server_micros: micros,
    }
}

/// Checks that `resp` answers `req`. Errors: [`ProtocolFault::ResponseMismatch`].
pub fn check_offline_response(
    req: &MaskOfflineRequest,
    resp: &MaskOfflineResponse,
) -> Result<(), PrivateError> {
    if (resp.layer, resp.group, resp.batch) == (req.layer, req.group, req.batch) {
        Ok(())
    } else {
        Err(PrivateError::Protocol {
            what: ProtocolFault::ResponseMismatch,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: GroupKey = GroupKey { layer: 2, group: 1 };

    #[test]
    fn rows_round_trip_at_60_bits_up_and_32_down() {
        let refs = [
            MaskRef {
                batch: 3,
                position: 0,
            },
            MaskRef {
                batch: 4,
                position: 7,
            },
        ];
        let masked: Vec<u64> = (0..10).map(|i| (1u64 << 59) + i * 12_345).collect();
        let req = masked_request(Bytes::from_static(&[1; 16]), 9, KEY, &refs, &masked);
        assert_eq!(req.values.len(), 10 * 60 / 8);
        let rows = read_masked_request(&req, 5).unwrap();
        assert_eq!(
            (rows.key, &rows.refs[..], &rows.masked),
            (KEY, &refs[..], &masked)
        );
        assert!(matches!(
            read_masked_request(&req, 6),
            Err(PrivateError::Message(ProtoError::PackedLength { .. }))
        ));
        let mut unpaired = req.clone();
        unpaired.positions.pop();
        assert!(matches!(
            read_masked_request(&unpaired, 5),
            Err(PrivateError::Message(ProtoError::MaskRows { .. }))
        ));

        let values = [u32::MAX, 0, 77];
        let resp = masked_response(&req, &values, 5);
        assert_eq!(resp.values.len(), 12);
        assert_eq!(read_masked_response(&req, &resp, 3).unwrap(), values);
        let mut other = resp.clone();
        other.round += 1;
        assert!(matches!(
            read_masked_response(&req, &other, 3),
            Err(PrivateError::Protocol {
                what: ProtocolFault::ResponseMismatch
            })
        ));
    }
}

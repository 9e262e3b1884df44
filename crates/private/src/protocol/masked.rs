//! Masked ring values on the wire (docs/design/wire.md, "Masked ring values"): a masked
//! session's group requests. An offline request is a [`GroupRequest`] carrying a batch number
//! and the client's encrypted masks as its ciphertexts; an online request carries
//! [`v1::MaskedRows`] instead of ciphertexts and is answered with `masked_values`. The checks
//! both halves share live here.

use bytes::Bytes;
use cipherlora_helora::GroupPlan;
use cipherlora_helora::masks::{GroupKey, MaskRef};
use cipherlora_helora::ring::RingPublic;
use cipherlora_model::Proj;
use cipherlora_proto::ProtoError;
use cipherlora_proto::ring_values::{INPUT_BITS, pack, unpack};
use cipherlora_proto::v1::{self, GroupRequest, GroupResponse};

use super::codes::{group_of, kind_code, kind_of, malformed, proj_code, to_u32, to_usize};
use super::offer::{Grouping, LoraKind, group_index};
use super::plan::{decode_plan, encode_plan};
use super::wire::{MAX_GROUPS, MAX_T, offered_projections};
use crate::{PrivateError, ProtocolFault};

/// The wire name of the offline phase's parameters (`offline_parameters`: N = 16384, batched
/// BFV over the ring's prime): the `ckks_preset` of a masked session's keys and offer.
pub const MASKED_PRESET: &str = "bfv-offline-n16384";

/// The offline context both halves make their keys and ciphertexts in: `offline_parameters`
/// (N = 16384, chain 5 × 60 + 60). Errors: [`PrivateError::Ckks`].
pub fn offline_context() -> Result<std::sync::Arc<cipherlora_ckks::Context>, PrivateError> {
    let params = cipherlora_helora::bfv_backend::offline_parameters()?;
    Ok(cipherlora_ckks::Context::new(params)?)
}

/// One group's offline plan, keyed as its messages name it.
#[derive(Debug, Clone, PartialEq)]
pub struct MaskedPlan {
    /// The group's wire key.
    pub key: GroupKey,
    /// The offline plan: T positions per batch, in the offline context's slots.
    pub plan: GroupPlan,
    /// The group's projections, in the order of the plan's deltas.
    pub projections: Vec<Proj>,
}

/// What a client needs per group of an open masked session: its plan and the ring's public
/// parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct MaskedOfferGroup {
    /// The group's plan.
    pub plan: MaskedPlan,
    /// Input bits, scale and dropped bits of the group's fixed point.
    pub public: RingPublic,
}

/// The offer of a masked session: every group's plan and, once the session is open, its fixed
/// point (`None` in an offer-only answer), T positions per batch.
#[must_use]
pub fn encode_masked_offer(
    kind: LoraKind,
    t: usize,
    groups: &[(MaskedPlan, Option<RingPublic>)],
) -> v1::SessionOffer {
    v1::SessionOffer {
        ckks_preset: MASKED_PRESET.to_string(),
        positions: to_u32(t),
        kind: kind_code(kind).into(),
        layers_per_group: 0,
        server_cost_ratio: 1.0,
        acceptance: None,
        groups: groups
            .iter()
            .map(|(plan, public)| v1::OfferedGroup {
                layer: plan.key.layer,
                group: plan.key.group,
                projections: plan
                    .projections
                    .iter()
                    .map(|&p| v1::AdaptedProjection {
                        layer: plan.key.layer,
                        projection: proj_code(p).into(),
                    })
                    .collect(),
                plan: Some(encode_plan(&plan.plan)),
                ring: public.map(|r| v1::RingParameters {
                    input_bits: r.input_bits,
                    scale_log2: r.scale_log2,
                    shift: r.shift,
                }),
            })
            .collect(),
    }
}

/// A masked session's offer as read: kind, T, and each group's plan with its fixed point when
/// the session is open.
pub type MaskedOffer = (LoraKind, usize, Vec<(MaskedPlan, Option<RingPublic>)>);

/// Reads a masked session's offer: its kind, T and groups (each with a plan of that T and kind,
/// its projections and, if present, a fixed point of 1 to 24 input bits and fewer than 60
/// dropped bits). Errors: [`PrivateError::Helora`] (malformed).
pub fn decode_masked_offer(m: &v1::SessionOffer) -> Result<MaskedOffer, PrivateError> {
    let bad = |reason| malformed("masked session offer", reason);
    if m.ckks_preset != MASKED_PRESET {
        return Err(bad("not a masked session's preset"));
    }
    let t = to_usize(m.positions);
    if t == 0 || t > MAX_T {
        return Err(bad("T out of range"));
    }
    let kind = kind_of(m.kind, "masked session offer")?;
    if m.groups.len() > MAX_GROUPS {
        return Err(bad("too many groups"));
    }
    let mut groups: Vec<(MaskedPlan, Option<RingPublic>)> = Vec::with_capacity(m.groups.len());
    for g in &m.groups {
        let group = group_of(g.group, "masked session offer")?;
        let key = GroupKey {
            layer: g.layer,
            group: group_index(group),
        };
        if groups.iter().any(|(p, _)| p.key == key) {
            return Err(bad("group offered twice"));
        }
        let projections = offered_projections(g, (to_usize(g.layer), group), Grouping::ByInput)?
            .into_iter()
            .map(|(_, p)| p)
            .collect::<Vec<_>>();
        let plan = decode_plan(g.plan.as_ref().ok_or_else(|| bad("no plan"))?)?;
        if plan.t != t || plan.mode != kind.mode() || plan.shape.ranks.len() != projections.len() {
            return Err(bad(
                "plan does not match the offer's T, kind or projections",
            ));
        }
        let public = match &g.ring {
            // Responses travel at 60 − shift bits, at most 32.
            Some(r) if r.input_bits == 0 || r.input_bits > 24 || !(28..60).contains(&r.shift) => {
                return Err(bad("ring parameters out of range"));
            }
            Some(r) => Some(RingPublic {
                input_bits: r.input_bits,
                scale_log2: r.scale_log2,
                shift: r.shift,
            }),
            None => None,
        };
        let plan = MaskedPlan {
            key,
            plan,
            projections,
        };
        groups.push((plan, public));
    }
    Ok((kind, t, groups))
}

/// The online rows of one group as the server reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OnlineRequest {
    /// The group.
    pub key: GroupKey,
    /// Each row's mask.
    pub refs: Vec<MaskRef>,
    /// Rows × input width masked values (each below 2^60; the ring checks `< p`).
    pub masked: Vec<u64>,
}

/// Where a masked session's request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Addressed {
    /// The session.
    pub session_id: Bytes,
    /// The session's plan id (`offer_id` of its offer).
    pub plan_id: u64,
}

/// The online request of `refs.len()` rows of `masked` for group `key`.
#[must_use]
pub fn masked_request(
    to: &Addressed,
    round: u64,
    key: GroupKey,
    refs: &[MaskRef],
    masked: &[u64],
) -> GroupRequest {
    GroupRequest {
        session_id: to.session_id.clone(),
        round,
        layer: key.layer,
        group: key.group,
        ciphertexts: Vec::new(),
        plan_id: to.plan_id,
        response_bits: 0,
        masked: Some(v1::MaskedRows {
            batches: refs.iter().map(|r| r.batch).collect(),
            positions: refs.iter().map(|r| r.position).collect(),
            values: pack(masked, INPUT_BITS),
        }),
        batch: 0,
    }
}

/// Reads an online request for a group of input width `width`. Errors:
/// [`ProtoError::MaskRows`] for no rows or unpaired ones; [`ProtoError::PackedLength`].
pub fn read_masked_request(
    req: &GroupRequest,
    width: usize,
) -> Result<OnlineRequest, PrivateError> {
    let rows = req.masked.as_ref().ok_or(ProtoError::MaskRows {
        batches: 0,
        positions: 0,
    })?;
    if rows.batches.len() != rows.positions.len() || rows.batches.is_empty() {
        return Err(ProtoError::MaskRows {
            batches: rows.batches.len(),
            positions: rows.positions.len(),
        }
        .into());
    }
    let refs: Vec<MaskRef> = rows
        .batches
        .iter()
        .zip(&rows.positions)
        .map(|(&batch, &position)| MaskRef { batch, position })
        .collect();
    let count = refs.len().saturating_mul(width);
    let masked = unpack("masked values", &rows.values, count, INPUT_BITS)?;
    Ok(OnlineRequest {
        key: GroupKey {
            layer: req.layer,
            group: req.group,
        },
        refs,
        masked,
    })
}

/// The response to online request `req`: `values` at `bits` bits each (the group's
/// [`RingPublic::response_bits`]).
#[must_use]
pub fn masked_response(
    req: &GroupRequest,
    values: &[u32],
    bits: u32,
    micros: u64,
) -> GroupResponse {
    let wide: Vec<u64> = values.iter().map(|&v| u64::from(v)).collect();
    GroupResponse {
        round: req.round,
        layer: req.layer,
        group: req.group,
        ciphertexts: Vec::new(),
        server_micros: micros,
        masked_values: pack(&wide, bits),
    }
}

/// Checks that `resp` answers `req`'s layer and group (the transport numbers the rounds).
/// Errors: [`ProtocolFault::ResponseMismatch`].
pub fn check_response(req: &GroupRequest, resp: &GroupResponse) -> Result<(), PrivateError> {
    if (resp.layer, resp.group) == (req.layer, req.group) {
        Ok(())
    } else {
        Err(PrivateError::Protocol {
            what: ProtocolFault::ResponseMismatch,
        })
    }
}

/// Reads the response to online request `req`: `count` values of `bits` bits. Errors: as
/// [`check_response`]; [`ProtoError::PackedLength`].
pub fn read_masked_response(
    req: &GroupRequest,
    resp: &GroupResponse,
    (count, bits): (usize, u32),
) -> Result<Vec<u32>, PrivateError> {
    check_response(req, resp)?;
    Ok(unpack("response values", &resp.masked_values, count, bits)?
        .into_iter()
        .map(|v| v as u32)
        .collect())
}

/// The offline request of batch `batch` for group `key`: its serialised seeded ciphertexts.
#[must_use]
pub fn offline_request(
    to: &Addressed,
    key: GroupKey,
    batch: u64,
    ciphertexts: Vec<Bytes>,
) -> GroupRequest {
    GroupRequest {
        session_id: to.session_id.clone(),
        round: 0,
        layer: key.layer,
        group: key.group,
        ciphertexts,
        plan_id: to.plan_id,
        response_bits: 0,
        masked: None,
        batch,
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
        let to = Addressed {
            session_id: Bytes::from_static(&[1; 16]),
            plan_id: 5,
        };
        let req = masked_request(&to, 9, KEY, &refs, &masked);
        assert_eq!(req.masked.as_ref().unwrap().values.len(), 10 * 60 / 8);
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
        unpaired.masked.as_mut().unwrap().positions.pop();
        assert!(matches!(
            read_masked_request(&unpaired, 5),
            Err(PrivateError::Message(ProtoError::MaskRows { .. }))
        ));

        let values = [u32::MAX, 0, 77];
        let resp = masked_response(&req, &values, 32, 5);
        assert_eq!(resp.masked_values.len(), 12);
        assert_eq!(read_masked_response(&req, &resp, (3, 32)).unwrap(), values);
        // At 24 bits: three bytes a value.
        let values = [(1 << 24) - 1, 0, 77];
        let resp = masked_response(&req, &values, 24, 5);
        assert_eq!(resp.masked_values.len(), 9);
        assert_eq!(read_masked_response(&req, &resp, (3, 24)).unwrap(), values);
        assert!(matches!(
            read_masked_response(&req, &resp, (3, 32)),
            Err(PrivateError::Message(ProtoError::PackedLength { .. }))
        ));
        let mut other = resp.clone();
        other.group += 1;
        assert!(matches!(
            read_masked_response(&req, &other, (3, 24)),
            Err(PrivateError::Protocol {
                what: ProtocolFault::ResponseMismatch
            })
        ));
    }
}

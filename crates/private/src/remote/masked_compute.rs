//! A masked session behind the gRPC service: [`open_masked`] checks a masked `OpenSession`
//! (preset, T, the client's batched-BFV keys), plans the adapter's groups for the offline phase,
//! charges the session memory budget and returns the offer with every group's fixed point;
//! [`MaskedCompute`] answers the session's offline and online requests.

use std::sync::Arc;

use bytes::Bytes;
use cipherlora_ckks::{GaloisKeys, PublicKey};
use cipherlora_helora::HeloraError;
use cipherlora_helora::masks::{GroupKey, LedgerLimits};
use cipherlora_proto::v1::GroupRequest;
use cipherlora_service::{
    BackendError, CiphertextFault, GroupRequestShape, OpenSessionPayload, OpenedSession,
    SessionCompute,
};

use crate::PrivateError;
use crate::protocol::MAX_T;
use crate::protocol::masked::{MASKED_PRESET, encode_masked_offer, offline_context};
use crate::server::masked::{MaskedSession, offline_plans};
use crate::server::{HeAdapter, Reservation, SessionMemory};

use super::he_backend::OfferOnly;

/// Opens a masked session of `server`'s adapter. Errors: [`BackendError::UnknownPreset`] unless
/// the keys are of [`MASKED_PRESET`]; `InvalidPlan` for T outside 1..=256 or no plan;
/// `InvalidKey` for malformed keys or Galois keys other than the plans' steps; `LimitExceeded`
/// or `AtCapacity` when the session would pass the memory budget.
pub(super) fn open_masked(
    server: &HeAdapter,
    memory: &SessionMemory,
    payload: &OpenSessionPayload,
) -> Result<OpenedSession, BackendError> {
    if payload.ckks_preset != MASKED_PRESET {
        return Err(BackendError::UnknownPreset {
            preset: payload.ckks_preset.clone(),
        });
    }
    let t = payload.plan_request.positions as usize;
    if !(1..=MAX_T).contains(&t) {
        return Err(BackendError::invalid_plan(PrivateError::WidthMismatch {
            asked: t,
            offered: t.clamp(1, MAX_T),
        }));
    }
    let ctx = offline_context().map_err(BackendError::internal)?;
    let groups = server.groups();
    let plans = offline_plans(&ctx, groups, t).map_err(BackendError::invalid_plan)?;
    if payload.plan_request.offer_only {
        let bare: Vec<_> = plans.iter().map(|p| (p.clone(), None)).collect();
        return Ok(OpenedSession {
            offer: encode_masked_offer(groups.kind, t, &bare),
            compute: Box::new(OfferOnly),
        });
    }
    let invalid_key = |e: cipherlora_ckks::CkksError| BackendError::invalid_key(e);
    let pk = PublicKey::from_bytes(&ctx, &payload.public_key).map_err(invalid_key)?;
    let gks = GaloisKeys::from_bytes(&ctx, &payload.galois_keys).map_err(invalid_key)?;
    let session = MaskedSession::open(&ctx, groups, &plans, pk, gks, LedgerLimits::default())
        .map_err(|e| match e {
            e @ (PrivateError::GaloisKeysMismatch { .. } | PrivateError::Ckks(_)) => {
                BackendError::invalid_key(e)
            }
            e => BackendError::invalid_plan(e),
        })?;
    let bytes = session.diagonal_bytes() + 2 * payload.galois_keys.len() as u64;
    let reservation = memory.reserve(bytes).map_err(|held| {
        if bytes > memory.limit() {
            BackendError::LimitExceeded {
                what: "masked session memory (bytes)",
                got: bytes,
                limit: memory.limit(),
            }
        } else {
            BackendError::AtCapacity {
                what: "session memory held by all sessions (bytes)",
                got: held,
                limit: memory.limit(),
            }
        }
    })?;
    let offered: Vec<_> = session
        .offer()
        .iter()
        .map(|g| (g.plan.clone(), Some(g.public)))
        .collect();
    Ok(OpenedSession {
        offer: encode_masked_offer(groups.kind, t, &offered),
        compute: Box::new(MaskedCompute {
            session: Arc::new(session),
            _memory: reservation,
        }),
    })
}

/// A masked session's compute state and its share of the memory budget.
struct MaskedCompute {
    session: Arc<MaskedSession>,
    _memory: Reservation,
}

impl SessionCompute for MaskedCompute {
    /// Offline requests carry the plan's input ciphertexts and are charged no evaluation: the
    /// service charges each online row instead.
    fn group_shape(&self, layer: u32, group: u32) -> Result<GroupRequestShape, BackendError> {
        let inputs = self
            .session
            .offline_inputs(GroupKey { layer, group })
            .map_err(|_| BackendError::UnknownLayer { layer, group })?;
        Ok(GroupRequestShape {
            input_ciphertexts: inputs,
            positions: 0,
            masked: true,
        })
    }

    fn compute(&self, request: &GroupRequest) -> Result<Vec<Bytes>, BackendError> {
        let resp = self.session.handle(request).map_err(backend_error)?;
        Ok(if request.masked.is_some() {
            vec![resp.masked_values]
        } else {
            resp.ciphertexts
        })
    }
}

/// The service's refusal for a masked session's error.
fn backend_error(e: PrivateError) -> BackendError {
    let malformed = |what| BackendError::InvalidCiphertext {
        index: 0,
        fault: CiphertextFault::Malformed { what },
    };
    match e {
        PrivateError::UnknownGroup { layer, group } => BackendError::UnknownLayer { layer, group },
        e @ PrivateError::Helora(HeloraError::Mask(_)) => BackendError::MaskRefused {
            source: Box::new(e),
        },
        PrivateError::Message(_)
        | PrivateError::Helora(HeloraError::ShapeMismatch { .. } | HeloraError::Malformed { .. }) => {
            malformed("masked rows")
        }
        PrivateError::Ckks(_)
        | PrivateError::Helora(HeloraError::Ckks(_) | HeloraError::CiphertextCount { .. }) => {
            malformed("offline ciphertext")
        }
        e => BackendError::internal(e),
    }
}

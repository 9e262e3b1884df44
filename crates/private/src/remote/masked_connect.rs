//! Opening a masked session over gRPC: an offer-only `OpenSession` for the offline plans, fresh
//! batched-BFV keys for exactly their rotations, the real session, and a [`MaskedClient`] with a
//! [`GrpcTransport`] on it.

use bytes::Bytes;
use cipherlora_model::ModelConfig;
use cipherlora_proto::v1;
use cipherlora_service::{AdapterClient, ClientConfig, SessionParams};

use super::grpc_transport::{adapter_info, transport_error};
use crate::client::masked::{MaskedClient, offline_keys};
use crate::protocol::masked::{
    Addressed, MASKED_PRESET, MaskedOfferGroup, MaskedPlan, decode_masked_offer, offline_context,
};
use crate::protocol::{LoraKind, decode_public_a};

use crate::{GrpcTransport, PrivateError, ProtocolFault};

/// A masked session's `OpenSession` parameters.
fn params(adapter_id: &str, t: usize, offer_only: bool, keys: (Bytes, Bytes)) -> SessionParams {
    SessionParams {
        adapter_id: adapter_id.to_string(),
        ckks_preset: MASKED_PRESET.to_string(),
        public_key: keys.0,
        galois_keys: keys.1,
        plan_request: v1::PlanRequest {
            positions: u32::try_from(t).unwrap_or(u32::MAX),
            offer_only,
            layers_per_group: 0,
            masked: true,
        },
    }
}

/// Opens a masked session of `adapter_id` with `t` positions per offline batch and a mask pool
/// of at most `budget` bytes, delivering deltas in `model`'s row layout. Errors:
/// [`PrivateError::Service`] (refused, unreachable), [`PrivateError::UnknownAdapter`],
/// [`PrivateError::Protocol`] (an FFA adapter without its lora_A, or a session running other
/// plans than offered), [`PrivateError::Helora`] (a malformed offer).
pub fn open_masked(
    config: ClientConfig,
    adapter_id: &str,
    t: usize,
    budget: usize,
    model: &ModelConfig,
) -> Result<(MaskedClient, GrpcTransport), PrivateError> {
    let mut client = AdapterClient::connect(config).map_err(transport_error)?;
    let info = adapter_info(&mut client, adapter_id)?;
    let bare = client
        .open_session(params(adapter_id, t, true, (Bytes::new(), Bytes::new())))
        .map_err(transport_error)?;
    let (kind, _, offered) = decode_masked_offer(&bare.offer)?;
    let plans: Vec<MaskedPlan> = offered.into_iter().map(|(p, _)| p).collect();
    let ctx = offline_context()?;
    let (sk, keys) = offline_keys(&ctx, &plans)?;
    let uploads = (
        Bytes::from(keys.public_key.to_bytes()),
        Bytes::from(keys.galois_keys.to_bytes()),
    );
    let session = client
        .open_session(params(adapter_id, t, false, uploads))
        .map_err(transport_error)?;
    let (_, _, opened) = decode_masked_offer(&session.offer)?;
    let changed = PrivateError::Protocol {
        what: ProtocolFault::PlanChanged,
    };
    if opened.len() != plans.len() || opened.iter().zip(&plans).any(|((p, _), q)| p != q) {
        return Err(changed);
    }
    let groups = opened
        .into_iter()
        .map(|(plan, public)| public.map(|public| MaskedOfferGroup { plan, public }))
        .collect::<Option<Vec<_>>>()
        .ok_or(changed)?;
    let public_a = match kind {
        LoraKind::Ffa => {
            decode_public_a(info.ffa_lora_a.as_ref().ok_or(PrivateError::Protocol {
                what: ProtocolFault::NoPublicA,
            })?)?
        }
        LoraKind::Standard => Vec::new(),
    };
    let to = Addressed {
        session_id: Bytes::new(),
        plan_id: session.plan_id,
    };
    let masked = MaskedClient::new(&sk, kind, to, &groups, &public_a, budget)?.for_model(model);
    Ok((masked, GrpcTransport::on_session(client)))
}

//! The client side over gRPC: fetching the offer, opening the session, and a
//! [`Transport`] on the blocking [`AdapterClient`].

use std::collections::HashMap;

use bytes::Bytes;
use cipherlora_helora::wire::{GroupRequest, GroupResponse};
use cipherlora_model::ModelConfig;
use cipherlora_service::{AdapterClient, AdapterInfo, ClientConfig, GroupCall, SessionParams};

use super::wire::{PlanRequest, attach_public_a, decode_offer, decode_public_a};
use crate::PrivateError;
use crate::client::ByWidth;
use crate::client::HeHook;
use crate::client::width_plan::PlanSpace;
use crate::client::{Reply, Transport};
use crate::server::{Grouping, SessionOffer};

/// An adapter's offer for one verify width, as the server sent it.
#[derive(Debug, Clone)]
pub struct RemoteOffer {
    /// The adapter's public description (from `ListAdapters`).
    pub info: AdapterInfo,
    /// CKKS preset name the keys must be made under.
    pub ckks_preset: String,
    /// The decoded, validated offer.
    pub offer: SessionOffer,
    /// The offer bytes, to check that the real session runs the same plans.
    pub offer_bytes: Bytes,
}

fn transport_error(e: cipherlora_service::ServiceError) -> PrivateError {
    PrivateError::Service(e)
}

/// Step one of opening a session: looks `adapter_id` up with `ListAdapters`
/// and asks for its offer for verify width `t` with an offer-only
/// `OpenSession` (no key is sent; the server answers the plans, whose Galois
/// steps the client needs to make its keys). The offer-only session is
/// closed by the next `open_session` of the same client.
///
/// # Errors
/// [`PrivateError::Service`] for connection failures and refusals,
/// [`PrivateError::Transport`] for an
/// unknown adapter; [`PrivateError::Helora`] for a malformed offer or one
/// for another T.
pub fn fetch_offer(
    client: &mut AdapterClient,
    adapter_id: &str,
    t: usize,
    grouping: Grouping,
) -> Result<RemoteOffer, PrivateError> {
    let info = client
        .list_adapters()
        .map_err(transport_error)?
        .into_iter()
        .find(|a| a.adapter_id == adapter_id)
        .ok_or_else(|| {
            PrivateError::Transport(format!("the server has no adapter {adapter_id:?}"))
        })?;
    let ckks_preset = info
        .ckks_presets
        .first()
        .cloned()
        .ok_or_else(|| PrivateError::Transport("the adapter names no CKKS preset".into()))?;
    let session = client
        .open_session(SessionParams {
            adapter_id: adapter_id.to_string(),
            ckks_preset: ckks_preset.clone(),
            public_key: Bytes::new(),
            galois_keys: Bytes::new(),
            plan_request: Bytes::from(
                PlanRequest {
                    t,
                    offer_only: true,
                    grouping,
                }
                .to_bytes(),
            ),
        })
        .map_err(transport_error)?;
    let mut offer = decode_offer(&session.plan)?;
    if offer.kind == crate::server::LoraKind::Ffa {
        let bytes = info.ffa_lora_a.as_ref().ok_or_else(|| {
            PrivateError::Transport("the FFA adapter's info carries no lora_A".into())
        })?;
        attach_public_a(&mut offer, &decode_public_a(bytes)?)?;
    }
    if offer.t != t {
        return Err(PrivateError::Transport(format!(
            "asked for T = {t}, the server offered T = {}",
            offer.t
        )));
    }
    Ok(RemoteOffer {
        info,
        ckks_preset,
        offer,
        offer_bytes: session.plan,
    })
}

/// [`Transport`] over a gRPC session of the adapter service.
///
/// Each verify pass is one service round: the round number goes up when a
/// request's (layer, group) does not come after the previous one's, so all
/// groups of one forward pass share it. The [`AdapterClient`] replays a round
/// after a dropped connection under the same number (the backend is
/// deterministic, so the replay returns the same deltas).
pub struct GrpcTransport {
    client: AdapterClient,
    round: u64,
    last: Option<(u32, u32)>,
    /// Plan id and T of each streamed request in flight, by (round, layer,
    /// group), echoed into its reply as [`Transport::rounds`] echoes them.
    streamed: HashMap<(u64, u32, u32), (u64, u32)>,
}

impl std::fmt::Debug for GrpcTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcTransport")
            .field("round", &self.round)
            .field("stats", &self.client.stats())
            .finish_non_exhaustive()
    }
}

impl GrpcTransport {
    /// Step two: opens the real session for `offer` with the client's
    /// serialised Galois keys and, for an offer with circuit privacy, its
    /// public key.
    ///
    /// # Errors
    /// [`PrivateError::Service`] when the server refuses the keys,
    /// [`PrivateError::Transport`] when it
    /// answers another offer than [`fetch_offer`] got.
    pub fn open(
        mut client: AdapterClient,
        offer: &RemoteOffer,
        galois_keys: &[u8],
        public_key: Option<&[u8]>,
    ) -> Result<Self, PrivateError> {
        let session = client
            .open_session(SessionParams {
                adapter_id: offer.info.adapter_id.clone(),
                ckks_preset: offer.ckks_preset.clone(),
                public_key: public_key.map(Bytes::copy_from_slice).unwrap_or_default(),
                galois_keys: Bytes::copy_from_slice(galois_keys),
                plan_request: Bytes::from(
                    PlanRequest {
                        t: offer.offer.t,
                        offer_only: false,
                        grouping: offer.offer.grouping,
                    }
                    .to_bytes(),
                ),
            })
            .map_err(transport_error)?;
        if session.plan != offer.offer_bytes {
            return Err(PrivateError::Transport(
                "the session runs other plans than the server offered".into(),
            ));
        }
        Ok(Self {
            client,
            round: 0,
            last: None,
            streamed: HashMap::new(),
        })
    }

    /// Closes the session on the server (`CloseSession`): its keys and
    /// buffers are freed now instead of at its idle timeout.
    ///
    /// # Errors
    /// [`PrivateError::Service`] when the call fails.
    pub fn close(mut self) -> Result<(), PrivateError> {
        self.client.close().map_err(transport_error)
    }

    /// The gRPC client (stats, session).
    pub fn client(&self) -> &AdapterClient {
        &self.client
    }

    /// The gRPC client (stats, or raw calls).
    pub fn client_mut(&mut self) -> &mut AdapterClient {
        &mut self.client
    }
}

impl Transport for GrpcTransport {
    fn round(&mut self, request: &GroupRequest) -> Result<Reply, PrivateError> {
        let key = (request.layer, request.group);
        if self.last.is_none_or(|last| key <= last) {
            self.round += 1;
        }
        self.last = Some(key);
        let cts = request
            .ciphertexts
            .iter()
            .map(|c| Bytes::copy_from_slice(c))
            .collect();
        let before = self.client.stats().server_micros;
        let out = self
            .client
            .round(request.layer, request.group, self.round, cts)
            .map_err(transport_error)?;
        let micros = self.client.stats().server_micros.saturating_sub(before);
        Ok(Reply {
            response: GroupResponse {
                plan_id: request.plan_id,
                layer: request.layer,
                group: request.group,
                t: request.t,
                ciphertexts: out.into_iter().map(|b| b.to_vec()).collect(),
            },
            server_ms: Some(micros as f64 / 1e3),
        })
    }

    /// One service round carrying every request, pipelined on the session's
    /// stream: the requests leave back to back, the server computes each as
    /// it arrives and answers as it finishes, so upload, compute and
    /// download overlap and the latency is paid once.
    fn rounds(&mut self, requests: &[GroupRequest]) -> Result<Vec<Reply>, PrivateError> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        self.round += 1;
        self.last = None;
        let calls: Vec<GroupCall> = requests.iter().map(group_call).collect();
        let before = self.client.stats().server_micros;
        let outs = self
            .client
            .round_pipelined(self.round, &calls)
            .map_err(transport_error)?;
        let micros = self.client.stats().server_micros.saturating_sub(before);
        Ok(requests
            .iter()
            .zip(outs)
            .enumerate()
            .map(|(i, (request, out))| Reply {
                response: GroupResponse {
                    plan_id: request.plan_id,
                    layer: request.layer,
                    group: request.group,
                    t: request.t,
                    ciphertexts: out.into_iter().map(|b| b.to_vec()).collect(),
                },
                // The batch's compute, booked once.
                server_ms: Some(if i == 0 { micros as f64 / 1e3 } else { 0.0 }),
            })
            .collect())
    }

    /// A fresh service round number: a streamed trip is a round of its own
    /// whose requests interleave on the stream with the neighbouring trips'.
    fn open_round(&mut self) -> u64 {
        self.round += 1;
        self.last = None;
        self.round
    }

    /// Sends the request on the session's stream without waiting
    /// ([`AdapterClient::send_call`]).
    fn send(&mut self, round: u64, request: &GroupRequest) -> Result<Option<Reply>, PrivateError> {
        self.client
            .send_call(round, group_call(request))
            .map_err(transport_error)?;
        self.streamed.insert(
            (round, request.layer, request.group),
            (request.plan_id, request.t),
        );
        Ok(None)
    }

    /// Waits for the answer ([`AdapterClient::receive_call`]); a dropped
    /// connection or lost session is replayed there.
    fn receive(&mut self, round: u64, layer: u32, group: u32) -> Result<Reply, PrivateError> {
        let Some((plan_id, t)) = self.streamed.remove(&(round, layer, group)) else {
            return Err(PrivateError::Transport(format!(
                "no request of round {round} layer {layer} group {group} in flight"
            )));
        };
        let (out, micros) = self
            .client
            .receive_call(round, layer, group)
            .map_err(transport_error)?;
        Ok(Reply {
            response: GroupResponse {
                plan_id,
                layer,
                group,
                t,
                ciphertexts: out.into_iter().map(|b| b.to_vec()).collect(),
            },
            server_ms: Some(micros as f64 / 1e3),
        })
    }
}

/// The service's form of a group request.
fn group_call(r: &GroupRequest) -> GroupCall {
    GroupCall {
        layer: r.layer,
        group: r.group,
        ciphertexts: r
            .ciphertexts
            .iter()
            .map(|c| Bytes::copy_from_slice(c))
            .collect(),
        response_bits: r.response_bits,
    }
}

/// Connects to an adapter server and returns a ready [`HeHook`] for verify
/// width `t` (K drafts + 1):
/// 1. `ListAdapters` + an offer-only `OpenSession` ([`fetch_offer`]): the
///    plans, and for FFA adapters the public lora_A;
/// 2. a fresh secret key and the Galois keys for exactly the plans' steps
///    ([`HeHook::connect`]);
/// 3. the real `OpenSession` with those keys ([`GrpcTransport::open`]).
///
/// `model_config` is the client model's shape (for the q/k row layout).
///
/// # Errors
/// [`PrivateError::Service`] for connection failures and refusals; those
/// of [`fetch_offer`] and [`HeHook::connect`].
pub fn connect_remote(
    config: ClientConfig,
    adapter_id: &str,
    t: usize,
    grouping: Grouping,
    model_config: &ModelConfig,
) -> Result<HeHook<GrpcTransport>, PrivateError> {
    let mut client = AdapterClient::connect(config).map_err(transport_error)?;
    let offer = fetch_offer(&mut client, adapter_id, t, grouping)?;
    HeHook::connect(&offer.offer, model_config, |keys, pk| {
        GrpcTransport::open(client, &offer, keys, pk)
    })
}

/// [`connect_remote`] for speculative decoding: a session of width
/// `verify_width` (K + 1) for the verify passes, its groups as
/// `verify_grouping` asks ([`Grouping::ByLayers`] only for the fixed-point
/// schedule), and, when `prefill_width` differs, a second one of that width
/// grouped by input for the prompt's prefill passes, behind one [`ByWidth`]
/// hook (pair with `SpecConfig::prefill_width`). When the widths are equal
/// the one session serves both, grouped as `verify_grouping` asks: a
/// session grouped by layers takes fixed-point prefill passes (every input
/// of a pass known at once) but not a group-by-group prefill, which then
/// fails with [`PrivateError::GroupedByLayer`].
///
/// # Errors
/// Those of [`connect_remote`], for either session.
pub fn connect_widths(
    config: ClientConfig,
    adapter_id: &str,
    (verify_width, verify_grouping): (usize, Grouping),
    prefill_width: usize,
    model_config: &ModelConfig,
) -> Result<ByWidth<GrpcTransport>, PrivateError> {
    let verify = connect_remote(
        config.clone(),
        adapter_id,
        verify_width,
        verify_grouping,
        model_config,
    )?;
    let mut hook = ByWidth::new().with(verify_width, verify);
    if prefill_width != verify_width {
        let wide = connect_remote(
            config,
            adapter_id,
            prefill_width,
            Grouping::ByInput,
            model_config,
        )?;
        hook = hook.with(prefill_width, wide);
    }
    Ok(hook)
}

/// [`connect_widths`] with a verify width the client chooses from the
/// server's plans: opens the prefill session of `prefill_width` first
/// (grouped by input), passes its [`PlanSpace`] (the adapter's public group
/// shapes) to `choose`, which returns K and the verify session's grouping,
/// then opens the verify session of width K + 1 (the prefill session
/// serves it when the widths are equal). Returns the hook and the verify
/// width. See [`crate::width_plan`].
///
/// # Errors
/// Those of [`connect_remote`] and of `choose`.
pub fn connect_chosen_width(
    config: ClientConfig,
    adapter_id: &str,
    prefill_width: usize,
    model_config: &ModelConfig,
    choose: impl FnOnce(&PlanSpace) -> Result<(usize, Grouping), PrivateError>,
) -> Result<(ByWidth<GrpcTransport>, usize), PrivateError> {
    let wide = connect_remote(
        config.clone(),
        adapter_id,
        prefill_width,
        Grouping::ByInput,
        model_config,
    )?;
    let (k, grouping) = choose(wide.plan_space())?;
    let verify_width = k + 1;
    let mut hook = ByWidth::new().with(prefill_width, wide);
    if verify_width != prefill_width {
        let verify = connect_remote(config, adapter_id, verify_width, grouping, model_config)?;
        hook = hook.with(verify_width, verify);
    }
    Ok((hook, verify_width))
}

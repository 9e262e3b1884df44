//! The client over gRPC: fetching the offer, opening the session, a [`Transport`] on
//! [`AdapterClient`].

use bytes::Bytes;
use cipherlora_model::ModelConfig;
use cipherlora_proto::v1::{self, GroupRequest};
use cipherlora_service::{AdapterClient, AdapterInfo, ClientConfig, ServiceError, SessionParams};

use crate::PrivateError;
use crate::ProtocolFault;
use crate::client::ByWidth;
use crate::client::HeHook;
use crate::client::{Reply, Transport};
use crate::protocol::{Grouping, LoraKind, SessionOffer};
use crate::protocol::{PlanRequest, attach_public_a, decode_offer, decode_public_a};

/// An adapter's offer for one verify width, as the server sent it.
#[derive(Debug, Clone)]
pub struct RemoteOffer {
    /// The adapter's public description (from `ListAdapters`).
    pub info: AdapterInfo,
    /// CKKS preset name the keys must be made under.
    pub ckks_preset: String,
    /// The decoded, validated offer.
    pub offer: SessionOffer,
    /// The offer as sent, to check that the real session runs the same plans.
    pub offer_message: v1::SessionOffer,
}

pub(super) fn transport_error(e: cipherlora_service::ServiceError) -> PrivateError {
    PrivateError::Service(e)
}

/// The public description of `adapter_id` (`ListAdapters`). Errors: [`PrivateError::Service`],
/// [`PrivateError::UnknownAdapter`].
pub(super) fn adapter_info(
    client: &mut AdapterClient,
    adapter_id: &str,
) -> Result<AdapterInfo, PrivateError> {
    client
        .describe_adapter(adapter_id)
        .map_err(transport_error)?
        .ok_or_else(|| PrivateError::UnknownAdapter {
            adapter_id: adapter_id.chars().take(64).collect(),
        })
}

/// Step one of opening a session: an offer-only `OpenSession` for width `t` (no key sent). Errors:
/// [`PrivateError::Service`], `Transport` (unknown adapter), `Helora` (bad offer).
pub fn fetch_offer(
    client: &mut AdapterClient,
    adapter_id: &str,
    t: usize,
    grouping: Grouping,
) -> Result<RemoteOffer, PrivateError> {
    let info = adapter_info(client, adapter_id)?;
    fetch_listed_offer(client, info, t, grouping)
}

/// [`fetch_offer`] for an adapter whose description `info` the client already holds (one
/// `ListAdapters` serves every offer of an opening: an FFA adapter's carries its lora_A).
/// Errors: as [`fetch_offer`].
pub(super) fn fetch_listed_offer(
    client: &mut AdapterClient,
    info: AdapterInfo,
    t: usize,
    grouping: Grouping,
) -> Result<RemoteOffer, PrivateError> {
    let ckks_preset = info
        .ckks_presets
        .first()
        .cloned()
        .ok_or(PrivateError::Protocol {
            what: ProtocolFault::NoPreset,
        })?;
    let session = client
        .open_session(SessionParams {
            adapter_id: info.adapter_id.clone(),
            ckks_preset: ckks_preset.clone(),
            public_key: Bytes::new(),
            galois_keys: Bytes::new(),
            plan_request: PlanRequest {
                t,
                offer_only: true,
                grouping,
            }
            .to_proto(),
        })
        .map_err(transport_error)?;
    let mut offer = decode_offer(&session.offer)?;
    if offer.kind == LoraKind::Ffa {
        let public_a = info.ffa_lora_a.as_ref().ok_or(PrivateError::Protocol {
            what: ProtocolFault::NoPublicA,
        })?;
        attach_public_a(&mut offer, &decode_public_a(public_a)?)?;
    }
    if offer.t != t {
        return Err(PrivateError::WidthMismatch {
            asked: t,
            offered: offer.t,
        });
    }
    Ok(RemoteOffer {
        info,
        ckks_preset,
        offer,
        offer_message: session.offer,
    })
}

/// [`Transport`] over a gRPC adapter session, one service round per verify pass.
pub struct GrpcTransport {
    client: AdapterClient,
    round: u64,
    last: Option<(u32, u32)>,
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
    /// Step two: the real session for `offer` with the client's keys. Errors:
    /// [`PrivateError::Service`]; [`PrivateError::Protocol`] for another offer than
    /// [`fetch_offer`] got.
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
                plan_request: PlanRequest {
                    t: offer.offer.t,
                    offer_only: false,
                    grouping: offer.offer.grouping,
                }
                .to_proto(),
            })
            .map_err(transport_error)?;
        if session.offer != offer.offer_message {
            return Err(PrivateError::Protocol {
                what: ProtocolFault::PlanChanged,
            });
        }
        Ok(Self {
            client,
            round: 0,
            last: None,
        })
    }

    /// A transport on `client`'s open session.
    #[must_use]
    pub(crate) fn on_session(client: AdapterClient) -> Self {
        Self {
            client,
            round: 0,
            last: None,
        }
    }

    /// Closes the session on the server (`CloseSession`). Errors: [`PrivateError::Service`].
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
        let round = self.round;
        self.send(round, request)?;
        self.receive(round, request.layer, request.group)
    }

    /// One service round, its requests pipelined on the session's stream.
    fn rounds(&mut self, requests: &[GroupRequest]) -> Result<Vec<Reply>, PrivateError> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let round = self.open_round();
        for request in requests {
            self.send(round, request)?;
        }
        requests
            .iter()
            .map(|r| self.receive(round, r.layer, r.group))
            .collect()
    }

    /// A fresh service round number (a streamed trip is a round of its own).
    fn open_round(&mut self) -> u64 {
        self.round += 1;
        self.last = None;
        self.round
    }

    /// Sends the request on the session's stream without waiting ([`AdapterClient::send_call`]);
    /// its ciphertexts are shared with the stream, not copied.
    fn send(&mut self, round: u64, request: &GroupRequest) -> Result<Option<Reply>, PrivateError> {
        self.client
            .send_call(round, request.clone())
            .map_err(transport_error)?;
        Ok(None)
    }

    /// Waits for the answer ([`AdapterClient::receive_call`] replays losses). Errors:
    /// [`PrivateError::NotInFlight`] for a request never sent.
    fn receive(&mut self, round: u64, layer: u32, group: u32) -> Result<Reply, PrivateError> {
        let response = self
            .client
            .receive_call(round, layer, group)
            .map_err(|e| match e {
                ServiceError::Config { .. } => PrivateError::NotInFlight {
                    round,
                    layer,
                    group,
                },
                e => transport_error(e),
            })?;
        let server_ms = Some(response.server_micros as f64 / 1e3);
        Ok(Reply {
            response,
            server_ms,
        })
    }
}

/// A ready [`HeHook`] for verify width `t` from an adapter server: offer, fresh keys, session.
/// Errors: [`PrivateError::Service`]; those of [`fetch_offer`] and [`HeHook::connect`].
pub fn connect_remote(
    config: ClientConfig,
    adapter_id: &str,
    t: usize,
    grouping: Grouping,
    model_config: &ModelConfig,
) -> Result<HeHook<GrpcTransport>, PrivateError> {
    let mut client = AdapterClient::connect(config).map_err(transport_error)?;
    let info = adapter_info(&mut client, adapter_id)?;
    open_listed(client, info, t, grouping, model_config)
}

/// [`connect_remote`] on a connected `client` for an adapter whose description `info` it already
/// holds ([`fetch_listed_offer`]). Errors: as [`connect_remote`].
pub(super) fn open_listed(
    mut client: AdapterClient,
    info: AdapterInfo,
    t: usize,
    grouping: Grouping,
    model_config: &ModelConfig,
) -> Result<HeHook<GrpcTransport>, PrivateError> {
    let offer = fetch_listed_offer(&mut client, info, t, grouping)?;
    HeHook::connect(&offer.offer, model_config, |keys, pk| {
        GrpcTransport::open(client, &offer, keys, pk)
    })
}

/// [`connect_remote`] for speculative decoding: a verify session and, for another width, a prefill
/// session grouped by input, opened at once behind one [`ByWidth`]. Errors: [`connect_remote`]'s.
pub fn connect_widths(
    config: ClientConfig,
    adapter_id: &str,
    verify: (usize, Grouping),
    prefill_width: usize,
    model_config: &ModelConfig,
) -> Result<ByWidth<GrpcTransport>, PrivateError> {
    let mut opener = super::GrpcOpener::new(config, adapter_id);
    crate::client::open_widths(&mut opener, (prefill_width, None), verify, model_config)
}

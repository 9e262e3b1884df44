//! The HE adapter server as a [`cipherlora_service::AdapterBackend`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use cipherlora_ckks::{CkksError, CkksParameters, Context, SeededCiphertext};
use cipherlora_helora::HeloraError;
use cipherlora_model::ModelConfig;
use cipherlora_proto::v1::GroupRequest;
use cipherlora_service::{
    AdapterBackend, AdapterInfo, BackendError, CiphertextFault, GroupRequestShape, LinkProfile,
    OpenSessionPayload, OpenedSession, ParameterFault, SessionCompute,
};

use crate::PrivateError;
use crate::client::width_plan::{ClientCosts, PlanSpace};
use crate::client::{AUTO_CANDIDATES, choose_prefill_width, choose_verify_session};
use crate::protocol::{Grouping, LoraKind, SessionOffer};
use crate::protocol::{PlanRequest, encode_offer, encode_public_a, group_index, preset_name};
use crate::server::SessionMemory;
use crate::server::{HeAdapter, Room, ServerSession};

/// Repetitions per CKKS op when a backend measures its planner costs at load.
pub const COST_REPS: usize = 15;

/// An [`HeAdapter`] behind the gRPC service: offer-only sessions, key checks, shared diagonals
/// within a memory budget ([`HeBackend::with_session_memory`]), and ciphertexts checked against the
/// plan before any arithmetic.
#[derive(Debug)]
pub struct HeBackend {
    server: HeAdapter,
    info: AdapterInfo,
    ctx: Arc<Context>,
}

impl HeBackend {
    /// Loads the PEFT adapter in `dir` for a model of shape `config`, planned with cached op costs.
    /// Errors: as [`HeAdapter::load`] and `measure_costs`; [`PrivateError::Sidecar`].
    pub fn load(
        adapter_id: impl Into<String>,
        dir: &Path,
        config: &ModelConfig,
    ) -> Result<Self, PrivateError> {
        let mut server = HeAdapter::load(dir, config)?;
        // Plan with measured op costs, cached so a restart offers the same plans.
        server.cached_costs(COST_REPS)?;
        let info = describe(adapter_id.into(), dir, &server)?;
        Self::new(server, info)
    }

    /// Serves `server` announced as `info`. Errors: [`PrivateError::Ckks`].
    pub fn new(server: HeAdapter, mut info: AdapterInfo) -> Result<Self, PrivateError> {
        let ctx = Context::new(CkksParameters::preset(server.preset())?)?;
        info.ckks_presets = vec![preset_name(server.preset()).to_string()];
        info.ffa_lora_a = (server.groups().kind == LoraKind::Ffa)
            .then(|| encode_public_a(&server.groups().public_a()));
        Ok(Self { server, info, ctx })
    }

    /// Makes prepared offers reserve from `memory`, possibly shared with other backends.
    #[must_use]
    pub fn with_session_memory(mut self, memory: SessionMemory) -> Self {
        self.server.set_session_memory(memory);
        self
    }

    /// Turns circuit privacy on (`serve --circuit-privacy`).
    #[must_use]
    pub fn with_circuit_privacy(mut self, r: crate::Rerandomization) -> Self {
        self.server.set_circuit_privacy(Some(r));
        self
    }

    /// The session memory budget this backend reserves from.
    #[must_use]
    pub fn session_memory(&self) -> &SessionMemory {
        self.server.session_memory()
    }

    /// The adapter server.
    #[must_use]
    pub fn server(&self) -> &HeAdapter {
        &self.server
    }

    /// Encodes and keeps warm the diagonals of the prefill session a client with
    /// [`crate::client::PrefillWidth::Auto`] opens ([`HeAdapter::prewarm`]), so that its sessions
    /// open without waiting for them (`serve` does this at start, in the background). Returns the
    /// width and the bytes held. Errors: as [`HeAdapter::prewarm`] and
    /// [`crate::client::choose_prefill_width`].
    pub fn prewarm_prefill(&self) -> Result<(usize, u64), PrivateError> {
        let t = self.auto_prefill_width()?;
        Ok((
            t,
            self.server.prewarm(t, Grouping::ByInput, Room::EvictIdle)?,
        ))
    }

    /// Encodes and keeps warm the diagonals of the verify session a client with `--k auto` (K ≤
    /// `k_max`) and [`crate::client::PrefillWidth::Auto`] would open, guessed from `client`'s pass
    /// times on `link` ([`choose_verify_session`]), in free memory only ([`Room::Free`]): nothing
    /// encoded before is let go for a guess. A client whose passes or link differ may choose
    /// another width, which it then waits for as without this. Returns the width, grouping and
    /// bytes held; `None` where the verify session would be the prefill session. Errors: as
    /// [`HeAdapter::prewarm`] and [`choose_verify_session`].
    pub fn prewarm_verify(
        &self,
        client: &ClientCosts,
        link: &LinkProfile,
        k_max: usize,
    ) -> Result<Option<(usize, Grouping, u64)>, PrivateError> {
        let t = self.auto_prefill_width()?;
        let space = PlanSpace::of(&self.server.offer_grouped(t, Grouping::ByInput)?);
        let ((width, grouping), _) =
            choose_verify_session(&space, client, link, (None, k_max.into()), (None, None))?;
        if width == t {
            return Ok(None);
        }
        let bytes = self.server.prewarm(width, grouping, Room::Free)?;
        Ok(Some((width, grouping, bytes)))
    }

    /// The prefill width a client with [`crate::client::PrefillWidth::Auto`] opens.
    fn auto_prefill_width(&self) -> Result<usize, PrivateError> {
        let narrowest = self
            .server
            .offer_grouped(AUTO_CANDIDATES[0], Grouping::ByInput)?;
        choose_prefill_width(&PlanSpace::of(&narrowest))
    }
}

/// The public description of the adapter in `dir`.
fn describe(
    adapter_id: String,
    dir: &Path,
    server: &HeAdapter,
) -> Result<AdapterInfo, PrivateError> {
    let json = |name: &str| -> Result<Option<serde_json::Value>, PrivateError> {
        let path = dir.join(name);
        let Ok(text) = std::fs::read_to_string(&path) else {
            return Ok(None);
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| PrivateError::Sidecar {
                path,
                reason: e.to_string(),
            })
    };
    let peft = json("adapter_config.json")?.unwrap_or_default();
    let side = json("cipherlora.json")?.unwrap_or_default();
    let groups = server.groups();
    let str_of = |v: &serde_json::Value| v.as_str().map(str::to_string);
    let mut target_modules: Vec<String> = peft["target_modules"]
        .as_array()
        .map(|a| a.iter().filter_map(str_of).collect())
        .unwrap_or_default();
    target_modules.sort();
    let rank_pattern: BTreeMap<String, u32> = peft["rank_pattern"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), u32::try_from(v.as_u64()?).ok()?)))
                .collect()
        })
        .unwrap_or_default();
    let rank = peft["r"]
        .as_u64()
        .and_then(|r| u32::try_from(r).ok())
        .or_else(|| {
            let p = groups.groups.first()?.adapter.projections.first()?;
            u32::try_from(p.rank).ok()
        })
        .unwrap_or(0);
    let base = &side["base_model"];
    let base_model = str_of(&base["gguf_file"])
        .or_else(|| str_of(&peft["base_model_name_or_path"]))
        .unwrap_or_default();
    let base_model_sha256 = base["gguf_sha256"]
        .as_str()
        .and_then(parse_hex32)
        .unwrap_or([0u8; 32]);
    let layers: BTreeSet<usize> = groups.groups.iter().map(|g| g.layer).collect();
    let mut group_names: Vec<(u32, Vec<String>)> = Vec::new();
    for g in &groups.groups {
        let idx = group_index(g.group);
        if !group_names.iter().any(|(i, _)| *i == idx) {
            let names = g.adapter.projections.iter().map(|p| p.name.clone());
            group_names.push((idx, names.collect()));
        }
    }
    group_names.sort_by_key(|(i, _)| *i);
    Ok(AdapterInfo {
        adapter_id,
        base_model,
        base_model_revision: str_of(&peft["revision"]).unwrap_or_default(),
        base_model_sha256,
        target_modules,
        rank,
        rank_pattern,
        lora_alpha: peft["lora_alpha"].as_f64().unwrap_or(0.0),
        num_layers: u32::try_from(layers.len()).unwrap_or(u32::MAX),
        groups: group_names.into_iter().map(|(_, n)| n).collect(),
        ffa_lora_a: None,
        ckks_presets: Vec::new(),
    })
}

fn parse_hex32(hex: &str) -> Option<[u8; 32]> {
    let b = hex.as_bytes();
    if b.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (o, pair) in out.iter_mut().zip(b.chunks_exact(2)) {
        let s = std::str::from_utf8(pair).ok()?;
        *o = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

impl AdapterBackend for HeBackend {
    fn info(&self) -> AdapterInfo {
        self.info.clone()
    }

    fn open_session(&self, payload: OpenSessionPayload) -> Result<OpenedSession, BackendError> {
        if payload.plan_request.masked {
            return super::masked_compute::open_masked(
                &self.server,
                self.server.session_memory(),
                &payload,
            );
        }
        let preset = self.server.preset();
        if payload.ckks_preset != preset_name(preset) {
            return Err(BackendError::UnknownPreset {
                preset: payload.ckks_preset,
            });
        }
        let request =
            PlanRequest::from_proto(&payload.plan_request).map_err(BackendError::invalid_plan)?;
        let offer = self
            .server
            .offer_grouped(request.t, request.grouping)
            .map_err(BackendError::invalid_plan)?;
        let message = encode_offer(&offer);
        if request.offer_only {
            return Ok(OpenedSession {
                offer: message,
                compute: Box::new(OfferOnly),
            });
        }
        let public_key = (!payload.public_key.is_empty()).then_some(&payload.public_key[..]);
        let session = self
            .server
            .open_session_with_public_key(&offer, &payload.galois_keys, public_key)
            .map_err(|e| match e {
                e @ (PrivateError::PublicKeyRequired
                | PrivateError::Ckks(_)
                | PrivateError::GaloisKeysMismatch { .. }) => BackendError::invalid_key(e),
                PrivateError::MemoryBudget { need, limit, .. } if need > limit => {
                    BackendError::LimitExceeded {
                        what: "session plaintext memory (bytes)",
                        got: need,
                        limit,
                    }
                }
                PrivateError::MemoryBudget { got, limit, .. } => BackendError::AtCapacity {
                    what: "session plaintext memory held by all sessions (bytes)",
                    got,
                    limit,
                },
                other => BackendError::invalid_plan(other),
            })?;
        let compute = HeCompute::new(self.ctx.clone(), session, &offer)?;
        Ok(OpenedSession {
            offer: message,
            compute: Box::new(compute),
        })
    }
}

/// The session of an offer-only opening: it answers no round.
pub(super) struct OfferOnly;

impl SessionCompute for OfferOnly {
    fn offer_only(&self) -> bool {
        true
    }

    fn group_shape(&self, layer: u32, group: u32) -> Result<GroupRequestShape, BackendError> {
        Err(BackendError::UnknownLayer { layer, group })
    }

    fn compute(&self, request: &GroupRequest) -> Result<Vec<Bytes>, BackendError> {
        Err(BackendError::UnknownLayer {
            layer: request.layer,
            group: request.group,
        })
    }
}

/// What a request of one group must look like.
#[derive(Debug, Clone, Copy)]
struct GroupMeta {
    /// Delta evaluations per request for the extraction budget: T per input group answered.
    evaluations: u32,
    inputs: usize,
    level: usize,
    /// The scale every input ciphertext must have (the parameters').
    scale: f64,
}

/// A live HE session validating ciphertexts before [`ServerSession::handle`].
struct HeCompute {
    ctx: Arc<Context>,
    session: ServerSession,
    groups: HashMap<(u32, u32), GroupMeta>,
}

impl HeCompute {
    fn new(
        ctx: Arc<Context>,
        session: ServerSession,
        offer: &SessionOffer,
    ) -> Result<Self, BackendError> {
        let mut groups = HashMap::with_capacity(offer.groups.len());
        for og in &offer.groups {
            let inputs = og.plan.input_cts().map_err(BackendError::internal)?;
            let mut members: Vec<_> = og
                .projections
                .iter()
                .map(|&(l, p)| (l, p.group()))
                .collect();
            members.dedup();
            let meta = GroupMeta {
                evaluations: (og.plan.t * members.len().max(1)) as u32,
                inputs,
                level: og.plan.input_level(),
                scale: ctx.params().scale(),
            };
            let key = (og.layer as u32, group_index(og.group));
            groups.insert(key, meta);
        }
        Ok(Self {
            ctx,
            session,
            groups,
        })
    }

    fn meta(&self, layer: u32, group: u32) -> Result<GroupMeta, BackendError> {
        self.groups
            .get(&(layer, group))
            .copied()
            .ok_or(BackendError::UnknownLayer { layer, group })
    }
}

impl SessionCompute for HeCompute {
    fn group_shape(&self, layer: u32, group: u32) -> Result<GroupRequestShape, BackendError> {
        let meta = self.meta(layer, group)?;
        Ok(GroupRequestShape {
            masked: false,
            input_ciphertexts: meta.inputs,
            positions: meta.evaluations,
        })
    }

    fn compute(&self, request: &GroupRequest) -> Result<Vec<Bytes>, BackendError> {
        let (layer, group, ciphertexts) = (request.layer, request.group, &request.ciphertexts);
        let meta = self.meta(layer, group)?;
        // The service admitted the request against `group_shape` (its ciphertext count), and
        // helora checks the count against the plan.
        // Parsed once, shared by the checks and the evaluation.
        let mut inputs = Vec::with_capacity(ciphertexts.len());
        for (index, bytes) in ciphertexts.iter().enumerate() {
            let ct = SeededCiphertext::from_upload_bytes(&self.ctx, bytes)
                .map_err(|e| ciphertext_error(index, e))?;
            if ct.level() != meta.level {
                return Err(BackendError::ParameterMismatch {
                    index,
                    fault: ParameterFault::Level {
                        expected: meta.level,
                        got: ct.level(),
                    },
                });
            }
            if !scale_matches(ct.scale(), meta.scale) {
                return Err(BackendError::ParameterMismatch {
                    index,
                    fault: ParameterFault::Scale,
                });
            }
            inputs.push(ct.expand());
        }
        self.session
            .handle_parsed(request, &inputs)
            .map_err(backend_error)
    }
}

/// Whether `scale` is finite and within 1024 ulps of the plan's `expected` scale.
fn scale_matches(scale: f64, expected: f64) -> bool {
    scale.is_finite() && (scale - expected).abs() <= expected * f64::EPSILON * 1024.0
}

/// Maps a CKKS deserialisation error of ciphertext `index`.
fn ciphertext_error(index: usize, e: CkksError) -> BackendError {
    let fault = match e {
        CkksError::Truncated { expected, got } => CiphertextFault::Truncated { expected, got },
        CkksError::TrailingBytes { expected, got } => {
            CiphertextFault::TrailingBytes { expected, got }
        }
        CkksError::BadMagic | CkksError::WrongKind { .. } => CiphertextFault::BadMagic,
        CkksError::UnsupportedVersion { version } => {
            CiphertextFault::UnsupportedVersion { version }
        }
        CkksError::CoefficientOutOfRange { limb, index } => {
            CiphertextFault::CoefficientOutOfRange { limb, index }
        }
        CkksError::Malformed { what } => CiphertextFault::Malformed { what },
        CkksError::InvalidScale { .. } => CiphertextFault::Malformed { what: "scale" },
        CkksError::ParameterMismatch { what } => {
            return BackendError::ParameterMismatch {
                index,
                fault: ParameterFault::Parameters { what },
            };
        }
        CkksError::LevelOutOfRange { level, max } => {
            return BackendError::ParameterMismatch {
                index,
                fault: ParameterFault::LevelAboveTop { got: level, max },
            };
        }
        other => return BackendError::internal(other),
    };
    BackendError::InvalidCiphertext { index, fault }
}

/// Maps what [`ServerSession::handle`] reports once the ciphertexts parsed.
fn backend_error(e: PrivateError) -> BackendError {
    match e {
        PrivateError::UnknownGroup { layer, group } => BackendError::UnknownLayer { layer, group },
        PrivateError::Helora(HeloraError::CiphertextCount { expected, got, .. }) => {
            BackendError::CiphertextCount { expected, got }
        }
        PrivateError::Helora(HeloraError::PlanMismatch {
            field,
            expected,
            got,
        }) => BackendError::ParameterMismatch {
            index: 0,
            fault: ParameterFault::Plan {
                field,
                expected,
                got,
            },
        },
        PrivateError::Ckks(e) | PrivateError::Helora(HeloraError::Ckks(e)) => {
            ciphertext_error(0, e)
        }
        other => BackendError::internal(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AdapterGroups, Grouping};
    use cipherlora_proto::v1;

    #[test]
    fn ckks_faults_map_to_their_backend_errors() {
        let e = ciphertext_error(
            2,
            CkksError::Truncated {
                expected: 9,
                got: 3,
            },
        );
        assert!(matches!(
            e,
            BackendError::InvalidCiphertext {
                index: 2,
                fault: CiphertextFault::Truncated {
                    expected: 9,
                    got: 3
                }
            }
        ));
        assert!(matches!(
            ciphertext_error(
                1,
                CkksError::ParameterMismatch {
                    what: "ring degree"
                }
            ),
            BackendError::ParameterMismatch {
                index: 1,
                fault: ParameterFault::Parameters {
                    what: "ring degree"
                }
            }
        ));
        assert!(matches!(
            ciphertext_error(0, CkksError::LevelOutOfRange { level: 7, max: 1 }),
            BackendError::ParameterMismatch {
                index: 0,
                fault: ParameterFault::LevelAboveTop { got: 7, max: 1 }
            }
        ));
        assert!(matches!(
            backend_error(PrivateError::UnknownGroup { layer: 3, group: 1 }),
            BackendError::UnknownLayer { layer: 3, group: 1 }
        ));
        assert!(matches!(
            backend_error(PrivateError::Helora(HeloraError::CiphertextCount {
                what: "x",
                expected: 1,
                got: 2
            })),
            BackendError::CiphertextCount {
                expected: 1,
                got: 2
            }
        ));
    }

    /// One rank-2 projection `name` of an 8 → 8 group, fixed weights.
    fn projection(name: &str) -> cipherlora_helora::GroupAdapter {
        cipherlora_helora::GroupAdapter {
            d_in: 8,
            projections: vec![cipherlora_helora::ProjectionAdapter {
                name: name.into(),
                d_out: 8,
                rank: 2,
                a: (0..16).map(|i| i as f32 / 16.0).collect(),
                b: (0..16).map(|i| 0.5 - i as f32 / 32.0).collect(),
                scaling: 2.0,
            }],
        }
    }

    fn backend() -> HeBackend {
        use crate::server::LayerGroup;
        let adapter = projection("o_proj");
        let groups = AdapterGroups {
            kind: LoraKind::Ffa,
            groups: vec![LayerGroup::new(1, cipherlora_model::ProjGroup::O, adapter)],
            acceptance: None,
        };
        HeBackend::new(HeAdapter::new(groups), AdapterInfo::default()).unwrap()
    }

    /// A request grouping a layer's q and o inputs is charged two groups' evaluations.
    #[test]
    fn a_layer_request_is_charged_for_every_input_it_answers() {
        use crate::server::LayerGroup;
        use cipherlora_helora::CkksClient;
        use cipherlora_model::ProjGroup;
        let group = |group, name: &str| LayerGroup::new(1, group, projection(name));
        let groups = AdapterGroups {
            kind: LoraKind::Ffa,
            groups: vec![
                group(ProjGroup::Qkv, "q_proj"),
                group(ProjGroup::O, "o_proj"),
            ],
            acceptance: None,
        };
        let b = HeBackend::new(HeAdapter::new(groups), AdapterInfo::default()).unwrap();
        let preset = b.info().ckks_presets[0].clone();
        let t = 5;
        for (grouping, groups, evaluations) in
            [(Grouping::ByInput, 2, t), (Grouping::BY_LAYER, 1, 2 * t)]
        {
            let request = |offer_only| {
                PlanRequest {
                    t,
                    offer_only,
                    grouping,
                }
                .to_proto()
            };
            let opened = b
                .open_session(payload(&preset, request(true), vec![]))
                .unwrap();
            let offer = crate::protocol::decode_offer(&opened.offer).unwrap();
            assert_eq!(offer.groups.len(), groups);
            let ctx = Context::new(CkksParameters::preset(offer.preset).unwrap()).unwrap();
            let steps: BTreeSet<i64> = offer
                .groups
                .iter()
                .flat_map(|g| g.plan.galois_steps().unwrap())
                .collect();
            let steps: Vec<i64> = steps.into_iter().collect();
            let keys = CkksClient::new(&ctx)
                .unwrap()
                .galois_keys(&steps)
                .to_bytes();
            let real = b
                .open_session(payload(&preset, request(false), keys))
                .unwrap();
            let shape = real.compute.group_shape(1, 0).unwrap();
            assert_eq!(shape.positions as usize, evaluations, "{grouping:?}");
        }
    }

    fn payload(preset: &str, request: v1::PlanRequest, keys: Vec<u8>) -> OpenSessionPayload {
        OpenSessionPayload {
            ckks_preset: preset.into(),
            public_key: Bytes::new(),
            galois_keys: Bytes::from(keys),
            plan_request: request,
        }
    }

    fn refusal(r: Result<OpenedSession, BackendError>) -> BackendError {
        match r {
            Ok(_) => panic!("opened a session it should refuse"),
            Err(e) => e,
        }
    }

    /// The offer for width `t` and exactly-matching Galois keys for it.
    fn offer_and_keys(b: &HeBackend, t: usize) -> (SessionOffer, Vec<u8>, Vec<i64>) {
        use cipherlora_helora::CkksClient;
        let preset = b.info().ckks_presets[0].clone();
        let request = PlanRequest {
            t,
            offer_only: true,
            grouping: Grouping::ByInput,
        }
        .to_proto();
        let opened = b.open_session(payload(&preset, request, vec![])).unwrap();
        let offer = crate::protocol::decode_offer(&opened.offer).unwrap();
        let ctx = Context::new(CkksParameters::preset(offer.preset).unwrap()).unwrap();
        let he = CkksClient::new(&ctx).unwrap();
        let steps: Vec<i64> = offer.groups[0]
            .plan
            .galois_steps()
            .unwrap()
            .into_iter()
            .collect();
        let keys = he.galois_keys(&steps).to_bytes();
        (offer, keys, steps)
    }

    fn open_t(b: &HeBackend, t: usize, keys: &[u8]) -> Result<OpenedSession, BackendError> {
        let preset = b.info().ckks_presets[0].clone();
        let request = PlanRequest {
            t,
            offer_only: false,
            grouping: Grouping::ByInput,
        }
        .to_proto();
        b.open_session(payload(&preset, request, keys.to_vec()))
    }

    /// Sessions of one offer share its diagonals, charged once, kept warm after the last, and
    /// given up when another offer needs the room.
    #[test]
    fn sessions_of_one_offer_share_its_diagonals_charged_once() {
        let probe = backend();
        let (offer3, keys3, _) = offer_and_keys(&probe, 3);
        let (offer5, keys5, _) = offer_and_keys(&probe, 5);
        let (need3, need5) = (
            offer3.diagonal_bytes().unwrap(),
            offer5.diagonal_bytes().unwrap(),
        );
        assert!(need3 > 0 && need5 > 0);
        let b = backend().with_session_memory(SessionMemory::new(need3.max(need5) + 1));
        let sessions: Vec<_> = (0..4).map(|_| open_t(&b, 3, &keys3).unwrap()).collect();
        assert_eq!(
            b.session_memory().reserved(),
            need3,
            "charged once for 4 sessions"
        );
        // Held by others: a refusal that clears as they close.
        match refusal(open_t(&b, 5, &keys5)) {
            BackendError::AtCapacity { got, .. } => assert_eq!(got, need3 + need5),
            e => panic!("{e}"),
        }
        // Offer-only sessions hold no diagonals and are never refused.
        let preset = b.info().ckks_presets[0].clone();
        let probe_req = PlanRequest {
            t: 5,
            offer_only: true,
            grouping: Grouping::ByInput,
        }
        .to_proto();
        b.open_session(payload(&preset, probe_req, vec![])).unwrap();
        let mut sessions = sessions;
        sessions.truncate(1);
        assert_eq!(
            b.session_memory().reserved(),
            need3,
            "one session still holds them"
        );
        drop(sessions);
        assert_eq!(
            b.session_memory().reserved(),
            need3,
            "kept warm after the last session"
        );
        let _five = open_t(&b, 5, &keys5).unwrap();
        assert_eq!(
            b.session_memory().reserved(),
            need5,
            "the idle warm offer made room"
        );
        // A budget shared by two backends counts both.
        let other = backend().with_session_memory(b.session_memory().clone());
        assert!(matches!(
            refusal(open_t(&other, 3, &keys3)),
            BackendError::AtCapacity { .. }
        ));
        let tiny = backend().with_session_memory(SessionMemory::new(need3 - 1));
        assert!(matches!(
            refusal(open_t(&tiny, 3, &keys3)),
            BackendError::LimitExceeded { .. }
        ));
    }

    /// A session whose Galois keys miss plan steps is refused, nothing reserved.
    #[test]
    fn open_session_rejects_galois_keys_missing_plan_steps() {
        use cipherlora_helora::CkksClient;
        let b = backend();
        let (offer, _, steps) = offer_and_keys(&b, 3);
        assert!(!steps.is_empty(), "the test plan must rotate");
        let ctx = Context::new(CkksParameters::preset(offer.preset).unwrap()).unwrap();
        let he = CkksClient::new(&ctx).unwrap();
        let empty = he.galois_keys(&[]).to_bytes();
        let missing_one = he.galois_keys(&steps[1..]).to_bytes();
        let mut other_width: Vec<i64> = steps.clone();
        other_width.push(ctx.slots() as i64 / 2 + 1);
        let extra_one = he.galois_keys(&other_width).to_bytes();
        for (what, keys) in [
            ("empty", empty),
            ("missing", missing_one),
            ("extra", extra_one),
        ] {
            match refusal(open_t(&b, 3, &keys)) {
                BackendError::InvalidKey { source }
                    if matches!(
                        source.downcast_ref(),
                        Some(PrivateError::GaloisKeysMismatch { .. })
                    ) => {}
                e => panic!("{what}: {e}"),
            }
            assert_eq!(b.session_memory().reserved(), 0, "{what}: nothing reserved");
        }
    }

    /// A seeded ciphertext with scale 1e300 is `ParameterMismatch`, not INTERNAL.
    #[test]
    fn ciphertext_with_scale_1e300_is_parameter_mismatch_not_internal() {
        use cipherlora_helora::{CkksClient, HeClient};
        let b = backend();
        let (offer, _, steps) = offer_and_keys(&b, 3);
        let ctx = Context::new(CkksParameters::preset(offer.preset).unwrap()).unwrap();
        // Keys and ciphertexts under one secret key.
        let he = CkksClient::new(&ctx).unwrap();
        let keys = he.galois_keys(&steps).to_bytes();
        let c = open_t(&b, 3, &keys).unwrap().compute;
        let n = c.group_shape(1, 1).unwrap().input_ciphertexts;
        let level = offer.groups[0].plan.input_level();
        let good = he.encrypt_to_bytes(&[0.25; 8], &[], level).unwrap();
        assert_eq!(
            c.compute(&GroupRequest::for_group(
                1,
                1,
                vec![Bytes::from(good.clone()); n],
                0
            ))
            .unwrap()
            .len(),
            1
        );
        for scale in [1e300, 2.0, ctx.params().scale() * 2.0] {
            let mut bad = good.clone();
            bad[16..24].copy_from_slice(&f64::to_bits(scale).to_le_bytes());
            let e = c
                .compute(&GroupRequest::for_group(1, 1, vec![Bytes::from(bad); n], 0))
                .unwrap_err();
            assert!(
                matches!(e, BackendError::ParameterMismatch { index: 0, .. }),
                "scale {scale}: {e}"
            );
        }
    }

    #[test]
    fn open_session_refuses_bad_preset_plan_request_and_keys() {
        use cipherlora_helora::{CkksClient, HeClient};
        let b = backend();
        let info = b.info();
        assert_eq!(info.ckks_presets, ["n8192-depth2-fast"]);
        let preset = info.ckks_presets[0].as_str();
        let probe = PlanRequest {
            t: 3,
            offer_only: true,
            grouping: Grouping::ByInput,
        }
        .to_proto();
        let real = PlanRequest {
            t: 3,
            offer_only: false,
            grouping: Grouping::ByInput,
        }
        .to_proto();
        let e = refusal(b.open_session(payload("n4096", probe, vec![])));
        assert!(matches!(e, BackendError::UnknownPreset { .. }), "{e}");
        let e = refusal(b.open_session(payload(preset, v1::PlanRequest::default(), vec![])));
        assert!(matches!(e, BackendError::InvalidPlan { .. }), "{e}");
        let e = refusal(b.open_session(payload(preset, real, vec![1, 2, 3])));
        assert!(matches!(e, BackendError::InvalidKey { .. }), "{e}");

        // Offer only: the offer, and a session that computes nothing.
        let opened = b.open_session(payload(preset, probe, vec![])).unwrap();
        let offer = crate::protocol::decode_offer(&opened.offer).unwrap();
        assert_eq!((offer.t, offer.groups.len()), (3, 1));
        assert!(matches!(
            opened.compute.group_shape(1, 1),
            Err(BackendError::UnknownLayer { .. })
        ));

        // The real session validates every ciphertext before any arithmetic.
        let plan = &offer.groups[0].plan;
        let ctx = Context::new(CkksParameters::preset(offer.preset).unwrap()).unwrap();
        let he = CkksClient::new(&ctx).unwrap();
        let steps: Vec<i64> = plan.galois_steps().unwrap().into_iter().collect();
        let keys = he.galois_keys(&steps).to_bytes();
        let opened = b.open_session(payload(preset, real, keys)).unwrap();
        let c = opened.compute;
        let n = c.group_shape(1, 1).unwrap().input_ciphertexts;
        assert!(matches!(
            c.group_shape(0, 1),
            Err(BackendError::UnknownLayer { layer: 0, group: 1 })
        ));
        let good = Bytes::from(
            he.encrypt_to_bytes(&[0.25; 8], &[], plan.input_level())
                .unwrap(),
        );
        assert_eq!(
            c.compute(&GroupRequest::for_group(1, 1, vec![good.clone(); n], 0))
                .unwrap()
                .len(),
            1
        );
        let e = c
            .compute(&GroupRequest::for_group(1, 1, vec![good.clone(); n + 1], 0))
            .unwrap_err();
        assert!(
            matches!(e, BackendError::CiphertextCount { expected, got } if expected == n && got == n + 1),
            "{e}"
        );
        let mut bad_magic = good.to_vec();
        bad_magic[0] ^= 0xff;
        let e = c
            .compute(&GroupRequest::for_group(
                1,
                1,
                vec![Bytes::from(bad_magic); n],
                0,
            ))
            .unwrap_err();
        assert!(matches!(
            e,
            BackendError::InvalidCiphertext {
                index: 0,
                fault: CiphertextFault::BadMagic
            }
        ));
        let short = good.slice(..good.len() - 1);
        let e = c
            .compute(&GroupRequest::for_group(1, 1, vec![short; n], 0))
            .unwrap_err();
        assert!(
            matches!(
                e,
                BackendError::InvalidCiphertext {
                    fault: CiphertextFault::Truncated { .. },
                    ..
                }
            ),
            "{e}"
        );
        let low = Bytes::from(he.encrypt_to_bytes(&[0.25; 8], &[], 0).unwrap());
        let e = c
            .compute(&GroupRequest::for_group(1, 1, vec![low; n], 0))
            .unwrap_err();
        assert!(
            matches!(e, BackendError::ParameterMismatch { index: 0, .. }),
            "{e}"
        );
    }

    /// Circuit privacy needs the public key and keeps the deltas.
    #[test]
    fn circuit_privacy_needs_the_public_key_and_keeps_the_deltas() {
        use cipherlora_helora::{CkksClient, HeClient};
        let plain = backend();
        let private = backend().with_circuit_privacy(crate::Rerandomization::default());
        let (offer, _, steps) = offer_and_keys(&private, 3);
        assert!(offer.groups.iter().all(|g| g.plan.rerandomize));
        let (plain_offer, _, _) = offer_and_keys(&plain, 3);
        assert!(plain_offer.groups.iter().all(|g| !g.plan.rerandomize));
        let ctx = Context::new(CkksParameters::preset(offer.preset).unwrap()).unwrap();
        let he = CkksClient::new(&ctx).unwrap();
        let keys = he.galois_keys(&steps).to_bytes();
        match refusal(open_t(&private, 3, &keys)) {
            BackendError::InvalidKey { source }
                if matches!(source.downcast_ref(), Some(PrivateError::PublicKeyRequired)) => {}
            e => panic!("{e}"),
        }
        assert_eq!(private.session_memory().reserved(), 0);
        let preset = private.info().ckks_presets[0].clone();
        let real = PlanRequest {
            t: 3,
            offer_only: false,
            grouping: Grouping::ByInput,
        }
        .to_proto();
        let mut p = payload(&preset, real, keys.clone());
        p.public_key = Bytes::from(he.public_key().to_bytes());
        let c = private.open_session(p).unwrap().compute;
        let c0 = open_t(&plain, 3, &keys).unwrap().compute;
        let n = c.group_shape(1, 1).unwrap().input_ciphertexts;
        let x: Vec<f64> = (0..8).map(|i| 0.1 * i as f64 - 0.3).collect();
        let level = offer.groups[0].plan.input_level();
        let ct = Bytes::from(he.encrypt_to_bytes(&x, &[], level).unwrap());
        let a = c
            .compute(&GroupRequest::for_group(1, 1, vec![ct.clone(); n], 0))
            .unwrap();
        let b = c0
            .compute(&GroupRequest::for_group(1, 1, vec![ct; n], 0))
            .unwrap();
        assert_ne!(a, b, "rerandomised outputs are fresh ciphertexts");
        let (da, db) = (
            he.decrypt_from_bytes(&a[0]).unwrap(),
            he.decrypt_from_bytes(&b[0]).unwrap(),
        );
        let worst = da
            .iter()
            .zip(&db)
            .map(|(u, v)| (u - v).norm())
            .fold(0.0f64, f64::max);
        assert!(worst < 1e-3, "deltas differ by {worst}");
        assert!(
            db.iter().any(|v| v.norm() > 1e-2),
            "the deltas are not all zero"
        );
    }

    #[test]
    fn sha256_hex_parses() {
        let h = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
        let b = parse_hex32(h).unwrap();
        assert_eq!((b[0], b[31]), (0xb1, 0x53));
        assert!(parse_hex32(&h[1..]).is_none());
        assert!(parse_hex32(&h.replace('b', "g")).is_none());
    }
}

//! The HE adapter server as a [`cipherlora_service::AdapterBackend`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use cipherlora_ckks::{CkksError, CkksParameters, Context, SeededCiphertext};
use cipherlora_helora::HeloraError;
use cipherlora_helora::wire::GroupRequest;
use cipherlora_model::ModelConfig;
use cipherlora_service::{
    AdapterBackend, AdapterInfo, BackendError, CiphertextFault, GroupShape, OpenSessionPayload,
    OpenedSession, SessionCompute,
};

use super::memory::{Reservation, SessionMemory};
use super::wire::{PlanRequest, encode_offer, encode_public_a, preset_name};
use crate::PrivateError;
use crate::adapter_groups::{AdapterGroups, LoraKind};
use crate::server::{AdapterServer, ServerSession, SessionOffer};

/// Repetitions per CKKS op when a backend measures its planner costs at load.
const COST_REPS: usize = 15;

/// An [`AdapterServer`] behind the gRPC service.
///
/// `open_session` reads a [`PlanRequest`] from the plan request bytes:
/// - `offer_only`: answers the encoded [`SessionOffer`] for T
///   ([`super::wire::encode_offer`]) without reading any key; the session it
///   opens computes nothing (every round is `NOT_FOUND`). This is the first
///   step of the client's two-step opening: it needs the plans' Galois steps
///   to make the keys.
/// - otherwise: the same offer (deterministic in T and the server's planner
///   costs), the Galois keys parsed and validated, every group's plaintext
///   diagonals pre-encoded ([`AdapterServer::open_session`]).
///
/// The public key is not used (no circuit-privacy rerandomisation yet).
///
/// Sessions share a memory budget ([`HeBackend::with_session_memory`];
/// default: 60 % of physical memory, for this backend alone): a session
/// reserves its diagonals' bytes ([`SessionOffer::diagonal_bytes`]) before
/// encoding them and is refused with [`BackendError::LimitExceeded`] if
/// they do not fit.
#[derive(Debug)]
pub struct HeBackend {
    server: AdapterServer,
    info: AdapterInfo,
    ctx: Arc<Context>,
    memory: SessionMemory,
}

impl HeBackend {
    /// Loads the PEFT adapter in `dir` for a base model of shape `config`
    /// and describes it from `adapter_config.json` and `cipherlora.json`;
    /// measures this machine's CKKS op costs for the planner
    /// ([`AdapterServer::measure_costs`], about a second).
    ///
    /// # Errors
    /// As [`AdapterServer::load`] and [`AdapterServer::measure_costs`];
    /// [`PrivateError::Sidecar`] for an
    /// unreadable or malformed `adapter_config.json`.
    pub fn load(
        adapter_id: impl Into<String>,
        dir: &Path,
        config: &ModelConfig,
    ) -> Result<Self, PrivateError> {
        let mut server = AdapterServer::load(dir, config)?;
        // Plan with this machine's measured op costs, not the defaults.
        server.measure_costs(COST_REPS)?;
        let info = describe(adapter_id.into(), dir, &server)?;
        Self::new(server, info)
    }

    /// Serves `server`, announced as `info` (whose `ckks_presets` and, for
    /// FFA adapters, `ffa_lora_a` are filled in from the server).
    ///
    /// # Errors
    /// [`PrivateError::Ckks`] if the preset's context cannot be built.
    pub fn new(server: AdapterServer, mut info: AdapterInfo) -> Result<Self, PrivateError> {
        let ctx = Context::new(CkksParameters::preset(server.preset())?)?;
        info.ckks_presets = vec![preset_name(server.preset()).to_string()];
        info.ffa_lora_a = (server.groups().kind == LoraKind::Ffa)
            .then(|| Bytes::from(encode_public_a(server.groups())));
        Ok(Self {
            server,
            info,
            ctx,
            memory: SessionMemory::default(),
        })
    }

    /// Makes this backend's sessions reserve from `memory`, which other
    /// backends may share (the bytes of plaintext diagonals all their open
    /// sessions may hold together).
    #[must_use]
    pub fn with_session_memory(mut self, memory: SessionMemory) -> Self {
        self.memory = memory;
        self
    }

    /// The session memory budget this backend reserves from.
    #[must_use]
    pub fn session_memory(&self) -> &SessionMemory {
        &self.memory
    }

    /// The adapter server.
    #[must_use]
    pub fn server(&self) -> &AdapterServer {
        &self.server
    }
}

/// The public description of the adapter in `dir`.
fn describe(
    adapter_id: String,
    dir: &Path,
    server: &AdapterServer,
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
        let idx = AdapterGroups::group_index(g.group);
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
        let preset = self.server.preset();
        if payload.ckks_preset != preset_name(preset) {
            return Err(BackendError::UnknownPreset {
                preset: payload.ckks_preset,
            });
        }
        let request = PlanRequest::from_bytes(&payload.plan_request).map_err(|e| {
            BackendError::InvalidPlan {
                reason: e.to_string(),
            }
        })?;
        let offer = self
            .server
            .offer(request.t)
            .map_err(|e| BackendError::InvalidPlan {
                reason: e.to_string(),
            })?;
        let plan = Bytes::from(encode_offer(&offer));
        if request.offer_only {
            return Ok(OpenedSession {
                plan,
                compute: Box::new(OfferOnly),
            });
        }
        let bytes = offer
            .diagonal_bytes()
            .map_err(|e| BackendError::InvalidPlan {
                reason: e.to_string(),
            })?;
        let reservation =
            self.memory
                .reserve(bytes)
                .map_err(|got| BackendError::LimitExceeded {
                    what: "session plaintext memory (bytes)",
                    got,
                    limit: self.memory.limit(),
                })?;
        let session = self
            .server
            .open_session(&offer, &payload.galois_keys)
            .map_err(|e| match e {
                PrivateError::Ckks(e) => BackendError::InvalidKey {
                    what: e.to_string(),
                },
                other => BackendError::InvalidPlan {
                    reason: other.to_string(),
                },
            })?;
        let compute = HeCompute::new(self.ctx.clone(), session, &offer, reservation)?;
        Ok(OpenedSession {
            plan,
            compute: Box::new(compute),
        })
    }
}

/// The session of an offer-only opening: it answers no round.
struct OfferOnly;

impl SessionCompute for OfferOnly {
    fn group_shape(&self, layer: u32, group: u32) -> Result<GroupShape, BackendError> {
        Err(BackendError::UnknownLayer { layer, group })
    }

    fn compute(
        &self,
        layer: u32,
        group: u32,
        _round: u64,
        _ciphertexts: &[Bytes],
    ) -> Result<Vec<Bytes>, BackendError> {
        Err(BackendError::UnknownLayer { layer, group })
    }
}

/// What a request of one group must look like.
#[derive(Debug, Clone, Copy)]
struct GroupMeta {
    plan_id: u64,
    t: u32,
    inputs: usize,
    level: usize,
}

/// A live HE session: validates each request's ciphertexts (framing,
/// parameters, level, coefficients) before [`ServerSession::handle`] does any
/// arithmetic, so that bad input maps to a precise [`BackendError`].
struct HeCompute {
    ctx: Arc<Context>,
    session: ServerSession,
    groups: HashMap<(u32, u32), GroupMeta>,
    /// The session's share of the memory budget, returned on drop.
    _memory: Reservation,
}

impl HeCompute {
    fn new(
        ctx: Arc<Context>,
        session: ServerSession,
        offer: &SessionOffer,
        memory: Reservation,
    ) -> Result<Self, BackendError> {
        let mut groups = HashMap::with_capacity(offer.groups.len());
        for og in &offer.groups {
            let inputs = og.plan.input_cts().map_err(|e| BackendError::Internal {
                reason: e.to_string(),
            })?;
            let meta = GroupMeta {
                plan_id: og.plan.id(),
                t: og.plan.t as u32,
                inputs,
                level: og.plan.input_level(),
            };
            let key = (og.layer as u32, AdapterGroups::group_index(og.group));
            groups.insert(key, meta);
        }
        Ok(Self {
            ctx,
            session,
            groups,
            _memory: memory,
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
    fn group_shape(&self, layer: u32, group: u32) -> Result<GroupShape, BackendError> {
        Ok(GroupShape {
            input_ciphertexts: self.meta(layer, group)?.inputs,
        })
    }

    fn compute(
        &self,
        layer: u32,
        group: u32,
        _round: u64,
        ciphertexts: &[Bytes],
    ) -> Result<Vec<Bytes>, BackendError> {
        let meta = self.meta(layer, group)?;
        if ciphertexts.len() != meta.inputs {
            return Err(BackendError::CiphertextCount {
                expected: meta.inputs,
                got: ciphertexts.len(),
            });
        }
        for (index, bytes) in ciphertexts.iter().enumerate() {
            let ct = SeededCiphertext::from_bytes(&self.ctx, bytes)
                .map_err(|e| ciphertext_error(index, e))?;
            if ct.level() != meta.level {
                return Err(BackendError::ParameterMismatch {
                    index,
                    what: format!("level {}, the plan needs {}", ct.level(), meta.level),
                });
            }
        }
        let request = GroupRequest {
            plan_id: meta.plan_id,
            layer,
            group,
            t: meta.t,
            ciphertexts: ciphertexts.iter().map(|c| c.to_vec()).collect(),
        };
        let response = self.session.handle(&request).map_err(backend_error)?;
        Ok(response.ciphertexts.into_iter().map(Bytes::from).collect())
    }
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
                what: what.to_string(),
            };
        }
        CkksError::LevelOutOfRange { level, max } => {
            return BackendError::ParameterMismatch {
                index,
                what: format!("level {level} above the parameters' maximum {max}"),
            };
        }
        other => {
            return BackendError::Internal {
                reason: other.to_string(),
            };
        }
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
            what: format!("{field} is {got}, the plan needs {expected}"),
        },
        PrivateError::Ckks(e) => ciphertext_error(0, e),
        other => BackendError::Internal {
            reason: other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ckks_faults_map_to_their_backend_errors() {
        let e = ciphertext_error(
            2,
            CkksError::Truncated {
                expected: 9,
                got: 3,
            },
        );
        assert_eq!(
            e,
            BackendError::InvalidCiphertext {
                index: 2,
                fault: CiphertextFault::Truncated {
                    expected: 9,
                    got: 3
                }
            }
        );
        assert!(matches!(
            ciphertext_error(
                1,
                CkksError::ParameterMismatch {
                    what: "ring degree"
                }
            ),
            BackendError::ParameterMismatch { index: 1, .. }
        ));
        assert!(matches!(
            ciphertext_error(0, CkksError::LevelOutOfRange { level: 7, max: 1 }),
            BackendError::ParameterMismatch { index: 0, .. }
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

    fn backend() -> HeBackend {
        use crate::adapter_groups::LayerGroup;
        use cipherlora_helora::{GroupAdapter, ProjectionAdapter};
        let adapter = GroupAdapter {
            d_in: 8,
            projections: vec![ProjectionAdapter {
                name: "o_proj".into(),
                d_out: 8,
                rank: 2,
                a: (0..16).map(|i| i as f32 / 16.0).collect(),
                b: (0..16).map(|i| 0.5 - i as f32 / 32.0).collect(),
                scaling: 2.0,
            }],
        };
        let groups = AdapterGroups {
            kind: LoraKind::Ffa,
            groups: vec![LayerGroup {
                layer: 1,
                group: cipherlora_model::ProjGroup::O,
                adapter,
            }],
        };
        HeBackend::new(AdapterServer::new(groups), AdapterInfo::default()).unwrap()
    }

    fn payload(preset: &str, request: Vec<u8>, keys: Vec<u8>) -> OpenSessionPayload {
        OpenSessionPayload {
            ckks_preset: preset.into(),
            public_key: Bytes::new(),
            galois_keys: Bytes::from(keys),
            plan_request: Bytes::from(request),
        }
    }

    fn refusal(r: Result<OpenedSession, BackendError>) -> BackendError {
        match r {
            Ok(_) => panic!("opened a session it should refuse"),
            Err(e) => e,
        }
    }

    /// Regression (session memory was bounded only by the session count:
    /// the wan80 bench peaked at 18.5 GB): sessions reserve their
    /// diagonals' bytes, one that does not fit is refused with
    /// `LimitExceeded`, and a closed session gives its share back.
    #[test]
    fn regression_sessions_beyond_the_memory_budget_are_refused_until_one_closes() {
        use cipherlora_helora::CkksClient;
        let probe = backend();
        let preset = probe.info().ckks_presets[0].clone();
        let request = |offer_only| PlanRequest { t: 3, offer_only }.to_bytes();
        let opened = probe
            .open_session(payload(&preset, request(true), vec![]))
            .unwrap();
        let offer = super::super::wire::decode_offer(&opened.plan).unwrap();
        let need = offer.diagonal_bytes().unwrap();
        assert!(need > 0);
        let ctx = Context::new(CkksParameters::preset(offer.preset).unwrap()).unwrap();
        let he = CkksClient::new(&ctx).unwrap();
        let steps: Vec<i64> = offer.groups[0]
            .plan
            .galois_steps()
            .unwrap()
            .into_iter()
            .collect();
        let keys = he.galois_keys(&steps).to_bytes();
        let open = |b: &HeBackend| b.open_session(payload(&preset, request(false), keys.clone()));

        let b = backend().with_session_memory(SessionMemory::new(need + need / 2));
        assert_eq!(b.session_memory().limit(), need + need / 2);
        let first = open(&b).unwrap();
        match refusal(open(&b)) {
            BackendError::LimitExceeded { got, limit, .. } => {
                assert_eq!((got, limit), (2 * need, need + need / 2));
            }
            e => panic!("{e}"),
        }
        // Offer-only sessions hold no diagonals and are never refused.
        b.open_session(payload(&preset, request(true), vec![]))
            .unwrap();
        assert_eq!(b.session_memory().reserved(), need);
        drop(first);
        assert_eq!(b.session_memory().reserved(), 0);
        let _second = open(&b).unwrap();
        // A budget shared by two backends counts both.
        let other = backend().with_session_memory(b.session_memory().clone());
        assert!(matches!(
            refusal(open(&other)),
            BackendError::LimitExceeded { .. }
        ));
        let tiny = backend().with_session_memory(SessionMemory::new(need - 1));
        assert!(matches!(
            refusal(open(&tiny)),
            BackendError::LimitExceeded { .. }
        ));
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
        }
        .to_bytes();
        let real = PlanRequest {
            t: 3,
            offer_only: false,
        }
        .to_bytes();
        let e = refusal(b.open_session(payload("n4096", probe.clone(), vec![])));
        assert!(matches!(e, BackendError::UnknownPreset { .. }), "{e}");
        let e = refusal(b.open_session(payload(preset, b"CLPR".to_vec(), vec![])));
        assert!(matches!(e, BackendError::InvalidPlan { .. }), "{e}");
        let e = refusal(b.open_session(payload(preset, real.clone(), vec![1, 2, 3])));
        assert!(matches!(e, BackendError::InvalidKey { .. }), "{e}");

        // Offer only: the offer, and a session that computes nothing.
        let opened = b.open_session(payload(preset, probe, vec![])).unwrap();
        let offer = super::super::wire::decode_offer(&opened.plan).unwrap();
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
        assert_eq!(c.compute(1, 1, 0, &vec![good.clone(); n]).unwrap().len(), 1);
        let e = c.compute(1, 1, 0, &vec![good.clone(); n + 1]).unwrap_err();
        assert_eq!(
            e,
            BackendError::CiphertextCount {
                expected: n,
                got: n + 1
            }
        );
        let mut bad_magic = good.to_vec();
        bad_magic[0] ^= 0xff;
        let e = c
            .compute(1, 1, 0, &vec![Bytes::from(bad_magic); n])
            .unwrap_err();
        assert_eq!(
            e,
            BackendError::InvalidCiphertext {
                index: 0,
                fault: CiphertextFault::BadMagic
            }
        );
        let short = good.slice(..good.len() - 1);
        let e = c.compute(1, 1, 0, &vec![short; n]).unwrap_err();
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
        let e = c.compute(1, 1, 0, &vec![low; n]).unwrap_err();
        assert!(
            matches!(e, BackendError::ParameterMismatch { index: 0, .. }),
            "{e}"
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

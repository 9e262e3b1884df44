//! The adapter server's side: plans on offer, the adapter's plaintext
//! diagonals encoded once per offer and shared, sessions holding only the
//! client's keys.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex, Weak};

use cipherlora_ckks::{Ciphertext, CkksParameters, Context, GaloisKeys, Preset, PublicKey};
use cipherlora_helora::group_server::PreparedGroup;
use cipherlora_helora::planner::{Link, OpCosts, choose};
use cipherlora_helora::wire::{GroupRequest, GroupResponse};
use cipherlora_helora::{CkksServer, GroupPlan, Mode, Rerandomization};
use cipherlora_model::{ModelConfig, Proj, ProjGroup};

use crate::PrivateError;
use crate::server::{Reservation, SessionMemory};

/// The id an adapter folder is served under: its folder name (the one rule
/// `serve`, `demo` and `bench e2e` share, so a client can name it).
///
/// # Errors
/// [`PrivateError::AdapterId`] when the path has no final component or it
/// is not UTF-8.
pub fn adapter_id(dir: &Path) -> Result<String, PrivateError> {
    dir.file_name()
        .and_then(|n| n.to_str())
        .map(str::to_string)
        .ok_or_else(|| PrivateError::AdapterId {
            path: dir.to_path_buf(),
        })
}
use crate::server::{AdapterGroups, LoraKind};

/// What a client needs to open a session for verify width `t`: the CKKS
/// preset, one plan per adapted (layer, group), and for FFA adapters the
/// public lora_A of each projection.
#[derive(Debug, Clone)]
pub struct SessionOffer {
    /// CKKS parameter preset both sides use.
    pub preset: Preset,
    /// Positions per verify pass.
    pub t: usize,
    /// LoRA variant.
    pub kind: LoraKind,
    /// How the offer groups the adapted projections.
    pub grouping: Grouping,
    /// Per adapted group: layer, group, plan, and (FFA) the public lora_A of
    /// each projection of the group (r × d_in, row-major).
    pub groups: Vec<OfferedGroup>,
    /// The server's compute time for one pass of these plans at its
    /// measured op costs, over the same at [`OpCosts::default`]: what a
    /// client multiplies its default-priced model of the server's time by
    /// (`schedule_plan`, `width_plan`). 1 when unknown; the wire format
    /// accepts [`MIN_COST_RATIO`, `MAX_COST_RATIO`]. It tells the client how
    /// fast the server's machine is, nothing about other sessions.
    pub server_cost_ratio: f64,
    /// The adapter owner's measured per-token acceptance of a base-model
    /// drafter ([`crate::server::AdapterGroups::acceptance`]), when the
    /// adapter's sidecar gives one: a client without its own prior models
    /// its verify width with it (`width_plan::acceptance_prior`). A
    /// property of the adapter, which a client learns anyway from the
    /// outputs it verifies; the width chosen from it depends on nothing
    /// the client sees, so it tells the server nothing about the text.
    pub acceptance: Option<f64>,
}

/// Smallest [`SessionOffer::server_cost_ratio`] a client accepts.
pub const MIN_COST_RATIO: f64 = 1.0 / 64.0;
/// Largest [`SessionOffer::server_cost_ratio`] a client accepts.
pub const MAX_COST_RATIO: f64 = 64.0;

/// Whether `a` can be an acceptance hint ([`SessionOffer::acceptance`]):
/// a probability strictly between 0 and 1 (NaN is not). The one rule for
/// the adapter's `cipherlora.json` and the offer's wire format.
#[must_use]
pub fn is_acceptance_hint(a: f64) -> bool {
    a > 0.0 && a < 1.0
}

/// How a [`SessionOffer`] groups the adapted projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Grouping {
    /// One group per shared input ([`ProjGroup`]: q,k,v; o; gate,up; down):
    /// each group's input is known as soon as the forward pass reaches it,
    /// so any schedule can run (one round trip per group, or the fixed
    /// point).
    #[default]
    ByInput,
    /// One group per run of `n` consecutive adapted layers
    /// ([`AdapterGroups::fuse_layers`], FFA only; `1 ≤ n ≤`
    /// [`Grouping::MAX_LAYERS`]): keyed by its first layer's first adapted
    /// [`ProjGroup`], its input the concatenation of the run's group inputs
    /// in forward order. Only a schedule that knows every input of a pass
    /// at once (the fixed point) can use it; it uploads one ciphertext per
    /// `n` layers, and its outputs share ciphertexts across layers.
    ByLayers(usize),
}

impl Grouping {
    /// The most layers one [`Grouping::ByLayers`] group may span.
    pub const MAX_LAYERS: usize = 4;

    /// One group per layer.
    pub const BY_LAYER: Grouping = Grouping::ByLayers(1);

    /// Layers per group of a [`Grouping::ByLayers`] grouping (`None` by
    /// input).
    #[must_use]
    pub fn layers(self) -> Option<usize> {
        match self {
            Grouping::ByInput => None,
            Grouping::ByLayers(n) => Some(n),
        }
    }
}

impl std::fmt::Display for Grouping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Grouping::ByInput => f.write_str("by input"),
            Grouping::ByLayers(1) => f.write_str("by layer"),
            Grouping::ByLayers(n) => write!(f, "by {n} layers"),
        }
    }
}

/// One adapted group of a [`SessionOffer`].
#[derive(Debug, Clone)]
pub struct OfferedGroup {
    /// Decoder layer.
    pub layer: usize,
    /// Which projections.
    pub group: ProjGroup,
    /// The adapted projections of the group with their decoder layers, in
    /// plan order (all of `layer` unless the offer is
    /// [`Grouping::ByLayers`]).
    pub projections: Vec<(usize, Proj)>,
    /// The evaluation plan.
    pub plan: GroupPlan,
    /// Public lora_A per projection (FFA only).
    pub public_a: Option<Vec<Vec<f32>>>,
}

/// A PEFT adapter served under HE; see the crate docs.
///
/// The plaintext diagonals of an offer ([`PreparedOffer`]) depend only on
/// the adapter, the offer's plans and the CKKS parameters, not on the
/// client: they are encoded when the first session of that offer opens,
/// charged once to the [`SessionMemory`] budget, shared by every session of
/// the offer, and freed (with their reservation) when the last one closes.
#[derive(Debug)]
pub struct HeAdapter {
    groups: Arc<AdapterGroups>,
    /// [`AdapterGroups::fuse_layers`] of `groups` by layers per group, for
    /// [`Grouping::ByLayers`] offers (made at the first offer that asks).
    fused: Mutex<HashMap<usize, Arc<AdapterGroups>>>,
    costs: OpCosts,
    link: Link,
    memory: SessionMemory,
    /// Circuit privacy: every returned ciphertext rerandomised under the
    /// client's public key, with flooding noise.
    circuit_privacy: Option<Rerandomization>,
    /// The prepared offers alive now, by [`OfferKey`]. Each entry has its own
    /// lock so that two widths encode at once while two sessions of one
    /// width encode once.
    prepared: Mutex<HashMap<OfferKey, Arc<Mutex<Weak<PreparedOffer>>>>>,
}

/// What identifies an offer's diagonals: T, the grouping and each group's
/// plan id.
type OfferKey = (usize, Grouping, Vec<(usize, u32, u64)>);

/// An adapter's plaintext diagonals encoded for one offer: every group's
/// [`PreparedGroup`], with the offer's share of the memory budget.
pub struct PreparedOffer {
    groups: HashMap<(u32, u32), PreparedGroup<CkksServer>>,
    _memory: Reservation,
}

impl std::fmt::Debug for PreparedOffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedOffer")
            .field("groups", &self.groups.len())
            .finish_non_exhaustive()
    }
}

impl HeAdapter {
    /// Loads the adapter in `dir` for a base model of shape `config`.
    ///
    /// # Errors
    /// As [`AdapterGroups::load`].
    pub fn load(dir: &Path, config: &ModelConfig) -> Result<Self, PrivateError> {
        Ok(Self::new(AdapterGroups::load(dir, config)?))
    }

    /// Serves already split groups, with default op costs and link.
    #[must_use]
    pub fn new(groups: AdapterGroups) -> Self {
        Self {
            fused: Mutex::new(HashMap::new()),
            groups: Arc::new(groups),
            costs: OpCosts::default(),
            link: Link::default(),
            memory: SessionMemory::default(),
            circuit_privacy: None,
            prepared: Mutex::new(HashMap::new()),
        }
    }

    /// Turns circuit privacy on (`Some`) or off: offers made from now on
    /// plan rerandomised outputs ([`GroupPlan::rerandomize`]), and their
    /// sessions need the client's public key.
    pub fn set_circuit_privacy(&mut self, r: Option<Rerandomization>) {
        self.circuit_privacy = r;
    }

    /// The circuit-privacy setting.
    #[must_use]
    pub fn circuit_privacy(&self) -> Option<Rerandomization> {
        self.circuit_privacy
    }

    /// Makes this server's prepared offers reserve from `memory`, which
    /// other servers may share.
    pub fn set_session_memory(&mut self, memory: SessionMemory) {
        self.memory = memory;
    }

    /// The session memory budget this server's prepared offers reserve from.
    #[must_use]
    pub fn session_memory(&self) -> &SessionMemory {
        &self.memory
    }

    /// Replaces the planner's op costs (e.g. measured on this machine) and link.
    pub fn set_costs(&mut self, costs: OpCosts, link: Link) {
        self.costs = costs;
        self.link = link;
    }

    /// Measures the CKKS op costs of this adapter's preset on this machine
    /// (medians of `reps` repetitions, [`cipherlora_helora::measure::measure_op_costs`],
    /// about a second) and plans with them from now on. Offers stay
    /// deterministic in T for the life of this server.
    ///
    /// # Errors
    /// [`PrivateError::Ckks`] for a bad preset, [`PrivateError::Helora`] if
    /// a measurement fails.
    pub fn measure_costs(&mut self, reps: usize) -> Result<&OpCosts, PrivateError> {
        let ctx = Context::new(CkksParameters::preset(self.preset())?)?;
        self.costs = cipherlora_helora::measure::measure_op_costs(&ctx, reps.max(1))?;
        Ok(&self.costs)
    }

    /// As [`HeAdapter::measure_costs`], but measured once per machine:
    /// read from the op-cost cache ([`crate::server::cost_cache`]) when present, so
    /// that a restarted server offers the same plans.
    ///
    /// # Errors
    /// As [`HeAdapter::measure_costs`].
    pub fn cached_costs(&mut self, reps: usize) -> Result<&OpCosts, PrivateError> {
        let preset = format!("{:?}", self.preset());
        let dir = crate::server::cost_cache::cache_dir();
        let costs = crate::server::cost_cache::cached_costs(&dir, &preset, || {
            Ok(self.measure_costs(reps)?.clone())
        })?;
        self.costs = costs;
        Ok(&self.costs)
    }

    /// The adapter's groups.
    #[must_use]
    pub fn groups(&self) -> &AdapterGroups {
        &self.groups
    }

    /// The CKKS preset for this adapter: N = 8192, chain 50,40,40 + special
    /// 50 (`N8192Depth2Fast`, 128-bit). Its primes are below 2^50, where the
    /// NTT runs on AVX-512 IFMA; `cipherlora bench ckks`/`helora` measured it
    /// faster than the 60-bit chains at every op. Standard LoRA uses both
    /// levels (A·X, then B·U); FFA only the lower one (B·U), so its uploads
    /// are two-prime ciphertexts.
    #[must_use]
    pub fn preset(&self) -> Preset {
        Preset::N8192Depth2Fast
    }

    /// The plans (chosen by the planner from the op costs) for verify width
    /// `t`, one per shared input ([`Grouping::ByInput`]).
    ///
    /// # Errors
    /// [`PrivateError::Helora`] when no plan fits, [`PrivateError::Ckks`] for
    /// a bad preset.
    pub fn offer(&self, t: usize) -> Result<SessionOffer, PrivateError> {
        self.offer_grouped(t, Grouping::ByInput)
    }

    /// The groups an offer of `grouping` is made of: [`Grouping::ByLayers`]
    /// only for FFA adapters (a standard adapter's offer stays by input).
    ///
    /// # Errors
    /// [`PrivateError::LayersPerGroup`] for `ByLayers(n)` with `n` outside
    /// `1..=`[`Grouping::MAX_LAYERS`].
    fn grouped(&self, grouping: Grouping) -> Result<(Arc<AdapterGroups>, Grouping), PrivateError> {
        match (grouping, self.groups.kind) {
            (Grouping::ByLayers(n), _) if n == 0 || n > Grouping::MAX_LAYERS => {
                Err(PrivateError::LayersPerGroup {
                    got: n,
                    max: Grouping::MAX_LAYERS,
                })
            }
            (Grouping::ByLayers(n), LoraKind::Ffa) => {
                let mut fused = self.fused.lock().unwrap_or_else(|p| p.into_inner());
                let groups = fused
                    .entry(n)
                    .or_insert_with(|| Arc::new(self.groups.fuse_layers(n)))
                    .clone();
                Ok((groups, grouping))
            }
            _ => Ok((self.groups.clone(), Grouping::ByInput)),
        }
    }

    /// [`HeAdapter::offer`] with the projections grouped as `grouping` asks
    /// where the adapter allows it (the offer's
    /// [`SessionOffer::grouping`] says what it is).
    ///
    /// # Errors
    /// As [`HeAdapter::offer`].
    pub fn offer_grouped(
        &self,
        t: usize,
        grouping: Grouping,
    ) -> Result<SessionOffer, PrivateError> {
        let (adapter_groups, grouping) = self.grouped(grouping)?;
        let preset = self.preset();
        let slots = CkksParameters::preset(preset)?.slots();
        let mode = match self.groups.kind {
            LoraKind::Ffa => Mode::Ffa,
            LoraKind::Standard => Mode::Standard,
        };
        let mut plans: HashMap<cipherlora_helora::GroupShape, GroupPlan> = HashMap::new();
        let mut groups = Vec::with_capacity(adapter_groups.groups.len());
        for g in &adapter_groups.groups {
            let shape = g.adapter.shape();
            let plan = match plans.get(&shape) {
                Some(p) => p.clone(),
                None => {
                    let rerandomize = self.circuit_privacy.is_some();
                    let (p, _) =
                        choose(&shape, mode, t, slots, rerandomize, &self.costs, &self.link)?;
                    plans.insert(shape, p.clone());
                    p
                }
            };
            let public_a = (self.groups.kind == LoraKind::Ffa)
                .then(|| g.adapter.projections.iter().map(|p| p.a.clone()).collect());
            let projections = g.layer_projections();
            groups.push(OfferedGroup {
                layer: g.layer,
                group: g.group,
                projections,
                plan,
                public_a,
            });
        }
        // Priced per group (groups of one shape share a plan).
        let (mut own, mut default) = (0.0, 0.0);
        for g in &groups {
            let counts = g.plan.counts()?;
            own += self.costs.server_ms(&counts);
            default += OpCosts::default().server_ms(&counts);
        }
        let ratio = own / default;
        let server_cost_ratio = if ratio.is_finite() && ratio > 0.0 {
            ratio.clamp(MIN_COST_RATIO, MAX_COST_RATIO)
        } else {
            1.0
        };
        Ok(SessionOffer {
            preset,
            t,
            kind: self.groups.kind,
            grouping,
            groups,
            server_cost_ratio,
            acceptance: self.groups.acceptance,
        })
    }

    /// Opens a session for `offer` with the client's serialised Galois keys:
    /// parses the keys and checks they are exactly the rotations the
    /// offer's plans use, *then* takes the offer's shared diagonals,
    /// encoding them (and reserving their bytes) only if no open session
    /// holds them already.
    ///
    /// # Errors
    /// [`PrivateError::Ckks`] for malformed keys or parameters,
    /// [`PrivateError::GaloisKeysMismatch`] for keys that are not the
    /// plans' rotations (nothing reserved, nothing encoded),
    /// [`PrivateError::MemoryBudget`] when the diagonals do not fit the
    /// budget, [`PrivateError::Helora`] when a plan does not fit the adapter.
    pub fn open_session(
        &self,
        offer: &SessionOffer,
        galois_keys: &[u8],
    ) -> Result<ServerSession, PrivateError> {
        self.open_session_with_public_key(offer, galois_keys, None)
    }

    /// [`HeAdapter::open_session`] with the client's serialised public
    /// key, which circuit privacy needs (ignored without).
    ///
    /// # Errors
    /// Those of [`HeAdapter::open_session`];
    /// [`PrivateError::PublicKeyRequired`] when the offer rerandomises and
    /// `public_key` is `None`; [`PrivateError::Ckks`] for a malformed one.
    pub fn open_session_with_public_key(
        &self,
        offer: &SessionOffer,
        galois_keys: &[u8],
        public_key: Option<&[u8]>,
    ) -> Result<ServerSession, PrivateError> {
        let ctx = Context::new(CkksParameters::preset(offer.preset)?)?;
        let gks = GaloisKeys::from_bytes(&ctx, galois_keys)?;
        let mut needed = BTreeSet::new();
        for og in &offer.groups {
            for step in og.plan.galois_steps()? {
                let g = ctx.galois_element(step);
                if g != 1 {
                    needed.insert(g);
                }
            }
        }
        let given: BTreeSet<u64> = gks.galois_elements().into_iter().collect();
        if given != needed {
            return Err(PrivateError::GaloisKeysMismatch {
                missing: needed.difference(&given).count(),
                extra: given.difference(&needed).count(),
            });
        }
        let rerandomize = offer.groups.iter().any(|g| g.plan.rerandomize);
        let pk = match (rerandomize, public_key) {
            (false, _) => None,
            (true, None) => return Err(PrivateError::PublicKeyRequired),
            (true, Some(b)) => Some((
                PublicKey::from_bytes(&ctx, b)?,
                self.circuit_privacy.unwrap_or_default(),
            )),
        };
        let he = CkksServer::new(&ctx, gks, pk)?;
        let prepared = self.prepared_offer(offer, &he)?;
        Ok(ServerSession { ctx, he, prepared })
    }

    /// The shared diagonals of `offer`, encoded with `he`'s encoder if no
    /// open session holds them.
    fn prepared_offer(
        &self,
        offer: &SessionOffer,
        he: &CkksServer,
    ) -> Result<Arc<PreparedOffer>, PrivateError> {
        let key: OfferKey = (
            offer.t,
            offer.grouping,
            offer
                .groups
                .iter()
                .map(|g| (g.layer, AdapterGroups::group_index(g.group), g.plan.id()))
                .collect(),
        );
        let slot = {
            let mut map = self.prepared.lock().unwrap_or_else(|p| p.into_inner());
            map.retain(|_, v| {
                Arc::strong_count(v) > 1 || v.lock().is_ok_and(|w| w.strong_count() > 0)
            });
            map.entry(key).or_default().clone()
        };
        let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = slot.upgrade() {
            return Ok(p);
        }
        let bytes = offer.diagonal_bytes()?;
        let memory = self
            .memory
            .reserve(bytes)
            .map_err(|got| PrivateError::MemoryBudget {
                got,
                limit: self.memory.limit(),
            })?;
        let (adapter_groups, _) = self.grouped(offer.grouping)?;
        let mut groups = HashMap::with_capacity(offer.groups.len());
        for og in &offer.groups {
            let g = adapter_groups
                .get(og.layer, og.group)
                .ok_or(PrivateError::UnknownGroup {
                    layer: og.layer as u32,
                    group: AdapterGroups::group_index(og.group),
                })?;
            let pg = PreparedGroup::new(he, &og.plan, &g.adapter)?;
            groups.insert((og.layer as u32, AdapterGroups::group_index(og.group)), pg);
        }
        let p = Arc::new(PreparedOffer {
            groups,
            _memory: memory,
        });
        *slot = Arc::downgrade(&p);
        Ok(p)
    }
}

impl SessionOffer {
    /// Bytes of plaintext diagonals a session for this offer holds: the sum
    /// over its groups of [`cipherlora_helora::GroupPlan::diagonal_bytes`].
    ///
    /// # Errors
    /// [`cipherlora_helora::HeloraError`] for an infeasible plan.
    pub fn diagonal_bytes(&self) -> Result<u64, cipherlora_helora::HeloraError> {
        self.groups
            .iter()
            .map(|g| g.plan.diagonal_bytes())
            .try_fold(0u64, |a, b| Ok(a.saturating_add(b?)))
    }
}

/// One client's session: its Galois keys, and a handle on the offer's
/// shared diagonals.
pub struct ServerSession {
    ctx: Arc<Context>,
    he: CkksServer,
    prepared: Arc<PreparedOffer>,
}

impl std::fmt::Debug for ServerSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerSession")
            .field("slots", &self.ctx.slots())
            .field("groups", &self.prepared.groups.len())
            .finish_non_exhaustive()
    }
}

impl ServerSession {
    /// Evaluates one group request on ciphertexts.
    ///
    /// # Errors
    /// [`PrivateError::UnknownGroup`] for a (layer, group) outside the
    /// adapter; [`PrivateError::Helora`] for a plan mismatch, a wrong number
    /// of ciphertexts or malformed ciphertext bytes (checked before any
    /// arithmetic).
    pub fn handle(&self, request: &GroupRequest) -> Result<GroupResponse, PrivateError> {
        Ok(self
            .group(request.layer, request.group)?
            .handle(&self.he, request)?)
    }

    /// [`Self::handle`] for a request whose ciphertexts the caller has
    /// parsed already (`inputs`, in plan order): `request.ciphertexts` is
    /// not read ([`cipherlora_helora::PreparedGroup::handle_parsed`]).
    ///
    /// # Errors
    /// As [`Self::handle`].
    pub fn handle_parsed(
        &self,
        request: &GroupRequest,
        inputs: &[Ciphertext],
    ) -> Result<GroupResponse, PrivateError> {
        Ok(self
            .group(request.layer, request.group)?
            .handle_parsed(&self.he, request, inputs)?)
    }

    /// The prepared group of (layer, group).
    fn group(&self, layer: u32, group: u32) -> Result<&PreparedGroup<CkksServer>, PrivateError> {
        self.prepared
            .groups
            .get(&(layer, group))
            .ok_or(PrivateError::UnknownGroup { layer, group })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adapter_id_is_the_folder_name_or_a_typed_error() {
        assert_eq!(
            adapter_id(Path::new("adapters/code-ffa-r16")).unwrap(),
            "code-ffa-r16"
        );
        assert_eq!(adapter_id(Path::new("x/y/")).unwrap(), "y");
        for bad in ["/", "..", ""] {
            assert!(
                matches!(
                    adapter_id(Path::new(bad)),
                    Err(PrivateError::AdapterId { .. })
                ),
                "{bad:?}"
            );
        }
        #[cfg(unix)]
        {
            use std::os::unix::ffi::OsStrExt;
            let not_utf8 = Path::new(std::ffi::OsStr::from_bytes(b"a/\xff\xfe"));
            assert!(matches!(
                adapter_id(not_utf8),
                Err(PrivateError::AdapterId { .. })
            ));
        }
    }
}

//! The adapter server: plans on offer, diagonals encoded once per offer, sessions of client keys.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use cipherlora_ckks::{Ciphertext, CkksParameters, Context, GaloisKeys, Preset, PublicKey};
use cipherlora_helora::group_server::PreparedGroup;
use cipherlora_helora::planner::{Link, OpCosts, choose};
use cipherlora_helora::{CkksServer, GroupPlan, Rerandomization};
use cipherlora_model::ModelConfig;
use cipherlora_proto::v1::{GroupRequest, GroupResponse};
use rayon::prelude::*;

use crate::PrivateError;
use crate::server::{Reservation, SessionMemory};

/// The id an adapter folder is served under: its folder name. Errors: [`PrivateError::AdapterId`].
pub fn adapter_id(dir: &Path) -> Result<String, PrivateError> {
    dir.file_name()
        .and_then(|n| n.to_str())
        .map(str::to_string)
        .ok_or_else(|| PrivateError::AdapterId {
            path: dir.to_path_buf(),
        })
}
use crate::protocol::{
    Grouping, LoraKind, MAX_COST_RATIO, MIN_COST_RATIO, OfferedGroup, SessionOffer, group_index,
};
use crate::server::AdapterGroups;

/// A PEFT adapter served under HE; an offer's diagonals ([`PreparedOffer`]) are encoded once,
/// charged to [`SessionMemory`], shared by its sessions, and kept warm after the last one until
/// the budget needs them.
#[derive(Debug)]
pub struct HeAdapter {
    groups: Arc<AdapterGroups>,
    /// Layer-fused groups for [`Grouping::ByLayers`] offers, made on first use.
    fused: Mutex<HashMap<usize, Arc<AdapterGroups>>>,
    costs: OpCosts,
    link: Link,
    memory: SessionMemory,
    /// Circuit privacy: returned ciphertexts rerandomised with flooding noise.
    circuit_privacy: Option<Rerandomization>,
    /// Live prepared offers by [`OfferKey`], each behind its own lock (one encoding per width).
    prepared: Mutex<HashMap<OfferKey, Arc<Mutex<Weak<PreparedOffer>>>>>,
}

/// What identifies an offer's diagonals: T, the grouping and each group's plan id.
type OfferKey = (usize, Grouping, Vec<(usize, u32, u64)>);

/// An adapter's diagonals encoded for one offer, with its share of the memory budget.
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
    /// Loads the adapter in `dir` for a model of shape `config`; errors as [`AdapterGroups::load`].
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

    /// Turns circuit privacy on or off for later offers (which then need the public key).
    pub fn set_circuit_privacy(&mut self, r: Option<Rerandomization>) {
        self.circuit_privacy = r;
    }

    /// The circuit-privacy setting.
    #[must_use]
    pub fn circuit_privacy(&self) -> Option<Rerandomization> {
        self.circuit_privacy
    }

    /// Makes this server's prepared offers reserve from `memory`, which other servers may share.
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

    /// Measures this preset's op costs here (medians of `reps`) and plans with them. Errors:
    /// [`PrivateError::Ckks`], [`PrivateError::Helora`].
    pub fn measure_costs(&mut self, reps: usize) -> Result<&OpCosts, PrivateError> {
        let ctx = Context::new(CkksParameters::preset(self.preset())?)?;
        self.costs = cipherlora_helora::measure::measure_op_costs(&ctx, reps.max(1))?;
        Ok(&self.costs)
    }

    /// As [`HeAdapter::measure_costs`], through the op-cost cache ([`crate::server::cost_cache`]).
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

    /// The CKKS preset: `N8192Depth2Fast` (N = 8192, chain 50,40,40 + special 50, 128-bit).
    #[must_use]
    pub fn preset(&self) -> Preset {
        Preset::N8192Depth2Fast
    }

    /// The plans for verify width `t`, one per shared input. Errors: [`PrivateError::Helora`],
    /// `Ckks`.
    pub fn offer(&self, t: usize) -> Result<SessionOffer, PrivateError> {
        self.offer_grouped(t, Grouping::ByInput)
    }

    /// The groups of a `grouping` offer. Errors: [`PrivateError::LayersPerGroup`] for a bad `n`.
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

    /// [`HeAdapter::offer`] grouped as `grouping` where the adapter allows. Errors as `offer`.
    pub fn offer_grouped(
        &self,
        t: usize,
        grouping: Grouping,
    ) -> Result<SessionOffer, PrivateError> {
        let (adapter_groups, grouping) = self.grouped(grouping)?;
        let preset = self.preset();
        let slots = CkksParameters::preset(preset)?.slots();
        let mode = self.groups.kind.mode();
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

    /// Opens a session for `offer` with the client's Galois keys (exactly the plans' rotations),
    /// sharing or encoding the offer's diagonals. Errors: [`PrivateError::Ckks`],
    /// `GaloisKeysMismatch` (nothing reserved), `MemoryBudget`, `Helora`.
    pub fn open_session(
        &self,
        offer: &SessionOffer,
        galois_keys: &[u8],
    ) -> Result<ServerSession, PrivateError> {
        self.open_session_with_public_key(offer, galois_keys, None)
    }

    /// [`HeAdapter::open_session`] with the client's public key (circuit privacy). Errors: as
    /// `open_session`; [`PrivateError::PublicKeyRequired`]; `Ckks` for a malformed key.
    pub fn open_session_with_public_key(
        &self,
        offer: &SessionOffer,
        galois_keys: &[u8],
        public_key: Option<&[u8]>,
    ) -> Result<ServerSession, PrivateError> {
        let ctx = Context::new(CkksParameters::preset(offer.preset)?)?;
        let gks = GaloisKeys::from_bytes(&ctx, galois_keys)?;
        check_galois_keys(&ctx, offer.groups.iter().map(|g| &g.plan), &gks)?;
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
        let prepared = self.prepared_offer(offer, &he, Room::EvictIdle)?;
        Ok(ServerSession { ctx, he, prepared })
    }

    /// Encodes the diagonals of the `(t, grouping)` offer now, before any client asks for it, and
    /// keeps them warm ([`SessionMemory`]), so the first session of that offer opens without
    /// encoding them. With [`Room::EvictIdle`] idle warm offers make room, oldest first; with
    /// [`Room::Free`] only free memory is used. Returns their bytes. Errors: as
    /// [`HeAdapter::offer_grouped`]; [`PrivateError::MemoryBudget`] when they do not fit.
    pub fn prewarm(&self, t: usize, grouping: Grouping, room: Room) -> Result<u64, PrivateError> {
        let offer = self.offer_grouped(t, grouping)?;
        let ctx = Context::new(CkksParameters::preset(offer.preset)?)?;
        let encoder_only = CkksServer::new(&ctx, GaloisKeys::none(&ctx), None)?;
        self.prepared_offer(&offer, &encoder_only, room)?;
        Ok(offer.diagonal_bytes()?)
    }

    /// The shared diagonals of `offer`, encoded with `he`'s encoder if no open session holds them,
    /// in memory found as `room` says.
    fn prepared_offer(
        &self,
        offer: &SessionOffer,
        he: &CkksServer,
        room: Room,
    ) -> Result<Arc<PreparedOffer>, PrivateError> {
        let key: OfferKey = (
            offer.t,
            offer.grouping,
            offer
                .groups
                .iter()
                .map(|g| (g.layer, group_index(g.group), g.plan.id()))
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
            self.memory.keep_warm(p.clone());
            return Ok(p);
        }
        let bytes = offer.diagonal_bytes()?;
        let reserved = match room {
            Room::EvictIdle => self.memory.reserve(bytes),
            Room::Free => self.memory.try_reserve(bytes),
        };
        let memory = reserved.map_err(|got| PrivateError::MemoryBudget {
            got,
            need: bytes,
            limit: self.memory.limit(),
        })?;
        let (adapter_groups, _) = self.grouped(offer.grouping)?;
        // The groups' diagonals are independent: encode them on every core
        // the server may use (most of a session's opening time).
        let groups = offer
            .groups
            .par_iter()
            .map(|og| {
                let g =
                    adapter_groups
                        .get(og.layer, og.group)
                        .ok_or(PrivateError::UnknownGroup {
                            layer: og.layer as u32,
                            group: group_index(og.group),
                        })?;
                let key = (og.layer as u32, group_index(og.group));
                Ok((key, PreparedGroup::new(he, &og.plan, &g.adapter)?))
            })
            .collect::<Result<HashMap<_, _>, PrivateError>>()?;
        let p = Arc::new(PreparedOffer {
            groups,
            _memory: memory,
        });
        *slot = Arc::downgrade(&p);
        self.memory.keep_warm(p.clone());
        Ok(p)
    }
}

/// Where an offer's diagonals may find memory in the budget ([`HeAdapter::prewarm`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Room {
    /// Free memory, then idle warm offers let go, oldest first (as a session opens).
    EvictIdle,
    /// Free memory only: nothing already encoded is let go.
    Free,
}

impl SessionOffer {
    /// Plaintext diagonal bytes a session of this offer holds. Errors: infeasible plan.
    pub fn diagonal_bytes(&self) -> Result<u64, cipherlora_helora::HeloraError> {
        self.groups
            .iter()
            .map(|g| g.plan.diagonal_bytes())
            .try_fold(0u64, |a, b| Ok(a.saturating_add(b?)))
    }
}

/// One client's session: its Galois keys, and a handle on the offer's shared diagonals.
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
    /// Evaluates one group request (in process: no session envelope to check). Errors:
    /// [`PrivateError::UnknownGroup`]; [`PrivateError::Helora`] for a wrong ciphertext count or bad
    /// ciphertexts (checked before any arithmetic).
    pub fn handle(&self, request: &GroupRequest) -> Result<GroupResponse, PrivateError> {
        let (layer, group) = (request.layer, request.group);
        let ciphertexts = self.group(layer, group)?.handle(
            &self.he,
            &request.ciphertexts,
            request.response_bits,
        )?;
        Ok(GroupResponse {
            masked_values: Default::default(),
            round: request.round,
            layer,
            group,
            ciphertexts,
            server_micros: 0,
        })
    }

    /// The delta ciphertexts of `request`'s group with its ciphertexts parsed already (`inputs`,
    /// plan order). Errors: as [`Self::handle`].
    pub fn handle_parsed(
        &self,
        request: &GroupRequest,
        inputs: &[Ciphertext],
    ) -> Result<Vec<Bytes>, PrivateError> {
        Ok(self.group(request.layer, request.group)?.handle_parsed(
            &self.he,
            inputs,
            request.response_bits,
        )?)
    }

    /// The prepared group of (layer, group).
    fn group(&self, layer: u32, group: u32) -> Result<&PreparedGroup<CkksServer>, PrivateError> {
        self.prepared
            .groups
            .get(&(layer, group))
            .ok_or(PrivateError::UnknownGroup { layer, group })
    }
}

/// Checks that `gks` are exactly the rotations `plans` need. Errors:
/// [`PrivateError::GaloisKeysMismatch`]; [`PrivateError::Helora`] for a plan without steps.
pub(crate) fn check_galois_keys<'a>(
    ctx: &Context,
    plans: impl IntoIterator<Item = &'a GroupPlan>,
    gks: &GaloisKeys,
) -> Result<(), PrivateError> {
    let mut needed = BTreeSet::new();
    for plan in plans {
        for step in plan.galois_steps()? {
            let g = ctx.galois_element(step);
            if g != 1 {
                needed.insert(g);
            }
        }
    }
    let given: BTreeSet<u64> = gks.galois_elements().into_iter().collect();
    if given == needed {
        Ok(())
    } else {
        Err(PrivateError::GaloisKeysMismatch {
            missing: needed.difference(&given).count(),
            extra: given.difference(&needed).count(),
        })
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

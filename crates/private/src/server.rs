//! The adapter server's side: plans on offer, sessions with pre-encoded
//! weights.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use cipherlora_ckks::{CkksParameters, Context, GaloisKeys, Preset};
use cipherlora_helora::planner::{Link, OpCosts, choose};
use cipherlora_helora::server::PreparedGroup;
use cipherlora_helora::wire::{GroupRequest, GroupResponse};
use cipherlora_helora::{CkksServer, GroupPlan, Mode};
use cipherlora_model::{ModelConfig, Proj, ProjGroup};

use crate::PrivateError;

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
use crate::adapter_groups::{AdapterGroups, LoraKind};

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
    /// Per adapted group: layer, group, plan, and (FFA) the public lora_A of
    /// each projection of the group (r × d_in, row-major).
    pub groups: Vec<OfferedGroup>,
}

/// One adapted group of a [`SessionOffer`].
#[derive(Debug, Clone)]
pub struct OfferedGroup {
    /// Decoder layer.
    pub layer: usize,
    /// Which projections.
    pub group: ProjGroup,
    /// The adapted projections of the group, in plan order.
    pub projections: Vec<Proj>,
    /// The evaluation plan.
    pub plan: GroupPlan,
    /// Public lora_A per projection (FFA only).
    pub public_a: Option<Vec<Vec<f32>>>,
}

/// A PEFT adapter served under HE; see the crate docs.
#[derive(Debug)]
pub struct AdapterServer {
    groups: AdapterGroups,
    costs: OpCosts,
    link: Link,
}

impl AdapterServer {
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
            groups,
            costs: OpCosts::default(),
            link: Link::default(),
        }
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

    /// The plans (chosen by the planner from the op costs) for verify width `t`.
    ///
    /// # Errors
    /// [`PrivateError::Helora`] when no plan fits, [`PrivateError::Ckks`] for
    /// a bad preset.
    pub fn offer(&self, t: usize) -> Result<SessionOffer, PrivateError> {
        let preset = self.preset();
        let slots = CkksParameters::preset(preset)?.slots();
        let mode = match self.groups.kind {
            LoraKind::Ffa => Mode::Ffa,
            LoraKind::Standard => Mode::Standard,
        };
        let mut plans: HashMap<cipherlora_helora::GroupShape, GroupPlan> = HashMap::new();
        let mut groups = Vec::with_capacity(self.groups.groups.len());
        for g in &self.groups.groups {
            let shape = g.adapter.shape();
            let plan = match plans.get(&shape) {
                Some(p) => p.clone(),
                None => {
                    let (p, _) = choose(&shape, mode, t, slots, false, &self.costs, &self.link)?;
                    plans.insert(shape, p.clone());
                    p
                }
            };
            let public_a = (self.groups.kind == LoraKind::Ffa)
                .then(|| g.adapter.projections.iter().map(|p| p.a.clone()).collect());
            let projections = g
                .adapter
                .projections
                .iter()
                .filter_map(|p| Proj::from_peft_name(&p.name))
                .collect();
            groups.push(OfferedGroup {
                layer: g.layer,
                group: g.group,
                projections,
                plan,
                public_a,
            });
        }
        Ok(SessionOffer {
            preset,
            t,
            kind: self.groups.kind,
            groups,
        })
    }

    /// Opens a session for `offer` with the client's serialised Galois keys:
    /// parses and validates the keys, then pre-encodes every group's
    /// plaintext diagonals for the offered plans.
    ///
    /// # Errors
    /// [`PrivateError::Ckks`] for malformed keys or parameters,
    /// [`PrivateError::Helora`] when a plan does not fit the adapter.
    pub fn open_session(
        &self,
        offer: &SessionOffer,
        galois_keys: &[u8],
    ) -> Result<ServerSession, PrivateError> {
        let ctx = Context::new(CkksParameters::preset(offer.preset)?)?;
        let gks = GaloisKeys::from_bytes(&ctx, galois_keys)?;
        let he = CkksServer::new(&ctx, gks, None)?;
        let mut prepared = HashMap::with_capacity(offer.groups.len());
        for og in &offer.groups {
            let g = self
                .groups
                .get(og.layer, og.group)
                .ok_or(PrivateError::UnknownGroup {
                    layer: og.layer as u32,
                    group: AdapterGroups::group_index(og.group),
                })?;
            let pg = PreparedGroup::new(&he, &og.plan, &g.adapter)?;
            prepared.insert((og.layer as u32, AdapterGroups::group_index(og.group)), pg);
        }
        Ok(ServerSession { ctx, he, prepared })
    }
}

/// One client's session: its Galois keys and the pre-encoded weights.
pub struct ServerSession {
    ctx: Arc<Context>,
    he: CkksServer,
    prepared: HashMap<(u32, u32), PreparedGroup<CkksServer>>,
}

impl std::fmt::Debug for ServerSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerSession")
            .field("slots", &self.ctx.slots())
            .field("groups", &self.prepared.len())
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
        let pg = self.prepared.get(&(request.layer, request.group)).ok_or(
            PrivateError::UnknownGroup {
                layer: request.layer,
                group: request.group,
            },
        )?;
        Ok(pg.handle(&self.he, request)?)
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

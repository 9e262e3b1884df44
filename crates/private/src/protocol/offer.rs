//! What a session is: the server's offer for a verify width (preset, LoRA kind, grouping, one
//! plan per adapted group) and the names both halves give the adapter's groups.

use cipherlora_ckks::Preset;
use cipherlora_helora::{GroupPlan, Mode};
use cipherlora_model::{Proj, ProjGroup};

/// Which LoRA variant the adapter is, from its `cipherlora.json` sidecar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoraKind {
    /// lora_A and lora_B secret: the server computes both products (depth 2).
    Standard,
    /// FFA-LoRA (Sun et al., ICLR 2024): lora_A frozen and public; the client computes A·x.
    Ffa,
}

impl LoraKind {
    /// The packing mode of the kind's plans.
    #[must_use]
    pub fn mode(self) -> Mode {
        match self {
            LoraKind::Standard => Mode::Standard,
            LoraKind::Ffa => Mode::Ffa,
        }
    }
}

/// What a client needs for a session of width `t`: preset, plans per (layer, group), FFA lora_A.
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
    /// Per adapted group: layer, group, plan, and (FFA) each projection's lora_A (r × d_in).
    pub groups: Vec<OfferedGroup>,
    /// Server time per pass at its measured costs over [`OpCosts::default`](cipherlora_helora::planner::OpCosts::default)'s (1: unknown).
    pub server_cost_ratio: f64,
    /// The owner's per-token acceptance of a base drafter (sidecar), a verify-width prior.
    pub acceptance: Option<f64>,
}

/// Smallest [`SessionOffer::server_cost_ratio`] a client accepts.
pub const MIN_COST_RATIO: f64 = 1.0 / 64.0;
/// Largest [`SessionOffer::server_cost_ratio`] a client accepts.
pub const MAX_COST_RATIO: f64 = 64.0;

/// Whether `a` can be an acceptance hint: a probability strictly in (0, 1).
#[must_use]
pub fn is_acceptance_hint(a: f64) -> bool {
    a > 0.0 && a < 1.0
}

/// How a [`SessionOffer`] groups the adapted projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Grouping {
    /// One group per shared input ([`ProjGroup`]); works with any schedule.
    #[default]
    ByInput,
    /// One group per run of `n` adapted layers (FFA, fixed point only; ≤ [`Grouping::MAX_LAYERS`]).
    ByLayers(usize),
}

impl Grouping {
    /// The most layers one [`Grouping::ByLayers`] group may span.
    pub const MAX_LAYERS: usize = 4;

    /// One group per layer.
    pub const BY_LAYER: Grouping = Grouping::ByLayers(1);

    /// Layers per group of a [`Grouping::ByLayers`] grouping (`None` by input).
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
    /// The group's adapted projections with their decoder layers, in plan order.
    pub projections: Vec<(usize, Proj)>,
    /// The evaluation plan.
    pub plan: GroupPlan,
    /// Public lora_A per projection (FFA only).
    pub public_a: Option<Vec<Vec<f32>>>,
}

/// Wire index of a group kind.
#[must_use]
pub fn group_index(group: ProjGroup) -> u32 {
    match group {
        ProjGroup::Qkv => 0,
        ProjGroup::O => 1,
        ProjGroup::GateUp => 2,
        ProjGroup::Down => 3,
    }
}

/// Index ranges of runs of `n` adapted layers over groups in forward order (both halves group
/// layers this way).
pub(crate) fn layer_runs(layers: &[usize], n: usize) -> Vec<std::ops::Range<usize>> {
    let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
    let mut distinct = 0;
    for (i, &layer) in layers.iter().enumerate() {
        let new_layer = i == 0 || layers[i - 1] != layer;
        match runs.last_mut() {
            Some(run) if !new_layer || distinct < n => {
                run.end = i + 1;
                distinct += usize::from(new_layer);
            }
            _ => {
                runs.push(i..i + 1);
                distinct = 1;
            }
        }
    }
    runs
}

//! The drafter's state ([`Drafter`]): the base model's own KV cache, the
//! chain drafters that guess from the context ([`crate::ContextDrafter`]),
//! adaptive K, tree calibration and delta guidance. The base model's chains
//! and drafting ahead live in `base`, its trees in `tree`.

mod base;
mod tree;

use cipherlora_model::{GroupInput, KvCache, Model, PassDeltas, ProjGroup, Sampler};
use rand_chacha::ChaCha20Rng;

use super::{DraftModel, Drafting, SpecConfig};
use crate::SpecError;
use crate::acceptance::RoundOutcome;
use crate::adaptive::{AdaptiveK, RoundCost};
use crate::draft_bias::DraftBias;
use crate::drafted_inputs::DraftedInputs;
use crate::tree_draft::{Calibration, GrownTree};

/// What drafting ahead guessed: the round's outcome and the next draft.
pub(super) struct Guess {
    pub(super) accepted: usize,
    pub(super) bonus: u32,
    /// The accepted tree nodes of a tree round (empty for a chain).
    pub(super) path: Vec<usize>,
    /// The next round's draft.
    pub(super) next: Draft,
}

/// One round's draft.
pub(super) struct Draft {
    pub(super) tokens: Vec<u32>,
    /// The drafter's distributions when it sampled (None: point masses).
    pub(super) probs: Option<Vec<Vec<f32>>>,
    /// Whether the base model produced it (its cache then ran ahead).
    pub(super) from_base: bool,
    /// A tree draft (`tokens` then lists its nodes).
    pub(super) tree: Option<GrownTree>,
    /// The drafter's LoRA inputs for the window (chains only).
    pub(super) inputs: Option<Vec<GroupInput>>,
}

impl Draft {
    /// A chain guessed from the context ([`crate::ContextDrafter`]).
    fn from_context(tokens: Vec<u32>) -> Self {
        Self {
            tokens,
            probs: None,
            from_base: false,
            tree: None,
            inputs: None,
        }
    }

    /// A greedy chain from the base drafter.
    fn chain(tokens: Vec<u32>) -> Self {
        Self {
            tokens,
            probs: None,
            from_base: true,
            tree: None,
            inputs: None,
        }
    }
}

/// Drafter state: the base model's own KV cache and the adaptive-K controller.
pub(super) struct Drafter<'m> {
    model: &'m Model,
    /// A separate network ([`DraftModel::Separate`]): its cache holds its own
    /// rows of the context, never the target's.
    separate: bool,
    /// The model for a tree level's batched pass (the target's f32 weights).
    batch_model: &'m Model,
    drafting: Drafting,
    cache: Option<KvCache>,
    /// Positions `..synced` of `cache` equal the target cache's.
    synced: usize,
    adaptive: Option<AdaptiveK>,
    /// [`SpecConfig::draft_stop_below`].
    stop_below: f32,
    /// Tree drafts: the acceptance estimate learnt from earlier rounds.
    pub(super) calibration: Calibration,
    /// [`SpecConfig::delta_guided`].
    guided: bool,
    /// What the drafter adds to the base model (empty unless guided).
    bias: DraftBias,
    /// Records the LoRA inputs of a chain draft's positions (drafted start).
    recorder: Option<DraftedInputs>,
}

impl<'m> Drafter<'m> {
    /// `adapted`: the verifier's groups in forward order.
    pub(super) fn new(
        (drafting, batch_model): (DraftModel<'m>, &'m Model),
        cfg: &SpecConfig,
        capacity: usize,
        adapted: Vec<(usize, ProjGroup)>,
    ) -> Result<Self, SpecError> {
        let (model, separate) = (drafting.model(), drafting.is_separate());
        let cache = if cfg.drafting.runs_base() {
            Some(model.new_cache(capacity)?)
        } else {
            None
        };
        // Prior: 72 % per-token agreement; a drafted token costs ~1/20 of a round.
        let adaptive = cfg.drafting.is_adaptive().then(|| {
            let per_position = if cfg.pad_to_k { 0.0 } else { 0.05 };
            AdaptiveK::new(
                1,
                cfg.drafting.k(),
                0.72,
                8.0,
                0.9,
                RoundCost {
                    round: 1.0,
                    draft: 0.05,
                    per_position,
                },
            )
        });
        Ok(Self {
            model,
            separate,
            batch_model,
            drafting: cfg.drafting.clone(),
            cache,
            synced: 0,
            adaptive,
            stop_below: cfg.draft_stop_below,
            calibration: cfg
                .drafting
                .tree_drafts()
                .map(|t| t.calibration.clone())
                .unwrap_or_default(),
            guided: cfg.delta_guided && !separate,
            bias: DraftBias::none(),
            recorder: (cfg.drafted_start() && !separate).then(|| DraftedInputs::new(adapted)),
        })
    }

    /// Delta-guided drafting: adds row `row` of `deltas` to every drafted position.
    pub(super) fn guide(&mut self, deltas: &PassDeltas, row: usize) -> Result<(), SpecError> {
        if self.guided && !deltas.is_empty() {
            self.bias = DraftBias::from_row(deltas, row)?;
        }
        Ok(())
    }

    pub(super) fn next_k(&self) -> usize {
        match &self.adaptive {
            Some(a) => a.next_k(),
            None => self.drafting.k(),
        }
    }

    pub(super) fn draft(
        &mut self,
        context: &[u32],
        target: &KvCache,
        k: usize,
        sampler: &Sampler,
        rng: &mut ChaCha20Rng,
    ) -> Result<Draft, SpecError> {
        let Some(drafter) = self.drafting.chain_drafter() else {
            return Ok(Draft::from_context(Vec::new()));
        };
        if let Some(guess) = drafter.context_drafter() {
            let tokens = guess.draft(context, k);
            // The hybrid drafter asks the base model when the lookup falls short.
            if !drafter.runs_base() || tokens.len() == k {
                return Ok(Draft::from_context(tokens));
            }
        }
        self.draft_base(context, target, k, sampler, rng)
    }

    /// Rolls the base cache back to at most `len` positions.
    pub(super) fn truncate(&mut self, len: usize) {
        if let Some(cache) = self.cache.as_mut() {
            cache.truncate(len.min(cache.len()));
        }
    }

    /// Rolls the cache back to what the round proved and feeds adaptive K
    /// (`went_ahead`: draft_ahead ran; `hit`: its guess was right).
    pub(super) fn observe(
        &mut self,
        draft: &Draft,
        outcome: &RoundOutcome,
        context_len: usize,
        went_ahead: bool,
        hit: bool,
    ) {
        if let Some(cache) = self.cache.as_mut()
            && !hit
        {
            // Only the accepted drafts among the cached ones stay valid.
            let cached = draft.tokens.len() - usize::from(!went_ahead);
            let valid = if draft.from_base {
                context_len + outcome.accepted.min(cached)
            } else {
                cache.len().min(context_len)
            };
            cache.truncate(valid.min(cache.len()));
        }
        if let Some(a) = self.adaptive.as_mut()
            && !draft.tokens.is_empty()
        {
            a.observe(draft.tokens.len(), outcome.accepted.min(draft.tokens.len()));
        }
    }
}

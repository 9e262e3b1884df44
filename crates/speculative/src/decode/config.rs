//! What a speculative generation is asked to do ([`SpecConfig`]) and what
//! it reports ([`SpecStats`], [`SpecOutput`]).

use cipherlora_model::SamplingParams;

use super::PrefillSpan;
use crate::context_drafter::ContextDrafter;
use crate::draw_bounds::log_weight_bound;
use crate::ngram::PromptLookup;
use crate::replay::ReplayDrafts;
use crate::schedule::Schedule;
use crate::tree_draft::{Calibration, TreeDrafts};
use crate::{ConfigError, SpecError};

/// A drafter that proposes a chain of tokens, one after the other.
#[derive(Debug, Clone, PartialEq)]
pub enum ChainDrafter {
    /// The plaintext base model without the adapter (greedy or sampled drafts).
    Base,
    /// Prompt lookup: free, deterministic drafts copied from the context.
    Ngram,
    /// Prompt lookup when it proposes a full draft, the base model otherwise.
    Hybrid,
    /// The reference continuation at a set acceptance (synthetic models in benchmarks).
    Replay(ReplayDrafts),
}

impl ChainDrafter {
    /// Whether the drafter runs the base model (it then keeps its own KV cache).
    #[must_use]
    pub fn runs_base(&self) -> bool {
        matches!(self, Self::Base | Self::Hybrid)
    }

    /// The drafter that guesses from the context alone: prompt lookup (alone, or the first try
    /// of the hybrid drafter), the replayed drafts; `None` for the base model.
    #[must_use]
    pub fn context_drafter(&self) -> Option<&dyn ContextDrafter> {
        match self {
            Self::Base => None,
            Self::Ngram | Self::Hybrid => Some(&PromptLookup::DEFAULT),
            Self::Replay(replay) => Some(replay),
        }
    }
}

/// How each round drafts: no drafts, a chain, or a tree. Combinations the
/// decoder cannot run (a tree from prompt lookup, a tree with adaptive K,
/// replay without its drafts) cannot be written.
#[derive(Debug, Clone)]
pub enum Drafting {
    /// No speculation: one position per round (the private baseline).
    None,
    /// A chain of up to `k` drafted tokens per round.
    Chain {
        /// The drafter.
        drafter: ChainDrafter,
        /// K: drafted tokens per round (the maximum when `adaptive`), ≥ 1.
        k: usize,
        /// Choose k ≤ K per round from the observed acceptance rate.
        adaptive: bool,
    },
    /// A tree of at most `nodes` drafted tokens per round from the base model
    /// ([`crate::tree_draft`]; fixed size, no `draft_stop_below`).
    Tree {
        /// Shape limits and the starting acceptance estimate.
        drafts: Box<TreeDrafts>,
        /// K: nodes per round, ≥ 1.
        nodes: usize,
    },
}

impl Drafting {
    /// A fixed chain of `k` drafts from `drafter`.
    #[must_use]
    pub fn chain(drafter: ChainDrafter, k: usize) -> Self {
        Self::Chain {
            drafter,
            k,
            adaptive: false,
        }
    }

    /// Trees of at most `nodes` drafts, grown with `drafts`' limits and estimate.
    #[must_use]
    pub fn tree(drafts: impl Into<TreeDrafts>, nodes: usize) -> Self {
        Self::Tree {
            drafts: Box::new(drafts.into()),
            nodes,
        }
    }

    /// K: the most tokens a round drafts (0 without drafts).
    #[must_use]
    pub fn k(&self) -> usize {
        match self {
            Self::None => 0,
            Self::Chain { k, .. } => *k,
            Self::Tree { nodes, .. } => *nodes,
        }
    }

    /// The tree settings of tree drafting.
    #[must_use]
    pub fn tree_drafts(&self) -> Option<&TreeDrafts> {
        match self {
            Self::Tree { drafts, .. } => Some(drafts),
            _ => None,
        }
    }

    /// The chain drafter of chain drafting.
    #[must_use]
    pub fn chain_drafter(&self) -> Option<&ChainDrafter> {
        match self {
            Self::Chain { drafter, .. } => Some(drafter),
            _ => None,
        }
    }

    /// Whether K is chosen per round.
    #[must_use]
    pub fn is_adaptive(&self) -> bool {
        matches!(self, Self::Chain { adaptive: true, .. })
    }

    /// Whether the base model drafts (a base or hybrid chain, or a tree).
    #[must_use]
    pub fn runs_base(&self) -> bool {
        match self {
            Self::None => false,
            Self::Chain { drafter, .. } => drafter.runs_base(),
            Self::Tree { .. } => true,
        }
    }

    /// Whether drafting ahead applies: a fixed base chain or a tree.
    pub(super) fn can_draft_ahead(&self) -> bool {
        matches!(
            self,
            Self::Chain {
                drafter: ChainDrafter::Base,
                adaptive: false,
                ..
            } | Self::Tree { .. }
        )
    }
}

/// Configuration of a speculative generation.
#[derive(Debug, Clone)]
pub struct SpecConfig {
    /// How each round drafts.
    pub drafting: Drafting,
    /// Constant-K padding: every verify pass carries exactly K+1 positions.
    pub pad_to_k: bool,
    /// Positions per prefill pass (`None`: the verify width; `cipherlora_private::ByWidth`).
    pub prefill_width: Option<usize>,
    /// Optimistic drafting (greedy, a fixed base chain or a tree): draft the
    /// next round during the verify pass, guessing every draft accepted.
    /// Output unchanged.
    pub optimistic: bool,
    /// Stop a greedy base draft below this drafter probability (0: off; EAGLE-2,
    /// Li et al. 2024; SpecDec++, Huang et al. 2024). Output unchanged.
    pub draft_stop_below: f32,
    /// Delta-guided drafting ([`crate::draft_bias`]). Output unchanged.
    pub delta_guided: bool,
    /// Stop after this many generated tokens.
    pub max_tokens: usize,
    /// Sampling parameters (temperature 0 = greedy).
    pub sampling: SamplingParams,
    /// End-of-sequence tokens: generation stops before emitting one.
    pub eos: Vec<u32>,
    /// Take the first new token from the prefill's last row where the prefill
    /// runs group by group ([`Schedule::prefills_per_group`]): its rows are
    /// exact, so no verify pass is needed before the first token.
    pub first_token_from_prefill: bool,
    /// Positions per group-by-group prefill pass, unpadded (the hook splits
    /// it over its sessions' widths); at most the prefill width: fixed-width
    /// padded chunks (by default as many as fit [`super::PREFILL_MEMORY`]).
    pub prefill_span: PrefillSpan,
    /// How each pass gets its deltas; same output either way (sampling runs
    /// [`crate::schedule::FixedPoint::for_sampling`]).
    pub schedule: Schedule,
}

impl SpecConfig {
    /// Greedy delta-guided base chains of `k`, padded, per group ([`Schedule::PerGroup`]).
    #[must_use]
    pub fn greedy(k: usize, max_tokens: usize, eos: Vec<u32>) -> Self {
        Self {
            drafting: Drafting::chain(ChainDrafter::Base, k),
            pad_to_k: true,
            prefill_width: None,
            optimistic: false,
            draft_stop_below: 0.0,
            delta_guided: true,
            max_tokens,
            sampling: SamplingParams::greedy(),
            eos,
            first_token_from_prefill: false,
            prefill_span: PrefillSpan::default(),
            schedule: Schedule::PerGroup,
        }
    }

    /// Checks what the types cannot. Errors: [`ConfigError::ZeroK`] for a
    /// chain or tree of K = 0; the replay drafts' own errors
    /// ([`ReplayDrafts::validate`]).
    pub fn validate(&self) -> Result<(), SpecError> {
        if let Drafting::Chain {
            drafter: ChainDrafter::Replay(replay),
            ..
        } = &self.drafting
        {
            replay.validate()?;
        }
        if !matches!(self.drafting, Drafting::None) && self.drafting.k() == 0 {
            return Err(ConfigError::ZeroK.into());
        }
        Ok(())
    }

    /// Positions per verify pass when padding is on (K+1, or 1 without drafts).
    #[must_use]
    pub fn verify_width(&self) -> usize {
        self.drafting.k() + 1
    }

    /// `schedule` when greedy, else a sampling fixed point ([`crate::schedule::FixedPoint::for_sampling`]).
    #[must_use]
    pub fn effective_schedule(&self) -> Schedule {
        if self.sampling.is_greedy() {
            return self.schedule;
        }
        match self.schedule.for_decoding(false) {
            Schedule::FixedPoint(fp) if self.certified_draws() => {
                Schedule::FixedPoint(fp.for_certified_draws())
            }
            other => other,
        }
    }

    /// Whether sampled chain rounds certify their draws.
    pub(super) fn certified_draws(&self) -> bool {
        self.drafting.tree_drafts().is_none() && log_weight_bound(1.0, &self.sampling).is_some()
    }

    /// Whether chain drafts record their inputs ([`crate::schedule::FixedPoint::drafted_start`]).
    pub(super) fn drafted_start(&self) -> bool {
        matches!(self.schedule, Schedule::FixedPoint(fp) if fp.drafted_start && fp.round_trips >= 2)
            && matches!(&self.drafting, Drafting::Chain { drafter, .. } if drafter.runs_base())
    }
}

/// Counters and timings of a generation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpecStats {
    /// Verify rounds (prefill chunks excluded).
    pub rounds: usize,
    /// Prefill passes through the hook.
    pub prefill_passes: usize,
    /// Real drafted tokens (fillers excluded).
    pub drafted: usize,
    /// Accepted drafted tokens.
    pub accepted: usize,
    /// Seconds spent drafting.
    pub draft_secs: f64,
    /// Seconds in verify passes (forward + hook), prefill excluded.
    pub verify_secs: f64,
    /// Seconds in prefill passes.
    pub prefill_secs: f64,
    /// Rounds whose draft was made ahead (optimistic drafting) and used.
    pub ahead_hits: usize,
    /// Seconds the draft-ahead thread ran (overlapped with verify passes).
    pub ahead_secs: f64,
    /// Batched round trips of the verify passes ([`Schedule::FixedPoint`]).
    pub round_trips: usize,
    /// Batched round trips of the prefill passes.
    pub prefill_round_trips: usize,
    /// Rounds that continued an earlier pass (none of its rows certified).
    pub continuations: usize,
    /// Prompt tokens reused from a cached context (not prefilled).
    pub cached_tokens: usize,
    /// Prompt tokens prefilled through the hook.
    pub prefilled_tokens: usize,
    /// Verified rows left unused for want of certification (fixed point).
    pub uncertified_rows: usize,
    /// Settlings of cached rows after a stall ([`crate::schedule::FixedPoint::shadow`]).
    pub settles: usize,
    /// Passes that started from the drafter's inputs ([`crate::schedule::FixedPoint::drafted_start`]).
    pub drafted_starts: usize,
}

impl SpecStats {
    /// Mean tokens produced per verify round (the acceptance length).
    #[must_use]
    pub fn mean_accepted_length(&self, generated: usize) -> f64 {
        if self.rounds == 0 {
            0.0
        } else {
            generated as f64 / self.rounds as f64
        }
    }
}

/// The result of a generation.
#[derive(Debug, Clone)]
pub struct SpecOutput {
    /// Generated tokens (EOS excluded).
    pub tokens: Vec<u32>,
    /// Whether generation stopped at an EOS token.
    pub stopped_at_eos: bool,
    /// Whether `on_tokens` ended the generation ([`SpecError::Stopped`]).
    pub stopped_by_caller: bool,
    /// Tree drafts: the acceptance estimate to start the next generation from.
    pub calibration: Option<Calibration>,
    /// Counters and timings.
    pub stats: SpecStats,
}

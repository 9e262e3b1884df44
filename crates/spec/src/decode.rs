//! The speculative generation loop: draft, verify K+1 positions in one pass,
//! accept, roll back.
//!
//! Invariants between rounds (L = prompt + generated tokens so far):
//! - the target cache holds the adapted model's keys/values of `context[..L-1]`;
//!   the last token is the first input of the next verify pass, whose row 0
//!   then predicts the next token (so prefill and decode are the same step);
//! - the base drafter's cache agrees with the target cache on its first
//!   `synced` positions; before each base draft it copies the target's newer
//!   positions (the adapted model's keys/values of the verified prefix) and
//!   feeds the last token. The drafter therefore never prefills the prompt,
//!   and the base weights draft over the *adapted* prefix, which the target
//!   accepts far more often than drafts over the base model's own prefix
//!   (measured: 3.76 vs 2.91 tokens per round at K = 4, 5.82 vs 3.76 at
//!   K = 8, BENCHMARKS.md). Correctness never depends on the drafter.
//!
//! A round drafts k ≤ K tokens, pads them to K with filler tokens when
//! constant-K padding is on (the server then always sees T = K+1 positions,
//! threat model guarantee 4; fillers are ordinary drafts and are accepted
//! only if they are right, so padding never changes the output), verifies
//! `[last, d_0, …, d_{K-1}]` through the delta hook (the adapter server in
//! private mode), accepts greedily or by exact speculative sampling, and
//! truncates the target cache to the accepted prefix. Prefill is chunked to
//! the same width when padding is on.

use std::time::Instant;

use cipherlora_model::{
    AttentionMask, DeltaHook, GroupInput, KvCache, KvRows, Model, PassDeltas, ProjGroup, Sampler,
    SamplingParams, Tensor, wanted_groups,
};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

use crate::SpecError;
use crate::acceptance::{
    DraftProbs, RoundOutcome, RowUniforms, accept_greedy, accept_sampled_with,
};
use crate::adaptive::{AdaptiveK, RoundCost};
use crate::draft_bias::DraftBias;
use crate::drafted_inputs::{DraftedInputs, Recording};
use crate::draw_bounds::{BoundedRow, DrawCut, decided, log_weight_bound};
use crate::ngram::PromptLookup;
use crate::prefix_cache::CachedContext;
use crate::row_deltas::RowDeltas;
use crate::schedule::{
    FixedPoint, Prefill, Schedule, Window, certify_greedy, certify_sampled, certify_tree_greedy,
    prefill_pass, remaining_error, settle, verify,
};
use crate::target_probs::{chain_probs, tree_probs};
use crate::tree::{accept_tree_greedy, accept_tree_sampled_with, path_rows};
use crate::tree_draft::{Calibration, GrownTree, SampledGrowth, TreeDrafts, TreeParams, grow};

/// Which drafter proposes the K tokens of a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrafterKind {
    /// No speculation: one position per round (the private baseline).
    None,
    /// The plaintext base model without the adapter (greedy drafts in greedy
    /// mode, sampled drafts when sampling).
    Base,
    /// Prompt lookup: free, deterministic drafts copied from the context.
    Ngram,
    /// Prompt lookup when it proposes a full draft, the base model otherwise.
    Hybrid,
}

/// Configuration of a speculative generation.
#[derive(Debug, Clone)]
pub struct SpecConfig {
    /// The drafter.
    pub drafter: DrafterKind,
    /// K: drafted tokens per round (the maximum when `adaptive`).
    pub k: usize,
    /// Choose k ≤ K per round from the observed acceptance rate.
    pub adaptive: bool,
    /// Constant-K padding: every verify pass carries exactly K+1 positions.
    pub pad_to_k: bool,
    /// Positions per prefill pass (`None`: the verify width). With padding
    /// on, every prefill pass carries exactly this many. A private client
    /// may verify through a narrow session and prefill through a wide one:
    /// prefill is then ⌈prompt / width⌉ round trips instead of
    /// ⌈prompt / (K+1)⌉ (see `cipherlora_private::ByWidth`).
    pub prefill_width: Option<usize>,
    /// Optimistic drafting (greedy, base drafter, fixed K): while the verify
    /// pass waits for the adapter server, a second thread drafts the next
    /// round as if every draft were accepted and the bonus token were the
    /// base model's own next token. When the round proves exactly that, the
    /// next round starts with its draft ready; otherwise the guess is
    /// dropped. Output is unchanged either way.
    pub optimistic: bool,
    /// Confidence-based draft length (greedy, base drafter): a draft stops
    /// after a token whose drafter probability (softmax of the drafter's
    /// logits) is below this, instead of always drafting k tokens; 0 turns
    /// it off. With constant-K padding the server still sees K+1 positions
    /// (the rest are fillers), so this only saves drafter steps that would
    /// most likely have been rejected (the same idea as the dynamic draft
    /// lengths of Li et al. 2024, EAGLE-2, and Huang et al. 2024,
    /// SpecDec++). Output is unchanged whatever the value.
    pub draft_stop_below: f32,
    /// Delta-guided drafting (base drafter, chains and trees): the drafter
    /// adds the adapter deltas of the latest verified position to every
    /// position it drafts ([`crate::draft_bias`]). It changes only what is
    /// drafted: the output is the same either way (greedy) or follows the
    /// same distribution (sampling).
    pub delta_guided: bool,
    /// Stop after this many generated tokens.
    pub max_tokens: usize,
    /// Sampling parameters (temperature 0 = greedy).
    pub sampling: SamplingParams,
    /// End-of-sequence tokens: generation stops before emitting one.
    pub eos: Vec<u32>,
    /// Prefill the whole prompt and take the first new token from its last
    /// row (per-group schedule only; ignored under the fixed point, whose
    /// prefill rows are not certified). The first token then arrives one
    /// verify pass sooner (time to first token); the output is the same
    /// (greedy) or follows the same distribution (sampling; a given seed
    /// samples other tokens than with this off).
    pub first_token_from_prefill: bool,
    /// Draft a tree of K nodes instead of a chain of K tokens (base
    /// drafter only; [`crate::tree`], [`crate::tree_draft`]): the verify
    /// pass still carries K+1 positions, spread over the drafter's most
    /// likely continuations. Adaptive K, optimistic drafting and
    /// `draft_stop_below` do not apply to trees.
    pub tree: Option<TreeDrafts>,
    /// How each verify and prefill pass gets its deltas
    /// ([`Schedule::PerGroup`]: one round trip per layer group;
    /// [`Schedule::FixedPoint`]: a constant number of batched round trips).
    /// The output is the same either way (see [`crate::schedule`]). A
    /// sampled generation runs a fixed point as
    /// [`crate::schedule::FixedPoint::for_sampling`] whatever this says.
    pub schedule: Schedule,
}

impl SpecConfig {
    /// Greedy chains of `k` drafts from the delta-guided base drafter,
    /// padded to the verify width K + 1, up to `max_tokens` new tokens or
    /// one of `eos`, verified group by group ([`Schedule::PerGroup`]): the
    /// common case, to adjust with struct update syntax.
    #[must_use]
    pub fn greedy(k: usize, max_tokens: usize, eos: Vec<u32>) -> Self {
        Self {
            tree: None,
            drafter: DrafterKind::Base,
            k,
            adaptive: false,
            pad_to_k: true,
            prefill_width: None,
            optimistic: false,
            draft_stop_below: 0.0,
            delta_guided: true,
            max_tokens,
            sampling: SamplingParams::greedy(),
            eos,
            first_token_from_prefill: false,
            schedule: Schedule::PerGroup,
        }
    }

    /// Positions per verify pass when padding is on (K+1, or 1 without drafter).
    #[must_use]
    pub fn verify_width(&self) -> usize {
        if self.drafter == DrafterKind::None {
            1
        } else {
            self.k + 1
        }
    }

    /// The schedule a generation under this configuration runs: `schedule`
    /// when greedy; sampled rows need a fixed point of their own
    /// ([`FixedPoint::for_sampling`]), and chains whose draws are certified
    /// ([`crate::draw_bounds`]) also settle their kept rows.
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
    fn certified_draws(&self) -> bool {
        self.tree.is_none() && log_weight_bound(1.0, &self.sampling).is_some()
    }

    /// Whether chain drafts record their LoRA inputs as the verify pass's
    /// first estimate: [`FixedPoint::drafted_start`] with at least two
    /// trips per round, chains, a base drafter.
    fn drafted_start(&self) -> bool {
        matches!(self.schedule, Schedule::FixedPoint(fp) if fp.drafted_start && fp.round_trips >= 2)
            && self.tree.is_none()
            && matches!(self.drafter, DrafterKind::Base | DrafterKind::Hybrid)
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
    /// Rounds whose draft was made ahead, during the previous verify pass
    /// (optimistic drafting), and used.
    pub ahead_hits: usize,
    /// Seconds the draft-ahead thread ran (overlapped with verify passes,
    /// so not part of the wall time unless the verify pass waited for it).
    pub ahead_secs: f64,
    /// Batched round trips of the verify passes ([`Schedule::FixedPoint`]).
    pub round_trips: usize,
    /// Batched round trips of the prefill passes.
    pub prefill_round_trips: usize,
    /// Rounds that continued an earlier round's pass because none of its
    /// rows was certified yet (counted in `rounds` too).
    pub continuations: usize,
    /// Prompt tokens whose rows came from a cached context (prefix
    /// caching): not prefilled.
    pub cached_tokens: usize,
    /// Prompt tokens prefilled through the hook.
    pub prefilled_tokens: usize,
    /// Verified rows the rounds could not use because they were not
    /// certified (fixed-point schedule; 0 on the per-group schedule).
    pub uncertified_rows: usize,
    /// Times the cached rows were settled because a round stalled on their
    /// residual ([`crate::schedule::FixedPoint::shadow`]); their passes'
    /// trips are in `round_trips`, their rounds in `rounds`.
    pub settles: usize,
    /// Verify passes whose first trip sent the drafter's inputs instead of
    /// pass 0's ([`crate::schedule::FixedPoint::drafted_start`]).
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
    /// Tree drafts: the acceptance estimate after this generation (start
    /// the next one from it: [`TreeDrafts::calibration`]).
    pub calibration: Option<Calibration>,
    /// Counters and timings.
    pub stats: SpecStats,
}

/// Runs speculative generation after `prompt`, with `verifier` supplying the
/// adapter deltas of every verify pass (plaintext LoRA as the reference, the
/// HE client in private mode). `on_tokens` sees each round's new tokens.
///
/// Greedy output equals sequential greedy decoding of the adapted model;
/// sampled output follows its distribution exactly (see [`crate::acceptance`]).
///
/// # Errors
/// [`SpecError::Config`] for an empty prompt or K = 0 with a drafter;
/// [`SpecError::Model`] for errors of the forward pass or the hook (the
/// generation stops; nothing is retried here — retries belong to the transport).
pub fn generate(
    model: &Model,
    prompt: &[u32],
    cfg: &SpecConfig,
    verifier: &mut dyn DeltaHook,
    on_tokens: &mut dyn FnMut(&[u32]) -> Result<(), SpecError>,
) -> Result<SpecOutput, SpecError> {
    generate_drafted(model, model, prompt, cfg, verifier, on_tokens)
}

/// [`generate`] with a separate model for the base drafter: the same
/// architecture and shapes as `model`, typically its weights held in a
/// cheaper form ([`Model::to_f16_weights`]: a single-position step streams
/// half the bytes). The drafter's KV cache is still synced from the target's
/// (the adapted f32 model's keys and values), and every draft is verified by
/// `model`, so the output is exactly [`generate`]'s; only acceptance and
/// speed change.
///
/// # Errors
/// As [`generate`]; [`SpecError::Config`] when `draft_model`'s layer count,
/// KV heads, head size or vocabulary differ from `model`'s.
pub fn generate_drafted(
    model: &Model,
    draft_model: &Model,
    prompt: &[u32],
    cfg: &SpecConfig,
    verifier: &mut dyn DeltaHook,
    on_tokens: &mut dyn FnMut(&[u32]) -> Result<(), SpecError>,
) -> Result<SpecOutput, SpecError> {
    let (out, _) = generate_cached(model, draft_model, prompt, cfg, verifier, on_tokens, None)?;
    Ok(out)
}

/// [`generate_drafted`] starting from the rows of an earlier context
/// (prefix caching, [`crate::prefix_cache`]): the prompt's tokens that
/// `cached` holds rows of are not prefilled again; at least the prompt's
/// last token is. Returns the output and the rows of the new context
/// (prompt and generated tokens, the last one excepted) for the next
/// request. A `cached` context of another schedule or model is not used.
/// The output is the same as without the cache: every reused row is a row
/// of the adapted model, as a fresh prefill would compute it.
///
/// # Errors
/// As [`generate_drafted`].
pub fn generate_cached(
    model: &Model,
    draft_model: &Model,
    prompt: &[u32],
    cfg: &SpecConfig,
    verifier: &mut dyn DeltaHook,
    on_tokens: &mut dyn FnMut(&[u32]) -> Result<(), SpecError>,
    cached: Option<CachedContext>,
) -> Result<(SpecOutput, CachedContext), SpecError> {
    let (t, d) = (model.config(), draft_model.config());
    if (t.num_layers, t.num_kv_heads, t.head_dim, t.vocab_size)
        != (d.num_layers, d.num_kv_heads, d.head_dim, d.vocab_size)
    {
        return Err(SpecError::Config(
            "the draft model's layers, KV heads, head size or vocabulary differ from the target's"
                .into(),
        ));
    }
    if prompt.is_empty() {
        return Err(SpecError::Config("empty prompt".into()));
    }
    if cfg.drafter != DrafterKind::None && cfg.k == 0 {
        return Err(SpecError::Config("a drafter needs K ≥ 1".into()));
    }
    if cfg.tree.is_some() && (cfg.drafter != DrafterKind::Base || cfg.adaptive) {
        return Err(SpecError::Config(
            "tree drafts need the base drafter and a fixed K".into(),
        ));
    }
    let width = cfg.verify_width();
    let prefill_width = cfg.prefill_width.unwrap_or(width).max(1);
    let capacity = prompt.len() + cfg.max_tokens + width.max(prefill_width) + 1;
    let sampler = Sampler::new(cfg.sampling.clone())?;
    let greedy = sampler.is_greedy();
    let certified_draws = cfg.certified_draws();
    let sampled_cfg;
    let cfg = if greedy {
        cfg
    } else {
        sampled_cfg = SpecConfig {
            schedule: cfg.effective_schedule(),
            ..cfg.clone()
        };
        &sampled_cfg
    };
    let mut rng = ChaCha20Rng::seed_from_u64(cfg.sampling.seed);
    let mut stats = SpecStats::default();
    let mut context = prompt.to_vec();

    let t0 = Instant::now();
    // With the first token taken from the prefill, the prefill covers the
    // whole prompt; otherwise its last token opens the first verify round.
    let first_from_prefill = cfg.first_token_from_prefill && cfg.schedule == Schedule::PerGroup;
    let prefilled = if first_from_prefill {
        prompt
    } else {
        &prompt[..prompt.len() - 1]
    };
    // A group-by-group prefill under the fixed point keeps its last chunk
    // in the wide session too: the verify session may group its requests
    // by layer (one request per layer needs the whole layer's inputs, which
    // a group-by-group pass does not have), and the wide session's deltas
    // are exact all the same.
    let narrow = match cfg.schedule {
        Schedule::FixedPoint(FixedPoint {
            prefill: Prefill::PerGroup,
            ..
        }) => 0,
        _ => width,
    };
    // The target cache, with the shadow cache (`FixedPoint::shadow`: every
    // row one trip less converged than the target's, the prompt's
    // included) and the deltas every target row was computed with (where a
    // settling starts, `crate::row_deltas`); from `cached` when it holds a
    // prefix of the prompt.
    let Rows {
        mut target,
        mut shadow,
        mut log,
        settled: cached_settled,
        prompt_settled: cached_prompt_settled,
    } = Rows::start(model, cfg, capacity, prefilled, cached)?;
    let reused = target.len();
    let done = prefill(
        model,
        (&mut target, shadow.as_mut(), log.as_mut()),
        &prefilled[reused..],
        (prefill_width, narrow),
        cfg.pad_to_k,
        verifier,
        &cfg.schedule,
    )?;
    (stats.prefill_passes, stats.prefill_round_trips) = (done.passes, done.round_trips);
    (stats.cached_tokens, stats.prefilled_tokens) = (reused, prefilled.len() - reused);
    stats.prefill_secs = t0.elapsed().as_secs_f64();
    verifier.prefill_done();
    // Settling after a stall (`schedule::settle`) first reruns the rows
    // kept since the prompt or the latest settling; when the round stalls
    // again, the prompt's rows too (their prefill trips, unless group by
    // group, leave a residual of their own).
    // Reused rows keep the settling state their generation left them in.
    let prompt_rows = target.len();
    let mut settled = cached_settled.unwrap_or(prompt_rows);
    let mut prompt_settled = cached_prompt_settled
        && matches!(
            cfg.schedule,
            Schedule::FixedPoint(FixedPoint {
                prefill: Prefill::PerGroup,
                ..
            })
        );
    // A draft to verify again after its round stalled and the cached rows
    // were settled, and how many settlings this round has had.
    let mut retry: Option<Draft> = None;
    let mut round_settles = 0;

    let adapted = wanted_groups(model, &*verifier);
    // The estimate passes' model (`FixedPoint::drafter_estimates`): the
    // drafter's when its weights are quantized (our kernels: 2.2× an f32
    // pass at 9 positions); an f16 drafter is slower than the target at
    // several positions (candle's f16 GEMM on the CPU), an f32 one no
    // faster.
    let estimator = if draft_model.weights_held() == "quantized" {
        draft_model
    } else {
        model
    };
    // Drafting ahead runs K + 1 positions past a full draft; a tree's
    // growth feeds up to `branch` nodes per level.
    let tree_margin = cfg.tree.as_ref().map_or(0, |t| t.shape.max_fed(cfg.k));
    let mut drafter = Drafter::new(
        (draft_model, model),
        cfg,
        capacity + width + 1 + tree_margin,
        adapted,
    )?;
    drafter.guide(&done.last_deltas.0, done.last_deltas.1)?;
    // The next verify pass's first estimate (`FixedPoint::guessed_start`).
    let mut estimate = DraftBias::from_rows(&done.last_deltas.0, kept_tail(done.last_deltas.1))?;
    let optimistic = cfg.optimistic && greedy && cfg.drafter == DrafterKind::Base && !cfg.adaptive;
    // The next round's draft, made during this round's verify pass.
    let mut ahead: Option<Draft> = None;
    // Rows a greedy chain round verified but could not certify, with the
    // deltas its last pass added (`schedule::Window::carried`): the old
    // window's tokens from the new row 0 on, and the row they start at.
    let mut carry: Option<(Vec<u32>, PassDeltas, usize)> = None;
    let mut out = Vec::new();
    let mut stopped_at_eos = false;
    let mut stopped_by_caller = false;
    if let Some(row) = done
        .last_row
        .filter(|_| first_from_prefill && cfg.max_tokens > 0)
    {
        // The prefill's last row is the adapted model's exact distribution
        // of the first new token (per-group schedule): take it as the
        // sequential decoder would.
        let first = if greedy {
            greedy_token(&row)
        } else {
            crate::acceptance::sample(&sampler.probs(&row, &context), &mut rng)
        };
        if cfg.eos.contains(&first) {
            stopped_at_eos = true;
        } else {
            out.push(first);
            context.push(first);
            match on_tokens(&[first]) {
                Err(SpecError::Stopped) => stopped_by_caller = true,
                other => other?,
            }
        }
    }
    while out.len() < cfg.max_tokens && !stopped_at_eos && !stopped_by_caller {
        debug_assert!(log.as_ref().is_none_or(|l| l.len() == target.len()));
        let k = drafter.next_k();
        let t_draft = Instant::now();
        if retry.is_none() {
            round_settles = 0;
        }
        let may_stall = round_settles == 0 || (round_settles == 1 && !prompt_settled);
        // A retried draft (after settling) drafts nothing ahead: the
        // drafter's cache was reset to the context.
        let retrying = retry.is_some();
        let ahead_hit = !retrying && ahead.is_some();
        let draft = match retry.take().or_else(|| ahead.take()) {
            Some(draft) => {
                stats.ahead_hits += usize::from(ahead_hit);
                draft
            }
            None => match &cfg.tree {
                Some(tree) => {
                    drafter.draft_tree(&context, &target, (k, &tree.shape), (&sampler, &mut rng))?
                }
                None => drafter.draft(&context, &target, k, &sampler, &mut rng)?,
            },
        };
        stats.draft_secs += t_draft.elapsed().as_secs_f64();
        stats.drafted += draft.tokens.len();

        let mut inputs = Vec::with_capacity(width);
        inputs.push(*context.last().expect("context is never empty"));
        inputs.extend(&draft.tokens);
        let real = inputs.len();
        if cfg.pad_to_k {
            let filler = *inputs.last().expect("non-empty");
            inputs.resize(width, filler);
        }
        let tree = draft.tree.as_ref().map(|g| &g.tree);
        let mask = match tree {
            Some(t) => AttentionMask::tree(t.verify_parents(inputs.len())?),
            None => AttentionMask::Causal,
        };
        let t_verify = Instant::now();
        let before = target.len();
        let go_ahead = optimistic
            && !retrying
            && draft.from_base
            && draft.tokens.len() == k
            && draft.tree.is_none();
        let drafts = &inputs[1..real];
        // A sampled chain round draws its rows' uniforms before it is
        // verified; where the sampler allows, the fixed point then
        // certifies the rows' draws, within a cut of rows fixed before any
        // uniform is looked at (`crate::draw_bounds`). Trees draw as they
        // walk and keep the tolerance rule.
        let uniforms = (!greedy && tree.is_none()).then(|| RowUniforms::draw(&mut rng, real));
        let draws = uniforms.as_deref().filter(|_| certified_draws);
        let cut = DrawCut::new();
        let certify_draws = |fp: &FixedPoint,
                             logits: &Tensor,
                             change: &[f32],
                             previous: Option<&[f32]>,
                             uniforms: &[RowUniforms]|
         -> Result<usize, SpecError> {
            let bounds: Vec<f32> = (0..real)
                .map(|j| fp.margin * remaining_error(change, previous, j))
                .collect();
            let tolerance = fp.draw_tolerance * cfg.sampling.temperature.min(1.0);
            let m = cut.rows(&bounds, tolerance);
            if m == 0 {
                return Ok(0);
            }
            let probs = chain_probs(&sampler, &rows(logits, m)?, &context, drafts);
            let bounded: Vec<BoundedRow<'_>> = probs
                .iter()
                .zip(&bounds)
                .map(|(p, &b)| BoundedRow {
                    probs: p,
                    delta: log_weight_bound(b, &cfg.sampling).unwrap_or(f64::INFINITY),
                })
                .collect();
            let q = draft_probs(draft.probs.as_deref(), m - 1);
            Ok(if decided(&drafts[..m - 1], q, &bounded, uniforms) {
                m
            } else {
                0
            })
        };
        let certify = |logits: &Tensor,
                       change: &[f32],
                       previous: Option<&[f32]>|
         -> Result<usize, SpecError> {
            Ok(match (&cfg.schedule, tree, draws) {
                (Schedule::FixedPoint(fp), Some(t), _) if greedy => {
                    certify_tree_greedy(&rows(logits, real)?, change, previous, t, fp.margin)
                }
                (Schedule::FixedPoint(fp), None, _) if greedy => {
                    certify_greedy(&rows(logits, real)?, change, previous, drafts, fp.margin)
                }
                (Schedule::FixedPoint(fp), None, Some(uniforms)) => {
                    certify_draws(fp, logits, change, previous, uniforms)?
                }
                (Schedule::FixedPoint(fp), tree, _) => {
                    let rows = certify_sampled(change, previous, real, fp.sampling_tolerance);
                    // A sampled tree walk may visit any row: all or none.
                    if tree.is_some() && rows < real {
                        0
                    } else {
                        rows
                    }
                }
                (Schedule::PerGroup, _, _) => real,
            })
        };
        // Fixed point: while the round's last trip is on the network, draft
        // the next round (a chain, or a tree grown from the predicted path)
        // from the outcome the pass before it predicts.
        let predict = matches!(cfg.schedule, Schedule::FixedPoint(fp) if fp.draft_ahead)
            && greedy
            && cfg.drafter == DrafterKind::Base
            && !cfg.adaptive
            && draft.from_base
            && !retrying;
        let window = Window {
            model,
            tokens: &inputs,
            mask: &mask,
            real,
            schedule: &cfg.schedule,
            certify: &certify,
            estimate: &estimate,
            may_stall,
            // (A draft shorter than the window, e.g. under adaptive K, runs
            // pass 0.)
            drafted: draft.inputs.as_deref().filter(|d| {
                d.first()
                    .is_some_and(|g| g.x.dims().first() == Some(&inputs.len()))
            }),
            estimator,
            carried: carry.as_ref().and_then(|(tokens, deltas, from)| {
                let count = tokens
                    .iter()
                    .zip(&inputs[..real])
                    .take_while(|(a, b)| a == b)
                    .count();
                (count > 0 && tree.is_none()).then_some((deltas, *from, count))
            }),
        };
        let (verified, guess) = if go_ahead {
            std::thread::scope(|scope| {
                let helper = scope.spawn(|| {
                    let t = Instant::now();
                    let guess = drafter.draft_ahead(&draft.tokens, k);
                    (guess, t.elapsed().as_secs_f64())
                });
                let verified = verify::<()>(&window, &mut target, verifier, None, shadow.as_mut());
                let (guess, secs) = helper
                    .join()
                    .map_err(|_| SpecError::Config("the draft-ahead thread panicked".into()))?;
                stats.ahead_secs += secs;
                Ok::<_, SpecError>((verified?.0, Some(guess?)))
            })?
        } else if predict {
            let mut work = |logits: &Tensor,
                            deltas: &PassDeltas,
                            window: &KvRows|
             -> Result<(Guess, f64), SpecError> {
                let t = Instant::now();
                let argmax: Vec<u32> = rows(logits, real)?
                    .iter()
                    .map(|r| greedy_token(r))
                    .collect();
                let guess = match (&draft.tree, &cfg.tree) {
                    (Some(grown), Some(trees)) => {
                        let predicted = accept_tree_greedy(&grown.tree, &argmax, real)?;
                        drafter.guide(deltas, last_kept_row(&predicted.path))?;
                        drafter.tree_from((before, window), &predicted, k, &trees.shape)?
                    }
                    _ => {
                        let predicted = accept_greedy(drafts, &argmax)?;
                        drafter.guide(deltas, predicted.accepted)?;
                        drafter.draft_from((before, window), &predicted, k)?
                    }
                };
                Ok((guess, t.elapsed().as_secs_f64()))
            };
            let (verified, g) = verify(
                &window,
                &mut target,
                verifier,
                Some(&mut work),
                shadow.as_mut(),
            )?;
            let guess = g.map(|(guess, secs)| {
                stats.ahead_secs += secs;
                guess
            });
            (verified, guess)
        } else {
            let (v, _) = verify::<()>(&window, &mut target, verifier, None, shadow.as_mut())?;
            (v, None)
        };
        stats.verify_secs += t_verify.elapsed().as_secs_f64();
        stats.rounds += 1 + verified.continuations;
        stats.continuations += verified.continuations;
        stats.round_trips += verified.round_trips;
        stats.drafted_starts += usize::from(verified.drafted_start);
        if verified.stalled {
            // The cached rows' residual blocks even row 0: settle the rows
            // since the last settling, then verify the same draft again.
            if let (Schedule::FixedPoint(fp), Some(sh), Some(log)) =
                (&cfg.schedule, shadow.as_mut(), log.as_mut())
            {
                target.truncate(before);
                log.truncate(before);
                let batch = fp.round_trips.max(1);
                let from = if round_settles == 0 {
                    settled
                } else {
                    prompt_settled = true;
                    0
                };
                let trips = settle(
                    model,
                    &context[from..before],
                    from,
                    width,
                    (&mut target, sh),
                    log,
                    verifier,
                    fp,
                )?;
                stats.round_trips += trips;
                stats.rounds += trips / batch;
                stats.settles += 1;
                settled = before;
                round_settles += 1;
            }
            // The drafter's cache may hold rows drafted ahead from this
            // pass's prediction: back to the context (the next draft
            // copies what it needs from the target cache).
            drafter.truncate(context.len());
            retry = Some(draft);
            continue;
        }
        // Only the certified rows decide (all of them on the per-group
        // schedule): a shorter draft, verified exactly. Certified draws
        // keep their cut also when the pass ran on until its inputs were
        // exact without asking.
        let usable = cut
            .fixed()
            .map_or(verified.usable, |m| m.min(verified.usable));
        stats.uncertified_rows += real - usable;
        if let Some(grown) = &draft.tree {
            let all = rows(&verified.logits, real)?;
            let argmax: Vec<u32> = all.iter().map(|r| greedy_token(r)).collect();
            drafter.calibration.observe_tree(grown, &argmax);
            let outcome = accept_tree(grown, &all, usable, &sampler, &context, &mut rng)?;
            if !greedy {
                // Only sampled rounds draw first children.
                drafter.calibration.observe_drawn(grown, &outcome.path);
            }
            stats.accepted += outcome.path.len();
            drafter.guide(&verified.deltas, last_kept_row(&outcome.path))?;
            let last = last_kept_row(&outcome.path);
            estimate = DraftBias::from_rows(&verified.deltas, last..last + 1)?;
            // Keep `last` and the accepted path; the new last token is not cached.
            let keep = path_rows(&outcome.path);
            target.compact(before, &keep)?;
            if let Some(sh) = shadow.as_mut() {
                sh.compact(before, &keep)?;
            }
            if let Some(log) = log.as_mut() {
                log.truncate(before);
                log.push(&verified.deltas, &keep)?;
            }
            match guess {
                // The next tree was grown from this very outcome: the
                // drafter's cache already holds it.
                Some(g) if g.path == outcome.path && outcome.tokens.last() == Some(&g.bonus) => {
                    ahead = Some(g.next);
                }
                // Grown from a wrong guess: back to the round's context (the
                // next draft copies the accepted path's rows from the
                // target cache).
                Some(_) => drafter.truncate(context.len()),
                None if retrying => drafter.truncate(context.len()),
                None => drafter.keep_tree_path(context.len(), grown, &outcome.path)?,
            }
            let round = RoundOutcome {
                accepted: outcome.path.len(),
                tokens: outcome.tokens,
            };
            let ended = emit(&round, cfg, &mut out, &mut context, on_tokens)?;
            (stopped_at_eos, stopped_by_caller) = ended;
            if stopped_at_eos || stopped_by_caller {
                break;
            }
            continue;
        }
        let rows = rows(&verified.logits, usable)?;
        let drafts = &drafts[..usable - 1];
        let outcome = if greedy {
            let argmax: Vec<u32> = rows.iter().map(|r| greedy_token(r)).collect();
            accept_greedy(drafts, &argmax)?
        } else {
            let p = chain_probs(&sampler, &rows, &context, drafts);
            let q = draft_probs(draft.probs.as_deref(), drafts.len());
            let uniforms = uniforms.as_deref().ok_or_else(|| {
                SpecError::Config("a sampled chain round without its uniforms".into())
            })?;
            accept_sampled_with(drafts, q, &p, uniforms)?
        };
        stats.accepted += outcome.accepted;
        drafter.guide(&verified.deltas, outcome.accepted)?;
        estimate = DraftBias::from_rows(&verified.deltas, kept_tail(outcome.accepted))?;
        // A greedy round cut short by an uncertified row whose token came
        // out as drafted: the rows from there on are the next window's
        // first rows if the next draft repeats them.
        let next_row = 1 + outcome.accepted;
        carry = (greedy
            && usable < real
            && next_row < real
            && outcome.tokens.last() == Some(&inputs[next_row]))
        .then(|| {
            (
                inputs[next_row..real].to_vec(),
                verified.deltas.clone(),
                next_row,
            )
        });
        let hit = guess.as_ref().is_some_and(|g| {
            outcome.accepted == g.accepted && outcome.tokens.last() == Some(&g.bonus)
        });
        if let Some(g) = guess.as_ref().filter(|_| !hit) {
            // A wrong guess: the drafter's cache is valid only up to the
            // drafts both the guess and the outcome accepted.
            drafter.truncate(context.len() + outcome.accepted.min(g.accepted));
        }
        drafter.observe(&draft, &outcome, context.len(), guess.is_some(), hit);
        if hit {
            ahead = guess.map(|g| g.next);
        }
        // Keep `last` and the accepted drafts; the new last token is not cached.
        target.truncate(before + 1 + outcome.accepted);
        if let Some(sh) = shadow.as_mut() {
            sh.truncate(before + 1 + outcome.accepted);
        }
        if let Some(log) = log.as_mut() {
            log.truncate(before);
            log.push_first(&verified.deltas, 1 + outcome.accepted)?;
        }
        (stopped_at_eos, stopped_by_caller) =
            emit(&outcome, cfg, &mut out, &mut context, on_tokens)?;
        if stopped_at_eos || stopped_by_caller {
            break;
        }
    }
    // Row i of the caches holds context[i]'s keys and values (rows past
    // the context, e.g. of a drafted EOS, are dropped).
    let n = target.len().min(context.len());
    target.truncate(n);
    if let Some(sh) = shadow.as_mut() {
        sh.truncate(n);
    }
    if let Some(log) = log.as_mut() {
        log.truncate(n);
    }
    context.truncate(n);
    let kept = CachedContext {
        tokens: context,
        target,
        shadow,
        log,
        schedule: cfg.schedule,
        settled: settled.min(n),
        prompt_settled,
    };
    let out = SpecOutput {
        tokens: out,
        stopped_at_eos,
        stopped_by_caller,
        stats,
        calibration: cfg.tree.is_some().then_some(drafter.calibration),
    };
    Ok((out, kept))
}

/// The caches a generation starts from.
struct Rows {
    target: KvCache,
    shadow: Option<KvCache>,
    log: Option<RowDeltas>,
    /// The reused rows' settling state (`None`: fresh caches).
    settled: Option<usize>,
    prompt_settled: bool,
}

impl Rows {
    /// Fresh caches of `capacity` positions, or `cached`'s rows of the
    /// longest prefix of `prefilled` it holds (at most all but one of its
    /// tokens, so that a prefill pass starts the first round), grown to
    /// `capacity`.
    fn start(
        model: &Model,
        cfg: &SpecConfig,
        capacity: usize,
        prefilled: &[u32],
        cached: Option<CachedContext>,
    ) -> Result<Self, SpecError> {
        let config = model.config();
        let row_bytes = KvCache::bytes_for(config, config.num_layers, 1);
        let usable = cached.filter(|c| {
            c.schedule == cfg.schedule
                && c.target.layers() == (0..config.num_layers)
                && c.target.bytes() == row_bytes * c.target.capacity()
        });
        let reuse = usable.as_ref().map_or(0, |c| {
            c.common_prefix(prefilled)
                .min(prefilled.len().saturating_sub(1))
        });
        match usable.filter(|_| reuse > 0) {
            Some(c) => {
                let c = c.truncated(reuse)?;
                Ok(Self {
                    target: c.target.resized(capacity)?,
                    shadow: c.shadow.map(|s| s.resized(capacity)).transpose()?,
                    log: c.log,
                    settled: Some(c.settled.min(reuse)),
                    prompt_settled: c.prompt_settled,
                })
            }
            None => {
                let shadow = match cfg.schedule {
                    Schedule::FixedPoint(fp) if fp.shadow => Some(model.new_cache(capacity)?),
                    _ => None,
                };
                Ok(Self {
                    target: model.new_cache(capacity)?,
                    log: shadow.as_ref().map(|_| RowDeltas::new()),
                    shadow,
                    settled: None,
                    prompt_settled: true,
                })
            }
        }
    }
}

/// One drafter forward of `feed` after `cache`, adding `bias` and, with a
/// `recorder`, keeping each adapted group's input of the last position
/// ([`crate::schedule::FixedPoint::drafted_start`]); returns the last
/// position's logits.
fn step(
    model: &Model,
    feed: &[u32],
    cache: &mut KvCache,
    bias: &mut DraftBias,
    recorder: Option<&mut DraftedInputs>,
) -> Result<Vec<f32>, SpecError> {
    let mut hook = Recording {
        bias,
        inputs: recorder,
    };
    let logits = model.forward(feed, cache, &AttentionMask::Causal, &mut hook)?;
    Ok(rows(&logits, feed.len())?.pop().expect("at least one row"))
}

/// Rows of a pass whose mean is the next pass's first estimate.
const ESTIMATE_ROWS: usize = 4;

/// The last [`ESTIMATE_ROWS`] rows of a chain pass that keeps rows
/// `..=last` (fewer at its start): their mean deltas are the next pass's
/// first estimate ([`crate::schedule::FixedPoint::guessed_start`]); a tree
/// round's only its last kept row, since the rows before it in the pass
/// may be off its path.
fn kept_tail(last: usize) -> std::ops::Range<usize> {
    (last + 1).saturating_sub(ESTIMATE_ROWS)..last + 1
}

/// The verify row of the last position a tree round keeps: the last node
/// of the accepted `path` (node n is row n + 1), or row 0.
fn last_kept_row(path: &[usize]) -> usize {
    path.last().map_or(0, |&n| n + 1)
}

/// Appends a round's tokens to `out` and `context` up to the first EOS
/// token or `max_tokens`, and shows them to `on_tokens`. Returns
/// (stopped at EOS, stopped by the caller).
fn emit(
    outcome: &RoundOutcome,
    cfg: &SpecConfig,
    out: &mut Vec<u32>,
    context: &mut Vec<u32>,
    on_tokens: &mut dyn FnMut(&[u32]) -> Result<(), SpecError>,
) -> Result<(bool, bool), SpecError> {
    let mut fresh = Vec::with_capacity(outcome.tokens.len());
    let mut eos = false;
    for &tok in &outcome.tokens {
        if cfg.eos.contains(&tok) {
            eos = true;
            break;
        }
        if out.len() == cfg.max_tokens {
            break;
        }
        fresh.push(tok);
        out.push(tok);
    }
    context.extend(&fresh);
    if !fresh.is_empty() {
        match on_tokens(&fresh) {
            Err(SpecError::Stopped) => return Ok((eos, true)),
            other => other?,
        }
    }
    Ok((eos, false))
}

/// Accepts a tree round from its verify rows (`rows[r]`: the logits of
/// verify row r, root first; `usable`: rows of the path that may be used,
/// see [`accept_tree_greedy`]). Sampling takes each row's distribution
/// after its own history (the context and the row's path), and each
/// sampled node's proposal from `grown`.
fn accept_tree(
    grown: &GrownTree,
    rows: &[Vec<f32>],
    usable: usize,
    sampler: &Sampler,
    context: &[u32],
    rng: &mut ChaCha20Rng,
) -> Result<crate::tree::TreeOutcome, SpecError> {
    let tree = &grown.tree;
    let rows = &rows[..=tree.len()];
    if sampler.is_greedy() {
        let argmax: Vec<u32> = rows.iter().map(|r| greedy_token(r)).collect();
        return accept_tree_greedy(tree, &argmax, usable);
    }
    let probs = tree_probs(sampler, rows, context, tree);
    let proposals: Vec<Option<&[f32]>> = grown.proposals.iter().map(|q| q.as_deref()).collect();
    accept_tree_sampled_with(tree, &probs, &proposals, rng)
}

/// What [`prefill`] did.
struct Prefilled {
    /// Passes through the hook.
    passes: usize,
    /// Batched round trips of those passes.
    round_trips: usize,
    /// The logits row of the last prefilled token (per-group schedule; the
    /// fixed-point schedule's rows are not certified, so `None`).
    last_row: Option<Vec<f32>>,
    /// The last pass's deltas and the row of its last prompt token: the
    /// first round's drafting guide.
    last_deltas: (PassDeltas, usize),
}

/// Runs `tokens` (a prompt, or all but its last token) through the adapted
/// model, in chunks of `width` positions padded to `width` when `pad` is
/// set, each pass under `schedule`. With padding, a last chunk that fits
/// the verify width `narrow` is padded to that instead: a private client's
/// verify session then runs it, a pass several times cheaper than a wide
/// one (the server sees one more pass of the verify width, as it would
/// for a round); `narrow` = 0 keeps every chunk at `width`.
fn prefill(
    model: &Model,
    (cache, mut shadow, mut log): (&mut KvCache, Option<&mut KvCache>, Option<&mut RowDeltas>),
    tokens: &[u32],
    (width, narrow): (usize, usize),
    pad: bool,
    hook: &mut dyn DeltaHook,
    schedule: &Schedule,
) -> Result<Prefilled, SpecError> {
    let mut done = Prefilled {
        passes: 0,
        round_trips: 0,
        last_row: None,
        last_deltas: (PassDeltas::new(), 0),
    };
    if tokens.is_empty() {
        return Ok(done);
    }
    let chunk = if pad { width } else { tokens.len() };
    for part in tokens.chunks(chunk) {
        let mut inputs = part.to_vec();
        if pad {
            let padded = if part.len() <= narrow { narrow } else { width };
            inputs.resize(padded, *part.last().expect("chunks are non-empty"));
        }
        let before = cache.len();
        let pass = prefill_pass(model, &inputs, cache, hook, schedule, shadow.as_deref_mut())?;
        done.round_trips += pass.round_trips;
        done.last_row = match pass.logits {
            Some(l) => Some(rows(&l, part.len())?.pop().expect("a chunk is non-empty")),
            None => None,
        };
        if let Some(log) = log.as_deref_mut() {
            log.truncate(before);
            log.push_first(&pass.deltas, part.len())?;
        }
        done.last_deltas = (pass.deltas, part.len() - 1);
        cache.truncate(before + part.len());
        if let Some(sh) = shadow.as_deref_mut() {
            sh.truncate(before + part.len());
        }
        done.passes += 1;
    }
    Ok(done)
}

/// How the first `n` drafts of a chain were chosen: drawn from the
/// drafter's `probs` rows, or point masses.
fn draft_probs(probs: Option<&[Vec<f32>]>, n: usize) -> DraftProbs<'_> {
    match probs {
        Some(q) => DraftProbs::Sampled(&q[..n]),
        None => DraftProbs::PointMass,
    }
}

/// The first `n` rows of a (T, vocab) logits tensor.
fn rows(logits: &Tensor, n: usize) -> Result<Vec<Vec<f32>>, SpecError> {
    let all = logits.narrow(0, 0, n).and_then(|t| t.to_vec2::<f32>());
    all.map_err(|e| SpecError::Model(cipherlora_model::ModelError::from(e)))
}

/// The greedy choice, by the same rule as the plaintext reference.
fn greedy_token(row: &[f32]) -> u32 {
    cipherlora_model::argmax(row) as u32
}

/// The largest softmax probability of a logits row: 1 / Σ exp(l − max l).
fn top_probability(row: &[f32]) -> f32 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = row.iter().map(|&l| (l - max).exp()).sum();
    if sum.is_finite() && sum > 0.0 {
        1.0 / sum
    } else {
        0.0
    }
}

/// What [`Drafter::draft_ahead`] or [`Drafter::draft_from`] guessed: the
/// outcome of the round being verified (accepted drafts and bonus token) and
/// the next round's draft after it.
struct Guess {
    accepted: usize,
    bonus: u32,
    /// The accepted tree nodes of a tree round (empty for a chain).
    path: Vec<usize>,
    /// The next round's draft.
    next: Draft,
}

/// One round's draft.
struct Draft {
    tokens: Vec<u32>,
    /// The drafter's distributions when it sampled (None: point masses).
    probs: Option<Vec<Vec<f32>>>,
    /// Whether the base model produced it (its cache then ran ahead).
    from_base: bool,
    /// A tree draft (`tokens` then lists its nodes).
    tree: Option<GrownTree>,
    /// The LoRA inputs the drafter computed for the window's positions
    /// ([`crate::schedule::FixedPoint::drafted_start`]; chains only).
    inputs: Option<Vec<GroupInput>>,
}

impl Draft {
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

    /// A tree of at most k nodes grown by [`grow`] after feeding `feed`
    /// to the drafter's `cache`.
    fn grown(
        models: (&Model, &Model),
        cache: &mut KvCache,
        feed: &[u32],
        k: usize,
        params: &TreeParams,
        (calibration, bias): (&Calibration, &mut DraftBias),
        sampled: Option<SampledGrowth<'_>>,
    ) -> Result<Self, SpecError> {
        let grown = grow(
            models,
            cache,
            feed,
            (k, params),
            (calibration, bias),
            sampled,
        )?;
        Ok(Self {
            tokens: grown.tree.tokens.clone(),
            probs: None,
            from_base: true,
            tree: Some(grown),
            inputs: None,
        })
    }
}

/// Drafter state: the base model's own KV cache and the adaptive-K controller.
struct Drafter<'m> {
    model: &'m Model,
    /// The model for a tree level's batched pass (the target's weights:
    /// f32 runs several positions faster than f16 does).
    batch_model: &'m Model,
    kind: DrafterKind,
    k_max: usize,
    cache: Option<KvCache>,
    /// Positions `..synced` of `cache` equal the target cache's (the
    /// target only ever rolls back past positions it added in a round).
    synced: usize,
    lookup: PromptLookup,
    adaptive: Option<AdaptiveK>,
    /// [`SpecConfig::draft_stop_below`].
    stop_below: f32,
    /// Tree drafts: the acceptance estimate learnt from earlier rounds.
    calibration: Calibration,
    /// [`SpecConfig::delta_guided`].
    guided: bool,
    /// What the drafter adds to the base model (empty unless guided).
    bias: DraftBias,
    /// Records the LoRA inputs of the positions a chain draft feeds
    /// ([`crate::schedule::FixedPoint::drafted_start`]; `None` when the
    /// schedule does not use them).
    recorder: Option<DraftedInputs>,
}

impl<'m> Drafter<'m> {
    /// `adapted`: the groups the verifier adapts, in forward order (what a
    /// drafted start records).
    fn new(
        (model, batch_model): (&'m Model, &'m Model),
        cfg: &SpecConfig,
        capacity: usize,
        adapted: Vec<(usize, ProjGroup)>,
    ) -> Result<Self, SpecError> {
        let needs_base = matches!(cfg.drafter, DrafterKind::Base | DrafterKind::Hybrid);
        let cache = if needs_base {
            Some(model.new_cache(capacity)?)
        } else {
            None
        };
        // Prior: the 72% per-token agreement measured on a real adapter; a
        // padded round costs the same whatever k, drafting a token ~1/20 of it.
        let adaptive = (cfg.adaptive && cfg.drafter != DrafterKind::None).then(|| {
            let per_position = if cfg.pad_to_k { 0.0 } else { 0.05 };
            AdaptiveK::new(
                1,
                cfg.k,
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
            batch_model,
            kind: cfg.drafter,
            k_max: cfg.k,
            cache,
            synced: 0,
            lookup: PromptLookup::default(),
            adaptive,
            stop_below: cfg.draft_stop_below,
            calibration: cfg
                .tree
                .as_ref()
                .map(|t| t.calibration.clone())
                .unwrap_or_default(),
            guided: cfg.delta_guided,
            bias: DraftBias::none(),
            recorder: cfg.drafted_start().then(|| DraftedInputs::new(adapted)),
        })
    }

    /// Delta-guided drafting: from now on, adds row `row` of a verify
    /// pass's `deltas` (the latest position the round keeps) to every
    /// drafted position. Does nothing unless [`SpecConfig::delta_guided`].
    fn guide(&mut self, deltas: &PassDeltas, row: usize) -> Result<(), SpecError> {
        if self.guided && !deltas.is_empty() {
            self.bias = DraftBias::from_row(deltas, row)?;
        }
        Ok(())
    }

    fn next_k(&self) -> usize {
        match (&self.adaptive, self.kind) {
            (_, DrafterKind::None) => 0,
            (Some(a), _) => a.next_k(),
            (None, _) => self.k_max,
        }
    }

    fn draft(
        &mut self,
        context: &[u32],
        target: &KvCache,
        k: usize,
        sampler: &Sampler,
        rng: &mut ChaCha20Rng,
    ) -> Result<Draft, SpecError> {
        let lookup = || Draft {
            tokens: self.lookup.draft(context, k),
            probs: None,
            from_base: false,
            tree: None,
            inputs: None,
        };
        match self.kind {
            DrafterKind::None => Ok(Draft {
                tokens: Vec::new(),
                probs: None,
                from_base: false,
                tree: None,
                inputs: None,
            }),
            DrafterKind::Ngram => Ok(lookup()),
            DrafterKind::Hybrid => {
                let d = lookup();
                if d.tokens.len() == k {
                    Ok(d)
                } else {
                    self.draft_base(context, target, k, sampler, rng)
                }
            }
            DrafterKind::Base => self.draft_base(context, target, k, sampler, rng),
        }
    }

    /// k tokens from the base model. Its cache first takes the verified
    /// prefix's keys and values from the target cache (the adapted model's:
    /// only positions added since the last sync are copied), so the drafter
    /// never prefills the prompt and drafts over the adapted prefix; then
    /// it feeds what the target has not cached (the last token).
    fn draft_base(
        &mut self,
        context: &[u32],
        target: &KvCache,
        k: usize,
        sampler: &Sampler,
        rng: &mut ChaCha20Rng,
    ) -> Result<Draft, SpecError> {
        let cache = self.cache.as_mut().expect("base drafter has a cache");
        let from = self.synced.min(cache.len());
        cache.sync_from(target, from)?;
        self.synced = target.len();
        let greedy = sampler.is_greedy();
        let mut history = context.to_vec();
        let mut tokens = Vec::with_capacity(k);
        let mut probs = Vec::with_capacity(k);
        let mut feed = context[cache.len()..].to_vec();
        if let Some(r) = self.recorder.as_mut() {
            r.clear();
        }
        for i in 0..k {
            let row = step(
                self.model,
                &feed,
                cache,
                &mut self.bias,
                self.recorder.as_mut(),
            )?;
            // Greedy drafts stop early after a low-confidence token.
            let (next, stop) = if greedy {
                // (The softmax over the vocabulary only when the option is on.)
                let stop = self.stop_below > 0.0 && top_probability(&row) < self.stop_below;
                (greedy_token(&row), stop)
            } else {
                let q = sampler.probs(&row, &history);
                let t = crate::acceptance::sample(&q, rng);
                probs.push(q);
                (t, false)
            };
            tokens.push(next);
            history.push(next);
            if stop || i + 1 == k {
                break;
            }
            feed = vec![next];
        }
        let inputs = self.drafted_inputs(&tokens, k)?;
        Ok(Draft {
            tokens,
            probs: (!greedy).then_some(probs),
            from_base: true,
            tree: None,
            inputs,
        })
    }

    /// With a recorder and a full draft of `k` tokens: feeds the last draft
    /// once more, recording its inputs (its cache row is dropped again), and
    /// returns the window's k + 1 positions' inputs. `None` otherwise.
    fn drafted_inputs(
        &mut self,
        tokens: &[u32],
        k: usize,
    ) -> Result<Option<Vec<GroupInput>>, SpecError> {
        let (Some(recorder), Some(cache), Some(&last)) =
            (self.recorder.as_mut(), self.cache.as_mut(), tokens.last())
        else {
            return Ok(None);
        };
        if tokens.len() != k {
            recorder.clear();
            return Ok(None);
        }
        step(
            self.model,
            &[last],
            cache,
            &mut self.bias,
            Some(&mut *recorder),
        )?;
        cache.truncate(cache.len() - 1);
        recorder.take(k + 1)
    }

    /// A tree of at most k nodes from the base model
    /// ([`crate::tree_draft`]), synced from the target cache as
    /// [`Self::draft_base`] is. Afterwards the cache holds the context and
    /// the tree nodes growth fed.
    fn draft_tree(
        &mut self,
        context: &[u32],
        target: &KvCache,
        (k, params): (usize, &TreeParams),
        sampling: (&Sampler, &mut ChaCha20Rng),
    ) -> Result<Draft, SpecError> {
        let cache = self.cache.as_mut().expect("base drafter has a cache");
        let from = self.synced.min(cache.len());
        cache.sync_from(target, from)?;
        self.synced = target.len();
        let feed = context[cache.len()..].to_vec();
        let models = (self.model, self.batch_model);
        let (sampler, rng) = sampling;
        let sampled = (!sampler.is_greedy()).then_some(SampledGrowth {
            sampler,
            context,
            rng,
        });
        Draft::grown(
            models,
            cache,
            &feed,
            k,
            params,
            (&self.calibration, &mut self.bias),
            sampled,
        )
    }

    /// After a tree round that accepted `path`: keeps the context
    /// (`context_len` tokens) and the accepted nodes growth had fed.
    fn keep_tree_path(
        &mut self,
        context_len: usize,
        grown: &GrownTree,
        path: &[usize],
    ) -> Result<(), SpecError> {
        if let Some(cache) = self.cache.as_mut() {
            cache.compact(context_len, &grown.cached_path(path))?;
        }
        Ok(())
    }

    /// Optimistic drafting: with the cache holding the context and the
    /// round's first k−1 drafts, feeds the last draft, takes the base
    /// model's next token as the guessed bonus token, and drafts k more
    /// tokens after it (k + 1 single-token passes, greedy).
    fn draft_ahead(&mut self, drafts: &[u32], k: usize) -> Result<Guess, SpecError> {
        let cache = self.cache.as_mut().expect("base drafter has a cache");
        let mut feed = *drafts.last().expect("a non-empty draft");
        let mut tokens = Vec::with_capacity(k + 1);
        for _ in 0..=k {
            let logits =
                self.model
                    .forward(&[feed], cache, &AttentionMask::Causal, &mut self.bias)?;
            let row = rows(&logits, 1)?.pop().expect("one row");
            feed = greedy_token(&row);
            tokens.push(feed);
        }
        // The last token was predicted but not fed: the cache holds the
        // bonus guess and k − 1 of the next drafts, as after a normal draft.
        Ok(Guess {
            accepted: drafts.len(),
            bonus: tokens[0],
            path: Vec::new(),
            next: Draft::chain(tokens[1..].to_vec()),
        })
    }

    /// Drafts the next round as if the round being verified ends with
    /// `predicted` (its accepted drafts and bonus token): puts the window's
    /// rows of the predicted accepted drafts (and of the context's last
    /// token before them) into the cache, feeds the bonus token and drafts
    /// k tokens greedily. Leaves the cache as after a normal draft of the
    /// next round.
    ///
    /// `(start, window)`: the verify window's first position and its rows
    /// as the pass before the last trip computed them ([`KvRows`]). They
    /// are the adapted model's up to one trip's residual, so the next
    /// drafts see the adapted prefix, as a round drafted after verification
    /// does when it syncs from the target cache ("Drafting over the adapted
    /// prefix" in BENCHMARKS.md); the drafter's own rows of its drafts are
    /// the base model's.
    fn draft_from(
        &mut self,
        (start, window): (usize, &KvRows),
        predicted: &RoundOutcome,
        k: usize,
    ) -> Result<Guess, SpecError> {
        let cache = self.cache.as_mut().expect("base drafter has a cache");
        let accepted = predicted.accepted;
        let bonus = *predicted
            .tokens
            .last()
            .expect("an outcome has a bonus token");
        let rows: Vec<usize> = (0..=accepted).collect();
        cache.put_rows(start, window, &rows)?;
        let mut feed = vec![bonus];
        let mut next = Vec::with_capacity(k);
        if let Some(r) = self.recorder.as_mut() {
            r.clear();
        }
        for i in 0..k {
            let row = step(
                self.model,
                &feed,
                cache,
                &mut self.bias,
                self.recorder.as_mut(),
            )?;
            let tok = greedy_token(&row);
            next.push(tok);
            if i + 1 < k {
                feed = vec![tok];
            }
        }
        let inputs = self.drafted_inputs(&next, k)?;
        Ok(Guess {
            accepted,
            bonus,
            path: Vec::new(),
            next: Draft {
                inputs,
                ..Draft::chain(next)
            },
        })
    }

    /// [`Self::draft_from`] for a tree round: grows the next round's tree
    /// (at most k nodes, `params`) as if the round being verified accepts
    /// `predicted` (its path of nodes and bonus token). Puts the
    /// window's rows of the context's last token and of the predicted
    /// path's nodes (window row n + 1 holds node n, at its depth's
    /// position) into the cache, feeds the bonus token, then grows; the
    /// cache ends as after [`Self::draft_tree`] of the next round.
    fn tree_from(
        &mut self,
        (start, window): (usize, &KvRows),
        predicted: &crate::tree::TreeOutcome,
        k: usize,
        params: &TreeParams,
    ) -> Result<Guess, SpecError> {
        let cache = self.cache.as_mut().expect("base drafter has a cache");
        cache.put_rows(start, window, &path_rows(&predicted.path))?;
        let bonus = *predicted
            .tokens
            .last()
            .expect("an outcome has a bonus token");
        let models = (self.model, self.batch_model);
        Ok(Guess {
            accepted: predicted.path.len(),
            bonus,
            path: predicted.path.clone(),
            next: Draft::grown(
                models,
                cache,
                &[bonus],
                k,
                params,
                (&self.calibration, &mut self.bias),
                // Drafting ahead is greedy only (`FixedPoint::draft_ahead`).
                None,
            )?,
        })
    }

    /// Rolls the base cache back to at most `len` positions.
    fn truncate(&mut self, len: usize) {
        if let Some(cache) = self.cache.as_mut() {
            cache.truncate(len.min(cache.len()));
        }
    }

    /// Rolls the base cache back to what the round proved right and feeds the
    /// acceptance statistics to adaptive K. `context_len` is L before the
    /// round; `went_ahead`: [`Self::draft_ahead`] ran this round (the cache
    /// then also holds the last draft and the guessed continuation); `hit`:
    /// the guess was right, so the cache is exactly what the next round needs.
    fn observe(
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
            // The cache may hold context[..L] plus the first k−1 drafts (all
            // k after a draft-ahead); only the accepted ones stay valid.
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

//! The speculative generation loop: draft, verify K+1 positions in one pass,
//! accept, roll back. The base drafter syncs its cache from the target's, so
//! it drafts over the adapted prefix; with constant-K padding the server
//! always sees K+1 positions. Invariants: code-notes.md, "spec: decode".

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
use crate::replay::ReplayDrafts;
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
    /// The plaintext base model without the adapter (greedy or sampled drafts).
    Base,
    /// Prompt lookup: free, deterministic drafts copied from the context.
    Ngram,
    /// Prompt lookup when it proposes a full draft, the base model otherwise.
    Hybrid,
    /// The reference continuation at a set acceptance ([`SpecConfig::replay`]; synthetic
    /// models in benchmarks).
    Replay,
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
    /// Positions per prefill pass (`None`: the verify width; `cipherlora_private::ByWidth`).
    pub prefill_width: Option<usize>,
    /// Optimistic drafting (greedy, base drafter, fixed K): draft the next round
    /// during the verify pass, guessing every draft accepted. Output unchanged.
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
    /// Take the first new token from the prefill's last row (per-group only).
    pub first_token_from_prefill: bool,
    /// Positions per group-by-group prefill pass, unpadded (the hook splits
    /// it over its sessions' widths); at most the prefill width: fixed-width
    /// padded chunks ([`PREFILL_SPAN`] by default).
    pub prefill_span: usize,
    /// Draft a tree of K nodes instead of a chain ([`crate::tree_draft`]; base
    /// drafter, no adaptive K, optimistic drafting or `draft_stop_below`).
    pub tree: Option<TreeDrafts>,
    /// How each pass gets its deltas; same output either way (sampling runs
    /// [`crate::schedule::FixedPoint::for_sampling`]).
    pub schedule: Schedule,
    /// What [`DrafterKind::Replay`] drafts.
    pub replay: Option<ReplayDrafts>,
}

impl SpecConfig {
    /// Greedy delta-guided base chains of `k`, padded, per group ([`Schedule::PerGroup`]).
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
            prefill_span: PREFILL_SPAN,
            schedule: Schedule::PerGroup,
            replay: None,
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

    /// `schedule` when greedy, else a sampling fixed point ([`FixedPoint::for_sampling`]).
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

    /// Whether chain drafts record their inputs ([`FixedPoint::drafted_start`]).
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

/// Speculative generation after `prompt`; `verifier` supplies each verify
/// pass's adapter deltas, `on_tokens` sees each round's new tokens. Greedy
/// output equals sequential greedy decoding of the adapted model; sampled
/// output follows its distribution ([`crate::acceptance`]).
///
/// Errors: [`SpecError::Config`] (empty prompt, K = 0 with a drafter),
/// [`SpecError::Model`] (forward pass or hook; not retried here).
pub fn generate(
    model: &Model,
    prompt: &[u32],
    cfg: &SpecConfig,
    verifier: &mut dyn DeltaHook,
    on_tokens: &mut dyn FnMut(&[u32]) -> Result<(), SpecError>,
) -> Result<SpecOutput, SpecError> {
    generate_drafted(model, model, prompt, cfg, verifier, on_tokens)
}

/// The model the base drafter runs ([`DrafterKind::Base`], the base half of
/// [`DrafterKind::Hybrid`]).
#[derive(Debug, Clone, Copy)]
pub enum DraftModel<'m> {
    /// The target or a copy of its weights ([`Model::to_f16_weights`],
    /// [`Model::fast_drafter`]): its KV cache copies the target's adapted rows
    /// before each draft, so it drafts over the adapted prefix, and
    /// delta-guided drafting applies.
    Copy(&'m Model),
    /// Another network with the target's vocabulary, e.g. a 1B model drafting
    /// for an 8B target (Leviathan et al., ICML 2023, §2): it keeps its own KV
    /// cache, fed the context's tokens, drafts chains only, and neither delta
    /// guidance nor drafted starts apply (its activations are not the
    /// target's).
    Separate(&'m Model),
}

impl<'m> DraftModel<'m> {
    /// The drafter's weights.
    #[must_use]
    pub fn model(self) -> &'m Model {
        match self {
            DraftModel::Copy(m) | DraftModel::Separate(m) => m,
        }
    }

    /// Whether the drafter is another network ([`DraftModel::Separate`]).
    #[must_use]
    pub fn is_separate(self) -> bool {
        matches!(self, DraftModel::Separate(_))
    }
}

impl<'m> From<&'m Model> for DraftModel<'m> {
    fn from(m: &'m Model) -> Self {
        DraftModel::Copy(m)
    }
}

/// [`generate`] with a drafter model other than the target: a copy of its
/// weights or another network ([`DraftModel`]); same output. Errors: as
/// [`generate`]; [`SpecError::Config`] when a copy's shapes differ from the
/// target's, when a separate drafter's vocabulary does, or when a separate
/// drafter is asked for trees.
pub fn generate_drafted<'m>(
    model: &Model,
    draft_model: impl Into<DraftModel<'m>>,
    prompt: &[u32],
    cfg: &SpecConfig,
    verifier: &mut dyn DeltaHook,
    on_tokens: &mut dyn FnMut(&[u32]) -> Result<(), SpecError>,
) -> Result<SpecOutput, SpecError> {
    let (out, _) = generate_cached(model, draft_model, prompt, cfg, verifier, on_tokens, None)?;
    Ok(out)
}

/// [`generate_drafted`] reusing the rows of an earlier context
/// ([`crate::prefix_cache`]); returns the output and the new context's rows.
/// Same output as without the cache. Errors: as [`generate_drafted`].
pub fn generate_cached<'m>(
    model: &Model,
    draft_model: impl Into<DraftModel<'m>>,
    prompt: &[u32],
    cfg: &SpecConfig,
    verifier: &mut dyn DeltaHook,
    on_tokens: &mut dyn FnMut(&[u32]) -> Result<(), SpecError>,
    cached: Option<CachedContext>,
) -> Result<(SpecOutput, CachedContext), SpecError> {
    let drafting = draft_model.into();
    check_draft_model(model, drafting, cfg)?;
    let (draft_model, separate) = (drafting.model(), drafting.is_separate());
    if prompt.is_empty() {
        return Err(SpecError::Config("empty prompt".into()));
    }
    if cfg.drafter == DrafterKind::Replay {
        cfg.replay
            .as_ref()
            .ok_or_else(|| SpecError::Config("the replay drafter needs its drafts".into()))?
            .validate()?;
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
    // With the first token from the prefill, the prefill covers the whole prompt.
    let first_from_prefill = cfg.first_token_from_prefill && cfg.schedule == Schedule::PerGroup;
    let prefilled = if first_from_prefill {
        prompt
    } else {
        &prompt[..prompt.len() - 1]
    };
    // A per-group prefill under the fixed point keeps its last chunk wide too.
    let narrow = match cfg.schedule {
        Schedule::FixedPoint(FixedPoint {
            prefill: Prefill::PerGroup,
            ..
        }) => 0,
        _ => width,
    };
    // Target, shadow (`FixedPoint::shadow`) and per-row deltas, maybe from `cached`.
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
        (prefill_width, narrow, cfg.prefill_span),
        cfg.pad_to_k,
        verifier,
        &cfg.schedule,
    )?;
    (stats.prefill_passes, stats.prefill_round_trips) = (done.passes, done.round_trips);
    (stats.cached_tokens, stats.prefilled_tokens) = (reused, prefilled.len() - reused);
    stats.prefill_secs = t0.elapsed().as_secs_f64();
    verifier.prefill_done();
    // Settling reruns the rows since the last settling, then the prompt's.
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
    // A draft to verify again after settling, and this round's settlings.
    let mut retry: Option<Draft> = None;
    let mut round_settles = 0;

    let adapted = wanted_groups(model, &*verifier);
    // Estimate passes run on a quantized copy of the target, else on the target.
    let estimator = if !separate && draft_model.weights_held() == "quantized" {
        draft_model
    } else {
        model
    };
    let tree_margin = cfg.tree.as_ref().map_or(0, |t| t.shape.max_fed(cfg.k));
    let mut drafter = Drafter::new(
        (drafting, model),
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
    // Verified but uncertified rows of a greedy chain (`schedule::Window::carried`).
    let mut carry: Option<(Vec<u32>, PassDeltas, usize)> = None;
    let mut out = Vec::new();
    let mut stopped_at_eos = false;
    let mut stopped_by_caller = false;
    if let Some(row) = done
        .last_row
        .filter(|_| first_from_prefill && cfg.max_tokens > 0)
    {
        // The prefill's last row is exact (per-group): sample it as usual.
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
        // Sampled chains draw their uniforms first, so the fixed point can certify
        // draws within a fixed cut (`crate::draw_bounds`).
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
        // Fixed point: draft the next round while the last trip is on the network.
        let predict = matches!(cfg.schedule, Schedule::FixedPoint(fp) if fp.draft_ahead)
            && !separate
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
            // A draft shorter than the window runs pass 0.
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
            // The cached rows' residual blocks row 0: settle, then retry the draft.
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
            // Back to the context: the drafter may hold rows drafted ahead.
            drafter.truncate(context.len());
            retry = Some(draft);
            continue;
        }
        // Only certified rows decide; certified draws keep their cut.
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
                // Grown from this very outcome: the drafter's cache holds it.
                Some(g) if g.path == outcome.path && outcome.tokens.last() == Some(&g.bonus) => {
                    ahead = Some(g.next);
                }
                // Grown from a wrong guess: back to the round's context.
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
        // Uncertified rows whose token came out as drafted may open the next window.
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
            // Wrong guess: the drafter's cache is valid up to the common drafts.
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
    // Row i of the caches holds context[i] (rows past it are dropped).
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

/// Errors: [`SpecError::Config`] when a copy's layers, KV heads, head size
/// or vocabulary differ from the target's, when a separate drafter's
/// vocabulary does, or when a separate drafter is asked for trees.
fn check_draft_model(
    model: &Model,
    drafting: DraftModel<'_>,
    cfg: &SpecConfig,
) -> Result<(), SpecError> {
    let (t, d) = (model.config(), drafting.model().config());
    match drafting {
        DraftModel::Copy(_)
            if (t.num_layers, t.num_kv_heads, t.head_dim, t.vocab_size)
                != (d.num_layers, d.num_kv_heads, d.head_dim, d.vocab_size) =>
        {
            Err(SpecError::Config(
                "the draft model's layers, KV heads, head size or vocabulary differ from the target's"
                    .into(),
            ))
        }
        DraftModel::Separate(_) if t.vocab_size != d.vocab_size => Err(SpecError::Config(format!(
            "the draft model's vocabulary ({}) differs from the target's ({}): it needs the same tokenizer",
            d.vocab_size, t.vocab_size
        ))),
        DraftModel::Separate(_) if cfg.tree.is_some() => Err(SpecError::Config(
            "tree drafts need a copy of the target's weights, not a separate draft model".into(),
        )),
        _ => Ok(()),
    }
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
    /// Fresh caches, or `cached`'s rows of the longest prefix of `prefilled`.
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
                let c = c.prefix(reuse, capacity)?;
                Ok(Self {
                    target: c.target,
                    shadow: c.shadow,
                    log: c.log,
                    settled: Some(c.settled),
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

/// One drafter forward of `feed` plus `bias` (recording inputs); last logits.
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

/// The last [`ESTIMATE_ROWS`] kept rows of a chain pass (the next first estimate).
fn kept_tail(last: usize) -> std::ops::Range<usize> {
    (last + 1).saturating_sub(ESTIMATE_ROWS)..last + 1
}

/// The verify row of a tree round's last kept position (node n: row n + 1).
fn last_kept_row(path: &[usize]) -> usize {
    path.last().map_or(0, |&n| n + 1)
}

/// Appends a round's tokens up to EOS or `max_tokens` and shows them to
/// `on_tokens`; returns (stopped at EOS, stopped by the caller).
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

/// Accepts a tree round from its verify rows (root first).
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
    /// The last prefilled token's logits row (per-group schedule only).
    last_row: Option<Vec<f32>>,
    /// The last pass's deltas and its last prompt row (the first drafting guide).
    last_deltas: (PassDeltas, usize),
}

/// The default [`SpecConfig::prefill_span`]: a long prompt pays one latency
/// per layer group every `PREFILL_SPAN` tokens; the span bounds the pass's
/// attention scores (heads × span × context f32).
pub const PREFILL_SPAN: usize = 512;

/// Runs `tokens` through the adapted model: group by group in unpadded passes
/// of up to `span` positions when `span > width`; otherwise in chunks of `width`
/// (padded when `pad`; then a last chunk that fits `narrow`, the verify
/// width or 0 for none, is padded to that instead, so the cheaper verify
/// session runs it).
fn prefill(
    model: &Model,
    (cache, mut shadow, mut log): (&mut KvCache, Option<&mut KvCache>, Option<&mut RowDeltas>),
    tokens: &[u32],
    (width, narrow, span): (usize, usize, usize),
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
    // A group-by-group pass needs no fixed width: the hook splits it into
    // requests of its sessions' widths and pipelines them.
    let per_group = span > width
        && matches!(
            schedule,
            Schedule::PerGroup
                | Schedule::FixedPoint(FixedPoint {
                    prefill: Prefill::PerGroup,
                    ..
                })
        );
    let pad = pad && !per_group;
    let chunk = match (pad, per_group) {
        (true, _) => width,
        (false, true) => span,
        (false, false) => tokens.len(),
    };
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

/// How the first `n` drafts were chosen: from `probs` rows, or point masses.
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

/// What drafting ahead guessed: the round's outcome and the next draft.
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
    /// The drafter's LoRA inputs for the window (chains only).
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

    /// A tree of at most k nodes grown by [`grow`] after feeding `feed`.
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
    /// A separate network ([`DraftModel::Separate`]): its cache holds its own
    /// rows of the context, never the target's.
    separate: bool,
    /// The model for a tree level's batched pass (the target's f32 weights).
    batch_model: &'m Model,
    kind: DrafterKind,
    k_max: usize,
    cache: Option<KvCache>,
    /// Positions `..synced` of `cache` equal the target cache's.
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
    /// Records the LoRA inputs of a chain draft's positions (drafted start).
    recorder: Option<DraftedInputs>,
    /// [`SpecConfig::replay`].
    replay: Option<ReplayDrafts>,
}

impl<'m> Drafter<'m> {
    /// `adapted`: the verifier's groups in forward order.
    fn new(
        (drafting, batch_model): (DraftModel<'m>, &'m Model),
        cfg: &SpecConfig,
        capacity: usize,
        adapted: Vec<(usize, ProjGroup)>,
    ) -> Result<Self, SpecError> {
        let (model, separate) = (drafting.model(), drafting.is_separate());
        let needs_base = matches!(cfg.drafter, DrafterKind::Base | DrafterKind::Hybrid);
        let cache = if needs_base {
            Some(model.new_cache(capacity)?)
        } else {
            None
        };
        // Prior: 72 % per-token agreement; a drafted token costs ~1/20 of a round.
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
            separate,
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
            guided: cfg.delta_guided && !separate,
            bias: DraftBias::none(),
            recorder: (cfg.drafted_start() && !separate).then(|| DraftedInputs::new(adapted)),
            replay: cfg.replay.clone(),
        })
    }

    /// Delta-guided drafting: adds row `row` of `deltas` to every drafted position.
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
            DrafterKind::Replay => Ok(Draft {
                tokens: self
                    .replay
                    .as_ref()
                    .map(|r| r.draft(context.len(), k))
                    .unwrap_or_default(),
                probs: None,
                from_base: false,
                tree: None,
                inputs: None,
            }),
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

    /// k tokens from the base model, its cache synced from the target's first.
    fn draft_base(
        &mut self,
        context: &[u32],
        target: &KvCache,
        k: usize,
        sampler: &Sampler,
        rng: &mut ChaCha20Rng,
    ) -> Result<Draft, SpecError> {
        let cache = self.cache.as_mut().expect("base drafter has a cache");
        if !self.separate {
            let from = self.synced.min(cache.len());
            cache.sync_from(target, from)?;
            self.synced = target.len();
        }
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

    /// With a recorder and a full draft: the window's k + 1 positions' inputs.
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

    /// A tree of at most k nodes ([`crate::tree_draft`]), synced as draft_base.
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

    /// After a tree round: keeps the context and the accepted path's nodes.
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

    /// Optimistic drafting: guesses the bonus token and drafts k after it.
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
        // The cache now holds the bonus guess and k − 1 next drafts.
        Ok(Guess {
            accepted: drafts.len(),
            bonus: tokens[0],
            path: Vec::new(),
            next: Draft::chain(tokens[1..].to_vec()),
        })
    }

    /// Drafts the next round as if the verified round ends with `predicted`,
    /// from the window's rows of the pass before the last trip (code-notes).
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

    /// [`Self::draft_from`] for a tree round (window row n + 1 holds node n).
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

    /// Rolls the cache back to what the round proved and feeds adaptive K
    /// (`went_ahead`: draft_ahead ran; `hit`: its guess was right).
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

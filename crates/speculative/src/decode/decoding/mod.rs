//! One speculative generation as explicit steps: [`Decoding::start`] runs
//! the prompt's passes (and takes the first token from the prefill where it
//! can), then each [`Decoding::round`] drafts, verifies the window in one
//! pass, and either settles the cached rows and retries the draft or accepts
//! a tree or a chain, commits the kept rows and emits the new tokens;
//! [`Decoding::finish`] returns the output and the context's rows.
//! Invariants: code-notes.md, "spec: decode".

mod accept;
mod settling;

use accept::{kept_tail, last_kept_row};
use settling::Settling;

use std::time::Instant;

use cipherlora_model::{
    AttentionMask, DeltaHook, KvCache, KvRows, Model, PassDeltas, Sampler, Tensor, wanted_groups,
};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

use super::certify::Certifier;
use super::drafter::{Draft, Drafter, Guess};
use super::prefill::{Rows, prefill};
use super::{DraftModel, SpecConfig, SpecOutput, SpecStats, greedy_token, rows};
use crate::SpecError;
use crate::acceptance::{RowUniforms, accept_greedy};
use crate::draft_bias::DraftBias;
use crate::draw_bounds::DrawCut;
use crate::prefix_cache::CachedContext;
use crate::row_deltas::RowDeltas;
use crate::schedule::{FixedPoint, Prefill, Schedule, Verified, Window, settle, verify};
use crate::tree::accept_tree_greedy;

/// The caller's sink for each round's new tokens.
pub(super) type OnTokens<'f> = dyn FnMut(&[u32]) -> Result<(), SpecError> + 'f;

/// The state of one generation between rounds.
pub(super) struct Decoding<'a> {
    model: &'a Model,
    /// Where estimate passes run: a quantized copy of the target, else the target.
    estimator: &'a Model,
    cfg: &'a SpecConfig,
    sampler: Sampler,
    greedy: bool,
    /// [`SpecConfig::certified_draws`].
    certified_draws: bool,
    /// [`SpecConfig::optimistic`] where it applies (greedy, base drafter, fixed K).
    optimistic: bool,
    /// The drafter is another network ([`DraftModel::Separate`]).
    separate: bool,
    /// Positions per verify pass.
    width: usize,
    rng: ChaCha20Rng,
    stats: SpecStats,
    context: Vec<u32>,
    target: KvCache,
    /// [`FixedPoint::shadow`]'s rows and the per-row deltas logged with them.
    shadow: Option<KvCache>,
    log: Option<RowDeltas>,
    drafter: Drafter<'a>,
    /// The next verify pass's first estimate ([`FixedPoint::guessed_start`]).
    estimate: DraftBias,
    /// The next round's draft, made during this round's verify pass.
    ahead: Option<Draft>,
    /// Verified but uncertified rows of a greedy chain (`Window::carried`).
    carry: Option<(Vec<u32>, PassDeltas, usize)>,
    /// A draft to verify again after settling, and this round's settlings.
    retry: Option<Draft>,
    round_settles: usize,
    /// Which rows a stall settles.
    settling: Settling,
    out: Vec<u32>,
    stopped_at_eos: bool,
    stopped_by_caller: bool,
}

/// A round's verify pass and what the round needs of it afterwards.
struct Checked {
    /// The window's tokens: the last context token, the drafts, any filler.
    inputs: Vec<u32>,
    /// Positions before the filler.
    real: usize,
    /// Target rows before the window.
    before: usize,
    verified: Verified,
    /// What drafting ahead guessed, if it ran.
    guess: Option<Guess>,
    /// A sampled chain's uniforms, drawn before the pass.
    uniforms: Option<Vec<RowUniforms>>,
    /// Leading rows the round may use: certified, within a certified draw's cut.
    usable: usize,
}

impl<'a> Decoding<'a> {
    /// Runs the prompt's passes (past the rows reused from `cached`), sets
    /// the drafter up, and emits the first token when the prefill's last row
    /// is exact. Errors: as [`super::generate_cached`].
    pub(super) fn start(
        model: &'a Model,
        drafting: DraftModel<'a>,
        prompt: &[u32],
        cfg: &'a SpecConfig,
        verifier: &mut dyn DeltaHook,
        on_tokens: &mut OnTokens<'_>,
        cached: Option<CachedContext>,
    ) -> Result<Self, SpecError> {
        let width = cfg.verify_width();
        let prefill_width = cfg.prefill_width.unwrap_or(width).max(1);
        let capacity = prompt.len() + cfg.max_tokens + width.max(prefill_width) + 1;
        let sampler = Sampler::new(cfg.sampling.clone())?;
        let greedy = sampler.is_greedy();
        let mut stats = SpecStats::default();
        let t0 = Instant::now();
        let per_group_prefill = matches!(
            cfg.schedule,
            Schedule::FixedPoint(FixedPoint {
                prefill: Prefill::PerGroup,
                ..
            })
        );
        // A prefill group by group leaves exact rows, so its last row gives the
        // first token and the prefill covers the whole prompt.
        let first_from_prefill = cfg.first_token_from_prefill && cfg.schedule.prefills_per_group();
        let prefilled = if first_from_prefill {
            prompt
        } else {
            &prompt[..prompt.len() - 1]
        };
        // A per-group prefill under the fixed point keeps its last chunk wide too.
        let narrow = if per_group_prefill { 0 } else { width };
        let Rows {
            mut target,
            mut shadow,
            mut log,
            settled,
            prompt_settled,
        } = Rows::start(model, cfg, capacity, prefilled, cached)?;
        let reused = target.len();
        let adapted = wanted_groups(model, &*verifier);
        let span = cfg
            .prefill_span
            .positions(model.config(), &adapted, capacity);
        let done = prefill(
            model,
            (&mut target, shadow.as_mut(), log.as_mut()),
            &prefilled[reused..],
            (prefill_width, narrow, span),
            cfg.pad_to_k,
            verifier,
            &cfg.schedule,
        )?;
        (stats.prefill_passes, stats.prefill_round_trips) = (done.passes, done.round_trips);
        (stats.cached_tokens, stats.prefilled_tokens) = (reused, prefilled.len() - reused);
        stats.prefill_secs = t0.elapsed().as_secs_f64();
        verifier.prefill_done();

        let separate = drafting.is_separate();
        let draft_model = drafting.model();
        let estimator = if !separate && draft_model.weights_held() == "quantized" {
            draft_model
        } else {
            model
        };
        let tree_margin = cfg
            .drafting
            .tree_drafts()
            .map_or(0, |t| t.shape.max_fed(cfg.drafting.k()));
        let mut drafter = Drafter::new(
            (drafting, model),
            cfg,
            capacity + width + 1 + tree_margin,
            adapted,
        )?;
        drafter.guide(&done.last_deltas.0, done.last_deltas.1)?;
        let estimate = DraftBias::from_rows(&done.last_deltas.0, kept_tail(done.last_deltas.1))?;
        let mut run = Decoding {
            model,
            estimator,
            cfg,
            greedy,
            certified_draws: cfg.certified_draws(),
            optimistic: cfg.optimistic && greedy && cfg.drafting.can_draft_ahead(),
            separate,
            width,
            rng: ChaCha20Rng::seed_from_u64(cfg.sampling.seed),
            sampler,
            stats,
            context: prompt.to_vec(),
            settling: Settling::new(
                settled.unwrap_or(target.len()),
                prompt_settled && per_group_prefill,
                target.len(),
            ),
            target,
            shadow,
            log,
            drafter,
            estimate,
            ahead: None,
            carry: None,
            retry: None,
            round_settles: 0,
            out: Vec::new(),
            stopped_at_eos: false,
            stopped_by_caller: false,
        };
        if let Some(row) = done
            .last_row
            .filter(|_| first_from_prefill && cfg.max_tokens > 0)
        {
            run.first_token(&row, on_tokens)?;
        }
        Ok(run)
    }

    /// The prefill's last row is exact (per-group): its token, drawn as usual.
    fn first_token(&mut self, row: &[f32], on_tokens: &mut OnTokens<'_>) -> Result<(), SpecError> {
        let first = if self.greedy {
            greedy_token(row)
        } else {
            crate::acceptance::sample(&self.sampler.probs(row, &self.context), &mut self.rng)
        };
        if self.cfg.eos.contains(&first) {
            self.stopped_at_eos = true;
        } else {
            self.out.push(first);
            self.context.push(first);
            match on_tokens(&[first]) {
                Err(SpecError::Stopped) => self.stopped_by_caller = true,
                other => other?,
            }
        }
        Ok(())
    }

    /// Whether another round is due: tokens left, no EOS, the caller still listening.
    pub(super) fn wants_more(&self) -> bool {
        self.out.len() < self.cfg.max_tokens && !self.stopped_at_eos && !self.stopped_by_caller
    }

    /// One round: draft, verify, then settle and retry, or accept and emit.
    pub(super) fn round(
        &mut self,
        verifier: &mut dyn DeltaHook,
        on_tokens: &mut OnTokens<'_>,
    ) -> Result<(), SpecError> {
        debug_assert!(
            self.log
                .as_ref()
                .is_none_or(|l| l.len() == self.target.len())
        );
        let k = self.drafter.next_k();
        if self.retry.is_none() {
            self.round_settles = 0;
            self.settling.new_round(self.target.len());
        }
        let may_stall = self.settling.start(self.round_settles).is_some();
        let retrying = self.retry.is_some();
        let draft = self.draft(k, retrying)?;
        let checked = self.verify(&draft, k, retrying, may_stall, verifier)?;
        if checked.verified.stalled {
            // The cached rows' residual blocks row 0: settle, then retry the draft.
            self.settle_cached(checked.before, verifier)?;
            // Back to the context: the drafter may hold rows drafted ahead.
            self.drafter.truncate(self.context.len());
            self.retry = Some(draft);
            return Ok(());
        }
        self.stats.uncertified_rows += checked.real - checked.usable;
        match &draft.tree {
            Some(grown) => self.accept_tree(grown, checked, retrying, on_tokens),
            None => self.accept_chain(&draft, checked, on_tokens),
        }
    }

    /// The round's draft: one to retry, one made ahead, or a fresh one.
    fn draft(&mut self, k: usize, retrying: bool) -> Result<Draft, SpecError> {
        let t_draft = Instant::now();
        let ahead_hit = !retrying && self.ahead.is_some();
        let draft = match self.retry.take().or_else(|| self.ahead.take()) {
            Some(draft) => {
                self.stats.ahead_hits += usize::from(ahead_hit);
                draft
            }
            None => match self.cfg.drafting.tree_drafts() {
                Some(tree) => self.drafter.draft_tree(
                    &self.context,
                    &self.target,
                    (k, &tree.shape),
                    (&self.sampler, &mut self.rng),
                )?,
                None => self.drafter.draft(
                    &self.context,
                    &self.target,
                    k,
                    &self.sampler,
                    &mut self.rng,
                )?,
            },
        };
        self.stats.draft_secs += t_draft.elapsed().as_secs_f64();
        self.stats.drafted += draft.tokens.len();
        Ok(draft)
    }

    /// Verifies `draft`'s window in one pass under the schedule, drafting the
    /// next round meanwhile where that applies.
    fn verify(
        &mut self,
        draft: &Draft,
        k: usize,
        retrying: bool,
        may_stall: bool,
        verifier: &mut dyn DeltaHook,
    ) -> Result<Checked, SpecError> {
        let Decoding {
            model,
            estimator,
            cfg,
            sampler,
            greedy,
            certified_draws,
            optimistic,
            separate,
            width,
            rng,
            stats,
            context,
            target,
            shadow,
            drafter,
            estimate,
            carry,
            ..
        } = self;
        let (cfg, greedy) = (*cfg, *greedy);
        let mut inputs = Vec::with_capacity(*width);
        inputs.push(*context.last().expect("context is never empty"));
        inputs.extend(&draft.tokens);
        let real = inputs.len();
        if cfg.pad_to_k {
            let filler = *inputs.last().expect("non-empty");
            inputs.resize(*width, filler);
        }
        let tree = draft.tree.as_ref().map(|g| &g.tree);
        let mask = match tree {
            Some(t) => AttentionMask::tree(t.verify_parents(inputs.len())?),
            None => AttentionMask::Causal,
        };
        let t_verify = Instant::now();
        let before = target.len();
        let go_ahead = *optimistic
            && !retrying
            && draft.from_base
            && draft.tokens.len() == k
            && draft.tree.is_none();
        let drafts = &inputs[1..real];
        // Sampled chains draw their uniforms first, so the fixed point can certify
        // draws within a fixed cut (`crate::draw_bounds`).
        let uniforms = (!greedy && tree.is_none()).then(|| RowUniforms::draw(rng, real));
        let draws = uniforms.as_deref().filter(|_| *certified_draws);
        let cut = DrawCut::new();
        let certifier = Certifier {
            cfg,
            tree,
            draws,
            drafts,
            draft_probs: draft.probs.as_deref(),
            sampler,
            context,
            cut: &cut,
        };
        let certify = |logits: &Tensor, change: &[f32], previous: Option<&[f32]>| {
            certifier.rows(logits, change, previous)
        };
        // Fixed point: draft the next round while the last trip is on the network.
        let predict = matches!(cfg.schedule, Schedule::FixedPoint(fp) if fp.draft_ahead)
            && !*separate
            && greedy
            && cfg.drafting.can_draft_ahead()
            && draft.from_base
            && !retrying;
        let window = Window {
            model,
            tokens: &inputs,
            mask: &mask,
            real,
            schedule: &cfg.schedule,
            certify: &certify,
            estimate,
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
                let verified = verify::<()>(&window, target, verifier, None, shadow.as_mut());
                let (guess, secs) = helper.join().map_err(|_| SpecError::DraftAheadPanicked)?;
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
                let guess = match (&draft.tree, cfg.drafting.tree_drafts()) {
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
            let (verified, g) =
                verify(&window, target, verifier, Some(&mut work), shadow.as_mut())?;
            let guess = g.map(|(guess, secs)| {
                stats.ahead_secs += secs;
                guess
            });
            (verified, guess)
        } else {
            let (v, _) = verify::<()>(&window, target, verifier, None, shadow.as_mut())?;
            (v, None)
        };
        stats.verify_secs += t_verify.elapsed().as_secs_f64();
        stats.rounds += 1 + verified.continuations;
        stats.continuations += verified.continuations;
        stats.round_trips += verified.round_trips;
        stats.drafted_starts += usize::from(verified.drafted_start);
        // Only certified rows decide; certified draws keep their cut.
        let usable = cut
            .fixed()
            .map_or(verified.usable, |m| m.min(verified.usable));
        Ok(Checked {
            inputs,
            real,
            before,
            verified,
            guess,
            uniforms,
            usable,
        })
    }

    /// Settles the cached rows of the round's next settling step ([`Settling`]) when a
    /// fixed-point pass stalled on their residual.
    fn settle_cached(
        &mut self,
        before: usize,
        verifier: &mut dyn DeltaHook,
    ) -> Result<(), SpecError> {
        let (Schedule::FixedPoint(fp), Some(sh), Some(log), Some(from)) = (
            &self.cfg.schedule,
            self.shadow.as_mut(),
            self.log.as_mut(),
            self.settling.start(self.round_settles),
        ) else {
            return Ok(());
        };
        self.target.truncate(before);
        log.truncate(before);
        let batch = fp.round_trips.max(1);
        let trips = settle(
            self.model,
            &self.context[from..before],
            from,
            self.width,
            (&mut self.target, sh),
            log,
            verifier,
            fp,
        )?;
        self.stats.round_trips += trips;
        self.stats.rounds += trips / batch;
        self.stats.settles += 1;
        self.settling.done(from, before);
        self.round_settles += 1;
        Ok(())
    }

    /// The output and the context's rows (row i of the caches holds context[i]).
    pub(super) fn finish(mut self) -> (SpecOutput, CachedContext) {
        let n = self.target.len().min(self.context.len());
        self.target.truncate(n);
        if let Some(sh) = self.shadow.as_mut() {
            sh.truncate(n);
        }
        if let Some(log) = self.log.as_mut() {
            log.truncate(n);
        }
        self.context.truncate(n);
        let kept = CachedContext {
            tokens: self.context,
            target: self.target,
            shadow: self.shadow,
            log: self.log,
            schedule: self.cfg.schedule,
            settled: self.settling.settled.min(n),
            prompt_settled: self.settling.prompt_settled,
        };
        let out = SpecOutput {
            tokens: self.out,
            stopped_at_eos: self.stopped_at_eos,
            stopped_by_caller: self.stopped_by_caller,
            stats: self.stats,
            calibration: self
                .cfg
                .drafting
                .tree_drafts()
                .is_some()
                .then_some(self.drafter.calibration),
        };
        (out, kept)
    }
}

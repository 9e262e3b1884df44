//! The drafter's state: the base model's own KV cache, prompt lookup,
//! replayed drafts, adaptive K, tree calibration and delta guidance.

use cipherlora_model::{
    AttentionMask, GroupInput, KvCache, KvRows, Model, PassDeltas, ProjGroup, Sampler,
};
use rand_chacha::ChaCha20Rng;

use super::{ChainDrafter, DraftModel, Drafting, SpecConfig, greedy_token, rows};
use crate::SpecError;
use crate::acceptance::RoundOutcome;
use crate::adaptive::{AdaptiveK, RoundCost};
use crate::draft_bias::DraftBias;
use crate::drafted_inputs::{DraftedInputs, Recording};
use crate::ngram::PromptLookup;
use crate::tree::path_rows;
use crate::tree_draft::{Calibration, GrownTree, SampledGrowth, TreeParams, grow};

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
    lookup: PromptLookup,
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
            lookup: PromptLookup::default(),
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
        let lookup = || Draft {
            tokens: self.lookup.draft(context, k),
            probs: None,
            from_base: false,
            tree: None,
            inputs: None,
        };
        let none = |tokens| Draft {
            tokens,
            probs: None,
            from_base: false,
            tree: None,
            inputs: None,
        };
        match self.drafting.chain_drafter() {
            None => Ok(none(Vec::new())),
            Some(ChainDrafter::Ngram) => Ok(lookup()),
            Some(ChainDrafter::Replay(replay)) => Ok(none(replay.draft(context.len(), k))),
            Some(ChainDrafter::Hybrid) => {
                let d = lookup();
                if d.tokens.len() == k {
                    Ok(d)
                } else {
                    self.draft_base(context, target, k, sampler, rng)
                }
            }
            Some(ChainDrafter::Base) => self.draft_base(context, target, k, sampler, rng),
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
    pub(super) fn draft_tree(
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
    pub(super) fn keep_tree_path(
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
    pub(super) fn draft_ahead(&mut self, drafts: &[u32], k: usize) -> Result<Guess, SpecError> {
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
    pub(super) fn draft_from(
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
    pub(super) fn tree_from(
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

//! The base model's chain drafts: a round's draft, the inputs it records
//! for a drafted start, and drafting ahead of a verify pass.

use cipherlora_model::{AttentionMask, GroupInput, KvCache, KvRows, Model, Sampler};
use rand_chacha::ChaCha20Rng;

use super::{Draft, Drafter, Guess};
use crate::SpecError;
use crate::acceptance::RoundOutcome;
use crate::decode::{greedy_token, rows};
use crate::draft_bias::DraftBias;
use crate::drafted_inputs::{DraftedInputs, Recording};

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

/// Up to `k` drafted tokens after feeding `feed`, one drafter step each
/// (recording their inputs afresh when `recorder` is set); `choose` picks
/// each token from its logits row and says whether to stop after it.
fn chain(
    model: &Model,
    (cache, bias, mut recorder): (&mut KvCache, &mut DraftBias, Option<&mut DraftedInputs>),
    mut feed: Vec<u32>,
    k: usize,
    mut choose: impl FnMut(&[f32]) -> (u32, bool),
) -> Result<Vec<u32>, SpecError> {
    if let Some(r) = recorder.as_deref_mut() {
        r.clear();
    }
    let mut tokens = Vec::with_capacity(k);
    for i in 0..k {
        let row = step(model, &feed, cache, bias, recorder.as_deref_mut())?;
        let (next, stop) = choose(&row);
        tokens.push(next);
        if stop || i + 1 == k {
            break;
        }
        feed = vec![next];
    }
    Ok(tokens)
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

impl Drafter<'_> {
    /// k tokens from the base model, its cache synced from the target's first.
    pub(super) fn draft_base(
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
        let stop_below = self.stop_below;
        let mut history = context.to_vec();
        let mut probs = Vec::with_capacity(k);
        let feed = context[cache.len()..].to_vec();
        let recording = (cache, &mut self.bias, self.recorder.as_mut());
        let tokens = chain(self.model, recording, feed, k, |row| {
            // Greedy drafts stop early after a low-confidence token.
            let (next, stop) = if greedy {
                let stop = stop_below > 0.0 && top_probability(row) < stop_below;
                (greedy_token(row), stop)
            } else {
                let q = sampler.probs(row, &history);
                let t = crate::acceptance::sample(&q, rng);
                probs.push(q);
                (t, false)
            };
            history.push(next);
            (next, stop)
        })?;
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

    /// Optimistic drafting: guesses the bonus token and drafts k after it.
    pub(in crate::decode) fn draft_ahead(
        &mut self,
        drafts: &[u32],
        k: usize,
    ) -> Result<Guess, SpecError> {
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
    pub(in crate::decode) fn draft_from(
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
        let recording = (cache, &mut self.bias, self.recorder.as_mut());
        let next = chain(self.model, recording, vec![bonus], k, |row| {
            (greedy_token(row), false)
        })?;
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
}

//! Accepting a verified round: a tree's accepted path or a chain's longest accepted prefix and
//! bonus token, the rows kept in the caches, and the tokens emitted.

use cipherlora_model::Sampler;
use rand_chacha::ChaCha20Rng;

use crate::SpecError;
use crate::acceptance::{RoundOutcome, accept_greedy, accept_sampled_with};
use crate::decode::certify::draft_probs;
use crate::decode::drafter::Draft;
use crate::decode::{greedy_token, rows};
use crate::draft_bias::DraftBias;
use crate::target_probs::{chain_probs, tree_probs};
use crate::tree::{accept_tree_greedy, accept_tree_sampled_with, path_rows};
use crate::tree_draft::GrownTree;

use super::{Checked, Decoding, OnTokens};

impl Decoding<'_> {
    /// Accepts a tree round: walks the tree, keeps the accepted path's rows.
    pub(super) fn accept_tree(
        &mut self,
        grown: &GrownTree,
        checked: Checked,
        retrying: bool,
        on_tokens: &mut OnTokens<'_>,
    ) -> Result<(), SpecError> {
        let Checked {
            real,
            before,
            verified,
            guess,
            usable,
            ..
        } = checked;
        let all = rows(&verified.logits, real)?;
        let argmax: Vec<u32> = all.iter().map(|r| greedy_token(r)).collect();
        self.drafter.calibration.observe_tree(grown, &argmax);
        let outcome = accept_tree(
            grown,
            &all,
            usable,
            &self.sampler,
            &self.context,
            &mut self.rng,
        )?;
        if !self.greedy {
            // Only sampled rounds draw first children.
            self.drafter.calibration.observe_drawn(grown, &outcome.path);
        }
        self.stats.accepted += outcome.path.len();
        let last = last_kept_row(&outcome.path);
        self.drafter.guide(&verified.deltas, last)?;
        self.estimate = DraftBias::from_rows(&verified.deltas, last..last + 1)?;
        // Keep `last` and the accepted path; the new last token is not cached.
        let keep = path_rows(&outcome.path);
        self.target.compact(before, &keep)?;
        if let Some(sh) = self.shadow.as_mut() {
            sh.compact(before, &keep)?;
        }
        if let Some(log) = self.log.as_mut() {
            log.truncate(before);
            log.push(&verified.deltas, &keep)?;
        }
        let context_len = self.context.len();
        match guess {
            // Grown from this very outcome: the drafter's cache holds it.
            Some(g) if g.path == outcome.path && outcome.tokens.last() == Some(&g.bonus) => {
                self.ahead = Some(g.next);
            }
            // Grown from a wrong guess: back to the round's context.
            Some(_) => self.drafter.truncate(context_len),
            None if retrying => self.drafter.truncate(context_len),
            None => self
                .drafter
                .keep_tree_path(context_len, grown, &outcome.path)?,
        }
        let round = RoundOutcome {
            accepted: outcome.path.len(),
            tokens: outcome.tokens,
        };
        self.emit(&round, on_tokens)
    }

    /// Accepts a chain round: the longest accepted prefix and a bonus token.
    pub(super) fn accept_chain(
        &mut self,
        draft: &Draft,
        checked: Checked,
        on_tokens: &mut OnTokens<'_>,
    ) -> Result<(), SpecError> {
        let Checked {
            inputs,
            real,
            before,
            verified,
            guess,
            uniforms,
            usable,
        } = checked;
        let rows = rows(&verified.logits, usable)?;
        let drafts = &inputs[1..usable];
        let outcome = if self.greedy {
            let argmax: Vec<u32> = rows.iter().map(|r| greedy_token(r)).collect();
            accept_greedy(drafts, &argmax)?
        } else {
            let p = chain_probs(&self.sampler, &rows, &self.context, drafts);
            let q = draft_probs(draft.probs.as_deref(), drafts.len());
            let uniforms = uniforms.as_deref().ok_or_else(|| SpecError::Invariant {
                what: "a sampled chain round without its uniforms",
            })?;
            accept_sampled_with(drafts, q, &p, uniforms)?
        };
        let accepted = outcome.accepted;
        self.stats.accepted += accepted;
        self.drafter.guide(&verified.deltas, accepted)?;
        self.estimate = DraftBias::from_rows(&verified.deltas, kept_tail(accepted))?;
        // Uncertified rows whose token came out as drafted may open the next window.
        let next_row = 1 + accepted;
        self.carry = (self.greedy
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
        let hit = guess
            .as_ref()
            .is_some_and(|g| accepted == g.accepted && outcome.tokens.last() == Some(&g.bonus));
        let context_len = self.context.len();
        if let Some(g) = guess.as_ref().filter(|_| !hit) {
            // Wrong guess: the drafter's cache is valid up to the common drafts.
            self.drafter
                .truncate(context_len + accepted.min(g.accepted));
        }
        self.drafter
            .observe(draft, &outcome, context_len, guess.is_some(), hit);
        if hit {
            self.ahead = guess.map(|g| g.next);
        }
        // Keep `last` and the accepted drafts; the new last token is not cached.
        self.target.truncate(before + 1 + accepted);
        if let Some(sh) = self.shadow.as_mut() {
            sh.truncate(before + 1 + accepted);
        }
        if let Some(log) = self.log.as_mut() {
            log.truncate(before);
            log.push_first(&verified.deltas, 1 + accepted)?;
        }
        self.emit(&outcome, on_tokens)
    }

    /// Appends a round's tokens up to EOS or `max_tokens` and shows them to
    /// `on_tokens`; notes whether either stopped the generation.
    pub(super) fn emit(
        &mut self,
        outcome: &RoundOutcome,
        on_tokens: &mut OnTokens<'_>,
    ) -> Result<(), SpecError> {
        let mut fresh = Vec::with_capacity(outcome.tokens.len());
        for &tok in &outcome.tokens {
            if self.cfg.eos.contains(&tok) {
                self.stopped_at_eos = true;
                break;
            }
            if self.out.len() == self.cfg.max_tokens {
                break;
            }
            fresh.push(tok);
            self.out.push(tok);
        }
        self.context.extend(&fresh);
        if !fresh.is_empty() {
            match on_tokens(&fresh) {
                Err(SpecError::Stopped) => self.stopped_by_caller = true,
                other => other?,
            }
        }
        Ok(())
    }
}

/// Rows of a pass whose mean is the next pass's first estimate.
const ESTIMATE_ROWS: usize = 4;

/// The last [`ESTIMATE_ROWS`] kept rows of a chain pass (the next first estimate).
pub(super) fn kept_tail(last: usize) -> std::ops::Range<usize> {
    (last + 1).saturating_sub(ESTIMATE_ROWS)..last + 1
}

/// The verify row of a tree round's last kept position (node n: row n + 1).
pub(super) fn last_kept_row(path: &[usize]) -> usize {
    path.last().map_or(0, |&n| n + 1)
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

//! Drafters for split generation: proposals verified K+1 positions per
//! round trip. None costs a model pass (the client holds only a few
//! layers):
//!
//! - prompt lookup copies the continuation of an earlier occurrence of the
//!   context's last n-gram (`cipherlora_spec::ngram`; Saxena 2023);
//! - adaptive prompt lookup drafts as many tokens as the match suggests:
//!   a match of the full `max_ngram` tokens up to 2K, a shorter one of n
//!   tokens ⌈K·n / max_ngram⌉ (over the 5 prompts of `tests/grpc_split.rs`
//!   and the first 6 HumanEval prompts, 32 greedy tokens each, K = 4: the
//!   drafts after a one-token match kept 0.44 tokens per step, after a
//!   two-token match 1.1, after a three-token match 2.7);
//! - lookahead keeps an n-gram pool in the manner of lookahead decoding
//!   (Fu et al. 2024, "Break the Sequential Dependency of LLM Inference
//!   Using Lookahead Decoding", §3): the verify pass's rows after the
//!   bonus token are one Jacobi iteration of the positions that follow
//!   (each predicted from the drafts before it, right or wrong), so every
//!   n-gram of them goes into a pool keyed by its first token. The next
//!   draft is a prompt-lookup match of two tokens or more, else the pool's
//!   latest n-gram starting with the last token, else a one-token prompt
//!   match, else the Jacobi iterate itself.
//!   Simplified: the paper's separate 2-D lookahead window and its
//!   parallel verification of several pool n-grams need a non-causal
//!   attention mask the split protocol does not carry; here the Jacobi
//!   trajectory comes from the verify branch's rejected tail and one
//!   candidate is verified per step.

use std::collections::{HashMap, VecDeque};

use cipherlora_spec::ngram::PromptLookup;

/// How the client drafts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drafter {
    /// No draft: one token per round trip (the baseline).
    None,
    /// Prompt lookup over the prompt and the output so far (Saxena 2023).
    PromptLookup(PromptLookup),
    /// Prompt lookup with the draft length chosen per step from the match
    /// length ([`Drafter::draft_len`]; up to 2K).
    AdaptivePromptLookup(PromptLookup),
    /// An n-gram pool fed by Jacobi iterates (see the module docs), with
    /// prompt lookup as its fallback.
    Lookahead(Lookahead),
}

/// Parameters of the lookahead drafter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lookahead {
    /// Pool n-gram length N (≥ 2): a hit drafts N − 1 tokens.
    pub n: usize,
    /// N-grams kept per first token (the latest ones).
    pub per_key: usize,
    /// The fallback when the pool has no n-gram for the last token.
    pub fallback: PromptLookup,
}

impl Default for Lookahead {
    /// N = 4, 7 n-grams per key (the paper's G = W = 7 scale), prompt
    /// lookup with n-grams of 3 down to 1 as fallback.
    fn default() -> Self {
        Self {
            n: 4,
            per_key: 7,
            fallback: PromptLookup::default(),
        }
    }
}

impl Default for Drafter {
    /// Prompt lookup with n-grams of 3 down to 1 token.
    fn default() -> Self {
        Self::PromptLookup(PromptLookup::default())
    }
}

impl Drafter {
    /// The most tokens one step drafts with `k`: 2K for
    /// [`Drafter::AdaptivePromptLookup`], K otherwise.
    #[must_use]
    pub fn max_draft(&self, k: usize) -> usize {
        match self {
            Self::AdaptivePromptLookup(_) => 2 * k,
            _ => k,
        }
    }

    /// How many tokens adaptive prompt lookup drafts after a match of `n`
    /// tokens (of at most `max_ngram`) with `k`: none without a match, 2K
    /// for a full-length match, ⌈K·n / max_ngram⌉ for a shorter one.
    #[must_use]
    pub fn draft_len(k: usize, n: usize, max_ngram: usize) -> usize {
        match n {
            0 => 0,
            n if n >= max_ngram => 2 * k,
            n => (k * n).div_ceil(max_ngram.max(1)),
        }
    }

    /// The per-generation drafting state.
    pub(crate) fn start(self) -> DraftState {
        DraftState {
            drafter: self,
            pool: HashMap::new(),
            jacobi: Vec::new(),
        }
    }
}

/// A drafter with what it learned during one generation.
pub(crate) struct DraftState {
    drafter: Drafter,
    /// First token → latest continuations (N − 1 tokens each), newest last.
    pool: HashMap<u32, VecDeque<Vec<u32>>>,
    /// The last verify pass's predictions for the positions after its
    /// bonus token.
    jacobi: Vec<u32>,
}

impl DraftState {
    /// Tokens to follow `context` (possibly none): up to `k`, up to 2K by
    /// the match length for adaptive prompt lookup; never more than `room`.
    pub(crate) fn draft(&self, context: &[u32], k: usize, room: usize) -> Vec<u32> {
        let mut d = match &self.drafter {
            Drafter::None => Vec::new(),
            Drafter::PromptLookup(p) => p.draft(context, k),
            Drafter::AdaptivePromptLookup(p) => {
                let (mut d, n) = p.draft_with_match(context, 2 * k);
                d.truncate(Drafter::draft_len(k, n, p.max_ngram));
                d
            }
            Drafter::Lookahead(l) => {
                // A prompt-lookup match of two tokens or more is text that
                // occurred; a pool n-gram only a guess; a one-token match
                // less than either.
                let strong = PromptLookup {
                    min_ngram: l.fallback.min_ngram.max(2),
                    ..l.fallback
                };
                let pooled = || {
                    context
                        .last()
                        .and_then(|t| self.pool.get(t))
                        .and_then(|grams| grams.back())
                        .cloned()
                };
                let mut d = strong.draft(context, k);
                if d.is_empty() {
                    d = pooled().unwrap_or_default();
                }
                if d.is_empty() {
                    d = l.fallback.draft(context, k);
                }
                if d.is_empty() {
                    d = self.jacobi.clone();
                }
                d
            }
        };
        d.truncate(self.drafter.max_draft(k).min(room));
        d
    }

    /// Learns from a verify pass: `argmax` are its rows from the last
    /// pending token on (row i predicts the token after input i), of which
    /// the first `accepted` matched the drafts and row `accepted` gave the
    /// bonus token.
    pub(crate) fn observe(&mut self, argmax: &[u32], accepted: usize) {
        let Drafter::Lookahead(l) = self.drafter else {
            return;
        };
        let tail = &argmax[accepted.min(argmax.len())..];
        for gram in tail.windows(l.n.max(2)) {
            let grams = self.pool.entry(gram[0]).or_default();
            let cont = gram[1..].to_vec();
            grams.retain(|g| *g != cont);
            grams.push_back(cont);
            while grams.len() > l.per_key.max(1) {
                grams.pop_front();
            }
        }
        self.jacobi = tail.get(1..).map_or_else(Vec::new, <[u32]>::to_vec);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookahead_drafts_from_the_pool_then_prompt_lookup_then_jacobi() {
        let l = Lookahead {
            n: 3,
            per_key: 2,
            fallback: PromptLookup::default(),
        };
        let mut s = Drafter::Lookahead(l).start();
        // Nothing learned, no recurring n-gram: no draft.
        assert!(s.draft(&[1, 2, 3], 4, 9).is_empty());
        // A pass that accepted 1 draft: bonus 7, then the iterate 8, 9, 10.
        s.observe(&[5, 7, 8, 9, 10], 1);
        assert_eq!(s.draft(&[1, 2, 7], 4, 9), vec![8, 9]);
        assert_eq!(s.draft(&[1, 2, 8], 4, 9), vec![9, 10]);
        // No pool entry for 3, no prompt match: the Jacobi iterate.
        assert_eq!(s.draft(&[1, 2, 3], 4, 9), vec![8, 9, 10]);
        // One-token prompt lookup before the iterate.
        assert_eq!(s.draft(&[4, 6, 1, 4], 4, 9), vec![6, 1, 4]);
        // A longer prompt-lookup match before the pool.
        assert_eq!(s.draft(&[7, 8, 5, 7, 8], 4, 9), vec![5, 7, 8]);
        // Newer n-grams win; old ones beyond per_key go.
        s.observe(&[7, 11, 12], 0);
        assert_eq!(s.draft(&[7], 1, 9), vec![11]);
        // Other drafters learn nothing.
        let mut p = Drafter::default().start();
        p.observe(&[5, 7, 8, 9, 10], 1);
        assert!(p.draft(&[1, 2, 7], 4, 9).is_empty());
    }

    #[test]
    fn adaptive_lookup_drafts_by_the_match_length_within_the_room() {
        let s = Drafter::AdaptivePromptLookup(PromptLookup::default()).start();
        let ctx = |tail: &[u32]| {
            let mut c = vec![1, 2, 3, 10, 11, 12, 13, 14, 15, 16, 17, 18];
            c.extend_from_slice(tail);
            c
        };
        // K = 4: a 3-token match drafts 8, a 2-token match 3, a 1-token 2.
        assert_eq!(s.draft(&ctx(&[1, 2, 3]), 4, 99).len(), 8);
        assert_eq!(s.draft(&ctx(&[9, 2, 3]), 4, 99), vec![10, 11, 12]);
        assert_eq!(s.draft(&ctx(&[9, 8, 3]), 4, 99), vec![10, 11]);
        assert!(s.draft(&ctx(&[9, 8, 7]), 4, 99).is_empty());
        // Never beyond the room left.
        assert_eq!(s.draft(&ctx(&[1, 2, 3]), 4, 5).len(), 5);
        assert_eq!(Drafter::draft_len(6, 1, 3), 2);
        assert_eq!(Drafter::draft_len(4, 5, 3), 8);
    }
}

//! Drafters for split generation, none running a model: prompt lookup (Saxena 2023), adaptive
//! prompt lookup ([`cipherlora_speculative::ngram`], drafted through
//! [`ContextDrafter`]), and lookahead decoding ([`crate::lookahead`]). Notes:
//! docs/design/code-notes.md, "split: draft".

use cipherlora_speculative::ContextDrafter;
use cipherlora_speculative::ngram::{AdaptiveLookup, PromptLookup};
use cipherlora_speculative::tree::DraftTree;

use crate::batch::Batch;
use crate::lookahead::{Lookahead, Window};

/// How the client drafts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraftMethod {
    /// No draft: one token per round trip (the baseline).
    None,
    /// Prompt lookup over the prompt and the output so far (Saxena 2023).
    PromptLookup(PromptLookup),
    /// Prompt lookup drafting up to 2K, by the match length ([`AdaptiveLookup`]).
    AdaptivePromptLookup(AdaptiveLookup),
    /// Lookahead decoding (Fu et al. 2024): Jacobi window and n-gram pool as one token tree.
    Lookahead(Lookahead),
}

impl Default for DraftMethod {
    /// Prompt lookup with n-grams of 3 down to 1 token.
    fn default() -> Self {
        Self::PromptLookup(PromptLookup::default())
    }
}

impl DraftMethod {
    /// The most positions one step adds with `k` (2K adaptive, both branches for lookahead, else
    /// K).
    #[must_use]
    pub fn max_draft(&self, k: usize) -> usize {
        match (self, self.context_drafter()) {
            (Self::Lookahead(l), _) => l.max_verify_nodes(k) + l.branch_nodes(),
            (_, Some(chain)) => chain.max_drafts(k),
            (_, None) => k,
        }
    }

    /// The chain drafter ([`ContextDrafter`]) of prompt lookup and adaptive prompt lookup.
    #[must_use]
    pub fn context_drafter(&self) -> Option<&dyn ContextDrafter> {
        match self {
            Self::PromptLookup(p) => Some(p),
            Self::AdaptivePromptLookup(a) => Some(a),
            Self::None | Self::Lookahead(_) => None,
        }
    }

    /// The per-generation drafting state.
    pub(crate) fn start(self) -> DraftState {
        match self {
            Self::Lookahead(l) => DraftState::Lookahead(Window::new(l)),
            other => DraftState::Chain(other),
        }
    }
}

/// A drafter with what it learned during one generation.
pub(crate) enum DraftState {
    /// Chain drafters (none, prompt lookup, adaptive prompt lookup): they learn nothing.
    Chain(DraftMethod),
    /// Lookahead decoding's window and pool.
    Lookahead(Window),
}

impl DraftState {
    /// Whether passes are token trees (lookahead), verified and compacted as such.
    pub(crate) fn is_tree(&self) -> bool {
        matches!(self, Self::Lookahead(_))
    }

    /// Tokens to follow `context` as a chain (≤ `room`); lookahead: its batch's nodes.
    #[cfg(test)]
    pub(crate) fn draft(&mut self, context: &[u32], k: usize, room: usize) -> Vec<u32> {
        self.batch(context, k, room).tree.tokens
    }

    /// The next pass's nodes after `context` (last token pending), at most `room` accepted.
    pub(crate) fn batch(&mut self, context: &[u32], k: usize, room: usize) -> Batch {
        match self {
            Self::Chain(d) => {
                let mut drafts = d
                    .context_drafter()
                    .map_or_else(Vec::new, |chain| chain.draft(context, k));
                drafts.truncate(d.max_draft(k).min(room));
                Batch {
                    verify: drafts.len(),
                    tree: DraftTree::chain(&drafts),
                    level_rows: Vec::new(),
                }
            }
            Self::Lookahead(w) => w.batch(context, k, room),
        }
    }

    /// Learns from a lookahead pass: the next level, drafts `accepted`, and the new `context`.
    pub(crate) fn observe(&mut self, new_level: &[u32], accepted: usize, context: &[u32]) {
        if let Self::Lookahead(w) = self {
            w.observe(new_level, accepted, context);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_drafters_learn_nothing_and_stay_chains() {
        let mut p = DraftMethod::default().start();
        assert!(!p.is_tree());
        p.observe(&[5, 7, 8], 1, &[1, 2, 7]);
        assert!(p.draft(&[1, 2, 7], 4, 9).is_empty());
        let b = p.batch(&[1, 2, 3, 1, 2], 4, 2);
        assert_eq!((b.tree, b.verify), (DraftTree::chain(&[3, 1]), 2));
        assert!(b.level_rows.is_empty());
        assert!(DraftMethod::None.start().draft(&[1, 1, 1], 4, 9).is_empty());
        assert!(
            DraftMethod::Lookahead(Lookahead::default())
                .start()
                .is_tree()
        );
        let l = Lookahead {
            window: 4,
            n: 4,
            max_ngrams: 5,
            ..Lookahead::default()
        };
        // Both branches: G·(N − 1) + K verification nodes and the lookahead window.
        assert_eq!(DraftMethod::Lookahead(l).max_draft(4), 15 + 4 + 11);
        assert_eq!(
            DraftMethod::AdaptivePromptLookup(AdaptiveLookup::default()).max_draft(4),
            8
        );
        assert_eq!(DraftMethod::default().max_draft(4), 4);
        let bad = Lookahead {
            n: 1,
            ..Lookahead::default()
        };
        assert!(bad.validate().is_err());
        let bad = Lookahead {
            window: 0,
            ..Lookahead::default()
        };
        assert!(bad.validate().is_err());
        assert!(Lookahead::default().validate().is_ok());
        let l: Lookahead = "4, 3,2".parse().unwrap();
        assert_eq!((l.window, l.n, l.max_ngrams), (4, 3, 2));
        assert_eq!(l.to_string(), "4,3,2");
        for bad in ["4,3", "4,1,2", "0,3,2", "a,3,2", "1,2,3,4"] {
            assert!(bad.parse::<Lookahead>().is_err(), "{bad}");
        }
    }

    #[test]
    fn adaptive_lookup_drafts_by_the_match_length_within_the_room() {
        let mut s = DraftMethod::AdaptivePromptLookup(AdaptiveLookup::default()).start();
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
        assert_eq!(AdaptiveLookup::draft_len(6, 1, 3), 2);
        assert_eq!(AdaptiveLookup::draft_len(4, 5, 3), 8);
    }
}

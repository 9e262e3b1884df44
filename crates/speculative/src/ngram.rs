//! Prompt-lookup (n-gram) drafting (Saxena 2023): propose the tokens that followed the most recent
//! earlier occurrence of the context's last n tokens (n from `max_ngram` down to `min_ngram`).
//! Free, but rarely matching on fresh text. [`AdaptiveLookup`] drafts longer after longer matches.

use crate::context_drafter::ContextDrafter;

/// Prompt-lookup drafter configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptLookup {
    /// Longest suffix length tried first.
    pub max_ngram: usize,
    /// Shortest suffix length still accepted as a match (≥ 1).
    pub min_ngram: usize,
}

impl PromptLookup {
    /// N-grams of 3 down to 1 token.
    pub const DEFAULT: Self = Self {
        max_ngram: 3,
        min_ngram: 1,
    };
}

impl Default for PromptLookup {
    /// [`PromptLookup::DEFAULT`].
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl ContextDrafter for PromptLookup {
    /// Up to `k` tokens to follow `context`, fewer (or none) near its end or without a match;
    /// O(len(context) · max_ngram).
    fn draft(&self, context: &[u32], k: usize) -> Vec<u32> {
        self.draft_with_match(context, k).0
    }
}

impl PromptLookup {
    /// [`ContextDrafter::draft`] and the matched suffix length (0: none).
    #[must_use]
    pub fn draft_with_match(&self, context: &[u32], k: usize) -> (Vec<u32>, usize) {
        let min = self.min_ngram.max(1);
        for n in (min..=self.max_ngram).rev() {
            if context.len() <= n {
                continue;
            }
            let suffix = &context[context.len() - n..];
            // Latest earlier occurrence whose continuation is non-empty.
            let found = (0..context.len() - n)
                .rev()
                .find(|&start| &context[start..start + n] == suffix);
            if let Some(start) = found {
                let from = start + n;
                let to = (from + k).min(context.len());
                return (context[from..to].to_vec(), n);
            }
        }
        (Vec::new(), 0)
    }
}

/// Prompt lookup that drafts by the strength of its match: up to 2K tokens
/// after a match of `max_ngram` tokens, ⌈K·n / max_ngram⌉ after a match of n.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AdaptiveLookup(pub PromptLookup);

impl AdaptiveLookup {
    /// Tokens drafted after an `n`-token match: 0, 2K if full, else ⌈K·n / max_ngram⌉.
    #[must_use]
    pub fn draft_len(k: usize, n: usize, max_ngram: usize) -> usize {
        match n {
            0 => 0,
            n if n >= max_ngram => 2 * k,
            n => (k * n).div_ceil(max_ngram.max(1)),
        }
    }
}

impl ContextDrafter for AdaptiveLookup {
    fn draft(&self, context: &[u32], k: usize) -> Vec<u32> {
        let (mut drafts, n) = self.0.draft_with_match(context, 2 * k);
        drafts.truncate(Self::draft_len(k, n, self.0.max_ngram));
        drafts
    }

    fn max_drafts(&self, k: usize) -> usize {
        2 * k
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_the_continuation_of_the_latest_match() {
        let ctx = [1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3];
        let d = PromptLookup::default().draft(&ctx, 2);
        assert_eq!(d, vec![7, 8]);
    }

    #[test]
    fn falls_back_to_shorter_ngrams() {
        let ctx = [4, 5, 6, 1, 2, 9, 5];
        // "9 5" and "2 9 5" never occurred before; "5" did, followed by 6, 1.
        assert_eq!(PromptLookup::default().draft(&ctx, 2), vec![6, 1]);
    }

    #[test]
    fn reports_the_length_of_the_suffix_that_matched() {
        let p = PromptLookup::default();
        assert_eq!(p.draft_with_match(&[1, 2, 3, 9, 1, 2, 3], 1), (vec![9], 3));
        assert_eq!(
            p.draft_with_match(&[4, 5, 6, 1, 2, 9, 5], 2),
            (vec![6, 1], 1)
        );
        assert_eq!(p.draft_with_match(&[1, 2, 3, 4], 4), (vec![], 0));
    }

    #[test]
    fn no_match_gives_no_draft() {
        assert!(PromptLookup::default().draft(&[1, 2, 3, 4], 4).is_empty());
        assert!(PromptLookup::default().draft(&[], 4).is_empty());
    }

    #[test]
    fn continuation_is_cut_at_the_context_end() {
        let ctx = [1, 2, 1];
        assert_eq!(PromptLookup::default().draft(&ctx, 5), vec![2, 1]);
    }
}

//! Drafters for split generation: proposals verified K+1 positions per
//! round trip. They cost no model pass (the client holds only a few
//! layers): prompt lookup copies the continuation of an earlier
//! occurrence of the context's last n-gram (`cipherlora_spec::ngram`).

use cipherlora_spec::ngram::PromptLookup;

/// How the client drafts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drafter {
    /// No draft: one token per round trip (the baseline).
    None,
    /// Prompt lookup over the prompt and the output so far (Saxena 2023).
    PromptLookup(PromptLookup),
}

impl Drafter {
    /// Up to `k` tokens to follow `context` (possibly none).
    #[must_use]
    pub fn draft(&self, context: &[u32], k: usize) -> Vec<u32> {
        match self {
            Self::None => Vec::new(),
            Self::PromptLookup(p) => p.draft(context, k),
        }
    }
}

impl Default for Drafter {
    /// Prompt lookup with n-grams of 3 down to 1 token.
    fn default() -> Self {
        Self::PromptLookup(PromptLookup::default())
    }
}

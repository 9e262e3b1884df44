//! A drafter of controlled acceptance for models whose own drafts mean
//! nothing (random weights at a real model's shape): it proposes the
//! reference continuation (the plaintext adapted model's greedy tokens),
//! each drafted token kept right with probability `acceptance` and replaced
//! by another token otherwise, so a round accepts what a real drafter of
//! that per-token acceptance would. Benchmarks that use it say so; the
//! verifier still decides every token, so the output stays exact.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::context_drafter::ContextDrafter;
use crate::{ConfigError, SpecError};

/// The reference continuation and the per-token acceptance to replay it at.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayDrafts {
    /// Tokens of the prompt the continuation follows.
    pub prompt_len: usize,
    /// The reference continuation (greedy tokens of the plaintext adapted model).
    pub continuation: Vec<u32>,
    /// Probability that each drafted token is the reference one, in [0, 1].
    pub acceptance: f64,
    /// Seed of the per-position draws (the same position always draws the same).
    pub seed: u64,
    /// Vocabulary size: a wrong draft is another token below it.
    pub vocab_size: usize,
}

impl ReplayDrafts {
    /// Checks the fields. Errors: [`ConfigError::ReplayAcceptance`] for an acceptance outside [0, 1] or a
    /// vocabulary of fewer than two tokens.
    pub fn validate(&self) -> Result<(), SpecError> {
        if !(0.0..=1.0).contains(&self.acceptance) {
            return Err(ConfigError::ReplayAcceptance {
                acceptance: self.acceptance,
            }
            .into());
        }
        if self.vocab_size < 2 {
            return Err(ConfigError::ReplayVocabulary {
                vocab: self.vocab_size,
            }
            .into());
        }
        Ok(())
    }

    /// Up to `k` drafts after a context of `context_len` tokens: the reference tokens from there,
    /// each right with probability `acceptance` (drawn per position from `seed`); none past the
    /// end of the continuation.
    #[must_use]
    pub fn draft_at(&self, context_len: usize, k: usize) -> Vec<u32> {
        let start = context_len.saturating_sub(self.prompt_len);
        self.continuation
            .iter()
            .enumerate()
            .skip(start)
            .take(k)
            .map(|(pos, &want)| {
                let mut rng = ChaCha8Rng::seed_from_u64(self.seed ^ (pos as u64).rotate_left(32));
                if rng.random_bool(self.acceptance) {
                    want
                } else {
                    let other = rng.random_range(1..self.vocab_size as u32);
                    (want + other) % self.vocab_size as u32
                }
            })
            .collect()
    }
}

impl ContextDrafter for ReplayDrafts {
    /// [`ReplayDrafts::draft_at`] the context's length.
    fn draft(&self, context: &[u32], k: usize) -> Vec<u32> {
        self.draft_at(context.len(), k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replay(acceptance: f64) -> ReplayDrafts {
        ReplayDrafts {
            prompt_len: 3,
            continuation: (100..2100).collect(),
            acceptance,
            seed: 9,
            vocab_size: 50_000,
        }
    }

    #[test]
    fn drafts_follow_the_reference_at_the_asked_rate() {
        assert_eq!(replay(1.0).draft_at(3, 4), vec![100, 101, 102, 103]);
        assert_eq!(replay(1.0).draft_at(5, 2), vec![102, 103]);
        assert!(
            replay(0.0)
                .draft_at(3, 8)
                .iter()
                .zip(100..)
                .all(|(&d, w)| d != w)
        );
        let r = replay(0.8);
        let right = r
            .draft_at(3, 2000)
            .iter()
            .zip(100..)
            .filter(|(d, w)| **d == *w)
            .count();
        assert!((1500..1700).contains(&right), "{right} of 2000");
        // The same position draws the same, however the window starts.
        assert_eq!(r.draft_at(10, 3), r.draft_at(9, 4)[1..].to_vec());
        assert!(r.draft_at(3 + 2000, 4).is_empty());
    }

    #[test]
    fn a_bad_acceptance_is_refused() {
        assert!(replay(1.5).validate().is_err());
        assert!(replay(-0.1).validate().is_err());
        assert!(replay(0.7).validate().is_ok());
    }
}

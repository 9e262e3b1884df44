//! Which tokens a verify pass keeps: greedy acceptance, or exact
//! speculative sampling for deterministic drafts.
//!
//! Every split drafter (prompt lookup, the lookahead pool, none) proposes
//! tokens deterministically from the context: its draft distribution is a
//! point mass. Speculative sampling (Leviathan et al. 2023, "Fast Inference
//! from Transformers via Speculative Decoding", Algorithm 1; Chen et al.
//! 2023, "Accelerating Large Language Model Decoding with Speculative
//! Sampling", Algorithm 2) with q = δ_x accepts a draft x with probability
//! p(x) and on rejection draws from p with x removed and renormalised,
//! norm(max(0, p − δ_x)); after K accepted drafts the bonus token comes
//! from p. The tokens are then distributed exactly as sampling the model one
//! token at a time (`cipherlora_spec::acceptance::accept_sampled`, shared
//! with private generation).

use cipherlora_spec::acceptance::{DraftProbs, RoundOutcome, accept_sampled};
use rand_chacha::ChaCha20Rng;

use crate::SplitError;

/// Exact speculative sampling of point-mass drafts (see the module docs).
///
/// `drafts`: K tokens; `probs`: the K+1 target distributions (row i
/// predicts the token after the i-th input of the pass, from the last
/// pending token on), each summing to 1 over the vocabulary.
///
/// # Errors
/// [`SplitError::Spec`] for inconsistent inputs (row count, a row that is
/// not a distribution, a draft outside the vocabulary).
pub(crate) fn exact(
    drafts: &[u32],
    probs: &[Vec<f32>],
    rng: &mut ChaCha20Rng,
) -> Result<RoundOutcome, SplitError> {
    Ok(accept_sampled(drafts, DraftProbs::PointMass, probs, rng)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn a_certain_draft_is_kept_and_an_impossible_one_replaced() {
        let mut rng = ChaCha20Rng::seed_from_u64(1);
        let p = vec![vec![0.0f32, 1.0], vec![1.0, 0.0]];
        let out = exact(&[1], &p, &mut rng).unwrap();
        assert_eq!(out.tokens, vec![1, 0]);
        let out = exact(&[0], &p, &mut rng).unwrap();
        assert_eq!((out.accepted, out.tokens), (0, vec![1]));
        assert!(matches!(
            exact(&[0, 1], &p, &mut rng),
            Err(SplitError::Spec(_))
        ));
    }
}

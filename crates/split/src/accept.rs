//! Which tokens a verify pass keeps: greedy acceptance, or exact speculative sampling (Leviathan et
//! al. 2023, Algorithm 1; Chen et al. 2023, Algorithm 2) of point-mass drafts: accept x with p(x),
//! else draw from norm(max(0, p − δ_x)).

use cipherlora_speculative::acceptance::{DraftProbs, RoundOutcome, accept_sampled};
use rand_chacha::ChaCha20Rng;

use crate::SplitError;

/// Exact speculative sampling of point-mass `drafts` (K) against `probs`, the K+1 target
/// distributions from the last pending token on. Errors: [`SplitError::Spec`] for inconsistent
/// inputs (row count, a row that is no distribution, a draft outside the vocabulary).
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

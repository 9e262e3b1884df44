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

use cipherlora_model::Sampler;
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

/// The sampler's distributions (penalty, temperature, top-k, top-p) of the
/// verify rows `logits` (K+1 rows × vocab): row i's history is `context`
/// followed by the first i drafts, the tokens it would follow in
/// one-token-at-a-time sampling.
pub(crate) fn target_probs(
    sampler: &Sampler,
    logits: &[Vec<f32>],
    context: &[u32],
    drafts: &[u32],
) -> Vec<Vec<f32>> {
    let mut history = context.to_vec();
    let mut out = Vec::with_capacity(logits.len());
    for (i, row) in logits.iter().enumerate() {
        out.push(sampler.probs(row, &history));
        if let Some(&d) = drafts.get(i) {
            history.push(d);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use cipherlora_model::SamplingParams;
    use rand::SeedableRng;

    #[test]
    fn target_rows_see_the_drafts_before_them() {
        // A repetition penalty makes each row depend on its history.
        let sampler = Sampler::new(SamplingParams {
            temperature: 1.0,
            repetition_penalty: 4.0,
            ..SamplingParams::default()
        })
        .unwrap();
        let logits = vec![vec![1.0f32, 1.0, 1.0]; 3];
        let p = target_probs(&sampler, &logits, &[0], &[1, 2]);
        // Row 0 penalises 0; row 1 also 1; row 2 also 2 (uniform again).
        assert!(p[0][0] < p[0][1] && (p[0][1] - p[0][2]).abs() < 1e-6);
        assert!(p[1][1] < p[1][2] && (p[1][0] - p[1][1]).abs() < 1e-6);
        assert!((p[2][0] - p[2][2]).abs() < 1e-6);
    }

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

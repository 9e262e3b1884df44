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
use cipherlora_spec::tree::DraftTree;
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

/// The sampler's distributions of a tree's verify rows `logits` (row 0:
/// the root, the last pending token; row i + 1: node i): each row's
/// history is `context` followed by the tokens on the path from the root
/// to its node, as in one-token-at-a-time sampling along that path.
pub(crate) fn tree_target_probs(
    sampler: &Sampler,
    logits: &[Vec<f32>],
    context: &[u32],
    tree: &DraftTree,
) -> Vec<Vec<f32>> {
    let mut paths: Vec<Vec<u32>> = Vec::with_capacity(tree.len());
    let mut out = Vec::with_capacity(logits.len());
    for (row, l) in logits.iter().enumerate() {
        let mut history = context.to_vec();
        if let Some(node) = row.checked_sub(1) {
            let mut path = tree.parents[node].map_or_else(Vec::new, |p| paths[p].clone());
            path.push(tree.tokens[node]);
            history.extend_from_slice(&path);
            paths.push(path);
        }
        out.push(sampler.probs(l, &history));
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
    fn tree_rows_see_their_own_path_only() {
        let sampler = Sampler::new(SamplingParams {
            temperature: 1.0,
            repetition_penalty: 4.0,
            ..SamplingParams::default()
        })
        .unwrap();
        // root -> {node 0: 1, node 1: 2}, node 0 -> node 2: 3.
        let tree = DraftTree {
            tokens: vec![1, 2, 3],
            parents: vec![None, None, Some(0)],
        };
        let logits = vec![vec![1.0f32; 4]; 4];
        let p = tree_target_probs(&sampler, &logits, &[0], &tree);
        let chain = target_probs(&sampler, &logits[..1], &[0], &[]);
        assert_eq!(p[0], chain[0]);
        // Node 1 (token 2) does not see node 0 (token 1).
        assert!(p[2][2] < p[2][3] && (p[2][1] - p[2][3]).abs() < 1e-6);
        // Node 2 sees 0, 1 and 3 penalised, 2 not.
        assert!(p[3][1] < p[3][2] && p[3][3] < p[3][2] && (p[3][0] - p[3][1]).abs() < 1e-6);
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

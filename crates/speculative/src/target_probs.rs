//! The target's sampling distributions of a verify pass's rows, each after the sampling transforms
//! over its own history. Shared by the private decoder and split inference.

use cipherlora_model::Sampler;

use crate::tree::DraftTree;

/// The distributions of a chain round's verify rows `logits` (K + 1 rows × vocab): row i's history
/// is `context` followed by the first i drafts.
#[must_use]
pub fn chain_probs(
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

/// The distributions of a tree round's rows `logits` (row 0: root; i + 1: node i), each row's
/// history `context` plus its root path; padding rows left out.
#[must_use]
pub fn tree_probs(
    sampler: &Sampler,
    logits: &[Vec<f32>],
    context: &[u32],
    tree: &DraftTree,
) -> Vec<Vec<f32>> {
    logits
        .iter()
        .take(tree.len() + 1)
        .enumerate()
        .map(|(row, l)| {
            let mut history = context.to_vec();
            history.extend(tree.path_to(row.checked_sub(1)));
            sampler.probs(l, &history)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cipherlora_model::SamplingParams;

    fn penalising() -> Sampler {
        // A repetition penalty makes each row depend on its history.
        Sampler::new(SamplingParams {
            temperature: 1.0,
            repetition_penalty: 4.0,
            ..SamplingParams::default()
        })
        .unwrap()
    }

    #[test]
    fn chain_rows_see_the_drafts_before_them() {
        let logits = vec![vec![1.0f32, 1.0, 1.0]; 3];
        let p = chain_probs(&penalising(), &logits, &[0], &[1, 2]);
        // Row 0 penalises 0; row 1 also 1; row 2 also 2 (uniform again).
        assert!(p[0][0] < p[0][1] && (p[0][1] - p[0][2]).abs() < 1e-6);
        assert!(p[1][1] < p[1][2] && (p[1][0] - p[1][1]).abs() < 1e-6);
        assert!((p[2][0] - p[2][2]).abs() < 1e-6);
    }

    #[test]
    fn tree_rows_see_their_own_path_only() {
        let sampler = penalising();
        // root -> {node 0: 1, node 1: 2}, node 0 -> node 2: 3.
        let tree = DraftTree {
            tokens: vec![1, 2, 3],
            parents: vec![None, None, Some(0)],
        };
        let logits = vec![vec![1.0f32; 4]; 4];
        let p = tree_probs(&sampler, &logits, &[0], &tree);
        let chain = chain_probs(&sampler, &logits[..1], &[0], &[]);
        assert_eq!(p[0], chain[0]);
        // Node 1 (token 2) does not see node 0 (token 1).
        assert!(p[2][2] < p[2][3] && (p[2][1] - p[2][3]).abs() < 1e-6);
        // Node 2 sees 0, 1 and 3 penalised, 2 not.
        assert!(p[3][1] < p[3][2] && p[3][3] < p[3][2] && (p[3][0] - p[3][1]).abs() < 1e-6);
    }
}

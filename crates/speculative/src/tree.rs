//! Token trees: candidate continuations verified in one pass under a tree mask (SpecInfer, Miao et
//! al. 2024, §3-4; EAGLE-2, Li et al. 2024, §4), accepted greedily or by exact multi-draft
//! speculative sampling (Jeon et al. 2024, §3). Notes: docs/design/code-notes.md, "spec: tree".

use rand::{Rng, RngExt};

use crate::acceptance::{check_distribution, sample_weights};
use crate::{SpecError, TreeFault};

/// A draft tree: `n` nodes in level order, siblings most likely first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraftTree {
    /// Drafted token of each node.
    pub tokens: Vec<u32>,
    /// Parent of each node (`None`: the root, the last verified token); always earlier.
    pub parents: Vec<Option<usize>>,
}

impl DraftTree {
    /// A chain: node i's parent is node i − 1.
    #[must_use]
    pub fn chain(tokens: &[u32]) -> Self {
        Self {
            tokens: tokens.to_vec(),
            parents: (0..tokens.len()).map(|i| i.checked_sub(1)).collect(),
        }
    }

    /// Number of nodes (the root excluded).
    #[must_use]
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the tree has no node.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Depth of the deepest node (1 for children of the root; 0 if empty).
    #[must_use]
    pub fn depth(&self) -> usize {
        let mut depth = vec![0usize; self.len()];
        for (i, p) in self.parents.iter().enumerate() {
            depth[i] = p.map_or(1, |p| depth[p] + 1);
        }
        depth.into_iter().max().unwrap_or(0)
    }

    /// The tokens from the root to `node` (`None`: none), root first. Panics if out of range.
    #[must_use]
    pub fn path_to(&self, node: Option<usize>) -> Vec<u32> {
        let mut path = Vec::new();
        let mut at = node;
        while let Some(n) = at {
            path.push(self.tokens[n]);
            at = self.parents[n];
        }
        path.reverse();
        path
    }

    /// Checks the parent array. Errors: [`SpecError::Tree`] naming the first bad node.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.parents.len() != self.tokens.len() {
            return Err(TreeFault::ParentCount {
                tokens: self.tokens.len(),
                parents: self.parents.len(),
            }
            .into());
        }
        match self
            .parents
            .iter()
            .enumerate()
            .find(|&(i, p)| p.is_some_and(|p| p >= i))
        {
            Some((node, _)) => Err(TreeFault::ParentNotEarlier { node }.into()),
            None => Ok(()),
        }
    }

    /// Children of each verify row (entry 0: the root's; `i + 1`: node i's).
    #[must_use]
    pub fn children(&self) -> Vec<Vec<usize>> {
        let mut children = vec![Vec::new(); self.len() + 1];
        for (i, p) in self.parents.iter().enumerate() {
            children[p.map_or(0, |p| p + 1)].push(i);
        }
        children
    }

    /// The parents of the verify pass `[root, nodes…, fillers…]` of `width` positions. Errors:
    /// [`TreeFault::TooWide`] when the tree does not fit.
    pub fn verify_parents(&self, width: usize) -> Result<Vec<Option<usize>>, SpecError> {
        if self.len() + 1 > width.max(1) {
            return Err(TreeFault::TooWide {
                nodes: self.len(),
                width,
            }
            .into());
        }
        let mut parents = Vec::with_capacity(width);
        parents.push(None);
        parents.extend(self.parents.iter().map(|p| Some(p.map_or(0, |p| p + 1))));
        parents.resize(width.max(1), Some(0));
        Ok(parents)
    }
}

/// What a tree round keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeOutcome {
    /// The accepted nodes, root to leaf (node `path[d]` has depth d + 1).
    pub path: Vec<usize>,
    /// The accepted nodes' tokens, then the target's token (`path.len() + 1`).
    pub tokens: Vec<u32>,
}

/// The verify rows of a root-to-node `path`: 0, then n + 1 for node n.
pub fn path_rows(path: &[usize]) -> Vec<usize> {
    std::iter::once(0)
        .chain(path.iter().map(|&n| n + 1))
        .collect()
}

/// Greedy tree acceptance along argmax children, within `max_rows` certified rows. Errors:
/// [`SpecError::TargetCount`].
pub fn accept_tree_greedy(
    tree: &DraftTree,
    argmax: &[u32],
    max_rows: usize,
) -> Result<TreeOutcome, SpecError> {
    check_rows(tree, argmax.len())?;
    let children = tree.children();
    let mut path = Vec::new();
    let mut row = 0;
    while path.len() + 1 < max_rows.max(1) {
        let want = argmax[row];
        match children[row].iter().find(|&&c| tree.tokens[c] == want) {
            Some(&c) => {
                path.push(c);
                row = c + 1;
            }
            None => break,
        }
    }
    let mut tokens: Vec<u32> = path.iter().map(|&c| tree.tokens[c]).collect();
    tokens.push(argmax[row]);
    Ok(TreeOutcome { path, tokens })
}

/// Exact multi-draft speculative sampling over deterministic drafts: accept child x with p'(x)
/// (rejected children removed, renormalised), else sample the residual; `target_probs[r]`: row r's
/// distribution. Errors: [`SpecError::TargetCount`], `BadDistribution`, `TokenOutOfVocab`.
pub fn accept_tree_sampled<R: Rng + ?Sized>(
    tree: &DraftTree,
    target_probs: &[Vec<f32>],
    rng: &mut R,
) -> Result<TreeOutcome, SpecError> {
    accept_tree_sampled_with(tree, target_probs, &vec![None; tree.len()], rng)
}

/// [`accept_tree_sampled`] with drawn nodes (`proposals[n]`, first children only), accepted with
/// min(1, p'(x)/q(x)), rejection leaving max(0, p' − q). Errors: as `accept_tree_sampled`;
/// [`SpecError::Tree`], `BadDistribution` for bad proposals.
pub fn accept_tree_sampled_with<R: Rng + ?Sized>(
    tree: &DraftTree,
    target_probs: &[Vec<f32>],
    proposals: &[Option<&[f32]>],
    rng: &mut R,
) -> Result<TreeOutcome, SpecError> {
    check_rows(tree, target_probs.len())?;
    if proposals.len() != tree.len() {
        return Err(TreeFault::ProposalCount {
            got: proposals.len(),
            nodes: tree.len(),
        }
        .into());
    }
    let vocab = target_probs[0].len();
    for (row, p) in target_probs.iter().enumerate() {
        check_distribution(row, p, vocab)?;
    }
    if let Some((index, &token)) = tree
        .tokens
        .iter()
        .enumerate()
        .find(|&(_, &t)| t as usize >= vocab)
    {
        return Err(SpecError::TokenOutOfVocab {
            index,
            token,
            vocab,
        });
    }
    let children = tree.children();
    for (c, q) in proposals.iter().enumerate() {
        let Some(q) = q else { continue };
        let row = tree.parents[c].map_or(0, |p| p + 1);
        if children[row].first() != Some(&c) {
            return Err(TreeFault::SampledNotFirstChild { node: c }.into());
        }
        check_distribution(row, q, vocab)?;
        if q[tree.tokens[c] as usize] <= 0.0 {
            return Err(SpecError::BadDistribution {
                row,
                reason: "a sampled draft's token has no probability under its proposal",
            });
        }
    }
    let mut path = Vec::new();
    let mut row = 0;
    'rows: loop {
        let p = &target_probs[row];
        // The residual p' as weights w over the vocabulary, of total mass.
        let mut w: Vec<f64> = p.iter().map(|&x| f64::from(x)).collect();
        let mut mass: f64 = w.iter().sum();
        for &c in &children[row] {
            let x = tree.tokens[c] as usize;
            match proposals[c] {
                // A drawn child: accept with min(1, p'(x)/q(x)); a rejection leaves max(0, p' − q).
                Some(q) => {
                    if w[x] > 0.0 && rng.random::<f64>() * f64::from(q[x]) * mass < w[x] {
                        path.push(c);
                        row = c + 1;
                        continue 'rows;
                    }
                    for (wt, &qt) in w.iter_mut().zip(q) {
                        *wt = (*wt / mass - f64::from(qt)).max(0.0);
                    }
                    mass = w.iter().sum();
                }
                // A chosen child: accept with p'(x).
                None => {
                    if w[x] <= 0.0 {
                        continue; // e.g. a duplicate sibling: p'(x) is 0 now.
                    }
                    if rng.random::<f64>() * mass < w[x] {
                        path.push(c);
                        row = c + 1;
                        continue 'rows;
                    }
                    mass -= w[x];
                    w[x] = 0.0;
                }
            }
            if mass <= 0.0 {
                break;
            }
        }
        // Only rounding leaves no mass outside rejected children; then sample the row itself.
        let token = if mass > 0.0 && w.iter().any(|&x| x > 0.0) {
            sample_weights(vocab, |t| w[t], rng)
        } else {
            sample_weights(vocab, |t| f64::from(p[t]), rng)
        };
        let mut tokens: Vec<u32> = path.iter().map(|&c| tree.tokens[c]).collect();
        tokens.push(token);
        return Ok(TreeOutcome { path, tokens });
    }
}

fn check_rows(tree: &DraftTree, rows: usize) -> Result<(), SpecError> {
    tree.validate()?;
    if rows == tree.len() + 1 {
        Ok(())
    } else {
        Err(SpecError::TargetCount {
            drafts: tree.len(),
            got: rows,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// root -> {0: 5, 1: 6}, 0 -> {2: 7, 3: 8}, 1 -> {4: 9}
    fn tree() -> DraftTree {
        DraftTree {
            tokens: vec![5, 6, 7, 8, 9],
            parents: vec![None, None, Some(0), Some(0), Some(1)],
        }
    }

    #[test]
    fn greedy_follows_the_argmax_through_the_tree() {
        let t = tree();
        // Root picks 6 (node 1), node 1 picks 9 (node 4), node 4 picks 3.
        let out = accept_tree_greedy(&t, &[6, 0, 9, 0, 0, 3], usize::MAX).unwrap();
        assert_eq!(out.path, vec![1, 4]);
        assert_eq!(out.tokens, vec![6, 9, 3]);
        // Root picks 5, node 0 picks 8 (node 3), whose row says 1.
        let out = accept_tree_greedy(&t, &[5, 8, 0, 0, 1, 0], usize::MAX).unwrap();
        assert_eq!((out.path, out.tokens), (vec![0, 3], vec![5, 8, 1]));
        // No child matches: only the root's token.
        let out = accept_tree_greedy(&t, &[4, 0, 0, 0, 0, 0], usize::MAX).unwrap();
        assert_eq!((out.path, out.tokens), (vec![], vec![4]));
        // Two certified rows: the walk stops at node 0, whose argmax ends the round.
        let out = accept_tree_greedy(&t, &[5, 8, 0, 0, 1, 0], 2).unwrap();
        assert_eq!((out.path, out.tokens), (vec![0], vec![5, 8]));
    }

    #[test]
    fn a_chain_tree_accepts_like_a_chain() {
        let drafts = [3, 4, 5, 6];
        let argmax = [3, 4, 9, 6, 1];
        let chain = crate::acceptance::accept_greedy(&drafts, &argmax).unwrap();
        let tree = accept_tree_greedy(&DraftTree::chain(&drafts), &argmax, usize::MAX).unwrap();
        assert_eq!(tree.tokens, chain.tokens);
        assert_eq!(tree.path.len(), chain.accepted);
    }

    #[test]
    fn paths_walk_from_the_root_to_the_node() {
        let t = tree();
        assert_eq!(t.path_to(None), Vec::<u32>::new());
        assert_eq!(t.path_to(Some(1)), vec![6]);
        assert_eq!(t.path_to(Some(3)), vec![5, 8]);
        assert_eq!(t.path_to(Some(4)), vec![6, 9]);
        assert_eq!(DraftTree::chain(&[1, 2, 3]).path_to(Some(2)), vec![1, 2, 3]);
    }

    #[test]
    fn verify_layout_shifts_nodes_and_pads_off_the_root() {
        let t = tree();
        assert_eq!(
            t.verify_parents(8).unwrap(),
            vec![
                None,
                Some(0),
                Some(0),
                Some(1),
                Some(1),
                Some(2),
                Some(0),
                Some(0)
            ]
        );
        assert!(t.verify_parents(5).is_err());
        assert_eq!(t.depth(), 2);
        assert_eq!(DraftTree::chain(&[1, 2, 3]).depth(), 3);
    }

    #[test]
    fn bad_trees_and_row_counts_are_typed_errors() {
        let mut t = tree();
        assert!(matches!(
            accept_tree_greedy(&t, &[0; 5], 9),
            Err(SpecError::TargetCount { drafts: 5, got: 5 })
        ));
        t.parents[2] = Some(3);
        assert!(matches!(
            t.validate(),
            Err(SpecError::Tree(TreeFault::ParentNotEarlier { node: 2 }))
        ));
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let p = vec![vec![0.5f32, 0.5]; 6];
        assert!(matches!(
            accept_tree_sampled(&tree(), &p, &mut rng),
            Err(SpecError::TokenOutOfVocab { .. })
        ));
    }

    /// Malformed proposals are typed errors and nothing is sampled.
    #[test]
    fn bad_proposals_are_typed_errors() {
        let t = tree(); // root -> {0, 1}, 0 -> {2, 3}, 1 -> {4: token 9}
        let p = vec![vec![0.1f32; 10]; 6];
        let q = vec![0.1f32; 10];
        let mut no_nine = q.clone();
        (no_nine[9], no_nine[8]) = (0.0, 0.2);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let mut with =
            |proposals: &[Option<&[f32]>]| accept_tree_sampled_with(&t, &p, proposals, &mut rng);
        assert!(matches!(
            with(&[None; 4]),
            Err(SpecError::Tree(TreeFault::ProposalCount {
                got: 4,
                nodes: 5
            }))
        ));
        // Node 1 is the root's second child.
        let second = [None, Some(&q[..]), None, None, None];
        assert!(matches!(
            with(&second),
            Err(SpecError::Tree(TreeFault::SampledNotFirstChild { node: 1 }))
        ));
        // Node 4's proposal gives its token (9) nothing.
        let no_mass = [Some(&q[..]), None, None, None, Some(&no_nine[..])];
        assert!(matches!(
            with(&no_mass),
            Err(SpecError::BadDistribution { .. })
        ));
        let fine = [Some(&q[..]), None, Some(&no_nine[..]), None, Some(&q[..])];
        assert!(with(&fine).is_ok());
    }

    #[test]
    fn sampling_never_accepts_a_child_of_zero_probability() {
        let t = DraftTree {
            tokens: vec![0, 1],
            parents: vec![None, None],
        };
        let p = vec![
            vec![0.0f32, 0.0, 1.0],
            vec![1.0, 0.0, 0.0],
            vec![1.0, 0.0, 0.0],
        ];
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
        for _ in 0..200 {
            let out = accept_tree_sampled(&t, &p, &mut rng).unwrap();
            assert_eq!((out.path, out.tokens), (vec![], vec![2]));
        }
    }
}

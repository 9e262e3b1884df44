//! Token trees: several candidate continuations verified in one pass.
//!
//! A chain draft puts all K positions of a verify pass on one guess; when
//! the drafter's first choice is wrong at depth 2, the remaining positions
//! are wasted. A *draft tree* spends the same K positions on the drafter's
//! most likely continuations (SpecInfer: Miao et al. 2024, "SpecInfer:
//! Accelerating Large Language Model Serving with Tree-based Speculative
//! Inference and Verification", §3-4; the dynamic shape of EAGLE-2: Li et
//! al. 2024, §4): node i holds a drafted token whose parent is another node
//! or the *root*, the last verified token. The verify pass runs
//! `[root, node 0, …, node n−1]` under a tree attention mask
//! ([`cipherlora_model::AttentionMask::Tree`]), so row `i + 1` is the
//! adapted model's distribution after the path root → … → node i, exactly
//! as if that path had been verified as a chain.
//!
//! Acceptance walks down from the root:
//! - greedy ([`accept_tree_greedy`]): move to the child whose token is the
//!   row's argmax while there is one; the last row's argmax is the bonus
//!   token. Each emitted token is the argmax after its exact prefix, so the
//!   output equals sequential greedy decoding whatever the tree holds.
//! - sampling ([`accept_tree_sampled`]): multi-draft speculative sampling
//!   with deterministic drafts (SpecInfer's multi-step speculative sampling,
//!   Algorithm 2, with each child a point mass; the recursive rejection
//!   sampling of Jeon et al. 2024, "Recursive Speculative Decoding", §3, in
//!   the same case): try the children in order, accepting child x with
//!   probability p'(x), where p' is the row's distribution with the
//!   children already rejected removed and renormalised; when none is
//!   accepted, sample from that residual. Every emitted token is therefore
//!   distributed as the adapted model's next token after its prefix, which
//!   the χ² tests check (tests/speculative_sampling_chi2.rs), with a rule
//!   that forgets the renormalisation failing them.
//! - sampling with a *sampled* first child ([`accept_tree_sampled_with`]):
//!   a node's first child may instead be drawn from the drafter's
//!   distribution q, as a sampled chain's drafts are. Recursive rejection
//!   sampling takes any proposal the history allows (Jeon et al. 2024, §3):
//!   the sampled child is accepted with probability min(1, p'(x)/q(x)), and
//!   on rejection the residual becomes max(0, p' − q), renormalised; the
//!   deterministic siblings after it (the drafter's next choices, chosen
//!   without x) then proceed as above. (Accepting a drawn child with
//!   p'(x), as if chosen, would be exact too, since its token does not
//!   depend on the target's draws, but accepts it with Σ q·p on average
//!   where this rule accepts with Σ min(p, q), a sampled chain's rate: a
//!   tree whose first children are drawn keeps a sampled chain's
//!   acceptance along its first path and adds its siblings'. The χ² test
//!   with a drawn child rejected by the chosen child's update, removing x
//!   alone, fails.)

use rand::{Rng, RngExt};

use crate::SpecError;
use crate::acceptance::{check_distribution, sample_weights};

/// A draft tree: `n` nodes in level order (every parent before its
/// children; siblings in the drafter's order, most likely first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraftTree {
    /// Drafted token of each node.
    pub tokens: Vec<u32>,
    /// Parent of each node (`None`: a child of the root, the last verified
    /// token). Always an earlier node.
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

    /// The tokens on the path from the root to `node` (`None`: the root
    /// itself, an empty path), root side first: what verify row
    /// `node + 1` sees after the verified context. Panics if `node` is out
    /// of range (callers index rows of this tree).
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

    /// Checks the parent array: same length as the tokens, every parent an
    /// earlier node.
    ///
    /// # Errors
    /// [`SpecError::Config`] naming the first bad node.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.parents.len() != self.tokens.len() {
            return Err(SpecError::Config(format!(
                "draft tree has {} tokens but {} parents",
                self.tokens.len(),
                self.parents.len()
            )));
        }
        match self
            .parents
            .iter()
            .enumerate()
            .find(|&(i, p)| p.is_some_and(|p| p >= i))
        {
            Some((i, _)) => Err(SpecError::Config(format!(
                "draft tree node {i}'s parent is not an earlier node"
            ))),
            None => Ok(()),
        }
    }

    /// Children of each verify row, in node order: entry 0 lists the
    /// root's children, entry `i + 1` node i's (as node indices).
    #[must_use]
    pub fn children(&self) -> Vec<Vec<usize>> {
        let mut children = vec![Vec::new(); self.len() + 1];
        for (i, p) in self.parents.iter().enumerate() {
            children[p.map_or(0, |p| p + 1)].push(i);
        }
        children
    }

    /// The parent array of the verify pass `[root, nodes…, fillers…]` of
    /// `width` positions: the root first, every node shifted by one, and
    /// `width − 1 − n` filler positions hanging off the root (their rows
    /// are never read; they keep the number of positions the adapter server
    /// sees constant).
    ///
    /// # Errors
    /// [`SpecError::Config`] when the tree does not fit in `width − 1` nodes.
    pub fn verify_parents(&self, width: usize) -> Result<Vec<Option<usize>>, SpecError> {
        if self.len() + 1 > width.max(1) {
            return Err(SpecError::Config(format!(
                "a draft tree of {} nodes does not fit a verify pass of {width} positions",
                self.len()
            )));
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
    /// The tokens to append: the accepted nodes' tokens, then one token
    /// from the target model (`tokens.len() == path.len() + 1`).
    pub tokens: Vec<u32>,
}

/// The verify pass's rows of a root-to-node `path` of tree nodes: row 0
/// (the root, the context's last token) and row n + 1 for node n
/// ([`DraftTree::verify_parents`] lays the nodes out that way). Node
/// `path[d]`'s row then belongs at depth d + 1, as
/// `cipherlora_model::KvCache::compact` keeps it.
pub fn path_rows(path: &[usize]) -> Vec<usize> {
    std::iter::once(0)
        .chain(path.iter().map(|&n| n + 1))
        .collect()
}

/// Greedy tree acceptance: from the root, move to the child whose token is
/// the current row's argmax while one exists, using at most `max_rows`
/// rows of the path (the root's row included; a fixed-point pass may have
/// certified fewer rows than the tree has: the walk then ends at the last
/// certified row, whose argmax is exact). `argmax[r]` is the target's
/// choice at verify row r (row 0: the root).
///
/// # Errors
/// [`SpecError::TargetCount`] when `argmax` does not have a row per node
/// plus the root's.
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

/// Exact multi-draft speculative sampling over a tree of deterministic
/// drafts (module docs): at each row, try the children in order, accept
/// child x with probability p'(x) where p' is the row's distribution
/// without the children rejected so far, renormalised; when all are
/// rejected (or there are none), sample the residual p' and stop.
/// `target_probs[r]` is the target's distribution at verify row r after the
/// sampling transforms (temperature, top-k, top-p, penalties).
///
/// # Errors
/// [`SpecError::TargetCount`], [`SpecError::BadDistribution`] or
/// [`SpecError::TokenOutOfVocab`] when the inputs are inconsistent; nothing
/// is sampled then.
pub fn accept_tree_sampled<R: Rng + ?Sized>(
    tree: &DraftTree,
    target_probs: &[Vec<f32>],
    rng: &mut R,
) -> Result<TreeOutcome, SpecError> {
    accept_tree_sampled_with(tree, target_probs, &vec![None; tree.len()], rng)
}

/// [`accept_tree_sampled`] where some nodes were drawn from a drafter
/// distribution instead of chosen (module docs): `proposals[n]` is the
/// distribution node n's token was sampled from (after the same sampling
/// transforms as the target's), `None` for a deterministic node. A sampled
/// node is tried first among its siblings (it must be its parent's first
/// child) and accepted with probability min(1, p'(x)/q(x)); on rejection
/// the row's residual becomes max(0, p' − q). The rest is
/// [`accept_tree_sampled`].
///
/// # Errors
/// As [`accept_tree_sampled`]; also [`SpecError::Config`] when
/// `proposals` has the wrong length or a sampled node is not its parent's
/// first child, and [`SpecError::BadDistribution`] when a proposal is not a
/// distribution or gives its own token no probability.
pub fn accept_tree_sampled_with<R: Rng + ?Sized>(
    tree: &DraftTree,
    target_probs: &[Vec<f32>],
    proposals: &[Option<&[f32]>],
    rng: &mut R,
) -> Result<TreeOutcome, SpecError> {
    check_rows(tree, target_probs.len())?;
    if proposals.len() != tree.len() {
        return Err(SpecError::Config(format!(
            "{} proposals for a draft tree of {} nodes",
            proposals.len(),
            tree.len()
        )));
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
            return Err(SpecError::Config(format!(
                "draft tree node {c} was sampled but is not its parent's first child"
            )));
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
                // A sampled child: accept with min(1, p'(x) / q(x)); a
                // rejection, even of a token p' gives nothing, leaves
                // max(0, p' − q), whichever token was drawn.
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
        // The rejected children cannot hold all the mass but by rounding;
        // then the row itself is the fallback (as `pick_residual`).
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
        // Two certified rows: the walk stops at node 0, whose argmax (8)
        // is exact and becomes the last token.
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
        assert!(matches!(t.validate(), Err(SpecError::Config(_))));
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let p = vec![vec![0.5f32, 0.5]; 6];
        assert!(matches!(
            accept_tree_sampled(&tree(), &p, &mut rng),
            Err(SpecError::TokenOutOfVocab { .. })
        ));
    }

    /// A drawn node must be its parent's first child, come with a
    /// distribution that gives its token mass, and every node needs an
    /// entry: typed errors, nothing sampled.
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
        assert!(matches!(with(&[None; 4]), Err(SpecError::Config(_))));
        // Node 1 is the root's second child.
        let second = [None, Some(&q[..]), None, None, None];
        assert!(matches!(with(&second), Err(SpecError::Config(_))));
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

//! Attention masks for a forward pass over T new positions: causal (a chain) or an arbitrary token
//! tree (speculative decoding's draft and verify passes), possibly extending tree nodes an earlier
//! pass cached.

use crate::ModelError;

/// Which earlier positions each of the T new positions may attend to (always the cache prefix and
/// itself); RoPE positions `cache_len + i` (causal) or `cache_len − cached + depth(node)` (tree).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttentionMask {
    /// New position i sees new positions 0..=i.
    Causal,
    /// A token tree: `parents[i]` is node i's parent (< i) or `None` (a root off the prefix); node
    /// i sees its ancestors. The first `cached` nodes are the cache's last positions, so trees grow
    /// level by level (EAGLE-2, Li et al. 2024, §4).
    Tree {
        /// Parent of each node, in node order (cached nodes first).
        parents: Vec<Option<usize>>,
        /// Nodes already in the cache (the cache's last `cached` positions).
        cached: usize,
    },
}

impl AttentionMask {
    /// A tree mask from its parent array, every node new.
    pub fn tree(parents: Vec<Option<usize>>) -> Self {
        AttentionMask::Tree { parents, cached: 0 }
    }

    /// A tree mask whose first `cached` nodes are the cache's last `cached` positions; the pass
    /// computes the rest.
    pub fn tree_extension(parents: Vec<Option<usize>>, cached: usize) -> Self {
        AttentionMask::Tree { parents, cached }
    }

    /// Tree nodes already in the cache (0 for `Causal`).
    pub fn cached_nodes(&self) -> usize {
        match self {
            AttentionMask::Causal => 0,
            AttentionMask::Tree { cached, .. } => *cached,
        }
    }

    /// Depth of each of the `t` new positions. Errors: [`ModelError::Input`] for a tree of the
    /// wrong length or a parent not before its child.
    pub fn depths(&self, t: usize) -> Result<Vec<usize>, ModelError> {
        match self {
            AttentionMask::Causal => Ok((0..t).collect()),
            AttentionMask::Tree { parents, cached } => {
                if parents.len() != cached + t {
                    return Err(ModelError::Input(format!(
                        "tree mask has {} nodes ({cached} cached) for {t} tokens",
                        parents.len()
                    )));
                }
                let mut depth = Vec::with_capacity(parents.len());
                for (i, p) in parents.iter().enumerate() {
                    match *p {
                        None => depth.push(0),
                        Some(p) if p < i => depth.push(depth[p] + 1),
                        Some(p) => {
                            return Err(ModelError::Input(format!(
                                "tree node {i} has parent {p}, which is not an earlier node"
                            )));
                        }
                    }
                }
                Ok(depth.split_off(*cached))
            }
        }
    }

    /// Whether node (or new position) `i` may attend to node `j`.
    fn sees(&self, i: usize, j: usize) -> bool {
        match self {
            AttentionMask::Causal => j <= i,
            AttentionMask::Tree { parents, .. } => {
                let mut n = Some(i);
                while let Some(k) = n {
                    if k == j {
                        return true;
                    }
                    if k < j {
                        return false;
                    }
                    n = parents[k];
                }
                false
            }
        }
    }

    /// The keys each of the `t` new positions attends to, after `cache_len` cached positions
    /// (validate with [`AttentionMask::depths`] and `cached_nodes() ≤ cache_len` first).
    pub(crate) fn seen_keys(&self, cache_len: usize, t: usize) -> Vec<SeenKeys> {
        let cached = self.cached_nodes();
        // Position of node j (cached or new) among the cache_len + t keys.
        let tree_start = cache_len - cached;
        (0..t)
            .map(|i| match self {
                AttentionMask::Causal => SeenKeys::prefix(cache_len + i + 1),
                AttentionMask::Tree { .. } => SeenKeys {
                    prefix: tree_start,
                    nodes: (0..cached + t)
                        .filter(|&j| self.sees(cached + i, j))
                        .map(|j| tree_start + j)
                        .collect(),
                },
            })
            .collect()
    }
}

/// The keys one new position attends to, in the order its attention sums them: the cache's first
/// `prefix` positions, then `nodes` (tree nodes' positions, increasing, the position itself last).
/// A row decoded token by token and the same row in a pass see the same keys in the same order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SeenKeys {
    prefix: usize,
    nodes: Vec<usize>,
}

impl SeenKeys {
    /// Positions `0..n`.
    pub(crate) fn prefix(n: usize) -> Self {
        SeenKeys {
            prefix: n,
            nodes: Vec::new(),
        }
    }

    /// Calls `f` on each key position, in order.
    #[inline(always)]
    pub(crate) fn for_each(&self, mut f: impl FnMut(usize)) {
        (0..self.prefix).for_each(&mut f);
        self.nodes.iter().for_each(|&j| f(j));
    }

    /// One past the largest key position.
    pub(crate) fn end(&self) -> usize {
        self.nodes
            .last()
            .map_or(self.prefix, |&j| self.prefix.max(j + 1))
    }

    /// The key positions, in order.
    #[cfg(test)]
    pub(crate) fn keys(&self) -> Vec<usize> {
        let mut v = Vec::new();
        self.for_each(|j| v.push(j));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each row's key positions, in order.
    fn keys(m: &AttentionMask, cache_len: usize, t: usize) -> Vec<Vec<usize>> {
        m.seen_keys(cache_len, t)
            .iter()
            .map(SeenKeys::keys)
            .collect()
    }

    #[test]
    fn chain_tree_sees_the_causal_keys_and_depths() {
        let chain = AttentionMask::tree(vec![None, Some(0), Some(1), Some(2)]);
        assert_eq!(keys(&chain, 3, 4), keys(&AttentionMask::Causal, 3, 4));
        assert_eq!(
            keys(&AttentionMask::Causal, 3, 2),
            vec![vec![0, 1, 2, 3], vec![0, 1, 2, 3, 4]]
        );
        assert_eq!(chain.depths(4).unwrap(), vec![0, 1, 2, 3]);
    }

    #[test]
    fn tree_branches_do_not_see_each_other() {
        // 0 -> {1, 2}, 1 -> 3
        let m = AttentionMask::tree(vec![None, Some(0), Some(0), Some(1)]);
        assert_eq!(m.depths(4).unwrap(), vec![0, 1, 1, 2]);
        assert!(m.sees(3, 1) && m.sees(3, 0) && !m.sees(3, 2) && !m.sees(2, 1));
        assert_eq!(keys(&m, 2, 4)[3], vec![0, 1, 2, 3, 5]);
    }

    #[test]
    fn extension_keys_equal_the_whole_trees_rows() {
        // 0 -> {1, 2}, 1 -> 3, 2 -> 4: nodes 0..3 cached, 3 and 4 new.
        let parents = vec![None, Some(0), Some(0), Some(1), Some(2)];
        let whole = AttentionMask::tree(parents.clone());
        let ext = AttentionMask::tree_extension(parents, 3);
        // Same keys (2 prefix + 5 nodes), the extension's rows are the whole tree's last two.
        assert_eq!(keys(&ext, 5, 2), keys(&whole, 2, 5)[3..].to_vec());
        assert_eq!(ext.depths(2).unwrap(), vec![2, 2]);
        assert!(ext.depths(3).is_err());
    }

    #[test]
    fn tree_with_forward_parent_is_rejected() {
        let m = AttentionMask::tree(vec![None, Some(1)]);
        assert!(matches!(m.depths(2), Err(ModelError::Input(_))));
        assert!(AttentionMask::tree(vec![None]).depths(2).is_err());
    }

    proptest::proptest! {
        /// Node i sees the whole prefix, then depth(i) + 1 new positions in increasing order,
        /// itself last; a chain tree is causal.
        #[test]
        fn tree_visibility_counts_ancestors(raw in proptest::collection::vec(0usize..64, 1..12), cache_len in 0usize..4) {
            let parents: Vec<Option<usize>> = raw
                .iter()
                .enumerate()
                .map(|(i, &r)| if i == 0 || r % 4 == 0 { None } else { Some(r % i) })
                .collect();
            let t = parents.len();
            let m = AttentionMask::tree(parents);
            let depths = m.depths(t).unwrap();
            for (i, row) in keys(&m, cache_len, t).iter().enumerate() {
                proptest::prop_assert_eq!(&row[..cache_len], &(0..cache_len).collect::<Vec<_>>()[..]);
                proptest::prop_assert_eq!(row.len() - cache_len, depths[i] + 1);
                proptest::prop_assert!(row.windows(2).all(|w| w[0] < w[1]));
                proptest::prop_assert_eq!(row.last(), Some(&(cache_len + i)));
            }
            let chain = AttentionMask::tree((0..t).map(|i| i.checked_sub(1)).collect());
            proptest::prop_assert_eq!(keys(&chain, cache_len, t), keys(&AttentionMask::Causal, cache_len, t));
        }
    }
}

//! Attention masks for a forward pass over T new positions: causal (a chain) or an arbitrary token
//! tree (speculative decoding's draft and verify passes), possibly extending tree nodes an earlier
//! pass cached.

use candle_core::{Device, Tensor};

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

    /// Additive bias (t, cache_len + t): 0 allowed, -inf masked (validate with
    /// [`AttentionMask::depths`] first).
    pub(crate) fn bias(
        &self,
        cache_len: usize,
        t: usize,
        device: &Device,
    ) -> Result<Tensor, ModelError> {
        let total = cache_len + t;
        let cached = self.cached_nodes();
        // Column of node j (cached or new) in the (cache_len + t) keys.
        let tree_start = cache_len - cached;
        let mut data = vec![0f32; t * total];
        for i in 0..t {
            for j in 0..cached + t {
                if !self.sees(cached + i, j) {
                    data[i * total + tree_start + j] = f32::NEG_INFINITY;
                }
            }
        }
        Ok(Tensor::from_vec(data, (t, total), device)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_tree_has_causal_bias_and_depths() {
        let chain = AttentionMask::tree(vec![None, Some(0), Some(1), Some(2)]);
        let dev = Device::Cpu;
        let a = chain.bias(3, 4, &dev).unwrap().to_vec2::<f32>().unwrap();
        let b = AttentionMask::Causal
            .bias(3, 4, &dev)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        assert_eq!(a, b);
        assert_eq!(chain.depths(4).unwrap(), vec![0, 1, 2, 3]);
    }

    #[test]
    fn tree_branches_do_not_see_each_other() {
        // 0 -> {1, 2}, 1 -> 3
        let m = AttentionMask::tree(vec![None, Some(0), Some(0), Some(1)]);
        assert_eq!(m.depths(4).unwrap(), vec![0, 1, 1, 2]);
        assert!(m.sees(3, 1) && m.sees(3, 0) && !m.sees(3, 2) && !m.sees(2, 1));
    }

    #[test]
    fn extension_bias_equals_the_whole_trees_rows() {
        // 0 -> {1, 2}, 1 -> 3, 2 -> 4: nodes 0..3 cached, 3 and 4 new.
        let parents = vec![None, Some(0), Some(0), Some(1), Some(2)];
        let whole = AttentionMask::tree(parents.clone());
        let ext = AttentionMask::tree_extension(parents, 3);
        let dev = Device::Cpu;
        let w = whole.bias(2, 5, &dev).unwrap().to_vec2::<f32>().unwrap();
        let e = ext.bias(5, 2, &dev).unwrap().to_vec2::<f32>().unwrap();
        // Same keys (2 prefix + 5 nodes), the extension's rows are the whole tree's last two.
        assert_eq!(e, w[3..].to_vec());
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
        /// Node i sees depth(i) + 1 new positions and the whole prefix; a chain tree is causal.
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
            let bias = m.bias(cache_len, t, &Device::Cpu).unwrap().to_vec2::<f32>().unwrap();
            for i in 0..t {
                let row = &bias[i];
                proptest::prop_assert!(row[..cache_len].iter().all(|&x| x == 0.0));
                let seen = row[cache_len..].iter().filter(|&&x| x == 0.0).count();
                proptest::prop_assert_eq!(seen, depths[i] + 1);
                proptest::prop_assert_eq!(row[cache_len + i], 0.0);
            }
            let chain = AttentionMask::tree((0..t).map(|i| i.checked_sub(1)).collect());
            proptest::prop_assert_eq!(
                chain.bias(cache_len, t, &Device::Cpu).unwrap().to_vec2::<f32>().unwrap(),
                AttentionMask::Causal.bias(cache_len, t, &Device::Cpu).unwrap().to_vec2::<f32>().unwrap()
            );
        }
    }
}

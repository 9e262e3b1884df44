//! The planner's model of a draft: expected tokens per round of a chain or the best tree of the
//! same budget, under Sequoia's positional acceptance (Chen et al. 2024, §3.1). Rationale:
//! docs/design/code-notes.md, "spec: tree_plan".

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::SpecError;
use crate::tree_draft::TreeParams;

/// The share of the first choice's misses the second choice takes, and so on per rank.
pub const SECOND_CHOICE_SHARE: f64 = 0.56;

/// Ranks [`RankAcceptance::from_first`] models.
const MODELLED_RANKS: usize = 8;

/// Per rank i (0: first choice), the probability `r_i` that the target's token is that choice.
#[derive(Debug, Clone, PartialEq)]
pub struct RankAcceptance {
    rates: Vec<f64>,
}

impl RankAcceptance {
    /// The rates, first choice first. Errors: [`SpecError::BadRankAcceptance`].
    pub fn new(rates: Vec<f64>) -> Result<Self, SpecError> {
        let bad = |reason: String| Err(SpecError::BadRankAcceptance { reason });
        if rates.is_empty() {
            return bad("no rate given".into());
        }
        if let Some((i, r)) = rates
            .iter()
            .enumerate()
            .find(|(_, r)| !(r.is_finite() && (0.0..=1.0).contains(*r)))
        {
            return bad(format!("rate {r} of rank {} is not in [0, 1]", i + 1));
        }
        let sum: f64 = rates.iter().sum();
        if sum > 1.0 + 1e-9 {
            return bad(format!(
                "the rates sum to {sum}: the ranks' events are disjoint"
            ));
        }
        Ok(Self { rates })
    }

    /// Rates from the first choice's `alpha`: `r_i = (1 − α) · s · (1 − s)^(i − 2)` for i ≥ 2.
    #[must_use]
    pub fn from_first(alpha: f64) -> Self {
        let a = if alpha.is_finite() {
            alpha.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let mut rates = vec![a];
        let mut left = 1.0 - a;
        for _ in 1..MODELLED_RANKS {
            let r = left * SECOND_CHOICE_SHARE;
            rates.push(r);
            left -= r;
        }
        Self { rates }
    }

    /// `r_i` for rank `i` (0: the first choice); 0 past the known ranks.
    #[must_use]
    pub fn rate(&self, rank: usize) -> f64 {
        self.rates.get(rank).copied().unwrap_or(0.0)
    }

    /// Expected tokens per round of a `k`-draft chain: `1 + Σ_{d=1..k} r_1^d` (Leviathan et al.).
    #[must_use]
    pub fn chain_tokens(&self, k: usize) -> f64 {
        crate::adaptive::expected_tokens(self.rate(0), k)
    }
}

/// The best tree of a node budget under a [`RankAcceptance`].
#[derive(Debug, Clone, PartialEq)]
pub struct TreeEstimate {
    /// Expected tokens per round, bonus token included (module docs).
    pub tokens: f64,
    /// Depth of the deepest node (a chain of K has depth K).
    pub depth: usize,
    /// Nodes per depth from 1: one batched drafting pass each.
    pub widths: Vec<usize>,
}

impl TreeEstimate {
    /// Whether the best tree is a chain (one node per level).
    #[must_use]
    pub fn is_chain(&self) -> bool {
        self.widths.iter().all(|&w| w == 1)
    }
}

/// A frontier node: its value and depth (1: a child of the root).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Candidate {
    value: f64,
    depth: usize,
}

impl Eq for Candidate {}

impl Ord for Candidate {
    /// By value, then the shallower first (a parent before its equally valued child).
    fn cmp(&self, other: &Self) -> Ordering {
        self.value
            .total_cmp(&other.value)
            .then(other.depth.cmp(&self.depth))
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The best tree of `budget` nodes within `params` and its expected tokens per round.
#[must_use]
pub fn best_tree(acceptance: &RankAcceptance, budget: usize, params: &TreeParams) -> TreeEstimate {
    let mut frontier = BinaryHeap::new();
    let push_children = |frontier: &mut BinaryHeap<Candidate>, value: f64, depth: usize| {
        if depth >= params.max_depth {
            return;
        }
        for rank in 0..params.branch {
            let r = acceptance.rate(rank);
            if r > 0.0 {
                frontier.push(Candidate {
                    value: value * r,
                    depth: depth + 1,
                });
            }
        }
    };
    push_children(&mut frontier, 1.0, 0);
    let mut estimate = TreeEstimate {
        tokens: 1.0,
        depth: 0,
        widths: Vec::new(),
    };
    for _ in 0..budget {
        let Some(node) = frontier.pop() else {
            break;
        };
        estimate.tokens += node.value;
        estimate.depth = estimate.depth.max(node.depth);
        if estimate.widths.len() < node.depth {
            estimate.widths.resize(node.depth, 0);
        }
        estimate.widths[node.depth - 1] += 1;
        push_children(&mut frontier, node.value, node.depth);
    }
    estimate
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adaptive::expected_tokens;
    use proptest::prelude::*;

    fn shape(branch: usize, max_depth: usize) -> TreeParams {
        TreeParams { branch, max_depth }
    }

    /// The best expected tokens over every tree within the limits, by exhaustive search.
    fn exhaustive(acc: &RankAcceptance, budget: usize, branch: usize, depth: usize) -> f64 {
        // Best Σ value of a forest of `n` nodes of ranks ≥ `rank` within `d` levels.
        fn forest(acc: &RankAcceptance, n: usize, rank: usize, b: usize, d: usize) -> f64 {
            if n == 0 || rank >= b || d == 0 {
                return 0.0;
            }
            let r = acc.rate(rank);
            // No child of this rank, or one with an m-node subtree.
            let mut best = forest(acc, n, rank + 1, b, d);
            for m in 1..=n {
                let sub = r * (1.0 + forest(acc, m - 1, 0, b, d - 1));
                best = best.max(sub + forest(acc, n - m, rank + 1, b, d));
            }
            best
        }
        1.0 + forest(acc, budget, 0, branch, depth)
    }

    #[test]
    fn a_chain_yields_leviathans_expected_tokens() {
        // Known closed form (1 − α^(K+1)) / (1 − α), computed elsewhere.
        for &alpha in &[0.0, 0.3, 0.776, 0.9] {
            let acc = RankAcceptance::from_first(alpha);
            for k in 0..12 {
                let want = expected_tokens(alpha, k);
                assert!(
                    (acc.chain_tokens(k) - want).abs() < 1e-12,
                    "α {alpha} K {k}"
                );
                let tree = best_tree(&acc, k, &shape(1, 64));
                assert!((tree.tokens - want).abs() < 1e-12, "α {alpha} K {k}");
                assert!(tree.is_chain());
            }
        }
    }

    #[test]
    fn measured_prose_ranks_at_t16_give_a_chain() {
        // A drafter with α ≈ 0.88: the model spends 15 nodes on the chain.
        let acc = RankAcceptance::from_first(0.88);
        let tree = best_tree(&acc, 15, &shape(4, 64));
        assert!(tree.is_chain(), "{tree:?}");
        // … and that trees pay at a weaker drafter's rate.
        let weak = best_tree(&RankAcceptance::from_first(0.6), 15, &shape(4, 64));
        assert!(!weak.is_chain());
        assert!(weak.tokens > 1.05 * RankAcceptance::from_first(0.6).chain_tokens(15));
    }

    #[test]
    fn at_t16_every_tree_of_seven_tokens_per_round_is_a_chain() {
        // No ranked drafter gets both ≥ 7 tokens per round at T = 16 and trees ≥ 1.4× chains.
        let mut best_ratio_below_seven: f64 = 0.0;
        for a in (1..100).map(|i| f64::from(i) / 100.0) {
            for s in (0..=20).map(|i| f64::from(i) / 20.0) {
                let mut rates = vec![a];
                let mut left = 1.0 - a;
                for _ in 1..8 {
                    rates.push(left * s);
                    left -= left * s;
                }
                if rates.windows(2).any(|w| w[1] > w[0]) {
                    continue;
                }
                let acc = RankAcceptance::new(rates).unwrap();
                let tree = best_tree(&acc, 15, &shape(4, 64));
                if tree.tokens >= 7.0 {
                    assert!(tree.is_chain(), "r_1 {a}, share {s}: {tree:?}");
                } else {
                    best_ratio_below_seven =
                        best_ratio_below_seven.max(tree.tokens / acc.chain_tokens(15));
                }
            }
        }
        // Trees do gain where drafters are weak (below seven tokens).
        assert!(best_ratio_below_seven > 1.4, "{best_ratio_below_seven}");
    }

    #[test]
    fn paper_style_rates_reproduce_the_papers_tree_gains() {
        // Weak drafters with a strong second choice: trees gain well over 1.4× a chain.
        let acc = RankAcceptance::new(vec![0.6, 0.2, 0.08, 0.04]).unwrap();
        let tree = best_tree(&acc, 15, &shape(4, 16));
        assert!(tree.tokens / acc.chain_tokens(15) > 1.2, "{tree:?}");
    }

    #[test]
    fn bad_rates_are_typed_errors() {
        for rates in [
            vec![],
            vec![1.2],
            vec![-0.1],
            vec![f64::NAN],
            vec![0.7, 0.4],
        ] {
            assert!(matches!(
                RankAcceptance::new(rates.clone()),
                Err(SpecError::BadRankAcceptance { .. })
            ));
        }
    }

    #[test]
    fn limits_bound_the_tree() {
        let acc = RankAcceptance::from_first(0.5);
        let t = best_tree(&acc, 40, &shape(3, 4));
        assert!(t.depth <= 4);
        assert!(t.widths.iter().zip(1..).all(|(&w, d)| w <= 3usize.pow(d)));
        assert_eq!(t.widths.iter().sum::<usize>(), 40);
        // No node allowed: the bonus token alone.
        assert_eq!(best_tree(&acc, 10, &shape(0, 4)).tokens, 1.0);
        assert_eq!(best_tree(&acc, 10, &shape(3, 0)).tokens, 1.0);
    }

    /// Regression (proptest): near-certain acceptance once put the closed-form chain estimate
    /// above the tree's through cancellation.
    #[test]
    fn a_near_certain_chain_is_not_beaten_by_rounding() {
        let acc = RankAcceptance::from_first(0.999_922_921_105_825_8);
        let t = best_tree(&acc, 7, &shape(4, 64)).tokens;
        assert!(
            t + 1e-12 >= acc.chain_tokens(7),
            "{t} < {}",
            acc.chain_tokens(7)
        );
    }

    proptest! {
        #[test]
        fn best_first_is_the_exhaustive_optimum(
            raw in proptest::collection::vec(0.0f64..1.0, 1..4),
            budget in 0usize..7,
            branch in 1usize..4,
            depth in 1usize..5,
        ) {
            // Normalise to disjoint rates summing to at most 1.
            let total: f64 = raw.iter().sum::<f64>().max(1.0);
            let acc = RankAcceptance::new(raw.iter().map(|r| r / total).collect()).unwrap();
            let got = best_tree(&acc, budget, &shape(branch, depth)).tokens;
            let want = exhaustive(&acc, budget, branch, depth);
            prop_assert!((got - want).abs() < 1e-9, "best first {got}, exhaustive {want}");
        }

        #[test]
        fn a_tree_is_never_worse_than_a_chain_and_grows_with_its_budget(
            alpha in 0.0f64..1.0,
            budget in 0usize..24,
        ) {
            let acc = RankAcceptance::from_first(alpha);
            let limits = shape(4, 64);
            let t = best_tree(&acc, budget, &limits).tokens;
            prop_assert!(t + 1e-12 >= acc.chain_tokens(budget));
            prop_assert!(best_tree(&acc, budget + 1, &limits).tokens + 1e-12 >= t);
            prop_assert!(t <= budget as f64 + 1.0 + 1e-12);
        }
    }
}

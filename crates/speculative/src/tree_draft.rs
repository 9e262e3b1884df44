//! Growing a draft tree with the base drafter, level by level, after EAGLE-2 (Li et al. 2024,
//! §4.1-4.2), scored by learnt acceptance ([`Calibration`]). Notes: docs/design/code-notes.md,
//! "spec: tree_draft".

use std::sync::Arc;

use cipherlora_model::{AttentionMask, DeltaHook, KvCache, Model, Sampler};
use rand_chacha::ChaCha20Rng;

use crate::tree::DraftTree;
use crate::{ConfigError, SpecError};

/// Shape limits of a draft tree; the node budget is the round's K.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeParams {
    /// Children per expanded node, and nodes expanded per level (top-k).
    pub branch: usize,
    /// Deepest level drafted (a chain of K has depth K).
    pub max_depth: usize,
}

impl Default for TreeParams {
    /// Branch 4, depth 8 (measured with the acceptance example: BENCHMARKS.md, "Tree drafts").
    fn default() -> Self {
        Self {
            branch: 4,
            max_depth: 8,
        }
    }
}

impl TreeParams {
    /// The most positions growing a `budget`-node tree feeds the drafter's cache after the context.
    #[must_use]
    pub fn max_fed(&self, budget: usize) -> usize {
        self.branch.max(1) * self.max_depth.min(budget).saturating_sub(1)
    }
}

impl std::fmt::Display for TreeParams {
    /// `tree:BRANCHxDEPTH`, as parsed by [`std::str::FromStr`].
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "tree:{}x{}", self.branch, self.max_depth)
    }
}

impl std::str::FromStr for TreeParams {
    type Err = SpecError;

    /// `tree` (the defaults) or `tree:BRANCHxDEPTH` (both ≥ 1).
    fn from_str(s: &str) -> Result<Self, SpecError> {
        let bad = || SpecError::from(ConfigError::unparsed("tree shape", s, "tree or tree:BxD"));
        match s.split_once(':') {
            None if s == "tree" => Ok(Self::default()),
            Some(("tree", shape)) => {
                let (b, d) = shape.split_once('x').ok_or_else(bad)?;
                let branch: usize = b.parse().map_err(|_| bad())?;
                let max_depth: usize = d.parse().map_err(|_| bad())?;
                if branch == 0 || max_depth == 0 {
                    return Err(bad());
                }
                Ok(Self { branch, max_depth })
            }
            _ => Err(bad()),
        }
    }
}

/// Online estimate of c(rank, q), the chance the target picks a child of sibling rank `rank` and
/// drafter probability `q` (`BINS` bins, `PRIOR` pseudo-trials); drawn children learnt apart.
#[derive(Debug, Clone)]
pub struct Calibration {
    hits: [[f32; Self::BINS]; Self::RANKS],
    trials: [[f32; Self::BINS]; Self::RANKS],
    /// Drawn first children kept and tried.
    drawn: (f32, f32),
}

impl Default for Calibration {
    fn default() -> Self {
        Self {
            hits: [[0.0; Self::BINS]; Self::RANKS],
            trials: [[0.0; Self::BINS]; Self::RANKS],
            drawn: (0.0, 0.0),
        }
    }
}

impl Calibration {
    const BINS: usize = 20;
    const RANKS: usize = 3;
    const PRIOR: f32 = 4.0;

    fn bin(q: f32) -> usize {
        ((q.clamp(0.0, 1.0) * Self::BINS as f32) as usize).min(Self::BINS - 1)
    }

    /// The estimated acceptance of a child of rank `rank` and drafter probability `q`.
    #[must_use]
    pub fn estimate(&self, rank: usize, q: f32) -> f32 {
        let (r, b) = (rank.min(Self::RANKS - 1), Self::bin(q));
        let centre = (b as f32 + 0.5) / Self::BINS as f32;
        let prior = if r == 0 { centre.sqrt() } else { centre };
        let c = (self.hits[r][b] + Self::PRIOR * prior) / (self.trials[r][b] + Self::PRIOR);
        c.clamp(1e-4, 1.0)
    }

    /// The estimated acceptance of a drawn first child.
    #[must_use]
    pub fn drawn_estimate(&self) -> f32 {
        let (hits, trials) = self.drawn;
        ((hits + Self::PRIOR * 0.8) / (trials + Self::PRIOR)).clamp(1e-4, 1.0)
    }

    /// Learns from a sampled round that kept `path` whether each drawn first child was kept.
    pub(crate) fn observe_drawn(&mut self, grown: &GrownTree, path: &[usize]) {
        let children = grown.tree.children();
        for (depth, row) in crate::tree::path_rows(path).into_iter().enumerate() {
            let Some(&first) = children[row].first() else {
                continue;
            };
            if grown.proposals[first].is_some() {
                self.drawn.1 += 1.0;
                self.drawn.0 += f32::from(u8::from(path.get(depth) == Some(&first)));
            }
        }
    }

    /// Records whether the target chose a child of rank `rank` and probability `q`.
    pub fn observe(&mut self, rank: usize, q: f32, hit: bool) {
        let (r, b) = (rank.min(Self::RANKS - 1), Self::bin(q));
        self.trials[r][b] += 1.0;
        self.hits[r][b] += f32::from(u8::from(hit));
    }

    /// Learns from a verified tree (`argmax[r]`: the target's choice at row r, root first).
    pub(crate) fn observe_tree(&mut self, grown: &GrownTree, argmax: &[u32]) {
        for (row, children) in grown.tree.children().iter().enumerate() {
            let Some(&want) = argmax.get(row) else {
                continue;
            };
            for &c in children {
                self.observe(grown.rank[c], grown.q[c], grown.tree.tokens[c] == want);
            }
        }
    }
}

/// Tree drafting settings: shape limits and the starting acceptance estimate.
#[derive(Debug, Clone, Default)]
pub struct TreeDrafts {
    /// Shape limits.
    pub shape: TreeParams,
    /// The acceptance estimate growth starts from.
    pub calibration: Calibration,
}

impl From<TreeParams> for TreeDrafts {
    fn from(shape: TreeParams) -> Self {
        Self {
            shape,
            calibration: Calibration::default(),
        }
    }
}

/// A grown tree and where its nodes sit in the drafter's cache.
#[derive(Debug, Clone)]
pub(crate) struct GrownTree {
    /// The draft tree (level order).
    pub tree: DraftTree,
    /// Per node, its index among the drafter cache's tree positions if it was fed.
    pub fed: Vec<Option<usize>>,
    /// Each node's drafter probability given its parent (softmax).
    pub q: Vec<f32>,
    /// Each node's rank among the drafter's choices after its parent.
    pub rank: Vec<usize>,
    /// Per node drawn from the drafter (sampling), its distribution; `None` if chosen.
    pub proposals: Vec<Option<Arc<[f32]>>>,
}

/// What growth needs to draw first children when the target samples.
pub(crate) struct SampledGrowth<'a> {
    /// The target's sampler (temperature, top-k, top-p, penalty).
    pub sampler: &'a Sampler,
    /// Every token before the tree (its root is the last).
    pub context: &'a [u32],
    /// The decoding loop's generator.
    pub rng: &'a mut ChaCha20Rng,
}

impl SampledGrowth<'_> {
    /// The drafter's distribution after the context and `path`, and a token drawn from it.
    fn draw(&mut self, row: &[f32], path: &[u32]) -> (u32, Arc<[f32]>) {
        let mut history = self.context.to_vec();
        history.extend_from_slice(path);
        let q = self.sampler.probs(row, &history);
        let x = crate::acceptance::sample(&q, self.rng);
        (x, q.into())
    }
}

impl GrownTree {
    /// The drafter-cache indices to keep after a round accepted `path` ([`KvCache::compact`]).
    pub fn cached_path(&self, path: &[usize]) -> Vec<usize> {
        path.iter().map_while(|&n| self.fed[n]).collect()
    }
}

/// The least share of a node's estimate its chosen children keep after a drawn first child.
const MIN_AFTER_DRAWN: f32 = 0.05;

/// A candidate during growth.
#[derive(Debug, Clone)]
struct Candidate {
    token: u32,
    parent: Option<usize>,
    /// Drafter probability of the token after its parent.
    q: f32,
    /// Rank among the drafter's choices after the parent (0: first).
    rank: usize,
    /// Log of the path's estimated acceptance (Σ ln c(q) along it).
    score: f32,
    depth: usize,
    /// Index among the fed tree positions, once fed.
    fed: Option<usize>,
    /// The distribution the token was drawn from (a sampled first child).
    proposal: Option<Arc<[f32]>>,
}

/// The selection logic of growth, apart from the model (module docs).
#[derive(Debug)]
pub(crate) struct TreeGrowth {
    budget: usize,
    branch: usize,
    cands: Vec<Candidate>,
    /// Candidate ids of the newest level.
    level: Vec<usize>,
    /// Parents (as fed indices) of the fed nodes, in feed order.
    fed_parents: Vec<Option<usize>>,
}

impl TreeGrowth {
    pub fn new(budget: usize, branch: usize) -> Self {
        Self {
            budget,
            branch: branch.max(1),
            cands: Vec::new(),
            level: Vec::new(),
            fed_parents: Vec::new(),
        }
    }

    /// Adds the top `branch` tokens of `row` under `parent` (`None`: root); a drawn `first` leads.
    pub fn expand(
        &mut self,
        parent: Option<usize>,
        row: &[f32],
        calibration: &Calibration,
        first: Option<(u32, Arc<[f32]>)>,
    ) {
        let (base, depth) =
            parent.map_or((0.0, 1), |p| (self.cands[p].score, self.cands[p].depth + 1));
        let log_z = log_sum_exp(row);
        let top = top_k(row, self.branch);
        // A drawn first child gets its learnt rate; its siblings only what it misses.
        let drawn_estimate = first.as_ref().map(|_| calibration.drawn_estimate());
        let after_drawn = drawn_estimate.map_or(1.0, |c| (1.0 - c).max(MIN_AFTER_DRAWN));
        let mut push = |token: u32, rank: usize, proposal: Option<Arc<[f32]>>| {
            let q = (row[token as usize] - log_z).exp();
            let estimate = match (&proposal, drawn_estimate) {
                (Some(_), Some(c)) => c,
                _ => calibration.estimate(rank, q) * after_drawn,
            };
            self.cands.push(Candidate {
                token,
                parent,
                q,
                rank,
                score: base + estimate.ln(),
                depth,
                fed: None,
                proposal,
            });
        };
        let drawn = first.as_ref().map(|(x, _)| *x);
        if let Some((x, q)) = first {
            let rank = row.iter().filter(|&&l| l > row[x as usize]).count();
            push(x, rank, Some(q));
        }
        let others = self.branch - usize::from(drawn.is_some());
        for (rank, (token, _)) in top
            .into_iter()
            .enumerate()
            .filter(|&(_, (t, _))| Some(t) != drawn)
            .take(others)
        {
            push(token, rank, None);
        }
    }

    /// The tokens of candidate `c`'s path, root's child first.
    fn path_tokens(&self, c: usize) -> Vec<u32> {
        let mut path = Vec::new();
        let mut node = Some(c);
        while let Some(n) = node {
            path.push(self.cands[n].token);
            node = self.cands[n].parent;
        }
        path.reverse();
        path
    }

    /// Closes the level just expanded: its candidates form the next frontier.
    pub fn next_level(&mut self, first_new: usize) {
        self.level = (first_new..self.cands.len()).collect();
    }

    /// Number of candidates so far (ids are `0..len`).
    pub fn len(&self) -> usize {
        self.cands.len()
    }

    /// The newest level's nodes to expand (≤ `branch`, best first) and the extending mask.
    pub fn take_frontier(&mut self) -> (Vec<usize>, Vec<u32>, AttentionMask) {
        let threshold = self.kth_best_score(self.budget);
        let mut level: Vec<usize> = self
            .level
            .iter()
            .copied()
            .filter(|&c| self.cands[c].score >= threshold)
            .collect();
        level.sort_by(|&a, &b| self.cands[b].score.total_cmp(&self.cands[a].score));
        level.truncate(self.branch);
        let cached = self.fed_parents.len();
        let tokens = level.iter().map(|&c| self.cands[c].token).collect();
        for &c in &level {
            let parent = self.cands[c].parent.map(|p| {
                self.cands[p]
                    .fed
                    .expect("an expanded node's parent was fed")
            });
            self.cands[c].fed = Some(self.fed_parents.len());
            self.fed_parents.push(parent);
        }
        let mask = AttentionMask::tree_extension(self.fed_parents.clone(), cached);
        (level, tokens, mask)
    }

    /// The `budget` best candidates as a tree in level order, with fed indices, probabilities,
    /// ranks.
    pub fn finish(self) -> GrownTree {
        let mut order: Vec<usize> = (0..self.cands.len()).collect();
        order.sort_by(|&a, &b| {
            let (x, y) = (&self.cands[a], &self.cands[b]);
            y.score
                .total_cmp(&x.score)
                .then(x.depth.cmp(&y.depth))
                .then(a.cmp(&b))
        });
        order.truncate(self.budget);
        order.sort_by_key(|&c| (self.cands[c].depth, c));
        let mut node_of = vec![None; self.cands.len()];
        for (n, &c) in order.iter().enumerate() {
            node_of[c] = Some(n);
        }
        let tree = DraftTree {
            tokens: order.iter().map(|&c| self.cands[c].token).collect(),
            parents: order
                .iter()
                .map(|&c| {
                    self.cands[c]
                        .parent
                        .map(|p| node_of[p].expect("the best set is closed under parents"))
                })
                .collect(),
        };
        let fed = order.iter().map(|&c| self.cands[c].fed).collect();
        let q = order.iter().map(|&c| self.cands[c].q).collect();
        let rank = order.iter().map(|&c| self.cands[c].rank).collect();
        let proposals = order
            .iter()
            .map(|&c| self.cands[c].proposal.clone())
            .collect();
        GrownTree {
            tree,
            fed,
            q,
            rank,
            proposals,
        }
    }

    /// The k-th best score so far (−∞ when there are fewer than k).
    fn kth_best_score(&self, k: usize) -> f32 {
        if k == 0 || self.cands.len() < k {
            return f32::NEG_INFINITY;
        }
        let mut scores: Vec<f32> = self.cands.iter().map(|c| c.score).collect();
        scores.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
        scores[k - 1]
    }
}

/// Grows a tree of at most `budget` nodes after feeding `feed`; `bias` guides the drafter,
/// `models` = (single-position, batched). Errors: those of the forward pass (full cache included).
pub(crate) fn grow(
    (model, batch_model): (&Model, &Model),
    cache: &mut KvCache,
    feed: &[u32],
    (budget, params): (usize, &TreeParams),
    (calibration, bias): (&Calibration, &mut dyn DeltaHook),
    mut sampled: Option<SampledGrowth<'_>>,
) -> Result<GrownTree, SpecError> {
    let logits = model.forward(feed, cache, &AttentionMask::Causal, bias)?;
    let root = last_row(&logits, feed.len())?;
    let mut g = TreeGrowth::new(budget, params.branch);
    let first = sampled.as_mut().map(|s| s.draw(&root, &[]));
    g.expand(None, &root, calibration, first);
    g.next_level(0);
    for _ in 1..params.max_depth.min(budget) {
        let (level, tokens, mask) = g.take_frontier();
        if level.is_empty() {
            break;
        }
        let level_model = if tokens.len() > 1 { batch_model } else { model };
        let logits = level_model.forward(&tokens, cache, &mask, bias)?;
        let rows = logits
            .to_vec2::<f32>()
            .map_err(|e| SpecError::Model(e.into()))?;
        let first_new = g.len();
        for (&c, row) in level.iter().zip(&rows) {
            let path = g.path_tokens(c);
            let first = sampled.as_mut().map(|s| s.draw(row, &path));
            g.expand(Some(c), row, calibration, first);
        }
        g.next_level(first_new);
    }
    Ok(g.finish())
}

fn last_row(logits: &cipherlora_model::Tensor, n: usize) -> Result<Vec<f32>, SpecError> {
    logits
        .narrow(0, n - 1, 1)
        .and_then(|t| t.squeeze(0))
        .and_then(|t| t.to_vec1::<f32>())
        .map_err(|e| SpecError::Model(e.into()))
}

/// log Σ exp(row), computed stably.
fn log_sum_exp(row: &[f32]) -> f32 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return max;
    }
    let sum: f32 = row.iter().map(|&l| (l - max).exp()).sum();
    max + sum.ln()
}

/// The `k` largest entries of `row` as (index, value), largest first (ties: lower index first).
fn top_k(row: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    for (i, &v) in row.iter().enumerate() {
        if best.len() == k && best.last().is_some_and(|&(_, w)| v <= w) {
            continue;
        }
        let at = best.partition_point(|&(_, w)| w >= v);
        best.insert(at, (i as u32, v));
        best.truncate(k);
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_is_sorted_and_breaks_ties_by_index() {
        let row = [0.1, 3.0, -1.0, 3.0, 2.0];
        assert_eq!(top_k(&row, 3), vec![(1, 3.0), (3, 3.0), (4, 2.0)]);
        assert_eq!(top_k(&row, 10).len(), 5);
    }

    /// A row whose softmax puts `p` on each listed token (the rest spread thinly over `vocab`).
    fn row(vocab: usize, probs: &[(u32, f32)]) -> Vec<f32> {
        let mut r = vec![-30.0f32; vocab];
        for &(t, p) in probs {
            r[t as usize] = p.ln();
        }
        r
    }

    /// Growth feeds at most `branch` nodes per level ([`TreeParams::max_fed`]).
    #[test]
    fn a_tree_feeds_at_most_max_fed_positions() {
        let mut learnt = Calibration::default();
        for _ in 0..200 {
            for rank in 0..4 {
                learnt.observe(rank, 0.2, true);
            }
        }
        let even = row(64, &[(1, 0.2), (2, 0.2), (3, 0.2), (4, 0.2)]);
        for (branch, depth, budget) in [(4, 15, 15), (3, 15, 15), (2, 8, 8), (4, 8, 15), (3, 16, 8)]
        {
            let params = TreeParams {
                branch,
                max_depth: depth,
            };
            let mut g = TreeGrowth::new(budget, branch);
            g.expand(None, &even, &learnt, None);
            g.next_level(0);
            let mut fed = 0;
            for _ in 1..depth.min(budget) {
                let (level, tokens, _) = g.take_frontier();
                if level.is_empty() {
                    break;
                }
                assert!(tokens.len() <= branch);
                fed += tokens.len();
                let first_new = g.len();
                for &n in &level {
                    g.expand(Some(n), &even, &learnt, None);
                }
                g.next_level(first_new);
            }
            assert!(
                fed <= params.max_fed(budget),
                "{params} budget {budget}: fed {fed}"
            );
        }
    }

    #[test]
    fn growth_keeps_the_most_likely_paths_as_a_tree() {
        let c = Calibration::default();
        let mut g = TreeGrowth::new(4, 2);
        // Root: token 1 (0.6), token 2 (0.3).
        g.expand(None, &row(8, &[(1, 0.6), (2, 0.3)]), &c, None);
        g.next_level(0);
        let (level, tokens, mask) = g.take_frontier();
        assert_eq!((level, tokens), (vec![0, 1], vec![1, 2]));
        assert_eq!(mask, AttentionMask::tree_extension(vec![None, None], 0));
        let first = g.len();
        // After 1: token 3 (0.9), 4 (0.05); after 2: token 5 (0.5), 6 (0.4).
        g.expand(Some(0), &row(8, &[(3, 0.9), (4, 0.05)]), &c, None);
        g.expand(Some(1), &row(8, &[(5, 0.5), (6, 0.4)]), &c, None);
        g.next_level(first);
        // Scores: 1: .6, 2: .3, 1-3: .54, 1-4: .03, 2-5: .15, 2-6: .12.
        let (level, _, mask) = g.take_frontier();
        assert_eq!(level, vec![2, 4]); // 1-3 and 2-5, above the 4th best (.15)
        assert_eq!(
            mask,
            AttentionMask::tree_extension(vec![None, None, Some(0), Some(1)], 2)
        );
        let GrownTree { tree, fed, .. } = g.finish();
        // The 4 best: 1, 1-3, 2, 2-5 — in level order, siblings by rank.
        assert_eq!(tree.tokens, vec![1, 2, 3, 5]);
        assert_eq!(tree.parents, vec![None, None, Some(0), Some(1)]);
        assert_eq!(fed, vec![Some(0), Some(1), Some(2), Some(3)]);
    }

    /// A drawn first child leads its siblings, which skip its token, and is grown first.
    #[test]
    fn a_drawn_first_child_leads_and_is_grown_first() {
        let c = Calibration::default();
        let mut g = TreeGrowth::new(4, 2);
        let r = row(8, &[(1, 0.6), (2, 0.3)]);
        let q: Arc<[f32]> = vec![0.125f32; 8].into();
        g.expand(None, &r, &c, Some((2, Arc::clone(&q))));
        g.next_level(0);
        let (level, tokens, _) = g.take_frontier();
        assert_eq!(tokens, vec![2, 1], "drawn child first: {level:?}");
        let first = g.len();
        g.expand(
            Some(0),
            &row(8, &[(3, 0.9), (4, 0.05)]),
            &c,
            Some((3, Arc::clone(&q))),
        );
        g.expand(
            Some(1),
            &row(8, &[(5, 0.5), (6, 0.4)]),
            &c,
            Some((6, Arc::clone(&q))),
        );
        g.next_level(first);
        let GrownTree {
            tree, proposals, ..
        } = g.finish();
        // The root's drawn child 2, its drawn child 3, then chosen 1.
        assert_eq!(tree.tokens[0], 2);
        assert!(proposals[0].is_some());
        assert_eq!(tree.parents[..2], [None, None]);
        assert_eq!(tree.tokens[1], 1);
        assert!(proposals[1].is_none());
        assert!(tree.tokens.contains(&3), "{tree:?}");
        // Chosen siblings never repeat the drawn token.
        for (i, &p) in tree.parents.iter().enumerate() {
            let siblings: Vec<u32> = (0..tree.len())
                .filter(|&j| tree.parents[j] == p)
                .map(|j| tree.tokens[j])
                .collect();
            assert_eq!(
                siblings.iter().filter(|&&t| t == tree.tokens[i]).count(),
                1,
                "{tree:?}"
            );
        }
    }

    #[test]
    fn budget_one_is_the_drafters_greedy_token() {
        let mut g = TreeGrowth::new(1, 4);
        g.expand(
            None,
            &row(8, &[(7, 0.5), (2, 0.4)]),
            &Calibration::default(),
            None,
        );
        g.next_level(0);
        let GrownTree {
            tree, fed, q, rank, ..
        } = g.finish();
        assert_eq!(rank, vec![0]);
        assert!((q[0] - 0.5 / 0.9).abs() < 1e-3);
        assert_eq!(tree, DraftTree::chain(&[7]));
        assert_eq!(fed, vec![None]);
    }

    #[test]
    fn calibration_learns_hit_rates_from_its_prior() {
        let mut c = Calibration::default();
        // Prior: the bin centre, its square root for a first choice.
        assert!((c.estimate(1, 0.52) - 0.525).abs() < 1e-6);
        assert!((c.estimate(0, 0.52) - 0.525f32.sqrt()).abs() < 1e-6);
        for _ in 0..96 {
            c.observe(1, 0.52, true);
        }
        // 96 hits + 4 × 0.525 pseudo-hits over 100 trials.
        assert!((c.estimate(1, 0.51) - (96.0 + 2.1) / 100.0).abs() < 1e-5);
        // Other bins and ranks keep their prior; estimates stay in (0, 1].
        assert!((c.estimate(1, 0.1) - 0.125).abs() < 1e-6);
        assert!((c.estimate(2, 0.52) - 0.525).abs() < 1e-6);
        for _ in 0..1000 {
            c.observe(5, 0.01, false);
        }
        assert!(c.estimate(2, 0.01) > 0.0 && c.estimate(2, 0.01) < 0.01);
    }

    #[test]
    fn shape_strings_round_trip() {
        let p: TreeParams = "tree:3x6".parse().unwrap();
        assert_eq!(
            p,
            TreeParams {
                branch: 3,
                max_depth: 6
            }
        );
        assert_eq!(p.to_string().parse::<TreeParams>().unwrap(), p);
        assert_eq!("tree".parse::<TreeParams>().unwrap(), TreeParams::default());
        for bad in ["tree:0x3", "tree:3", "chain", "tree:ax2"] {
            assert!(bad.parse::<TreeParams>().is_err(), "{bad}");
        }
    }
}

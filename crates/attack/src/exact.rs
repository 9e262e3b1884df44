//! The attack with the public weights (SipIt: Nikolaou et al., arXiv 2510.15511): position by
//! position, the candidate token whose state matches the observed one within relative L2
//! `tolerance`. Notes: docs/design/code-notes.md, "attack: exact".

use cipherlora_model::{AttentionMask, Model, Tensor};

use crate::learned::Inverter;
use crate::{AttackError, Result};

/// Orders candidate tokens for the state at one position.
pub trait Ranker {
    /// Up to `k` token ids, most likely first. Errors: implementation-specific.
    fn rank(&self, state: &[f32], k: usize) -> Result<Vec<u32>>;
}

impl Ranker for Inverter {
    fn rank(&self, state: &[f32], k: usize) -> Result<Vec<u32>> {
        Inverter::rank(self, state, k)
    }
}

/// Ranks tokens by cosine similarity of the state to their embedding rows (no training).
#[derive(Debug)]
pub struct EmbeddingRanker {
    /// (vocab, hidden), rows scaled to unit norm.
    unit: Tensor,
    /// (vocab, hidden), the raw table.
    table: Tensor,
    /// (vocab,) squared row norms.
    sq: Vec<f32>,
}

impl EmbeddingRanker {
    /// From the model's embedding table. Errors: candle errors.
    pub fn new(model: &Model) -> Result<Self> {
        let e = model.embedding();
        let sq = e.sqr()?.sum_keepdim(1)?;
        let norms = sq.sqrt()?.clamp(1e-12, f64::MAX)?;
        Ok(EmbeddingRanker {
            unit: e.broadcast_div(&norms)?,
            table: e.clone(),
            sq: sq.squeeze(1)?.to_vec1::<f32>()?,
        })
    }

    /// Row `id` of the embedding table.
    fn row(&self, id: u32) -> Result<Vec<f32>> {
        Ok(self.table.get(id as usize)?.to_vec1::<f32>()?)
    }

    /// Tokens by increasing L2 distance of their embedding to `r`.
    fn nearest(&self, r: &[f32], k: usize) -> Result<Vec<u32>> {
        nearest_rows(&self.table, &self.sq, r, k)
    }
}

impl Ranker for EmbeddingRanker {
    fn rank(&self, state: &[f32], k: usize) -> Result<Vec<u32>> {
        let dim = self.unit.dim(1)?;
        if state.len() != dim {
            return Err(AttackError::Input(format!(
                "{} features, expected {dim}",
                state.len()
            )));
        }
        let s = Tensor::from_slice(state, (dim, 1), &candle_core::Device::Cpu)?;
        let sims = self.unit.matmul(&s)?.squeeze(1)?.to_vec1::<f32>()?;
        let mut idx: Vec<u32> = (0..sims.len() as u32).collect();
        idx.sort_by(|&a, &b| {
            sims[b as usize]
                .total_cmp(&sims[a as usize])
                .then(a.cmp(&b))
        });
        idx.truncate(k);
        Ok(idx)
    }
}

/// Every token's state at position 0 after `depth` layers: one lookup inverts position 0.
#[derive(Debug)]
pub struct FirstPositionTable {
    depth: usize,
    states: Tensor,
    sq: Vec<f32>,
}

impl FirstPositionTable {
    /// Computes the table, `batch` tokens per pass. Errors: [`AttackError::Input`]; model errors.
    pub fn new(model: &Model, depth: usize, batch: usize) -> Result<Self> {
        if depth > model.config().num_layers || batch == 0 {
            return Err(AttackError::Input(format!(
                "depth {depth} (model has {}) or batch {batch}",
                model.config().num_layers
            )));
        }
        let vocab = model.config().vocab_size as u32;
        let mut cache = model.new_cache(batch)?;
        let mut parts = Vec::new();
        let ids: Vec<u32> = (0..vocab).collect();
        for chunk in ids.chunks(batch) {
            cache.truncate(0);
            let mask = AttentionMask::tree(vec![None; chunk.len()]);
            parts.push(model.hidden_states(chunk, &mut cache, &mask, depth)?);
        }
        let states = Tensor::cat(&parts, 0)?;
        let sq = states.sqr()?.sum(1)?.to_vec1::<f32>()?;
        Ok(FirstPositionTable { depth, states, sq })
    }

    /// The depth it was computed at.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Tokens by increasing L2 distance of their position-0 state to `target`.
    fn nearest(&self, target: &[f32], k: usize) -> Result<Vec<u32>> {
        nearest_rows(&self.states, &self.sq, target, k)
    }
}

/// The first `k` rows of `table` by L2 distance to `r` (`sq`: squared row norms).
fn nearest_rows(table: &Tensor, sq: &[f32], r: &[f32], k: usize) -> Result<Vec<u32>> {
    let dim = r.len();
    let t = Tensor::from_slice(r, (dim, 1), &candle_core::Device::Cpu)?;
    let dots = table.matmul(&t)?.squeeze(1)?.to_vec1::<f32>()?;
    let d: Vec<f32> = dots.iter().zip(sq).map(|(p, q)| q - 2.0 * p).collect();
    let mut idx: Vec<u32> = (0..d.len() as u32).collect();
    let k = k.min(idx.len());
    if k == 0 {
        return Ok(Vec::new());
    }
    idx.select_nth_unstable_by(k - 1, |&a, &b| {
        d[a as usize].total_cmp(&d[b as usize]).then(a.cmp(&b))
    });
    idx.truncate(k);
    idx.sort_by(|&a, &b| d[a as usize].total_cmp(&d[b as usize]).then(a.cmp(&b)));
    Ok(idx)
}

/// Candidates per pass of [`ExactConfig::full_search`].
pub const FULL_SEARCH_BATCH: usize = 1024;

/// Search settings.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub struct ExactConfig {
    /// Candidates tried per position at most.
    pub budget: usize,
    /// Candidates per forward pass.
    pub batch: usize,
    /// Relative L2 distance under which a candidate matches.
    pub tolerance: f64,
    /// After `budget` misses, search the whole vocabulary (needs the embedding ranker).
    #[serde(default)]
    pub full_search: bool,
}

impl Default for ExactConfig {
    fn default() -> Self {
        ExactConfig {
            budget: 256,
            batch: 64,
            tolerance: 1e-3,
            full_search: false,
        }
    }
}

/// Outcome of inverting one or more windows.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct ExactResult {
    /// Recovered token per position.
    pub recovered: Vec<u32>,
    /// Positions where a candidate matched within the tolerance.
    pub matched: usize,
    /// Per position: whether it matched.
    pub matched_at: Vec<bool>,
    /// Candidates whose state was computed, all positions.
    pub candidates_tried: usize,
    /// Smallest relative distance of a wrong candidate (∞ if none): the tolerance's margin.
    pub closest_wrong: f64,
    /// Largest relative distance of an accepted match (0 if none).
    pub farthest_match: f64,
}

impl ExactResult {
    fn merge(&mut self, o: ExactResult) {
        self.recovered.extend(o.recovered);
        self.matched += o.matched;
        self.matched_at.extend(o.matched_at);
        self.candidates_tried += o.candidates_tried;
        self.closest_wrong = self.closest_wrong.min(o.closest_wrong);
        self.farthest_match = self.farthest_match.max(o.farthest_match);
    }
}

fn rel_dist(a: &[f32], b: &[f32]) -> f64 {
    let (mut d, mut n) = (0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        d += (x as f64 - y as f64).powi(2);
        n += (y as f64).powi(2);
    }
    (d / n.max(1e-30)).sqrt()
}

/// Recovers one window's tokens from `observed` ((T, hidden), row-major) after `depth` layers.
/// Errors: [`AttackError::Input`]; model errors.
pub fn invert_window(
    model: &Model,
    observed: &[f32],
    depth: usize,
    ranker: &dyn Ranker,
    refine: Option<&EmbeddingRanker>,
    first: Option<&FirstPositionTable>,
    cfg: &ExactConfig,
) -> Result<ExactResult> {
    check_table_depth(first, depth)?;
    let dim = model.config().hidden_size;
    if depth > model.config().num_layers {
        return Err(AttackError::Input(format!(
            "depth {depth} > the model's {} layers",
            model.config().num_layers
        )));
    }
    if observed.is_empty() || !observed.len().is_multiple_of(dim) {
        return Err(AttackError::Input(format!(
            "{} state values is not a positive multiple of {dim}",
            observed.len()
        )));
    }
    if cfg.budget == 0 || cfg.batch == 0 {
        return Err(AttackError::Input("zero budget or batch".into()));
    }
    let t = observed.len() / dim;
    let widest = if cfg.full_search {
        cfg.batch.min(cfg.budget).max(FULL_SEARCH_BATCH)
    } else {
        cfg.batch.min(cfg.budget)
    };
    let mut cache = model.new_cache(t + widest)?;
    let mut res = ExactResult {
        closest_wrong: f64::INFINITY,
        ..Default::default()
    };
    let mut matched_so_far = true;
    for pos in 0..t {
        let target = &observed[pos * dim..(pos + 1) * dim];
        let ranked = match first {
            Some(f) if pos == 0 => f.nearest(target, cfg.budget)?,
            _ => ranker.rank(target, cfg.budget)?,
        };
        let mut next_ranked = 0usize;
        let mut refined: Vec<u32> = Vec::new();
        let mut next_refined = 0usize;
        let mut tried: std::collections::HashSet<u32> = std::collections::HashSet::new();
        let mut best: Option<(u32, f64)> = None;
        let mut best_row: Vec<f32> = Vec::new();
        let mut found = None;
        while tried.len() < cfg.budget {
            // Half the batch from the ranker, half from the refinement.
            let want = cfg.batch.min(cfg.budget - tried.len());
            let mut group: Vec<u32> = Vec::with_capacity(want);
            let mut turn = 0usize;
            while group.len() < want {
                let from_refined = turn % 2 == 1 && next_refined < refined.len();
                let pick = if from_refined || next_ranked >= ranked.len() {
                    let Some(&c) = refined.get(next_refined) else {
                        break;
                    };
                    next_refined += 1;
                    c
                } else {
                    next_ranked += 1;
                    ranked[next_ranked - 1]
                };
                turn += 1;
                if tried.insert(pick) {
                    group.push(pick);
                }
            }
            if group.is_empty() {
                break;
            }
            let mask = AttentionMask::tree(vec![None; group.len()]);
            let h = model.hidden_states(&group, &mut cache, &mask, depth)?;
            cache.truncate(pos);
            res.candidates_tried += group.len();
            let rows = h.to_vec2::<f32>()?;
            let mut dists: Vec<(u32, f64)> = group
                .iter()
                .zip(&rows)
                .map(|(&c, r)| (c, rel_dist(r, target)))
                .collect();
            let mut improved = false;
            for (i, &(c, d)) in dists.iter().enumerate() {
                if best.is_none_or(|(_, bd)| d < bd) {
                    best = Some((c, d));
                    best_row = rows[i].clone();
                    improved = true;
                }
            }
            dists.sort_by(|a, b| a.1.total_cmp(&b.1));
            if dists[0].1 < cfg.tolerance {
                let (tok, _) = dists[0];
                found = Some(dists[0]);
                if let Some(&(_, d2)) = dists.iter().find(|(c, _)| *c != tok) {
                    res.closest_wrong = res.closest_wrong.min(d2);
                }
                break;
            }
            if matched_so_far {
                res.closest_wrong = res.closest_wrong.min(dists[0].1);
            }
            // Refinement: `target − (h(best) − e(best))` estimates the embedding; try its
            // neighbours.
            if let (Some(er), Some((bc, _)), true) = (refine, best, improved) {
                let e = er.row(bc)?;
                let r: Vec<f32> = target
                    .iter()
                    .zip(&best_row)
                    .zip(&e)
                    .map(|((t, h), e)| t - h + e)
                    .collect();
                refined = er.nearest(&r, cfg.batch + tried.len())?;
                next_refined = 0;
            }
        }
        if found.is_none()
            && cfg.full_search
            && let (Some(er), Some((bc, _))) = (refine, best)
        {
            let e = er.row(bc)?;
            let r: Vec<f32> = target
                .iter()
                .zip(&best_row)
                .zip(&e)
                .map(|((t, h), e)| t - h + e)
                .collect();
            let order: Vec<u32> = er
                .nearest(&r, usize::MAX)?
                .into_iter()
                .filter(|c| !tried.contains(c))
                .collect();
            for group in order.chunks(FULL_SEARCH_BATCH) {
                let mask = AttentionMask::tree(vec![None; group.len()]);
                let h = model.hidden_states(group, &mut cache, &mask, depth)?;
                cache.truncate(pos);
                res.candidates_tried += group.len();
                let rows = h.to_vec2::<f32>()?;
                let mut hit = None;
                for (&c, row) in group.iter().zip(&rows) {
                    let d = rel_dist(row, target);
                    if d < cfg.tolerance && hit.is_none_or(|(_, hd)| d < hd) {
                        hit = Some((c, d));
                    } else if matched_so_far {
                        res.closest_wrong = res.closest_wrong.min(d);
                    }
                }
                if hit.is_some() {
                    found = hit;
                    break;
                }
            }
        }
        let token = match found {
            Some((c, d)) => {
                res.matched += 1;
                res.matched_at.push(true);
                res.farthest_match = res.farthest_match.max(d);
                c
            }
            None => {
                // The prefix is now uncertain: later misses say nothing of the margin.
                matched_so_far = false;
                res.matched_at.push(false);
                best.map(|(c, _)| c).unwrap_or(0)
            }
        };
        res.recovered.push(token);
        model.hidden_states(&[token], &mut cache, &AttentionMask::Causal, depth)?;
    }
    Ok(res)
}

/// A position-0 table, if any, must be for the attack's depth.
fn check_table_depth(first: Option<&FirstPositionTable>, depth: usize) -> Result<()> {
    match first {
        Some(f) if f.depth != depth => Err(AttackError::Input(format!(
            "position-0 table for depth {}, attack at depth {depth}",
            f.depth
        ))),
        _ => Ok(()),
    }
}

/// [`invert_window`] over consecutive windows. Errors: [`AttackError::Input`]; as `invert_window`.
#[allow(clippy::too_many_arguments)]
pub fn invert_windows(
    model: &Model,
    states: &[f32],
    window_lens: &[usize],
    depth: usize,
    ranker: &dyn Ranker,
    refine: Option<&EmbeddingRanker>,
    first: Option<&FirstPositionTable>,
    cfg: &ExactConfig,
) -> Result<ExactResult> {
    check_table_depth(first, depth)?;
    let dim = model.config().hidden_size;
    let total: usize = window_lens.iter().sum();
    if total * dim != states.len() || total == 0 {
        return Err(AttackError::Input(format!(
            "{} state values for {total} positions of dimension {dim}",
            states.len()
        )));
    }
    let mut res = ExactResult {
        closest_wrong: f64::INFINITY,
        ..Default::default()
    };
    let mut at = 0;
    for &len in window_lens {
        let w = &states[at * dim..(at + len) * dim];
        res.merge(invert_window(model, w, depth, ranker, refine, first, cfg)?);
        at += len;
    }
    Ok(res)
}

/// `first`'s ranking, then `second`'s new tokens, up to `k`.
pub struct ChainRanker<'a> {
    /// Consulted first.
    pub first: &'a dyn Ranker,
    /// Fills the remaining places.
    pub second: &'a dyn Ranker,
}

impl Ranker for ChainRanker<'_> {
    fn rank(&self, state: &[f32], k: usize) -> Result<Vec<u32>> {
        let mut out = self.first.rank(state, k)?;
        if out.len() < k {
            let seen: std::collections::HashSet<u32> = out.iter().copied().collect();
            let more = self.second.rank(state, k)?;
            out.extend(more.into_iter().filter(|t| !seen.contains(t)));
            out.truncate(k);
        }
        Ok(out)
    }
}

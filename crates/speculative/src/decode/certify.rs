//! Which leading rows of a verify pass are final: greedy chains and trees
//! by their top-1/top-2 margin against what the last trip still moved,
//! sampled chains by whether the remaining error could change their draws.

use cipherlora_model::{Sampler, Tensor};

use super::{SpecConfig, rows};
use crate::SpecError;
use crate::acceptance::{DraftProbs, RowUniforms};
use crate::draw_bounds::{BoundedRow, DrawCut, decided, log_weight_bound};
use crate::schedule::{
    FixedPoint, Schedule, certify_greedy, certify_sampled, certify_tree_greedy, remaining_error,
};
use crate::target_probs::chain_probs;
use crate::tree::DraftTree;

/// Decides how many leading rows of a verify pass are final, from the
/// pass's logits and how much they still moved ([`Window::certify`];
/// certification: docs/design/schedules.md).
pub(super) struct Certifier<'c> {
    pub(super) cfg: &'c SpecConfig,
    /// A tree round's tree.
    pub(super) tree: Option<&'c DraftTree>,
    /// A sampled chain's uniforms, when its draws are certified.
    pub(super) draws: Option<&'c [RowUniforms]>,
    /// The window's drafts (its positions 1..real).
    pub(super) drafts: &'c [u32],
    /// The drafter's distributions, when it sampled.
    pub(super) draft_probs: Option<&'c [Vec<f32>]>,
    pub(super) sampler: &'c Sampler,
    pub(super) context: &'c [u32],
    pub(super) cut: &'c DrawCut,
}

impl Certifier<'_> {
    /// Positions in the window: the last context token and the drafts.
    fn real(&self) -> usize {
        self.drafts.len() + 1
    }

    /// Certified leading rows under the schedule (all of them per group).
    pub(super) fn rows(
        &self,
        logits: &Tensor,
        change: &[f32],
        previous: Option<&[f32]>,
    ) -> Result<usize, SpecError> {
        let (real, greedy) = (self.real(), self.sampler.is_greedy());
        Ok(match (&self.cfg.schedule, self.tree, self.draws) {
            (Schedule::FixedPoint(fp), Some(t), _) if greedy => {
                certify_tree_greedy(&rows(logits, real)?, change, previous, t, fp.margin)
            }
            (Schedule::FixedPoint(fp), None, _) if greedy => certify_greedy(
                &rows(logits, real)?,
                change,
                previous,
                self.drafts,
                fp.margin,
            ),
            (Schedule::FixedPoint(fp), None, Some(uniforms)) => {
                self.draws(fp, logits, change, previous, uniforms)?
            }
            (Schedule::FixedPoint(fp), tree, _) => {
                let rows = certify_sampled(change, previous, real, fp.sampling_tolerance);
                // A sampled tree walk may visit any row: all or none.
                if tree.is_some() && rows < real {
                    0
                } else {
                    rows
                }
            }
            (Schedule::PerGroup, _, _) => real,
        })
    }

    /// A sampled chain's rows whose draws the remaining error cannot change
    /// (`crate::draw_bounds`), within the round's fixed cut.
    fn draws(
        &self,
        fp: &FixedPoint,
        logits: &Tensor,
        change: &[f32],
        previous: Option<&[f32]>,
        uniforms: &[RowUniforms],
    ) -> Result<usize, SpecError> {
        let sampling = &self.cfg.sampling;
        let bounds: Vec<f32> = (0..self.real())
            .map(|j| fp.margin * remaining_error(change, previous, j))
            .collect();
        let tolerance = fp.draw_tolerance * sampling.temperature.min(1.0);
        let m = self.cut.rows(&bounds, tolerance);
        if m == 0 {
            return Ok(0);
        }
        let probs = chain_probs(self.sampler, &rows(logits, m)?, self.context, self.drafts);
        let bounded: Vec<BoundedRow<'_>> = probs
            .iter()
            .zip(&bounds)
            .map(|(p, &b)| BoundedRow {
                probs: p,
                delta: log_weight_bound(b, sampling).unwrap_or(f64::INFINITY),
            })
            .collect();
        let q = draft_probs(self.draft_probs, m - 1);
        Ok(if decided(&self.drafts[..m - 1], q, &bounded, uniforms) {
            m
        } else {
            0
        })
    }
}

/// How the first `n` drafts were chosen: from `probs` rows, or point masses.
pub(super) fn draft_probs(probs: Option<&[Vec<f32>]>, n: usize) -> DraftProbs<'_> {
    match probs {
        Some(q) => DraftProbs::Sampled(&q[..n]),
        None => DraftProbs::PointMass,
    }
}

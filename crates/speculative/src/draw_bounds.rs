//! Certifying a sampled row's *draw* from a bound on its logits: with uniforms drawn first, a round
//! is decided when every distribution within the bounds gives the same outcome (Leviathan et al.
//! 2023, Algorithm 1). Notes: docs/design/code-notes.md, "spec: draw_bounds".

use std::cell::Cell;

use cipherlora_model::SamplingParams;

use crate::acceptance::{DraftProbs, RowUniforms};
use crate::race::Race;

/// Relative slack for the rounding of the f32 probabilities.
const ROUNDING: f64 = 1e-5;

/// One verify row: its estimated probabilities and bound δ on its log-weights.
#[derive(Debug, Clone, Copy)]
pub struct BoundedRow<'a> {
    /// The estimate's probabilities, over the whole vocabulary.
    pub probs: &'a [f32],
    /// |log w_exact(x) − log w_estimate(x) − c| ≤ `delta` for one c and every x.
    pub delta: f64,
}

/// δ = max(θ, 1/θ)·ε/τ; `None` for greedy or top-k/top-p.
#[must_use]
pub fn log_weight_bound(logit_bound: f32, params: &SamplingParams) -> Option<f64> {
    let covered =
        params.temperature > 0.0 && params.top_k.is_none() && params.top_p.is_none_or(|p| p >= 1.0);
    if !covered {
        return None;
    }
    let theta = f64::from(params.repetition_penalty);
    let lipschitz = theta.max(1.0 / theta);
    Some(lipschitz * f64::from(logit_bound) / f64::from(params.temperature))
}

/// Whether acceptance gives the same outcome for every distribution within the bounds.
#[must_use]
pub fn decided(
    drafts: &[u32],
    draft_probs: DraftProbs<'_>,
    rows: &[BoundedRow<'_>],
    uniforms: &[RowUniforms],
) -> bool {
    if rows.len() != drafts.len() + 1 || uniforms.len() < rows.len() {
        return false;
    }
    for (i, &d) in drafts.iter().enumerate() {
        let row = rows[i];
        let Some(&p_d) = row.probs.get(d as usize) else {
            return false;
        };
        let spread = 2.0 * (row.delta + ROUNDING);
        let q = |t: usize| match draft_probs {
            DraftProbs::PointMass => f64::from(u8::from(t == d as usize)),
            DraftProbs::Sampled(q) => q.get(i).and_then(|r| r.get(t)).map_or(0.0, |&x| x.into()),
        };
        let uq = uniforms[i].accept * q(d as usize);
        let p_d = f64::from(p_d);
        if uq < p_d * (-spread).exp() {
            continue;
        }
        if uq < p_d * spread.exp() {
            return false;
        }
        // Rejected whatever the exact p: the residual max(0, p − q).
        let n = row.probs.len();
        let p = |t: usize| f64::from(row.probs[t]);
        let lo = |t: usize| (p(t) * (-spread).exp() - q(t)).max(0.0);
        let hi = |t: usize| (p(t) * spread.exp() - q(t)).max(0.0);
        let race = uniforms[i].race(n);
        return if (0..n).all(|t| hi(t) <= 0.0) {
            // p ≤ q everywhere for every p in the bound: the fallback to p.
            pick_decided(row, &race)
        } else if (0..n).any(|t| lo(t) > 0.0) {
            let center = |t: usize| (p(t) - q(t)).max(0.0);
            race.winner(center)
                .is_some_and(|t| race.wins_within(t as usize, lo, hi))
        } else {
            false
        };
    }
    let last = rows[drafts.len()];
    pick_decided(last, &uniforms[drafts.len()].race(last.probs.len()))
}

/// Whether the row's bonus pick by `race` is the same for every distribution within its bound.
fn pick_decided(row: BoundedRow<'_>, race: &Race) -> bool {
    let p = |t: usize| f64::from(row.probs[t]);
    let spread = row.delta + ROUNDING;
    race.winner(p).is_some_and(|t| {
        race.wins_within(
            t as usize,
            |s| p(s) * (-spread).exp(),
            |s| p(s) * spread.exp(),
        )
    })
}

/// The rows a sampled round may use, fixed from the bounds alone.
#[derive(Debug, Default)]
pub struct DrawCut {
    rows: Cell<Option<usize>>,
}

impl DrawCut {
    /// A cut not fixed yet.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The cut: fixed already, or the leading rows within `tolerance`; 0 while none is.
    pub fn rows(&self, bounds: &[f32], tolerance: f32) -> usize {
        if let Some(m) = self.rows.get() {
            return m;
        }
        let m = bounds.iter().take_while(|&&b| b <= tolerance).count();
        if m > 0 {
            self.rows.set(Some(m));
        }
        m
    }

    /// The fixed cut, if any.
    #[must_use]
    pub fn fixed(&self) -> Option<usize> {
        self.rows.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acceptance::accept_sampled_with;
    use proptest::prelude::*;

    fn softmax(l: &[f64]) -> Vec<f32> {
        let max = l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = l.iter().map(|x| (x - max).exp()).collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|x| (x / s) as f32).collect()
    }

    proptest! {
        /// A decided round's outcome is every exact distribution's within the bound.
        #[test]
        fn a_decided_draw_is_the_exact_draw(
            logits in proptest::collection::vec(proptest::collection::vec(-3.0f64..3.0, 6), 3),
            noise in proptest::collection::vec(proptest::collection::vec(-1.0f64..1.0, 6), 3),
            eps in 0.0f64..0.3,
            drafts in proptest::collection::vec(0u32..6, 2),
            u in proptest::collection::vec((0.0f64..1.0, any::<u64>()), 3),
            sampled in any::<bool>(),
        ) {
            let uniforms: Vec<RowUniforms> =
                u.iter().map(|&(accept, race_seed)| RowUniforms { accept, race_seed }).collect();
            let estimate: Vec<Vec<f32>> = logits.iter().map(|l| softmax(l)).collect();
            let q: Vec<Vec<f32>> = logits[..2]
                .iter()
                .map(|l| softmax(&l.iter().map(|x| 0.7 * x + 0.3).collect::<Vec<_>>()))
                .collect();
            let draft_probs = if sampled { DraftProbs::Sampled(&q) } else { DraftProbs::PointMass };
            let rows: Vec<BoundedRow<'_>> =
                estimate.iter().map(|p| BoundedRow { probs: p, delta: eps }).collect();
            prop_assume!(decided(&drafts, draft_probs, &rows, &uniforms));
            let want = accept_sampled_with(&drafts, draft_probs, &estimate, &uniforms).unwrap();
            for shift in [-1.0, 1.0, 0.0] {
                let exact: Vec<Vec<f32>> = logits
                    .iter()
                    .zip(&noise)
                    .map(|(l, n)| {
                        let moved: Vec<f64> = l
                            .iter()
                            .zip(n)
                            .enumerate()
                            .map(|(t, (x, z))| {
                                let s = if shift == 0.0 { *z } else if t % 2 == 0 { shift } else { -shift };
                                x + eps * s
                            })
                            .collect();
                        softmax(&moved)
                    })
                    .collect();
                let got = accept_sampled_with(&drafts, draft_probs, &exact, &uniforms).unwrap();
                prop_assert_eq!(&got, &want);
            }
        }
    }

    #[test]
    fn a_wider_bound_decides_less() {
        let p = softmax(&[0.0, 1.0, 2.0]);
        let row = |delta| BoundedRow { probs: &p, delta };
        let (mut tight, mut wide) = (0, 0);
        for seed in 0..20 {
            let u = [RowUniforms {
                accept: 0.5,
                race_seed: seed,
            }];
            tight += usize::from(decided(&[], DraftProbs::PointMass, &[row(0.0)], &u));
            wide += usize::from(decided(&[], DraftProbs::PointMass, &[row(5.0)], &u));
        }
        // A zero bound decides every race; e^±10 between two clocks decides next to none.
        assert_eq!((tight, wide), (20, 0));
    }

    #[test]
    fn the_cut_is_fixed_at_its_first_usable_rows() {
        let cut = DrawCut::new();
        assert_eq!(cut.rows(&[0.5, 0.1], 0.2), 0);
        assert_eq!(cut.fixed(), None);
        assert_eq!(cut.rows(&[0.1, 0.1, 0.5], 0.2), 2);
        // Later, tighter bounds do not move it.
        assert_eq!(cut.rows(&[0.0, 0.0, 0.0], 0.2), 2);
        assert_eq!(cut.fixed(), Some(2));
    }

    #[test]
    fn truncating_samplers_are_not_covered() {
        let mut params = SamplingParams {
            temperature: 0.5,
            ..SamplingParams::default()
        };
        let near = |got: Option<f64>, want: f64| got.is_some_and(|g| (g - want).abs() < 1e-6);
        assert!(near(log_weight_bound(0.1, &params), 0.2));
        params.repetition_penalty = 2.0;
        assert!(near(log_weight_bound(0.1, &params), 0.4));
        params.top_p = Some(0.9);
        assert_eq!(log_weight_bound(0.1, &params), None);
        params.top_p = None;
        params.top_k = Some(40);
        assert_eq!(log_weight_bound(0.1, &params), None);
        assert_eq!(log_weight_bound(0.1, &SamplingParams::greedy()), None);
    }
}

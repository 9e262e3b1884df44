//! Slot vectors of a plan (client inputs, server diagonals, output map), `slot(j, p) = j·T + p`
//! (layout: [`crate::plan`]).

use crate::adapter::FusedGroup;
use crate::error::{HeloraError, Result};
use crate::plan::{BabySteps, GroupPlan, Layout, Mode, Reach, Segment};

/// Where a delta value lives in the client's output: projection, output row, position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaIndex {
    /// Projection within the group.
    pub proj: usize,
    /// Output row within the projection.
    pub row: usize,
    /// A slot position (0..T') in [`output_map`], a round position (0..T) in the client's map.
    pub pos: usize,
}

fn fill_dim<V: Copy>(v: &mut [V], t: usize, j: usize, col: impl Fn(usize) -> V) {
    for p in 0..t {
        v[j * t + p] = col(p);
    }
}

/// Projection and row of fused output row `fused`.
fn split_row(plan: &GroupPlan, fused: usize) -> (usize, usize) {
    let mut base = 0;
    for (p, &d) in plan.shape.d_outs.iter().enumerate() {
        if fused < base + d {
            return (p, fused - base);
        }
        base += d;
    }
    (plan.shape.d_outs.len() - 1, fused - base)
}

/// Per output ciphertext, the delta each slot must hold. Errors as [`GroupPlan::layout`].
pub fn output_map(plan: &GroupPlan) -> Result<Vec<Vec<Option<DeltaIndex>>>> {
    let l = plan.layout()?;
    let t = plan.slot_positions();
    let mut out = vec![vec![None; plan.slots]; plan.stage_b.n_out];
    for (c, map) in out.iter_mut().enumerate() {
        for s in &l.segments {
            for x in 0..s.width {
                let row = c * s.width + x;
                if row >= s.out_len {
                    break;
                }
                let (proj, row) = split_row(plan, s.out0 + row);
                for pos in 0..t {
                    map[(s.start + x) * t + pos] = Some(DeltaIndex { proj, row, pos });
                }
            }
        }
    }
    Ok(out)
}

/// FFA client inputs from `U` (R × T'): real values, or masks in `Z_p` for the offline phase
/// (zero: `V::default()`). Errors: [`HeloraError::ShapeMismatch`]; plan errors.
pub fn ffa_inputs<V: Copy + Default>(plan: &GroupPlan, u: &[V]) -> Result<Vec<Vec<V>>> {
    let l = plan.layout()?;
    let t = plan.slot_positions();
    let r = plan.shape.total_rank();
    if u.len() != r * t {
        return Err(HeloraError::ShapeMismatch {
            what: "U (R × T')",
            expected: r * t,
            got: u.len(),
        });
    }
    let copies = match plan.stage_b.baby {
        BabySteps::Server | BabySteps::ServerExtended => 1,
        BabySteps::Client => l.babies_b,
    };
    Ok((0..copies)
        .map(|b| {
            let mut v = vec![V::default(); plan.slots];
            for s in &l.segments {
                for x in 0..s.width + s.ext {
                    let row = s.u_off + (x + b) % s.period;
                    let dim = (s.start + s.lead + x) % l.w_in;
                    fill_dim(&mut v, t, dim, |p| u[row * t + p]);
                }
            }
            v
        })
        .collect())
}

/// Standard client inputs from X (T' × d_in), real or in `Z_p` as [`ffa_inputs`]. Errors:
/// [`HeloraError::ShapeMismatch`]; plan errors.
pub fn standard_inputs<V: Copy + Default>(plan: &GroupPlan, x: &[V]) -> Result<Vec<Vec<V>>> {
    let l = plan.layout()?;
    let sa = plan.stage_a.ok_or(HeloraError::InfeasiblePlan {
        reason: "standard inputs need stage A",
    })?;
    let (t, d) = (plan.slot_positions(), plan.shape.d_in);
    if x.len() != t * d {
        return Err(HeloraError::ShapeMismatch {
            what: "X (T' × d_in)",
            expected: t * d,
            got: x.len(),
        });
    }
    let copies = match sa.baby {
        BabySteps::Server | BabySteps::ServerExtended => 1,
        BabySteps::Client => l.babies_a,
    };
    let mut out = Vec::with_capacity(l.n_x * copies);
    for c in 0..l.n_x {
        for b in 0..copies {
            let mut v = vec![V::default(); plan.slots];
            for j in 0..l.w_in {
                let col = c * sa.period + (j + b) % sa.period;
                if col < d {
                    fill_dim(&mut v, t, j, |p| x[p * d + col]);
                }
            }
            out.push(v);
        }
    }
    Ok(out)
}

/// Stage-B diagonal for output `c`, giant `q`, baby `b`, pre-rotated by `−q·g·T`.
pub fn stage_b_diag(
    plan: &GroupPlan,
    l: &Layout,
    f: &FusedGroup,
    c: usize,
    q: usize,
    b: usize,
) -> Vec<f64> {
    let t = plan.slot_positions();
    let k = q * plan.stage_b.g + b;
    let shift = q * plan.stage_b.g;
    let mut v = vec![0.0; plan.slots];
    for s in &l.segments {
        if k >= s.diags {
            continue;
        }
        for x in 0..s.width {
            let row = c * s.width + x;
            if row >= s.out_len {
                break;
            }
            let Some(col) = stage_b_read(plan.stage_b.reach, s, x, k) else {
                continue;
            };
            if s.u_off + col >= plan.shape.total_rank() {
                continue; // a padding row of U (dense layout): zero
            }
            let w = f.b_entry(s.out0 + row, s.u_off + col);
            fill_dim(&mut v, t, (s.start + x + shift) % l.w_in, |_| w);
        }
    }
    v
}

/// The column of the segment's `U` output `x` reads through diagonal `k`, if any.
fn stage_b_read(reach: Reach, s: &Segment, x: usize, k: usize) -> Option<usize> {
    match reach {
        Reach::Ahead => Some((x + k) % s.period),
        Reach::TwoSided => {
            let lo = x.min(s.width - s.period);
            let read = (x + k).checked_sub(s.lead)?;
            (lo..lo + s.period)
                .contains(&read)
                .then_some(read % s.period)
        }
    }
}

/// Stage-A diagonal for chunk `c`, giant `q`, baby `b`, pre-rotated by `−q·g·T`.
pub fn stage_a_diag(
    plan: &GroupPlan,
    l: &Layout,
    f: &FusedGroup,
    c: usize,
    q: usize,
    b: usize,
) -> Vec<f64> {
    let mut v = vec![0.0; plan.slots];
    let Some(sa) = plan.stage_a else {
        return v;
    };
    let (t, d) = (plan.slot_positions(), plan.shape.d_in);
    let k = q * sa.g + b;
    let shift = q * sa.g;
    for s in &l.segments {
        for j in s.start..s.start + s.region {
            let col = c * sa.period + (j + k) % sa.period;
            let row = s.u_off + (j - s.start) % s.period;
            // Padding rows of U (dense layout) stay zero.
            if col < d && row < plan.shape.total_rank() {
                let w = f.a[row * d + col];
                fill_dim(&mut v, t, (j + shift) % l.w_in, |_| w);
            }
        }
    }
    v
}

/// Whether the mode of `plan` and the FFA/standard input kind agree.
pub(crate) fn check_mode(plan: &GroupPlan, want: Mode) -> Result<()> {
    if plan.mode != want {
        return Err(HeloraError::InfeasiblePlan {
            reason: "plan mode does not match the call",
        });
    }
    Ok(())
}

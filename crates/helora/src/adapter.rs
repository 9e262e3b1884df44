//! LoRA adapters of one layer group fused into one block-diagonal LoRA: `A_f` (R × d_in) stacked,
//! `B_f = diag(s_p·B_p)` (D × R), `s_p = lora_alpha / r`; `A·B` is never formed.

use crate::error::{HeloraError, Result};

/// One projection's adapter: `Δ = scaling · B · (A · x)`.
#[derive(Debug, Clone, PartialEq)]
pub struct ProjectionAdapter {
    /// Name (e.g. `q_proj`), for reports only.
    pub name: String,
    /// Output dimension d_out.
    pub d_out: usize,
    /// Rank r.
    pub rank: usize,
    /// `lora_A`, r × d_in, row-major.
    pub a: Vec<f32>,
    /// `lora_B`, d_out × r, row-major.
    pub b: Vec<f32>,
    /// `lora_alpha / r`.
    pub scaling: f32,
}

/// The adapters of one group sharing an input (f32 matrices, as PEFT stores them).
#[derive(Debug, Clone, PartialEq)]
pub struct GroupAdapter {
    /// Shared input dimension d_in.
    pub d_in: usize,
    /// The projections, in output order.
    pub projections: Vec<ProjectionAdapter>,
}

/// Most projections one group may fuse (a decoded plan or offer with more is malformed).
pub const MAX_PROJECTIONS: usize = 64;

/// The public shape of a group: what client and server both know.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GroupShape {
    /// Shared input dimension d_in.
    pub d_in: usize,
    /// Output dimension of each projection.
    pub d_outs: Vec<usize>,
    /// Rank of each projection.
    pub ranks: Vec<usize>,
}

impl GroupShape {
    /// Builds and validates a shape. Errors: [`HeloraError::InvalidShape`].
    pub fn new(d_in: usize, d_outs: Vec<usize>, ranks: Vec<usize>) -> Result<Self> {
        let s = GroupShape {
            d_in,
            d_outs,
            ranks,
        };
        s.validate()?;
        Ok(s)
    }

    /// Checks the invariants of [`GroupShape::new`]; errors as there.
    pub fn validate(&self) -> Result<()> {
        if self.d_outs.is_empty() {
            return Err(HeloraError::InvalidShape {
                reason: "no projection",
            });
        }
        if self.d_outs.len() != self.ranks.len() {
            return Err(HeloraError::InvalidShape {
                reason: "d_outs and ranks differ in length",
            });
        }
        if self.d_in == 0 || self.d_outs.contains(&0) || self.ranks.contains(&0) {
            return Err(HeloraError::InvalidShape {
                reason: "zero dimension or rank",
            });
        }
        Ok(())
    }

    /// Total rank R = Σ r_p.
    pub fn total_rank(&self) -> usize {
        self.ranks.iter().sum()
    }

    /// Total output dimension D = Σ d_out_p.
    pub fn total_out(&self) -> usize {
        self.d_outs.iter().sum()
    }

    /// Offset of projection `p`'s rows in the fused U (Σ_{p'<p} r_p').
    pub fn rank_offset(&self, p: usize) -> usize {
        self.ranks[..p].iter().sum()
    }

    /// Offset of projection `p`'s outputs in the fused Δ (Σ_{p'<p} d_out_p').
    pub fn out_offset(&self, p: usize) -> usize {
        self.d_outs[..p].iter().sum()
    }
}

impl GroupAdapter {
    /// The public shape of this group.
    pub fn shape(&self) -> GroupShape {
        GroupShape {
            d_in: self.d_in,
            d_outs: self.projections.iter().map(|p| p.d_out).collect(),
            ranks: self.projections.iter().map(|p| p.rank).collect(),
        }
    }

    /// Checks every matrix against the shape. Errors: [`HeloraError::ShapeMismatch`],
    /// `InvalidShape`.
    pub fn validate(&self) -> Result<()> {
        self.shape().validate()?;
        for p in &self.projections {
            if p.a.len() != p.rank * self.d_in {
                return Err(HeloraError::ShapeMismatch {
                    what: "lora_A",
                    expected: p.rank * self.d_in,
                    got: p.a.len(),
                });
            }
            if p.b.len() != p.d_out * p.rank {
                return Err(HeloraError::ShapeMismatch {
                    what: "lora_B",
                    expected: p.d_out * p.rank,
                    got: p.b.len(),
                });
            }
            if !p.scaling.is_finite() {
                return Err(HeloraError::InvalidShape {
                    reason: "scaling is not finite",
                });
            }
        }
        Ok(())
    }

    /// Plaintext reference `Δ_p = s_p·B_p·A_p·x_t` for `x` (T × d_in): T × d_out_p per projection.
    /// Errors: [`HeloraError::ShapeMismatch`].
    pub fn reference_delta(&self, x: &[f32]) -> Result<Vec<Vec<f64>>> {
        let fused = FusedGroup::new(self)?;
        let t = positions(x.len(), self.d_in)?;
        let u = fused.down(x, t);
        Ok(fused.up(&u, t))
    }
}

/// Number of positions in a position-major T × d matrix.
pub(crate) fn positions(len: usize, d: usize) -> Result<usize> {
    if d == 0 || !len.is_multiple_of(d) || len == 0 {
        return Err(HeloraError::ShapeMismatch {
            what: "activations (T × d_in)",
            expected: d,
            got: len,
        });
    }
    Ok(len / d)
}

/// A group with the scaling folded into B, in f64, as the server stores it.
#[derive(Debug, Clone, PartialEq)]
pub struct FusedGroup {
    /// Public shape.
    pub shape: GroupShape,
    /// Stacked `A_f`, R × d_in, row-major.
    pub a: Vec<f64>,
    /// Per projection `s_p·B_p`, d_out_p × r_p, row-major.
    pub b_blocks: Vec<Vec<f64>>,
}

impl FusedGroup {
    /// Fuses a group (stacks the A's, folds scalings into B); errors as [`GroupAdapter::validate`].
    pub fn new(g: &GroupAdapter) -> Result<Self> {
        g.validate()?;
        let a = g
            .projections
            .iter()
            .flat_map(|p| p.a.iter().map(|&v| f64::from(v)))
            .collect();
        let b_blocks = g
            .projections
            .iter()
            .map(|p| {
                let s = f64::from(p.scaling);
                p.b.iter().map(|&v| s * f64::from(v)).collect()
            })
            .collect();
        Ok(FusedGroup {
            shape: g.shape(),
            a,
            b_blocks,
        })
    }

    /// Entry `B_f[row, col]` of the fused block-diagonal B (zero off-block).
    pub fn b_entry(&self, row: usize, col: usize) -> f64 {
        let mut out0 = 0;
        let mut r0 = 0;
        for (p, (&d, &r)) in self.shape.d_outs.iter().zip(&self.shape.ranks).enumerate() {
            if row < out0 + d {
                return if col >= r0 && col < r0 + r {
                    self.b_blocks[p][(row - out0) * r + (col - r0)]
                } else {
                    0.0
                };
            }
            out0 += d;
            r0 += r;
        }
        0.0
    }

    /// `U = A_f · X`: returns R × T (row-major) from position-major X (T × d_in).
    pub fn down(&self, x: &[f32], t: usize) -> Vec<f64> {
        let (r, d) = (self.shape.total_rank(), self.shape.d_in);
        let mut u = vec![0.0; r * t];
        for i in 0..r {
            let row = &self.a[i * d..(i + 1) * d];
            for p in 0..t {
                let xp = &x[p * d..(p + 1) * d];
                u[i * t + p] = row.iter().zip(xp).map(|(a, &x)| a * f64::from(x)).sum();
            }
        }
        u
    }

    /// `Δ_p = (s_p B_p) · U_p`, position-major T × d_out_p, from U (R × T).
    pub fn up(&self, u: &[f64], t: usize) -> Vec<Vec<f64>> {
        let mut out = Vec::with_capacity(self.b_blocks.len());
        for (p, blk) in self.b_blocks.iter().enumerate() {
            let (d, r, r0) = (
                self.shape.d_outs[p],
                self.shape.ranks[p],
                self.shape.rank_offset(p),
            );
            let mut delta = vec![0.0; t * d];
            for pos in 0..t {
                for i in 0..d {
                    delta[pos * d + i] =
                        (0..r).map(|k| blk[i * r + k] * u[(r0 + k) * t + pos]).sum();
                }
            }
            out.push(delta);
        }
        out
    }
}

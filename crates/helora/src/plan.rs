//! Evaluation plans for one layer group: packing geometry and BSGS parameters.
//!
//! # Slot layout
//! Dimension-major, position-minor: dimension `j` of position `p` lives in slot
//! `j·T + p`, so a rotation by `k·T` moves dimension `j+k` into `j` for all T
//! positions at once. A ciphertext holds `w_in = ⌊slots/T⌋` dimensions; the
//! last `slots − w_in·T` slots are never read with a non-zero weight. Because
//! T is rarely a power of two, a cyclic rotation by `k·T` does **not** wrap
//! consistently, so every layout below is sized such that no weighted read
//! ever wraps around (this costs a few dimensions per ciphertext, the `ext`
//! of each segment).
//!
//! # Two positions per complex slot ([`PositionPacking::ComplexPairs`])
//! CKKS slots are complex (Cheon–Kim–Kim–Song, Asiacrypt 2017, §3.2) and
//! every server operation here is linear with *real* plaintext weights
//! (products by real diagonals, rotations, additions, rescales), so it acts
//! on the real and imaginary parts of the slots independently. The client
//! therefore packs position `p < T'` in the real part and position `p + T'`
//! in the imaginary part of the same slot, `T' = ⌈T/2⌉`: the whole layout
//! below is built for `T'` *slot positions* ([`GroupPlan::slot_positions`]),
//! so a round of T positions costs what a round of ⌈T/2⌉ real positions
//! costs (fewer output ciphertexts, products, giant steps and decryptions;
//! the baby steps do not depend on T). Only the client knows or cares: the
//! server's computation is unchanged. Leak-freedom is unchanged too: each
//! returned slot holds the requested deltas of two positions (or zero in the
//! imaginary part past T), never partial sums — the weights being real, no
//! term crosses from one part to the other.
//!
//! # Stage B (`Δ = B_f · U`, both modes)
//! Generalised diagonals of a tall matrix (Halevi–Shoup, "Algorithms in
//! HElib", CRYPTO 2014, §4): with `u'` holding U replicated cyclically along
//! the dimension axis, `Δ[o] = Σ_{k<K} diag_k[o] · u'[o+k]`. The baby-step /
//! giant-step split `k = q·g + b` (Halevi–Shoup, "Faster homomorphic linear
//! transformations in HElib", CRYPTO 2018, §3) computes the g baby rotations
//! `rot(u', b·T)` once per group (hoisted: one key-switch decomposition
//! shared by all of them, Bossuat et al., "Efficient Bootstrapping for
//! Approximate HE with Non-Sparse Keys", EUROCRYPT 2021, §3.2 — the
//! "pre-rotated plaintext diagonals" of `lora-structure-aware-he.md` §7 are the
//! giant-step pre-rotation `rot^{-q·g·T}(diag)` done at load time) and one
//! giant rotation by `q·g·T` per output ciphertext and `q ≥ 1`. Lattigo's
//! `LinearTransformation` (he/linear_transformation.go) follows the same split.
//! Each giant partial sum is rescaled before its giant rotation, so giant
//! key switches run one level lower (one rescale each instead of one per
//! output; measured ≈ 2.5–4× cheaper key switches at N = 8192).
//!
//! In FFA mode the input is *segmented*: projection p owns the dimension range
//! `[start_p, start_p + W_p + ext_p)` in which `u'[start_p + x] = U_p[x mod r_p]`,
//! so projection p needs only `r_p` diagonals instead of R (the fused `B_f` is
//! block-diagonal: the other `R − r_p` generalised diagonals would be zero
//! there). All segments share the same input ciphertext and rotations.
//!
//! # Dense outputs ([`Reach::TwoSided`], FFA)
//! The `ext` dimensions above hold input only: every output ciphertext
//! returns them as zeros, `Σ_p (r_p − 1)` of its `w_in` dimensions (with
//! 16 projections of rank 16 in one group, 240 of 1024: a quarter of the
//! download). Reading both ways removes them: projection p's input holds
//! `U_p` replicated over exactly its `W_p` output dimensions, shifted by
//! `lead = R − 1`, and output `x` reads the one period `x'' ∈ [lo, lo + r_p)`
//! with `lo = min(x, W_p − r_p)` through diagonal `k = x'' − x + lead`,
//! `0 ≤ k ≤ 2R − 2`. Each output still sums exactly its own row (leak-freedom
//! as above), at `2R − 1` diagonals instead of R: more ct×pt products and
//! giant steps on the server for fewer output ciphertexts, decryptions and
//! bytes down, which the planner weighs. When T divides the slots a rotation
//! by `k·T` wraps consistently over the dimensions (`w_in·T = slots`), so the
//! shifted inputs may wrap and the lead costs nothing.
//!
//! With client baby steps ([`BabySteps::Client`]) the client encrypts the g
//! pre-rotated copies `rot(u', b·T)` itself (exactly, no wrap-around): no
//! server baby rotations, paid in g encryptions and g× upload.
//!
//! # Stage A (`U = A_f · X`, standard mode only)
//! The wide `A_f` (R × d_in) uses the Halevi–Shoup hybrid: X is cut into
//! `n_x` chunks of `P` columns (P a multiple of R); the client replicates each
//! chunk periodically with period P along the dimension axis (`x'_c`), the
//! server computes `y = Σ_c Σ_{k<R} dA_{c,k} ⊙ rot(x'_c, k·T)` (BSGS as above,
//! the sum over chunks is taken before the giant rotations) with
//! `dA_{c,k}[j] = A_f[j mod R, c·P + (j+k) mod P]`, and then the window sum
//! `u'[j] = Σ_{m<P/R} y[j + m·R]` (rotate-and-add by `m·R·T`) leaves the
//! **fully summed** `U[j mod R]` on the dimensions stage B reads. Each window
//! reaches `P − 1` dimensions beyond its start, so the stage-A region of a
//! row block is `W + P − 1` dimensions; dimensions past the fully summed part
//! hold partial sums, which stage B multiplies by exact zero weights: they
//! never reach the client.
//!
//! *Segmented* stage A ([`StageAPlan::segmented`], equal ranks r): one row
//! block per projection, `row(j) = u_off_p + (j − start_p) mod r`, so both
//! stages use r diagonals instead of R (the other R − r generalised diagonals
//! of the block-diagonal `B_f` are zero) and the window stride is r; the
//! price is one `P − 1` region gap per projection. The planner weighs both.

use std::collections::BTreeSet;

use crate::adapter::GroupShape;
use crate::error::{HeloraError, Result};

/// Which LoRA variant the group is evaluated as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// FFA-LoRA: lora_A public, the client computes `U = A·X` in plaintext;
    /// depth 1.
    Ffa,
    /// Standard LoRA: lora_A and lora_B secret; the server computes both
    /// products on ciphertexts; depth 2.
    Standard,
}

/// Who produces the baby-step rotations of a stage's input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BabySteps {
    /// The server rotates the input (hoisted rotations, each brought back
    /// to `Q` by its own ModDown).
    Server,
    /// The client encrypts pre-rotated copies (no server baby rotation).
    Client,
    /// The server rotates the input with double hoisting (Bossuat et al.,
    /// "Efficient Bootstrapping for Approximate HE with Non-Sparse Keys",
    /// EUROCRYPT 2021, §4.2): the rotations stay over `Q·P`, are multiplied
    /// by diagonals encoded over `Q·P`, and each giant-step sum takes one
    /// fused ModDown + rescale. Cheaper rotations, dearer products (one more
    /// limb); the planner weighs both.
    ServerExtended,
}

impl BabySteps {
    /// Whether the server makes the baby steps ([`BabySteps::Server`] or
    /// [`BabySteps::ServerExtended`]).
    pub fn on_server(self) -> bool {
        matches!(self, BabySteps::Server | BabySteps::ServerExtended)
    }
}

/// How the T positions of a round occupy the complex slots (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PositionPacking {
    /// One position per slot, in the real part (imaginary parts zero).
    Real,
    /// Two positions per slot: position `p < ⌈T/2⌉` in the real part,
    /// position `p + ⌈T/2⌉` in the imaginary part.
    ComplexPairs,
}

impl PositionPacking {
    /// Slot positions a round of `t` positions occupies: `t` or `⌈t/2⌉`.
    pub fn slot_positions(self, t: usize) -> usize {
        match self {
            PositionPacking::Real => t,
            PositionPacking::ComplexPairs => t.div_ceil(2),
        }
    }
}

/// Which input dimensions an FFA stage-B output reads (module docs,
/// "Dense outputs").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reach {
    /// Output `x` of a segment reads inputs `x … x + r − 1`: r diagonals, and
    /// `r − 1` input-only dimensions (`ext`) after every segment, which hold
    /// no output. Standard mode always reads so.
    Ahead,
    /// Output `x` reads one period of its segment's inputs: the r from `x`
    /// on, or the segment's last r where fewer remain, all within
    /// `x − (R − 1) … x + (R − 1)` (R the largest rank): `2R − 1` diagonals
    /// and no `ext`, so every dimension of an output ciphertext holds a
    /// delta (FFA with server baby steps only).
    TwoSided,
}

/// Stage B (`Δ = B_f·U`) parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StageBPlan {
    /// Output ciphertexts per group.
    pub n_out: usize,
    /// Baby-step size g (1 ≤ g ≤ number of diagonals).
    pub g: usize,
    /// Who makes the baby steps (standard mode: always [`BabySteps::Server`]).
    pub baby: BabySteps,
    /// Which inputs each output reads ([`Reach::Ahead`] in standard mode).
    pub reach: Reach,
}

/// Stage A (`U = A_f·X`, standard mode) parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StageAPlan {
    /// Columns of X per input chunk, P (a multiple of R).
    pub period: usize,
    /// Baby-step size g (1 ≤ g ≤ R).
    pub g: usize,
    /// Who makes the baby steps.
    pub baby: BabySteps,
    /// One row block per projection (stride r, block-diagonal B exploited
    /// in both stages; needs equal ranks) instead of one fused block of R
    /// rows.
    pub segmented: bool,
}

/// The evaluation plan of one layer group for T positions.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GroupPlan {
    /// Slots per ciphertext (N/2).
    pub slots: usize,
    /// Positions per verify round (K+1, or draft-tree nodes).
    pub t: usize,
    /// How positions occupy the complex slots; the layout is built for
    /// [`GroupPlan::slot_positions`] positions.
    pub packing: PositionPacking,
    /// LoRA variant.
    pub mode: Mode,
    /// Public shape of the group.
    pub shape: GroupShape,
    /// Stage A, present iff `mode == Standard`.
    pub stage_a: Option<StageAPlan>,
    /// Stage B.
    pub stage_b: StageBPlan,
    /// Add a fresh encryption of zero with flooding noise to every returned
    /// ciphertext (circuit privacy).
    pub rerandomize: bool,
}

/// A run of dimensions of every stage-B output ciphertext that holds one
/// block of output rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// First dimension.
    pub start: usize,
    /// Output dimensions per ciphertext (W).
    pub width: usize,
    /// Extra input dimensions read beyond the outputs (no wrap-around).
    pub ext: usize,
    /// Dimensions from the segment's first output to its first input
    /// (`R − 1` under [`Reach::TwoSided`], else 0); input dimensions are
    /// taken modulo [`Layout::w_in`].
    pub lead: usize,
    /// Dimensions the segment owns in the input (FFA: `width + ext`) or in
    /// the stage-A product y (standard: `width + P − 1`, the window sums'
    /// reach); segments never overlap.
    pub region: usize,
    /// Diagonals used by this segment (K_p).
    pub diags: usize,
    /// Period of the replicated U in this segment's input.
    pub period: usize,
    /// Index in the fused U of the value at `start` (`u'[start+x] = U[u_off + x mod period]`).
    pub u_off: usize,
    /// First fused output row of this segment.
    pub out0: usize,
    /// Output rows of this segment over all ciphertexts.
    pub out_len: usize,
}

/// Geometry derived from a [`GroupPlan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Dimensions per ciphertext, ⌊slots/T⌋.
    pub w_in: usize,
    /// Stage-B segments.
    pub segments: Vec<Segment>,
    /// Stage-B diagonals (max over segments).
    pub diags_b: usize,
    /// Stage-B giant steps ⌈diags_b / g⌉.
    pub giants_b: usize,
    /// Stage-B baby steps actually used, min(g, diags_b).
    pub babies_b: usize,
    /// Stage-A chunks `n_x` (0 in FFA).
    pub n_x: usize,
    /// Stage-A row-block rank ρ: diagonals of stage A and stride of the
    /// window sum (R fused, r segmented; 0 in FFA).
    pub stride_a: usize,
    /// Stage-A window length P/ρ (0 in FFA).
    pub window: usize,
    /// Stage-A giant steps (0 in FFA).
    pub giants_a: usize,
    /// Stage-A baby steps actually used (0 in FFA).
    pub babies_a: usize,
}

fn ceil_div(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

fn infeasible(reason: &'static str) -> HeloraError {
    HeloraError::InfeasiblePlan { reason }
}

impl GroupPlan {
    /// Multiplicative depth (levels consumed): FFA 1, standard 2.
    pub fn depth(&self) -> usize {
        match self.mode {
            Mode::Ffa => 1,
            Mode::Standard => 2,
        }
    }

    /// Slot positions the layout is built for: T ([`PositionPacking::Real`])
    /// or ⌈T/2⌉ ([`PositionPacking::ComplexPairs`]). In the docs of the
    /// layout and packing, "T" means this number.
    pub fn slot_positions(&self) -> usize {
        self.packing.slot_positions(self.t)
    }

    /// Level at which the client encrypts (= depth: outputs end at level 0).
    pub fn input_level(&self) -> usize {
        self.depth()
    }

    /// Derives and checks the geometry.
    ///
    /// # Errors
    /// [`HeloraError::InfeasiblePlan`] when a packing constraint fails
    /// (reads would wrap around, g out of range, …), or
    /// [`HeloraError::InvalidShape`].
    pub fn layout(&self) -> Result<Layout> {
        self.shape.validate()?;
        if self.t == 0 || self.slots == 0 {
            return Err(infeasible("T and slots must be positive"));
        }
        let w_in = self.slots / self.slot_positions();
        let sb = self.stage_b;
        if sb.n_out == 0 {
            return Err(infeasible("n_out must be positive"));
        }
        if sb.g == 0 {
            return Err(infeasible("baby-step size must be positive"));
        }
        let r_total = self.shape.total_rank();
        match (self.mode, self.stage_a) {
            (Mode::Ffa, None) => {
                let r_max = *self.shape.ranks.iter().max().unwrap_or(&1);
                let two_sided = sb.reach == Reach::TwoSided;
                if two_sided && sb.baby == BabySteps::Client {
                    return Err(infeasible("two-sided reach needs server baby steps"));
                }
                let lead = if two_sided { r_max - 1 } else { 0 };
                let diags_b = if two_sided { 2 * r_max - 1 } else { r_max };
                if sb.g > diags_b {
                    return Err(infeasible("baby-step size above the diagonal count"));
                }
                let mut segments = Vec::with_capacity(self.shape.ranks.len());
                let mut start = 0;
                for (p, (&d, &r)) in self.shape.d_outs.iter().zip(&self.shape.ranks).enumerate() {
                    let width = ceil_div(d, sb.n_out);
                    let ext = match (sb.reach, sb.baby) {
                        (Reach::TwoSided, _) => 0,
                        (Reach::Ahead, BabySteps::Server | BabySteps::ServerExtended) => r - 1,
                        (Reach::Ahead, BabySteps::Client) => ((r - 1) / sb.g) * sb.g,
                    };
                    if two_sided && width < r {
                        return Err(infeasible("two-sided reach needs segments of ≥ r outputs"));
                    }
                    segments.push(Segment {
                        start,
                        width,
                        ext,
                        lead,
                        region: width + ext,
                        diags: if two_sided { diags_b } else { r },
                        period: r,
                        u_off: self.shape.rank_offset(p),
                        out0: self.shape.out_offset(p),
                        out_len: d,
                    });
                    start += width + ext;
                }
                // Rotations by multiples of T wrap consistently over the
                // dimensions when T divides the slots: then the inputs may
                // wrap too, and the lead costs no dimension.
                let cyclic = w_in * self.slot_positions() == self.slots;
                if start + if cyclic { 0 } else { lead } > w_in {
                    return Err(infeasible("segments do not fit the slots"));
                }
                Ok(Layout {
                    w_in,
                    segments,
                    diags_b,
                    giants_b: ceil_div(diags_b, sb.g),
                    babies_b: sb.g.min(diags_b),
                    n_x: 0,
                    stride_a: 0,
                    window: 0,
                    giants_a: 0,
                    babies_a: 0,
                })
            }
            (Mode::Standard, Some(sa)) => {
                if !sb.baby.on_server() {
                    return Err(infeasible("standard stage B needs server baby steps"));
                }
                if sb.reach != Reach::Ahead {
                    return Err(infeasible("standard stage B reads ahead only"));
                }
                // Row blocks of the stage-A output: one per projection
                // (segmented; equal ranks) or one fused block of all R rows.
                let n_proj = self.shape.ranks.len();
                let rho = if sa.segmented {
                    let r0 = self.shape.ranks[0];
                    if self.shape.ranks.iter().any(|&r| r != r0) {
                        return Err(infeasible("segmented stage A needs equal ranks"));
                    }
                    r0
                } else {
                    r_total
                };
                if sb.g > rho || sa.g == 0 || sa.g > rho {
                    return Err(infeasible("baby-step size out of range"));
                }
                if sa.period == 0 || sa.period % rho != 0 {
                    return Err(infeasible(
                        "stage-A period must be a positive multiple of the row-block rank",
                    ));
                }
                let blocks: Vec<(usize, usize, usize)> = if sa.segmented {
                    (0..n_proj)
                        .map(|p| {
                            (
                                self.shape.rank_offset(p),
                                self.shape.out_offset(p),
                                self.shape.d_outs[p],
                            )
                        })
                        .collect()
                } else {
                    vec![(0, 0, self.shape.total_out())]
                };
                let mut segments = Vec::with_capacity(blocks.len());
                let mut start = 0;
                for (u_off, out0, out_len) in blocks {
                    let width = ceil_div(out_len, sb.n_out);
                    segments.push(Segment {
                        start,
                        width,
                        ext: rho - 1,
                        lead: 0,
                        region: width + sa.period - 1,
                        diags: rho,
                        period: rho,
                        u_off,
                        out0,
                        out_len,
                    });
                    start += width + sa.period - 1;
                }
                if start + rho - 1 > w_in {
                    return Err(infeasible("stage-A regions do not fit the slots"));
                }
                Ok(Layout {
                    w_in,
                    segments,
                    diags_b: rho,
                    giants_b: ceil_div(rho, sb.g),
                    babies_b: sb.g.min(rho),
                    n_x: ceil_div(self.shape.d_in, sa.period),
                    stride_a: rho,
                    window: sa.period / rho,
                    giants_a: ceil_div(rho, sa.g),
                    babies_a: sa.g.min(rho),
                })
            }
            _ => Err(infeasible("stage A present iff mode is standard")),
        }
    }

    /// Ciphertexts the client uploads for this group.
    ///
    /// # Errors
    /// As [`GroupPlan::layout`].
    pub fn input_cts(&self) -> Result<usize> {
        let l = self.layout()?;
        Ok(match self.mode {
            Mode::Ffa => match self.stage_b.baby {
                BabySteps::Server | BabySteps::ServerExtended => 1,
                BabySteps::Client => l.babies_b,
            },
            Mode::Standard => {
                let sa = self.stage_a.ok_or_else(|| infeasible("missing stage A"))?;
                match sa.baby {
                    BabySteps::Server | BabySteps::ServerExtended => l.n_x,
                    BabySteps::Client => l.n_x * l.babies_a,
                }
            }
        })
    }

    /// The stage-A window sum `S_M = Σ_{m<M} rot(y, m·unit)` as a chain of
    /// `(step, add_y)`: each entry computes `S ← (add_y ? y : S) + rot(S, step)`
    /// (binary method, MSB first: ⌊log2 M⌋ doublings plus popcount(M) − 1
    /// increments).
    pub fn window_steps(window: usize, unit: usize) -> Vec<(i64, bool)> {
        let mut steps = Vec::new();
        if window <= 1 {
            return steps;
        }
        let msb = usize::BITS - 1 - window.leading_zeros();
        let mut cur = 1usize;
        for bit in (0..msb).rev() {
            steps.push(((cur * unit) as i64, false));
            cur *= 2;
            if (window >> bit) & 1 == 1 {
                steps.push((unit as i64, true));
                cur += 1;
            }
        }
        steps
    }

    /// The Galois steps (left rotations, in slots) the plan uses: the server
    /// needs keys for exactly these.
    ///
    /// # Errors
    /// As [`GroupPlan::layout`].
    pub fn galois_steps(&self) -> Result<BTreeSet<i64>> {
        let l = self.layout()?;
        let t = self.slot_positions() as i64;
        let mut s = BTreeSet::new();
        if self.stage_b.baby.on_server() {
            s.extend((1..l.babies_b as i64).map(|b| b * t));
        }
        let g = self.stage_b.g as i64;
        s.extend((1..l.giants_b as i64).map(|q| q * g * t));
        if let Some(sa) = self.stage_a {
            if sa.baby.on_server() {
                s.extend((1..l.babies_a as i64).map(|b| b * t));
            }
            s.extend((1..l.giants_a as i64).map(|q| q * sa.g as i64 * t));
            s.extend(
                Self::window_steps(l.window, l.stride_a * self.slot_positions())
                    .into_iter()
                    .map(|(st, _)| st),
            );
        }
        Ok(s)
    }
}

//! Evaluation plans for one layer group: dimension-major slots (`j·T + p`), two positions per
//! complex slot, BSGS over generalised diagonals (Halevi–Shoup, CRYPTO 2014, §4; CRYPTO 2018, §3)
//! with hoisting. Derivation: docs/design/code-notes.md, "helora: plan".

use std::collections::BTreeSet;

use crate::adapter::GroupShape;
use crate::error::{HeloraError, Result};

/// Which LoRA variant the group is evaluated as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// FFA-LoRA: lora_A public, the client computes `U = A·X` in plaintext; depth 1.
    Ffa,
    /// Standard LoRA: both factors secret, both products on ciphertexts (depth 2).
    Standard,
}

/// Who produces the baby-step rotations of a stage's input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BabySteps {
    /// The server rotates the input (hoisted, one ModDown per rotation).
    Server,
    /// The client encrypts pre-rotated copies (no server baby rotation).
    Client,
    /// The server rotates with double hoisting (Bossuat et al., EUROCRYPT 2021, §4.2).
    ServerExtended,
}

impl BabySteps {
    /// Whether the server makes the baby steps.
    pub fn on_server(self) -> bool {
        matches!(self, BabySteps::Server | BabySteps::ServerExtended)
    }
}

/// How the T positions of a round occupy the complex slots (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PositionPacking {
    /// One position per slot, in the real part (imaginary parts zero).
    Real,
    /// Two positions per slot: `p < ⌈T/2⌉` in the real part, `p + ⌈T/2⌉` in the imaginary part.
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

/// Which input dimensions an FFA stage-B output reads (module docs, "Dense outputs").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reach {
    /// Output `x` reads inputs `x … x + r − 1`: r diagonals, `r − 1` input-only dimensions.
    Ahead,
    /// Output `x` reads one period within `x ± (R − 1)`: `2R − 1` diagonals, dense outputs.
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
    /// One row block per projection (stride r; needs equal ranks) instead of one of R rows.
    pub segmented: bool,
}

/// The evaluation plan of one layer group for T positions.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GroupPlan {
    /// Slots per ciphertext (N/2).
    pub slots: usize,
    /// Positions per verify round (K+1, or draft-tree nodes).
    pub t: usize,
    /// How positions occupy the complex slots.
    pub packing: PositionPacking,
    /// LoRA variant.
    pub mode: Mode,
    /// Public shape of the group.
    pub shape: GroupShape,
    /// Stage A, present iff `mode == Standard`.
    pub stage_a: Option<StageAPlan>,
    /// Stage B.
    pub stage_b: StageBPlan,
    /// Rerandomise every returned ciphertext with flooding noise (circuit privacy).
    pub rerandomize: bool,
}

/// A run of dimensions of every stage-B output ciphertext that holds one block of output rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// First dimension.
    pub start: usize,
    /// Output dimensions per ciphertext (W).
    pub width: usize,
    /// Extra input dimensions read beyond the outputs (no wrap-around).
    pub ext: usize,
    /// Dimensions from the segment's first output to its first input, modulo [`Layout::w_in`].
    pub lead: usize,
    /// Dimensions the segment owns: FFA `width + ext`, standard `width + P − 1`.
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
    /// Stage-A row-block rank ρ (R fused, r segmented; 0 in FFA).
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

    /// Slot positions the layout is built for: T, or ⌈T/2⌉ with complex pairs ("T" in the layout
    /// docs).
    pub fn slot_positions(&self) -> usize {
        self.packing.slot_positions(self.t)
    }

    /// Level at which the client encrypts (= depth: outputs end at level 0).
    pub fn input_level(&self) -> usize {
        self.depth()
    }

    /// Derives and checks the geometry. Errors: [`HeloraError::InfeasiblePlan`], `InvalidShape`.
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
                // When T divides the slots, rotations by multiples of T wrap consistently: the lead
                // is free.
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
                // Stage-A row blocks: one per projection (segmented) or one fused block of R rows;
                // a dense layout pads R to a divisor of w_in (zero rows).
                let n_proj = self.shape.ranks.len();
                let dense = self.dense_standard();
                let rho = if sa.segmented {
                    let r0 = self.shape.ranks[0];
                    if self.shape.ranks.iter().any(|&r| r != r0) {
                        return Err(infeasible("segmented stage A needs equal ranks"));
                    }
                    r0
                } else if dense {
                    r_total.next_power_of_two()
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
                if dense {
                    return Self::dense_layout(
                        self.shape.total_out(),
                        self.shape.d_in,
                        w_in,
                        rho,
                        sa,
                        sb,
                    );
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

    /// Whether this standard plan is dense: positions divide the slots (rotations by multiples
    /// of T' wrap consistently), one fused row block, and stage-A chunks of a whole
    /// ciphertext (`P = w_in`). Stage A's window sum then leaves U fully summed in every
    /// dimension, so X fills its ciphertexts and the outputs fill theirs (code-notes.md,
    /// "Dense standard layout").
    pub fn dense_standard(&self) -> bool {
        let t = self.slot_positions();
        self.stage_a
            .is_some_and(|sa| t > 0 && !sa.segmented && sa.period * t == self.slots)
    }

    /// The dense standard layout: one segment of every dimension, U of period ρ (R padded to a
    /// divisor of `w_in`). Errors: [`HeloraError::InfeasiblePlan`].
    fn dense_layout(
        total_out: usize,
        d_in: usize,
        w_in: usize,
        rho: usize,
        sa: StageAPlan,
        sb: StageBPlan,
    ) -> Result<Layout> {
        if !w_in.is_multiple_of(rho) {
            return Err(infeasible(
                "dense layout needs the row-block rank to divide w_in",
            ));
        }
        let width = ceil_div(total_out, sb.n_out);
        if width > w_in {
            return Err(infeasible("outputs do not fit the slots"));
        }
        Ok(Layout {
            w_in,
            segments: vec![Segment {
                start: 0,
                width,
                ext: 0,
                lead: 0,
                region: w_in,
                diags: rho,
                period: rho,
                u_off: 0,
                out0: 0,
                out_len: total_out,
            }],
            diags_b: rho,
            giants_b: ceil_div(rho, sb.g),
            babies_b: sb.g.min(rho),
            n_x: ceil_div(d_in, sa.period),
            stride_a: rho,
            window: sa.period / rho,
            giants_a: ceil_div(rho, sa.g),
            babies_a: sa.g.min(rho),
        })
    }

    /// Ciphertexts the client uploads for this group; errors as [`GroupPlan::layout`].
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

    /// The window sum `Σ_{m<M} rot(y, m·unit)` as binary-method `(step, add_y)` steps.
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

    /// The Galois steps the server needs keys for; errors as [`GroupPlan::layout`].
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

impl GroupPlan {
    /// A stable identifier of the plan within a build (FNV-1a over every field), e.g. to key the
    /// diagonals encoded for it.
    #[must_use]
    pub fn id(&self) -> u64 {
        canonical_bytes(self)
            .into_iter()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            })
    }
}

/// The bytes [`GroupPlan::id`] hashes: every field, in a fixed order.
fn canonical_bytes(p: &GroupPlan) -> Vec<u8> {
    let mut o = Vec::with_capacity(64);
    put_u32(&mut o, p.slots);
    put_u32(&mut o, p.t);
    o.push(match p.packing {
        PositionPacking::Real => 0,
        PositionPacking::ComplexPairs => 1,
    });
    o.push(match p.mode {
        Mode::Ffa => 0,
        Mode::Standard => 1,
    });
    o.push(u8::from(p.rerandomize));
    put_u32(&mut o, p.shape.d_in);
    put_u32(&mut o, p.shape.d_outs.len());
    for (&d, &r) in p.shape.d_outs.iter().zip(&p.shape.ranks) {
        put_u32(&mut o, d);
        put_u32(&mut o, r);
    }
    put_u32(&mut o, p.stage_b.n_out);
    put_u32(&mut o, p.stage_b.g);
    o.push(baby_code(p.stage_b.baby));
    o.push(match p.stage_b.reach {
        Reach::Ahead => 0,
        Reach::TwoSided => 1,
    });
    match p.stage_a {
        None => o.push(0),
        Some(a) => {
            o.push(1);
            put_u32(&mut o, a.period);
            put_u32(&mut o, a.g);
            o.push(baby_code(a.baby));
            o.push(u8::from(a.segmented));
        }
    }
    o
}

fn put_u32(out: &mut Vec<u8>, v: usize) {
    out.extend_from_slice(&(v as u32).to_le_bytes());
}

fn baby_code(b: BabySteps) -> u8 {
    match b {
        BabySteps::Server => 0,
        BabySteps::Client => 1,
        BabySteps::ServerExtended => 2,
    }
}

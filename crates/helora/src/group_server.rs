//! The server half: the adapter as encoded diagonals, evaluated on the client's ciphertexts; only
//! fully summed deltas leave, every other returned slot has an exact zero weight.

use crate::adapter::{FusedGroup, GroupAdapter};
use crate::counts::LEVELS;
use crate::error::{HeloraError, Result};
use crate::he_traits::HeServer;
use crate::packing::{output_map, stage_a_diag, stage_b_diag};
use crate::plan::{BabySteps, GroupPlan, Layout};
use bytes::Bytes;

/// Diagonals of one stage, `[giant][term]`, over `Q·P` when double hoisted.
enum Diags<S: HeServer> {
    Plain(Vec<Vec<S::Pt>>),
    Extended(Vec<Vec<S::ExtPt>>),
}

impl<S: HeServer> Diags<S> {
    fn encode(server: &S, extended: bool, per_q: Vec<Vec<Vec<f64>>>, level: usize) -> Result<Self> {
        Ok(if extended {
            Diags::Extended(
                per_q
                    .iter()
                    .map(|vs| {
                        vs.iter()
                            .map(|v| server.encode_weights_extended(v, level))
                            .collect()
                    })
                    .collect::<Result<_>>()?,
            )
        } else {
            Diags::Plain(
                per_q
                    .iter()
                    .map(|vs| vs.iter().map(|v| server.encode_weights(v, level)).collect())
                    .collect::<Result<_>>()?,
            )
        })
    }

    fn giants(&self) -> usize {
        match self {
            Diags::Plain(d) => d.len(),
            Diags::Extended(d) => d.len(),
        }
    }

    /// Adds this stage's diagonals, at `level`, to `(plain, extended)`.
    fn count_into(&self, level: usize, counts: &mut ([u64; LEVELS], [u64; LEVELS])) {
        match self {
            Diags::Plain(d) => counts.0[level] += d.iter().map(Vec::len).sum::<usize>() as u64,
            Diags::Extended(d) => counts.1[level] += d.iter().map(Vec::len).sum::<usize>() as u64,
        }
    }
}

/// Baby-step rotations of a stage's input: ordinary ciphertexts, or kept over `Q·P`.
enum Babies<'a, S: HeServer> {
    Plain(Vec<&'a S::Ct>),
    Extended(Vec<&'a S::ExtCt>),
}

/// A group's adapter encoded for one plan, all diagonals encoded once at load.
pub struct PreparedGroup<S: HeServer> {
    plan: GroupPlan,
    layout: Layout,
    /// Stage-B diagonals `[c][q][b]`.
    b_diags: Vec<Diags<S>>,
    /// Stage-A diagonals `[q][c·babies + b]` (standard mode).
    a_diags: Option<Diags<S>>,
    /// Per output ciphertext, the bound on every slot part for normalised inputs.
    output_bounds: Vec<f64>,
}

/// Per projection and row, `Σ_j |W_row,j|` of the server's map: the largest |output| for ±1 inputs.
fn row_bounds(fused: &FusedGroup, ffa: bool) -> Vec<Vec<f64>> {
    let shape = &fused.shape;
    let d_in = shape.d_in;
    let mut w = vec![0.0f64; d_in];
    fused
        .b_blocks
        .iter()
        .enumerate()
        .map(|(p, blk)| {
            let (d, r, r0) = (shape.d_outs[p], shape.ranks[p], shape.rank_offset(p));
            (0..d)
                .map(|i| {
                    let row = &blk[i * r..(i + 1) * r];
                    if ffa {
                        return row.iter().map(|v| v.abs()).sum();
                    }
                    w.fill(0.0);
                    for (k, &bk) in row.iter().enumerate() {
                        let a = &fused.a[(r0 + k) * d_in..(r0 + k + 1) * d_in];
                        for (o, &av) in w.iter_mut().zip(a) {
                            *o += bk * av;
                        }
                    }
                    w.iter().map(|v| v.abs()).sum()
                })
                .collect()
        })
        .collect()
}

impl<S: HeServer> std::fmt::Debug for PreparedGroup<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedGroup")
            .field("plan", &self.plan)
            .finish_non_exhaustive()
    }
}

impl<S: HeServer> PreparedGroup<S> {
    /// Fuses the adapter and encodes its diagonals. Errors: shape mismatch, plan, levels, encoding.
    pub fn new(server: &S, plan: &GroupPlan, adapter: &GroupAdapter) -> Result<Self> {
        let fused = FusedGroup::new(adapter)?;
        if fused.shape != plan.shape {
            return Err(HeloraError::InvalidShape {
                reason: "adapter shape differs from the plan's",
            });
        }
        if plan.slots != server.slots() {
            return Err(HeloraError::InfeasiblePlan {
                reason: "plan slots differ from the backend's",
            });
        }
        if plan.depth() > server.max_level() {
            return Err(HeloraError::NotEnoughLevels {
                needed: plan.depth(),
                available: server.max_level(),
            });
        }
        let layout = plan.layout()?;
        let sb = plan.stage_b;
        let ext_b = GroupPlan::double_hoisted(sb.baby, layout.babies_b);
        let mut b_diags = Vec::with_capacity(sb.n_out);
        for c in 0..sb.n_out {
            let mut per_q = Vec::with_capacity(layout.giants_b);
            for q in 0..layout.giants_b {
                let mut per_b = Vec::new();
                for b in 0..layout.babies_b {
                    if q * sb.g + b >= layout.diags_b {
                        break;
                    }
                    per_b.push(stage_b_diag(plan, &layout, &fused, c, q, b));
                }
                per_q.push(per_b);
            }
            b_diags.push(Diags::encode(server, ext_b, per_q, 1)?);
        }
        let mut a_diags = None;
        if let Some(sa) = plan.stage_a {
            let r = layout.stride_a;
            let mut per_q = Vec::with_capacity(layout.giants_a);
            for q in 0..layout.giants_a {
                let mut terms = Vec::new();
                for c in 0..layout.n_x {
                    for b in 0..layout.babies_a {
                        if q * sa.g + b >= r {
                            break;
                        }
                        terms.push(stage_a_diag(plan, &layout, &fused, c, q, b));
                    }
                }
                per_q.push(terms);
            }
            let ext_a = GroupPlan::double_hoisted(sa.baby, layout.babies_a);
            a_diags = Some(Diags::encode(server, ext_a, per_q, 2)?);
        }
        // Every returned slot holds one summed delta row or an exact zero.
        let rows = row_bounds(&fused, plan.stage_a.is_none());
        let output_bounds = output_map(plan)?
            .iter()
            .map(|ct| {
                ct.iter()
                    .flatten()
                    .map(|ix| rows[ix.proj][ix.row])
                    .fold(0.0, f64::max)
            })
            .collect();
        Ok(PreparedGroup {
            plan: plan.clone(),
            layout,
            b_diags,
            a_diags,
            output_bounds,
        })
    }

    /// Per returned ciphertext, the bound on every slot part for normalised inputs.
    pub fn output_bounds(&self) -> &[f64] {
        &self.output_bounds
    }

    /// Encoded diagonals held by level, `(ordinary, over Q·P)`: the plan's ct×pt counts.
    pub fn diagonal_counts(&self) -> ([u64; LEVELS], [u64; LEVELS]) {
        let mut counts = ([0; LEVELS], [0; LEVELS]);
        for d in &self.b_diags {
            d.count_into(1, &mut counts);
        }
        if let Some(a) = &self.a_diags {
            a.count_into(2, &mut counts);
        }
        counts
    }

    /// The plan this group was prepared for.
    pub fn plan(&self) -> &GroupPlan {
        &self.plan
    }

    /// Evaluates the delta: `n_out` ciphertexts at level 0. Errors: bad inputs, backend errors.
    pub fn evaluate(&self, server: &S, inputs: &[S::Ct]) -> Result<Vec<S::Ct>> {
        let expected = self.plan.input_cts()?;
        if inputs.len() != expected {
            return Err(HeloraError::CiphertextCount {
                what: "group request",
                expected,
                got: inputs.len(),
            });
        }
        let want_level = self.plan.input_level();
        if let Some(bad) = inputs.iter().find(|c| server.level(c) != want_level) {
            return Err(HeloraError::PlanMismatch {
                field: "input level",
                expected: want_level as u64,
                got: server.level(bad) as u64,
            });
        }
        let u;
        let input = match self.plan.stage_a {
            None => inputs,
            Some(_) => {
                u = self.stage_a(server, inputs)?;
                std::slice::from_ref(&u)
            }
        };
        let baby = self.plan.stage_b.baby;
        let ext = GroupPlan::double_hoisted(baby, self.layout.babies_b);
        let (plain, extended);
        let babies = if baby == BabySteps::Client {
            Babies::Plain(input.iter().collect())
        } else if ext {
            extended = self.babies_extended(server, &input[0], self.layout.babies_b)?;
            Babies::Extended(extended.iter().collect())
        } else {
            plain = self.babies(server, &input[0], self.layout.babies_b)?;
            Babies::Plain(plain.iter().collect())
        };
        self.stage_b(server, &babies)
    }

    /// Evaluates one request's serialised ciphertexts (plan order) and serialises the deltas at
    /// `response_bits` of precision (0: the default). Errors: parse errors; as
    /// [`PreparedGroup::evaluate`].
    pub fn handle<B: AsRef<[u8]>>(
        &self,
        server: &S,
        ciphertexts: &[B],
        response_bits: u32,
    ) -> Result<Vec<Bytes>> {
        let inputs = ciphertexts
            .iter()
            .map(|b| server.input_from_bytes(b.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        self.handle_parsed(server, &inputs, response_bits)
    }

    /// [`Self::handle`] with the ciphertexts parsed already (`inputs`, plan order).
    pub fn handle_parsed(
        &self,
        server: &S,
        inputs: &[S::Ct],
        response_bits: u32,
    ) -> Result<Vec<Bytes>> {
        let out = self.evaluate(server, inputs)?;
        out.iter()
            .zip(&self.output_bounds)
            .map(|(c, &bound)| {
                server
                    .output_to_bytes_bounded(c, bound, response_bits)
                    .map(Bytes::from)
            })
            .collect()
    }

    /// `[ct, rot(ct, T), …, rot(ct, (n−1)·T)]`, the rotations hoisted.
    fn babies(&self, server: &S, ct: &S::Ct, n: usize) -> Result<Vec<S::Ct>> {
        let t = self.plan.slot_positions() as i64;
        let steps: Vec<i64> = (1..n as i64).map(|b| b * t).collect();
        let mut out = Vec::with_capacity(n);
        out.push(ct.clone());
        out.extend(server.rotate_hoisted(ct, &steps)?);
        Ok(out)
    }

    /// As [`Self::babies`], kept over `Q·P` (double hoisting).
    fn babies_extended(&self, server: &S, ct: &S::Ct, n: usize) -> Result<Vec<S::ExtCt>> {
        let t = self.plan.slot_positions() as i64;
        let steps: Vec<i64> = (0..n as i64).map(|b| b * t).collect();
        server.rotate_hoisted_extended(ct, &steps)
    }

    /// The rescaled giant partial sums of every entry of `parts`, products computed together.
    fn giant_parts(
        &self,
        server: &S,
        babies: &Babies<'_, S>,
        parts: &[(&Diags<S>, usize, &[usize])],
    ) -> Result<Vec<S::Ct>> {
        const MISMATCH: HeloraError = HeloraError::InfeasiblePlan {
            reason: "diagonal encoding does not match the baby steps",
        };
        match babies {
            Babies::Plain(v) => {
                let sums = parts
                    .iter()
                    .map(|&(d, q, idx)| match d {
                        Diags::Plain(d) => {
                            Ok((idx.iter().map(|&i| v[i]).collect(), d[q].iter().collect()))
                        }
                        Diags::Extended(_) => Err(MISMATCH),
                    })
                    .collect::<Result<Vec<_>>>()?;
                server
                    .dot_plain_many(&sums)?
                    .iter()
                    .map(|s| server.rescale(s))
                    .collect()
            }
            Babies::Extended(v) => {
                let sums = parts
                    .iter()
                    .map(|&(d, q, idx)| match d {
                        Diags::Extended(d) => {
                            Ok((idx.iter().map(|&i| v[i]).collect(), d[q].iter().collect()))
                        }
                        Diags::Plain(_) => Err(MISMATCH),
                    })
                    .collect::<Result<Vec<_>>>()?;
                server
                    .dot_plain_extended_many(&sums)?
                    .iter()
                    .map(|s| server.mod_down_rescale(s))
                    .collect()
            }
        }
    }

    /// `Σ_q rot(rescale(Σ_b pdiag_{q,b} ⊙ v_b), q·g·T)` per set, rescaling before each rotation.
    fn bsgs_sums(
        &self,
        server: &S,
        g: usize,
        babies: &Babies<'_, S>,
        diags: &[&Diags<S>],
        terms: &[Vec<usize>],
    ) -> Result<Vec<S::Ct>> {
        if terms.is_empty() {
            return Err(HeloraError::InfeasiblePlan {
                reason: "no diagonal to evaluate",
            });
        }
        if diags.iter().any(|d| d.giants() != terms.len()) {
            return Err(HeloraError::InfeasiblePlan {
                reason: "giant-step count differs from the diagonals'",
            });
        }
        let parts: Vec<(&Diags<S>, usize, &[usize])> = diags
            .iter()
            .flat_map(|&d| {
                terms
                    .iter()
                    .enumerate()
                    .map(move |(q, idx)| (d, q, idx.as_slice()))
            })
            .collect();
        let mut parts = self.giant_parts(server, babies, &parts)?.into_iter();
        let t = self.plan.slot_positions() as i64;
        let mut out = Vec::with_capacity(diags.len());
        for _ in diags {
            let mut acc: Option<S::Ct> = None;
            for (q, mut part) in parts.by_ref().take(terms.len()).enumerate() {
                if q > 0 {
                    part = server.rotate(&part, q as i64 * g as i64 * t)?;
                }
                match acc.as_mut() {
                    None => acc = Some(part),
                    Some(a) => server.add_assign(a, &part)?,
                }
            }
            out.push(acc.ok_or(HeloraError::InfeasiblePlan {
                reason: "no diagonal to evaluate",
            })?);
        }
        Ok(out)
    }

    /// Stage A: `u'` with fully summed U wherever stage B reads it.
    fn stage_a(&self, server: &S, inputs: &[S::Ct]) -> Result<S::Ct> {
        let sa = self.plan.stage_a.ok_or(HeloraError::InfeasiblePlan {
            reason: "missing stage A",
        })?;
        let diags = self.a_diags.as_ref().ok_or(HeloraError::InfeasiblePlan {
            reason: "missing stage-A diagonals",
        })?;
        let l = &self.layout;
        let r = l.stride_a;
        // v[c·babies + b] = x'_c rotated by b·T.
        let (plain, extended);
        let v = match (sa.baby, diags) {
            (BabySteps::Client, _) => Babies::Plain(inputs.iter().collect()),
            (BabySteps::Server | BabySteps::ServerExtended, Diags::Extended(_)) => {
                extended = inputs
                    .iter()
                    .map(|x| self.babies_extended(server, x, l.babies_a))
                    .collect::<Result<Vec<_>>>()?;
                Babies::Extended(extended.iter().flatten().collect())
            }
            (BabySteps::Server | BabySteps::ServerExtended, Diags::Plain(_)) => {
                plain = inputs
                    .iter()
                    .map(|x| self.babies(server, x, l.babies_a))
                    .collect::<Result<Vec<_>>>()?;
                Babies::Plain(plain.iter().flatten().collect())
            }
        };
        let terms: Vec<Vec<usize>> = (0..l.giants_a)
            .map(|q| {
                (0..l.n_x)
                    .flat_map(|c| {
                        (0..l.babies_a)
                            .filter(move |&b| q * sa.g + b < r)
                            .map(move |b| c * l.babies_a + b)
                    })
                    .collect()
            })
            .collect();
        let y = self
            .bsgs_sums(server, sa.g, &v, &[diags], &terms)?
            .pop()
            .ok_or(HeloraError::InfeasiblePlan {
                reason: "no diagonal to evaluate",
            })?;
        // Window sum over P/ρ groups of ρ dimensions.
        let mut s = y.clone();
        for (step, add_y) in GroupPlan::window_steps(l.window, r * self.plan.slot_positions()) {
            let rotated = server.rotate(&s, step)?;
            s = if add_y { y.clone() } else { s };
            server.add_assign(&mut s, &rotated)?;
        }
        Ok(s)
    }

    /// Stage B: one output ciphertext per `c`, rescaled (and rerandomised).
    fn stage_b(&self, server: &S, v: &Babies<'_, S>) -> Result<Vec<S::Ct>> {
        let l = &self.layout;
        let g = self.plan.stage_b.g;
        let terms: Vec<Vec<usize>> = (0..l.giants_b)
            .map(|q| (0..l.babies_b).filter(|&b| q * g + b < l.diags_b).collect())
            .collect();
        // Every output's giant steps read the same babies: computed together.
        let diags: Vec<&Diags<S>> = self.b_diags.iter().collect();
        let mut out = self.bsgs_sums(server, g, v, &diags, &terms)?;
        if self.plan.rerandomize {
            for ct in &mut out {
                *ct = server.rerandomize(ct)?;
            }
        }
        Ok(out)
    }
}

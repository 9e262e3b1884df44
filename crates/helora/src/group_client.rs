//! The client half: packs, normalises and encrypts a group's inputs, decrypts and unpacks the
//! deltas; holds no adapter secret. Notes: docs/design/code-notes.md, "helora: group_client".

use crate::adapter::positions;
use crate::error::{HeloraError, Result};
use crate::he_traits::{Complex64, HeClient};
use crate::packing::{DeltaIndex, check_mode, ffa_inputs, output_map, standard_inputs};
use crate::plan::{GroupPlan, Mode, PositionPacking};
use bytes::Bytes;

/// The slot values of one upload: real parts and imaginary parts (empty if real packing).
#[derive(Debug, Clone, PartialEq)]
pub struct SlotValues {
    /// Real parts, one per slot.
    pub re: Vec<f64>,
    /// Imaginary parts, one per slot, or empty (all zero).
    pub im: Vec<f64>,
}

fn slot_values(parts: Vec<[Vec<f64>; 2]>) -> Vec<SlotValues> {
    parts
        .into_iter()
        .map(|[re, im]| SlotValues { re, im })
        .collect()
}

/// The normalisation factors `c_p` of one request, one per position; never sent.
#[derive(Debug, Clone, PartialEq)]
pub struct InputScales {
    factors: Vec<f64>,
}

impl InputScales {
    /// Factor `c_p` of round position `pos` (a power of two); `None` past the round.
    pub fn factor(&self, pos: usize) -> Option<f64> {
        self.factors.get(pos).copied()
    }

    /// All factors, one per position of the round.
    pub fn factors(&self) -> &[f64] {
        &self.factors
    }

    /// Divides each row by its smallest power of two `≥ max |row|`; returns the factors.
    fn normalise(rows: &mut [f64], width: usize) -> Self {
        let factors = rows
            .chunks_exact_mut(width)
            .map(|row| {
                let c = pow2_at_least(row.iter().fold(0.0, |m: f64, v| m.max(v.abs())));
                for v in row.iter_mut() {
                    *v /= c;
                }
                c
            })
            .collect();
        InputScales { factors }
    }
}

/// The smallest power of two `≥ m` for finite `m > 0`; 1 otherwise.
fn pow2_at_least(m: f64) -> f64 {
    if !(m.is_finite() && m > 0.0) {
        return 1.0;
    }
    let mut c = 2f64.powi(m.log2().ceil() as i32);
    if !c.is_finite() || c == 0.0 {
        return 1.0;
    }
    // log2 may be off by one ulp near powers of two.
    while c < m {
        c *= 2.0;
    }
    while c / 2.0 >= m {
        c /= 2.0;
    }
    c
}

/// What a returned slot's real and imaginary parts must hold (`None`: zero).
pub type SlotDeltas = [Option<DeltaIndex>; 2];

/// `Σ a_k·b_k` with eight partial sums, so the loop vectorizes.
fn dot(a: &[f64], b: &[f64]) -> f64 {
    let mut acc = [0.0f64; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f64 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for ((s, &x), &y) in acc.iter_mut().zip(x).zip(y) {
            *s += x * y;
        }
    }
    acc.iter().sum::<f64>() + tail
}

/// The client side of one layer group under one plan.
#[derive(Debug, Clone)]
pub struct GroupClient {
    plan: GroupPlan,
    /// Per output ciphertext and slot, the deltas of both parts (positions of the round).
    map: Vec<Vec<SlotDeltas>>,
    /// FFA: the rows of the stacked public `A_f` (R × d_in), each cut to its non-zero columns.
    public_a: Option<Vec<SparseRow>>,
}

/// One row of a public lora_A cut to its non-zero columns (fused groups zero-pad lora_A).
#[derive(Debug, Clone, PartialEq)]
struct SparseRow {
    /// First non-zero column.
    start: usize,
    /// The values from `start` to the last non-zero column.
    values: Vec<f64>,
}

impl SparseRow {
    fn new(row: &[f32]) -> Self {
        let start = row.iter().position(|&v| v != 0.0).unwrap_or(0);
        let end = row.iter().rposition(|&v| v != 0.0).map_or(start, |e| e + 1);
        SparseRow {
            start,
            values: row[start..end].iter().map(|&v| f64::from(v)).collect(),
        }
    }

    /// `row · x` (x: the whole input row).
    fn dot(&self, x: &[f64]) -> f64 {
        dot(&self.values, &x[self.start..self.start + self.values.len()])
    }
}

impl GroupClient {
    /// An FFA client with public lora_A `public_a[p]` (r_p × d_in). Errors: mode, shape, plan.
    pub fn ffa(plan: &GroupPlan, public_a: &[Vec<f32>]) -> Result<Self> {
        check_mode(plan, Mode::Ffa)?;
        if public_a.len() != plan.shape.ranks.len() {
            return Err(HeloraError::ShapeMismatch {
                what: "public lora_A list",
                expected: plan.shape.ranks.len(),
                got: public_a.len(),
            });
        }
        let d_in = plan.shape.d_in;
        let mut a = Vec::with_capacity(plan.shape.total_rank());
        for (m, &r) in public_a.iter().zip(&plan.shape.ranks) {
            if m.len() != r * d_in {
                return Err(HeloraError::ShapeMismatch {
                    what: "lora_A",
                    expected: r * d_in,
                    got: m.len(),
                });
            }
            a.extend(m.chunks(d_in.max(1)).take(r).map(SparseRow::new));
        }
        Self::build(plan, Some(a))
    }

    /// A standard-LoRA client. Errors: mode mismatch, infeasible plan.
    pub fn standard(plan: &GroupPlan) -> Result<Self> {
        check_mode(plan, Mode::Standard)?;
        Self::build(plan, None)
    }

    fn build(plan: &GroupPlan, public_a: Option<Vec<SparseRow>>) -> Result<Self> {
        let (t, ts) = (plan.t, plan.slot_positions());
        let to_round = |d: Option<DeltaIndex>, offset: usize| {
            d.and_then(|d| {
                let pos = d.pos + offset;
                (pos < t).then_some(DeltaIndex { pos, ..d })
            })
        };
        let map = output_map(plan)?
            .into_iter()
            .map(|ct| {
                ct.into_iter()
                    .map(|d| match plan.packing {
                        PositionPacking::Real => [d, None],
                        PositionPacking::ComplexPairs => [to_round(d, 0), to_round(d, ts)],
                    })
                    .collect()
            })
            .collect();
        Ok(GroupClient {
            plan: plan.clone(),
            map,
            public_a,
        })
    }

    /// Packs a position-major matrix's real-part and imaginary-part rows with `pack`: per
    /// upload, the real-part and imaginary-part slot vectors (the latter empty under real
    /// packing).
    fn pack_parts<V: Copy + Default>(
        &self,
        rows: &[V],
        width: usize,
        pack: impl Fn(&[V]) -> Result<Vec<Vec<V>>>,
    ) -> Result<Vec<[Vec<V>; 2]>> {
        let (re, im) = self.split_positions(rows, width);
        let re = pack(re)?;
        let im = match im {
            Some(im) => pack(&im)?,
            None => vec![Vec::new(); re.len()],
        };
        Ok(re.into_iter().zip(im).map(|(re, im)| [re, im]).collect())
    }

    /// Splits a position-major matrix into real-part and imaginary-part rows (T' each).
    fn split_positions<'a, V: Copy + Default>(
        &self,
        m: &'a [V],
        width: usize,
    ) -> (&'a [V], Option<Vec<V>>) {
        let ts = self.plan.slot_positions();
        match self.plan.packing {
            PositionPacking::Real => (m, None),
            PositionPacking::ComplexPairs => {
                let mut im = m[ts * width..].to_vec();
                im.resize(ts * width, V::default());
                (&m[..ts * width], Some(im))
            }
        }
    }

    /// Packs a position-major `T × width` matrix as the plan's uploads: FFA rows are `U`'s
    /// (width R, transposed to the R × T' the packing takes), standard rows are x's.
    fn pack_rows<V: Copy + Default>(&self, m: &[V], width: usize) -> Result<Vec<[Vec<V>; 2]>> {
        match self.plan.mode {
            Mode::Ffa => self.pack_parts(m, width, |rows| {
                let ts = rows.len() / width;
                let mut ut = vec![V::default(); width * ts];
                for p in 0..ts {
                    for i in 0..width {
                        ut[i * ts + p] = rows[p * width + i];
                    }
                }
                ffa_inputs(&self.plan, &ut)
            }),
            Mode::Standard => self.pack_parts(m, width, |rows| standard_inputs(&self.plan, rows)),
        }
    }

    /// Mask values per position: R for FFA (masks on `U = A·x`), d_in standard.
    pub fn mask_width(&self) -> usize {
        match self.plan.mode {
            Mode::Ffa => self.plan.shape.total_rank(),
            Mode::Standard => self.plan.shape.d_in,
        }
    }

    /// The offline phase's uploads for one-time masks `r` in `Z_p` (T × R for FFA, T × d_in
    /// standard, position-major): per upload the real-part and imaginary-part slot vectors,
    /// which batched BFV carries in its two rows. Errors: [`HeloraError::ShapeMismatch`].
    pub fn mask_slots(&self, r: &[u64]) -> Result<Vec<[Vec<u64>; 2]>> {
        let width = self.mask_width();
        if r.len() != self.plan.t * width {
            return Err(HeloraError::ShapeMismatch {
                what: "masks (T × input width)",
                expected: self.plan.t * width,
                got: r.len(),
            });
        }
        self.pack_rows(r, width)
    }

    /// Reads the offline responses (per returned ciphertext, N values of `Z_p`: row 0 the real
    /// parts, row 1 the imaginary parts) into T × d_out_p values per projection. Errors:
    /// [`HeloraError::CiphertextCount`], [`HeloraError::ShapeMismatch`].
    pub fn unpack_ring(&self, slots: &[Vec<u64>]) -> Result<Vec<Vec<u64>>> {
        if slots.len() != self.map.len() {
            return Err(HeloraError::CiphertextCount {
                what: "offline response",
                expected: self.map.len(),
                got: slots.len(),
            });
        }
        let half = self.plan.slots;
        let t = self.plan.t;
        let d_outs = &self.plan.shape.d_outs;
        let mut out: Vec<Vec<u64>> = d_outs.iter().map(|&d| vec![0; t * d]).collect();
        for (vals, map) in slots.iter().zip(&self.map) {
            if vals.len() != 2 * half {
                return Err(HeloraError::ShapeMismatch {
                    what: "offline response values (N)",
                    expected: 2 * half,
                    got: vals.len(),
                });
            }
            for (j, parts) in map.iter().enumerate() {
                for (row, ix) in parts.iter().enumerate() {
                    if let Some(ix) = ix {
                        out[ix.proj][ix.pos * d_outs[ix.proj] + ix.row] = vals[row * half + j];
                    }
                }
            }
        }
        Ok(out)
    }

    /// The plan.
    pub fn plan(&self) -> &GroupPlan {
        &self.plan
    }

    /// The normalised slot values for `x` (T × d_in) and the factors. Errors: shape mismatch.
    pub fn input_slots(&self, x: &[f32]) -> Result<(Vec<SlotValues>, InputScales)> {
        let d = self.plan.shape.d_in;
        let t = positions(x.len(), d)?;
        if t != self.plan.t {
            return Err(HeloraError::PlanMismatch {
                field: "t",
                expected: self.plan.t as u64,
                got: t as u64,
            });
        }
        let width = self.mask_width();
        let mut values = self.lora_input(x)?;
        let scales = InputScales::normalise(&mut values, width);
        Ok((slot_values(self.pack_rows(&values, width)?), scales))
    }

    /// What each position of `x` (positions × d_in) sends through the adapter: `U = A_f·x` (R
    /// values, FFA) or x itself (d_in values, standard), positions × [`Self::mask_width`].
    /// Errors: [`HeloraError::ShapeMismatch`] unless x is whole rows of d_in.
    pub fn lora_input(&self, x: &[f32]) -> Result<Vec<f64>> {
        let d = self.plan.shape.d_in;
        let t = positions(x.len(), d)?;
        let Some(a) = &self.public_a else {
            return Ok(x.iter().map(|&v| f64::from(v)).collect());
        };
        let r = self.plan.shape.total_rank();
        let mut u = vec![0.0; t * r];
        let mut xp = vec![0.0; d];
        for p in 0..t {
            for (o, &v) in xp.iter_mut().zip(&x[p * d..(p + 1) * d]) {
                *o = f64::from(v);
            }
            for (i, row) in a.iter().enumerate() {
                u[p * r + i] = row.dot(&xp);
            }
        }
        Ok(u)
    }

    /// Packs and encrypts `x` (T × d_in): the request's ciphertexts, in plan order, and the
    /// factors. Errors as [`GroupClient::input_slots`]; backend errors.
    pub fn encrypt<C: HeClient>(&self, client: &C, x: &[f32]) -> Result<(Vec<Bytes>, InputScales)> {
        self.encrypt_within(client, x, 0.0)
    }

    /// As [`GroupClient::encrypt`], the upload allowed to lose `max_error` per normalised value.
    pub fn encrypt_within<C: HeClient>(
        &self,
        client: &C,
        x: &[f32],
        max_error: f64,
    ) -> Result<(Vec<Bytes>, InputScales)> {
        let level = self.plan.input_level();
        let (slots, scales) = self.input_slots(x)?;
        let ciphertexts = slots
            .iter()
            .map(|v| {
                client
                    .encrypt_to_bytes_within(&v.re, &v.im, level, max_error)
                    .map(Bytes::from)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((ciphertexts, scales))
    }

    /// Decrypts every returned slot (normalised values). Errors: [`HeloraError::CiphertextCount`];
    /// backend errors.
    pub fn decrypt_all<C: HeClient, B: AsRef<[u8]>>(
        &self,
        client: &C,
        ciphertexts: &[B],
    ) -> Result<Vec<Vec<Complex64>>> {
        if ciphertexts.len() != self.map.len() {
            return Err(HeloraError::CiphertextCount {
                what: "group response",
                expected: self.map.len(),
                got: ciphertexts.len(),
            });
        }
        ciphertexts
            .iter()
            .map(|b| client.decrypt_from_bytes(b.as_ref()))
            .collect()
    }

    /// Decrypts and unpacks the deltas, T × d_out_p per projection, rescaled by `scales`.
    pub fn deltas<C: HeClient, B: AsRef<[u8]>>(
        &self,
        client: &C,
        ciphertexts: &[B],
        scales: &InputScales,
    ) -> Result<Vec<Vec<f32>>> {
        let slots = self.decrypt_all(client, ciphertexts)?;
        self.unpack(&slots, scales)
    }

    /// Unpacks decrypted slots into f32 deltas, rescaled. Errors: [`HeloraError::ShapeMismatch`].
    pub fn unpack(&self, slots: &[Vec<Complex64>], scales: &InputScales) -> Result<Vec<Vec<f32>>> {
        let t = self.plan.t;
        if scales.factors.len() != t {
            return Err(HeloraError::ShapeMismatch {
                what: "input scales (one per position)",
                expected: t,
                got: scales.factors.len(),
            });
        }
        let mut out: Vec<Vec<f32>> = self
            .plan
            .shape
            .d_outs
            .iter()
            .map(|&d| vec![0.0; t * d])
            .collect();
        for (vals, map) in slots.iter().zip(&self.map) {
            for (v, parts) in vals.iter().zip(map) {
                for (value, ix) in [v.re, v.im].into_iter().zip(parts) {
                    if let Some(ix) = ix {
                        let d = self.plan.shape.d_outs[ix.proj];
                        out[ix.proj][ix.pos * d + ix.row] = (value * scales.factors[ix.pos]) as f32;
                    }
                }
            }
        }
        Ok(out)
    }

    /// Per output ciphertext and slot, what its parts must hold.
    pub fn output_map(&self) -> &[Vec<SlotDeltas>] {
        &self.map
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pow2_at_least_is_the_smallest_power_of_two_not_below() {
        for (m, want) in [
            (1.0, 1.0),
            (1.0000001, 2.0),
            (0.5, 0.5),
            (0.50000001, 1.0),
            (3.0, 4.0),
            (1e-300, 2f64.powi(-996)),
            (0.0, 1.0),
            (-2.0, 1.0),
            (f64::NAN, 1.0),
            (f64::INFINITY, 1.0),
            (f64::MAX, 1.0),
        ] {
            assert_eq!(pow2_at_least(m), want, "{m}");
        }
        let mut x = 0.37f64;
        for _ in 0..200 {
            x *= 1.37;
            let c = pow2_at_least(x);
            assert!(c >= x && c / 2.0 < x && c.log2().fract() == 0.0, "{x}: {c}");
        }
    }

    #[test]
    fn normalise_divides_each_row_by_its_factor() {
        let mut rows = vec![3.0, -5.0, 0.25, 0.0, 0.0, 0.0, -0.1, 0.01, 0.0];
        let s = InputScales::normalise(&mut rows, 3);
        assert_eq!(s.factors(), &[8.0, 1.0, 0.125]);
        assert_eq!(
            rows,
            vec![0.375, -0.625, 0.03125, 0.0, 0.0, 0.0, -0.8, 0.08, 0.0]
        );
        assert_eq!(s.factor(2), Some(0.125));
        assert_eq!(s.factor(3), None);
    }
}

//! The client half: packs and encrypts a group's inputs, decrypts and unpacks
//! the deltas. Holds no adapter secret (FFA: the public lora_A only).
//!
//! The client alone maps the round's T positions onto slot positions: with
//! [`PositionPacking::ComplexPairs`] position `p < T'` goes to the real part
//! and `p + T'` to the imaginary part of slot position `p` (`T' = ⌈T/2⌉`,
//! see [`crate::plan`]); the packing functions and the server see the T'
//! slot positions only.

use crate::adapter::positions;
use crate::backend::{Complex64, HeClient};
use crate::error::{HeloraError, Result};
use crate::packing::{DeltaIndex, check_mode, ffa_inputs, output_map, standard_inputs};
use crate::plan::{GroupPlan, Mode, PositionPacking};
use crate::wire::{GroupRequest, GroupResponse};

/// The slot values of one uploaded ciphertext: real parts and imaginary
/// parts (the latter empty with [`PositionPacking::Real`]).
#[derive(Debug, Clone, PartialEq)]
pub struct SlotValues {
    /// Real parts, one per slot.
    pub re: Vec<f64>,
    /// Imaginary parts, one per slot, or empty (all zero).
    pub im: Vec<f64>,
}

/// What a slot of a returned ciphertext must hold: the delta in its real
/// part and the one in its imaginary part (`None`: must decrypt to zero).
pub type SlotDeltas = [Option<DeltaIndex>; 2];

/// `Σ a_k·b_k` with eight independent partial sums, so that the loop
/// vectorizes (a single running sum is a latency-bound chain: f64 addition
/// is not associative, so the compiler may not reorder it).
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
    plan_id: u64,
    /// Per output ciphertext and slot, the deltas of both parts (positions
    /// of the round).
    map: Vec<Vec<SlotDeltas>>,
    /// FFA: stacked public `A_f` (R × d_in, f64).
    public_a: Option<Vec<f64>>,
}

impl GroupClient {
    /// An FFA client: `public_a[p]` is projection p's lora_A (r_p × d_in,
    /// row-major), public by the FFA-LoRA construction.
    ///
    /// # Errors
    /// Mode mismatch, shape mismatch, infeasible plan.
    pub fn ffa(plan: &GroupPlan, public_a: &[Vec<f32>]) -> Result<Self> {
        check_mode(plan, Mode::Ffa)?;
        if public_a.len() != plan.shape.ranks.len() {
            return Err(HeloraError::ShapeMismatch {
                what: "public lora_A list",
                expected: plan.shape.ranks.len(),
                got: public_a.len(),
            });
        }
        let mut a = Vec::with_capacity(plan.shape.total_rank() * plan.shape.d_in);
        for (m, &r) in public_a.iter().zip(&plan.shape.ranks) {
            if m.len() != r * plan.shape.d_in {
                return Err(HeloraError::ShapeMismatch {
                    what: "lora_A",
                    expected: r * plan.shape.d_in,
                    got: m.len(),
                });
            }
            a.extend(m.iter().map(|&v| f64::from(v)));
        }
        Self::build(plan, Some(a))
    }

    /// A standard-LoRA client (the adapter is entirely secret).
    ///
    /// # Errors
    /// Mode mismatch, infeasible plan.
    pub fn standard(plan: &GroupPlan) -> Result<Self> {
        check_mode(plan, Mode::Standard)?;
        Self::build(plan, None)
    }

    fn build(plan: &GroupPlan, public_a: Option<Vec<f64>>) -> Result<Self> {
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
            plan_id: plan.id(),
            map,
            public_a,
        })
    }

    /// Packs a position-major matrix of the round (`t` rows of `width`):
    /// `pack` turns T' rows (slot positions) into slot vectors; it is
    /// applied to the real-part rows and, with two positions per slot, to
    /// the imaginary-part rows.
    fn pack_parts(
        &self,
        rows: &[f64],
        width: usize,
        pack: impl Fn(&[f64]) -> Result<Vec<Vec<f64>>>,
    ) -> Result<Vec<SlotValues>> {
        let (re, im) = self.split_positions(rows, width);
        let re = pack(re)?;
        let im = match im {
            Some(im) => pack(&im)?,
            None => vec![Vec::new(); re.len()],
        };
        Ok(re
            .into_iter()
            .zip(im)
            .map(|(re, im)| SlotValues { re, im })
            .collect())
    }

    /// Splits a position-major matrix of the round (`t` rows of `width`)
    /// into the rows of the real parts and of the imaginary parts, each
    /// with T' rows (the imaginary rows zero padded past T; none with
    /// [`PositionPacking::Real`]).
    fn split_positions<'a>(&self, m: &'a [f64], width: usize) -> (&'a [f64], Option<Vec<f64>>) {
        let ts = self.plan.slot_positions();
        match self.plan.packing {
            PositionPacking::Real => (m, None),
            PositionPacking::ComplexPairs => {
                let mut im = m[ts * width..].to_vec();
                im.resize(ts * width, 0.0);
                (&m[..ts * width], Some(im))
            }
        }
    }

    /// The plan.
    pub fn plan(&self) -> &GroupPlan {
        &self.plan
    }

    /// The unencrypted slot values the client would upload for activations
    /// `x` (position-major T × d_in).
    ///
    /// # Errors
    /// Shape mismatch (wrong T or d_in).
    pub fn input_slots(&self, x: &[f32]) -> Result<Vec<SlotValues>> {
        let d = self.plan.shape.d_in;
        let t = positions(x.len(), d)?;
        if t != self.plan.t {
            return Err(HeloraError::PlanMismatch {
                field: "t",
                expected: self.plan.t as u64,
                got: t as u64,
            });
        }
        match &self.public_a {
            Some(a) => {
                // U = A_f·X, position-major (T × R) for the split, then
                // transposed to the R × T' the packing takes.
                let r = self.plan.shape.total_rank();
                let mut u = vec![0.0; t * r];
                let mut xp = vec![0.0; d];
                for p in 0..t {
                    for (o, &v) in xp.iter_mut().zip(&x[p * d..(p + 1) * d]) {
                        *o = f64::from(v);
                    }
                    for i in 0..r {
                        u[p * r + i] = dot(&a[i * d..(i + 1) * d], &xp);
                    }
                }
                self.pack_parts(&u, r, |rows| {
                    let ts = rows.len() / r;
                    let mut ut = vec![0.0; r * ts];
                    for p in 0..ts {
                        for i in 0..r {
                            ut[i * ts + p] = rows[p * r + i];
                        }
                    }
                    ffa_inputs(&self.plan, &ut)
                })
            }
            None => {
                let x: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
                self.pack_parts(&x, d, |rows| standard_inputs(&self.plan, rows))
            }
        }
    }

    /// Packs and encrypts the activations `x` (position-major T × d_in) of
    /// layer `layer`, group `group`.
    ///
    /// # Errors
    /// As [`GroupClient::input_slots`]; backend errors.
    pub fn request<C: HeClient>(
        &self,
        client: &C,
        layer: u32,
        group: u32,
        x: &[f32],
    ) -> Result<GroupRequest> {
        let level = self.plan.input_level();
        let ciphertexts = self
            .input_slots(x)?
            .iter()
            .map(|v| client.encrypt_to_bytes(&v.re, &v.im, level))
            .collect::<Result<Vec<_>>>()?;
        Ok(GroupRequest {
            plan_id: self.plan_id,
            layer,
            group,
            t: self.plan.t as u32,
            ciphertexts,
        })
    }

    /// Decrypts every slot of every returned ciphertext (for the leak test
    /// and diagnostics).
    ///
    /// # Errors
    /// Header mismatch, wrong ciphertext count, backend errors.
    pub fn decrypt_all<C: HeClient>(
        &self,
        client: &C,
        resp: &GroupResponse,
    ) -> Result<Vec<Vec<Complex64>>> {
        if resp.plan_id != self.plan_id {
            return Err(HeloraError::PlanMismatch {
                field: "plan_id",
                expected: self.plan_id,
                got: resp.plan_id,
            });
        }
        if resp.ciphertexts.len() != self.map.len() {
            return Err(HeloraError::CiphertextCount {
                what: "group response",
                expected: self.map.len(),
                got: resp.ciphertexts.len(),
            });
        }
        resp.ciphertexts
            .iter()
            .map(|b| client.decrypt_from_bytes(b))
            .collect()
    }

    /// Decrypts and unpacks the deltas: per projection a position-major
    /// T × d_out_p matrix.
    ///
    /// # Errors
    /// As [`GroupClient::decrypt_all`].
    pub fn deltas<C: HeClient>(&self, client: &C, resp: &GroupResponse) -> Result<Vec<Vec<f32>>> {
        let slots = self.decrypt_all(client, resp)?;
        Ok(self.unpack(&slots))
    }

    /// Unpacks decrypted slot vectors into per-projection deltas (f32).
    pub fn unpack(&self, slots: &[Vec<Complex64>]) -> Vec<Vec<f32>> {
        let t = self.plan.t;
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
                        out[ix.proj][ix.pos * d + ix.row] = value as f32;
                    }
                }
            }
        }
        out
    }

    /// For every output ciphertext and slot, the deltas its real and
    /// imaginary parts must hold (positions of the round; `None`: the part
    /// must decrypt to zero).
    pub fn output_map(&self) -> &[Vec<SlotDeltas>] {
        &self.map
    }
}

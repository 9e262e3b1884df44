//! The client half: packs and encrypts a group's inputs, decrypts and unpacks
//! the deltas. Holds no adapter secret (FFA: the public lora_A only).

use crate::adapter::positions;
use crate::backend::HeClient;
use crate::error::{HeloraError, Result};
use crate::packing::{DeltaIndex, check_mode, ffa_inputs, output_map, standard_inputs};
use crate::plan::{GroupPlan, Mode};
use crate::wire::{GroupRequest, GroupResponse};

/// The client side of one layer group under one plan.
#[derive(Debug, Clone)]
pub struct GroupClient {
    plan: GroupPlan,
    plan_id: u64,
    map: Vec<Vec<Option<DeltaIndex>>>,
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
        Ok(GroupClient {
            plan: plan.clone(),
            plan_id: plan.id(),
            map: output_map(plan)?,
            public_a,
        })
    }

    /// The plan.
    pub fn plan(&self) -> &GroupPlan {
        &self.plan
    }

    /// The unencrypted slot vectors the client would upload for activations
    /// `x` (position-major T × d_in).
    ///
    /// # Errors
    /// Shape mismatch (wrong T or d_in).
    pub fn input_slots(&self, x: &[f32]) -> Result<Vec<Vec<f64>>> {
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
                let r = self.plan.shape.total_rank();
                let mut u = vec![0.0; r * t];
                for i in 0..r {
                    let row = &a[i * d..(i + 1) * d];
                    for p in 0..t {
                        u[i * t + p] = row
                            .iter()
                            .zip(&x[p * d..(p + 1) * d])
                            .map(|(a, &x)| a * f64::from(x))
                            .sum();
                    }
                }
                ffa_inputs(&self.plan, &u)
            }
            None => standard_inputs(&self.plan, x),
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
            .map(|v| client.encrypt_to_bytes(v, level))
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
    ) -> Result<Vec<Vec<f64>>> {
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
    pub fn unpack(&self, slots: &[Vec<f64>]) -> Vec<Vec<f32>> {
        let t = self.plan.t;
        let mut out: Vec<Vec<f32>> = self
            .plan
            .shape
            .d_outs
            .iter()
            .map(|&d| vec![0.0; t * d])
            .collect();
        for (vals, map) in slots.iter().zip(&self.map) {
            for (v, m) in vals.iter().zip(map) {
                if let Some(ix) = m {
                    let d = self.plan.shape.d_outs[ix.proj];
                    out[ix.proj][ix.pos * d + ix.row] = *v as f32;
                }
            }
        }
        out
    }

    /// For every output ciphertext, which delta each slot must hold (`None`:
    /// must be zero).
    pub fn output_map(&self) -> &[Vec<Option<DeltaIndex>>] {
        &self.map
    }
}

//! Delta-guided drafting: the base drafter adds the adapter deltas the
//! client decrypted for the latest verified position.
//!
//! The base model drafts for the adapted one, and on text unlike code the
//! two disagree often: teacher-forced over the adapted prefix, the base
//! model's greedy token was the adapted model's 84.7 % of the time on the
//! general-English adapter (q,k,v,o, r = 16). Every verify round gives the
//! client the adapter's deltas (alpha/r)·B·A·x at every projection of the
//! rows it verified, decrypted for its own use. Adding the *latest kept
//! row's* deltas, unchanged, to every draft position is a crude guess of
//! the next positions' deltas — a LoRA delta has a large part shared by
//! neighbouring positions — and raised that agreement to 93.1 % (90.6 % on
//! the all-linear adapter, from 85.1 %; BENCHMARKS.md, "Delta-guided
//! drafting", `cargo run --release -p cipherlora-spec --example
//! drafter_probe`).
//!
//! Nothing leaves the client: the guess only changes which tokens are
//! drafted, and every drafted token is verified as before, so greedy output
//! still equals sequential adapted decoding and sampling still follows the
//! adapted distribution (the drafter's distribution `q` is whatever it
//! sampled from). The server sees rounds of the same width; only the number
//! of rounds per token falls, which the threat model already counts as what
//! speculation reveals. The client reuses one delta vector per projection
//! that it already holds; it solves for nothing about lora_A or lora_B.
//!
//! One thing does change with sampling: a seed reproduces a generation
//! only given the same deltas. The guide is built from the deltas the
//! client decrypted, so another schedule (whose deltas differ in the last
//! bits) or CKKS noise may send the seeded generator down another path,
//! drawing other tokens from the same distribution.
//!
//! The idea is the drafting-side counterpart of reusing the previous
//! token's computation in speculative decoding (e.g. EAGLE's feature-level
//! drafting, Li et al., ICML 2024, which predicts the target's next hidden
//! state from its last one); here the target's last adapter deltas are
//! reused as they are.

use std::collections::HashMap;

use cipherlora_model::{DeltaHook, GroupDeltas, ModelError, PassDeltas, ProjGroup, Tensor};

use crate::SpecError;

/// One (1, d_out) delta per adapted projection, added to every position a
/// drafter runs (a [`DeltaHook`]). Empty: the plain base model.
#[derive(Debug, Clone, Default)]
pub struct DraftBias {
    rows: HashMap<(usize, ProjGroup), GroupDeltas>,
}

impl DraftBias {
    /// No bias: the base model as it is.
    #[must_use]
    pub fn none() -> Self {
        Self::default()
    }

    /// Row `row` of a verify pass's deltas ((T, d_out) per projection).
    ///
    /// # Errors
    /// [`SpecError::Model`] when `row` is past a delta's rows.
    pub fn from_row(deltas: &PassDeltas, row: usize) -> Result<Self, SpecError> {
        Self::from_rows(deltas, row..row + 1)
    }

    /// The mean of rows `rows` (non-empty) of a verify pass's deltas
    /// ((T, d_out) per projection).
    ///
    /// # Errors
    /// [`SpecError::Config`] when `rows` is empty, [`SpecError::Model`] when
    /// it is past a delta's rows.
    pub fn from_rows(deltas: &PassDeltas, rows: std::ops::Range<usize>) -> Result<Self, SpecError> {
        if rows.is_empty() {
            return Err(SpecError::Config(
                "a delta guess needs at least one row".into(),
            ));
        }
        let mut out = HashMap::with_capacity(deltas.len());
        for (&key, group) in deltas {
            let mut one = GroupDeltas::none();
            for (proj, d) in group.iter() {
                let r = d
                    .narrow(0, rows.start, rows.len())
                    .and_then(|r| r.mean_keepdim(0))
                    .map_err(|e| SpecError::Model(e.into()))?;
                one.push(proj, r);
            }
            if !one.is_empty() {
                out.insert(key, one);
            }
        }
        Ok(Self { rows: out })
    }

    /// The bias as the deltas of a pass of `t` positions, (t, d_out) per
    /// projection: a verify pass's guessed first estimate
    /// ([`cipherlora_model::FixedPointPass::start_sending`]).
    ///
    /// # Errors
    /// [`SpecError::Model`] when a broadcast fails.
    pub fn pass_deltas(&self, t: usize) -> Result<PassDeltas, SpecError> {
        let mut out = PassDeltas::with_capacity(self.rows.len());
        for (&key, one) in &self.rows {
            let mut group = GroupDeltas::none();
            for (proj, d) in one.iter() {
                let width = d.dim(1).map_err(|e| SpecError::Model(e.into()))?;
                let all = d
                    .broadcast_as((t, width))
                    .and_then(|a| a.contiguous())
                    .map_err(|e| SpecError::Model(e.into()))?;
                group.push(proj, all);
            }
            out.insert(key, group);
        }
        Ok(out)
    }

    /// Whether the bias adds nothing.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

impl DeltaHook for DraftBias {
    /// Each projection's delta row, repeated for the T rows of `x`.
    fn deltas(
        &mut self,
        layer: usize,
        group: ProjGroup,
        x: &Tensor,
    ) -> Result<GroupDeltas, ModelError> {
        let mut out = GroupDeltas::none();
        if let Some(one) = self.rows.get(&(layer, group)) {
            let t = x.dim(0)?;
            for (proj, d) in one.iter() {
                let width = d.dim(1)?;
                out.push(proj, d.broadcast_as((t, width))?.contiguous()?);
            }
        }
        Ok(out)
    }

    fn wants(&self, layer: usize, group: ProjGroup) -> bool {
        self.rows.contains_key(&(layer, group))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use cipherlora_model::Proj;

    #[test]
    fn a_row_of_the_pass_is_added_to_every_drafted_position() {
        let dev = Device::Cpu;
        let d =
            Tensor::from_vec((0..12).map(|v| v as f32).collect::<Vec<_>>(), (3, 4), &dev).unwrap();
        let mut pass = PassDeltas::new();
        pass.insert((2, ProjGroup::O), GroupDeltas::none().with(Proj::O, d));
        let mut bias = DraftBias::from_row(&pass, 1).unwrap();
        assert!(bias.wants(2, ProjGroup::O));
        assert!(!bias.wants(1, ProjGroup::O));
        let x = Tensor::zeros((2, 5), DType::F32, &dev).unwrap();
        let out = bias.deltas(2, ProjGroup::O, &x).unwrap();
        let got = out.get(Proj::O).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(got, vec![vec![4.0, 5.0, 6.0, 7.0]; 2]);
        assert!(DraftBias::from_row(&pass, 3).is_err());
        assert!(DraftBias::none().is_empty());
    }

    #[test]
    fn the_mean_of_rows_becomes_every_row_of_a_guessed_pass() {
        let dev = Device::Cpu;
        let d =
            Tensor::from_vec((0..12).map(|v| v as f32).collect::<Vec<_>>(), (3, 4), &dev).unwrap();
        let mut pass = PassDeltas::new();
        pass.insert((0, ProjGroup::Qkv), GroupDeltas::none().with(Proj::V, d));
        // Rows 1 and 2 are [4, 5, 6, 7] and [8, 9, 10, 11].
        let bias = DraftBias::from_rows(&pass, 1..3).unwrap();
        let guess = bias.pass_deltas(3).unwrap();
        let got = guess[&(0, ProjGroup::Qkv)]
            .get(Proj::V)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        assert_eq!(got, vec![vec![6.0, 7.0, 8.0, 9.0]; 3]);
        assert!(DraftBias::from_rows(&pass, 2..4).is_err());
        assert!(DraftBias::from_rows(&pass, 1..1).is_err());
        assert!(DraftBias::none().pass_deltas(3).unwrap().is_empty());
    }
}

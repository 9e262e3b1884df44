//! Delta-guided drafting: the base drafter adds the adapter deltas the client decrypted for the
//! latest verified position, a guess of the next positions' deltas (cf. EAGLE's feature reuse, Li
//! et al., ICML 2024). Nothing leaves the client and every draft is still verified, so outputs are
//! unchanged; a sampled seed reproduces a generation only given the same deltas. Rationale:
//! docs/design/code-notes.md, "spec: draft_bias".

use std::collections::HashMap;

use cipherlora_model::{DeltaHook, GroupDeltas, ModelError, PassDeltas, ProjGroup, Tensor};

use crate::SpecError;

/// One (1, d_out) delta per adapted projection, added to every position a drafter runs (a
/// [`DeltaHook`]). Empty: the plain base model.
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

    /// Row `row` of a verify pass's deltas ((T, d_out) per projection). Errors:
    /// [`SpecError::Model`] when `row` is past a delta's rows.
    pub fn from_row(deltas: &PassDeltas, row: usize) -> Result<Self, SpecError> {
        Self::from_rows(deltas, row..row + 1)
    }

    /// The mean of rows `rows` of a verify pass's deltas. Errors: [`SpecError::Invariant`] for empty
    /// `rows`, [`SpecError::Model`] past a delta's rows.
    pub fn from_rows(deltas: &PassDeltas, rows: std::ops::Range<usize>) -> Result<Self, SpecError> {
        if rows.is_empty() {
            return Err(SpecError::Invariant {
                what: "a delta guess needs at least one row",
            });
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

    /// The bias as deltas of a `t`-position pass, (t, d_out) per projection (a guessed first
    /// estimate). Errors: [`SpecError::Model`] when a broadcast fails.
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

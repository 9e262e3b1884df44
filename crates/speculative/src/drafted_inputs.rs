//! The LoRA inputs the base drafter computes while drafting, kept as the next verify pass's first
//! estimate ([`crate::schedule::FixedPoint::drafted_start`]): it saves the client a plaintext pass
//! of the verify width. Only pass 0's encrypted inputs leave the client, as without it.

use std::collections::HashMap;

use cipherlora_model::{DeltaHook, GroupDeltas, GroupInput, ModelError, ProjGroup, Tensor};

use crate::SpecError;
use crate::draft_bias::DraftBias;

/// Per adapted group, the inputs (1, d_in) of the positions a drafter fed since the last
/// [`DraftedInputs::clear`], in order.
#[derive(Debug, Default)]
pub(crate) struct DraftedInputs {
    /// The verifier's groups in forward order.
    groups: Vec<(usize, ProjGroup)>,
    index: HashMap<(usize, ProjGroup), usize>,
    rows: Vec<Vec<Tensor>>,
}

impl DraftedInputs {
    /// A recorder for `groups` (the groups the verifier adapts, in forward order:
    /// `cipherlora_model::wanted_groups`).
    pub(crate) fn new(groups: Vec<(usize, ProjGroup)>) -> Self {
        let index = groups.iter().enumerate().map(|(i, &g)| (g, i)).collect();
        let rows = vec![Vec::new(); groups.len()];
        Self {
            groups,
            index,
            rows,
        }
    }

    /// Forgets every recorded position.
    pub(crate) fn clear(&mut self) {
        self.rows.iter_mut().for_each(Vec::clear);
    }

    /// Every group's recorded positions as one (t, d_in) input, forward order, and clears the
    /// record; `None` unless exactly `t` positions per group. Errors: [`SpecError::Model`] when the
    /// rows do not concatenate.
    pub(crate) fn take(&mut self, t: usize) -> Result<Option<Vec<GroupInput>>, SpecError> {
        if self.groups.is_empty() || self.rows.iter().any(|r| r.len() != t) {
            self.clear();
            return Ok(None);
        }
        let mut out = Vec::with_capacity(self.groups.len());
        for (&(layer, group), rows) in self.groups.iter().zip(&mut self.rows) {
            let x = Tensor::cat(rows, 0).map_err(|e| SpecError::Model(e.into()))?;
            rows.clear();
            out.push(GroupInput { layer, group, x });
        }
        Ok(Some(out))
    }

    /// Keeps the last row of `x`, the input of the position just fed.
    fn record(&mut self, layer: usize, group: ProjGroup, x: &Tensor) -> Result<(), ModelError> {
        if let Some(&i) = self.index.get(&(layer, group)) {
            let t = x.dim(0)?;
            self.rows[i].push(x.narrow(0, t.saturating_sub(1), 1)?);
        }
        Ok(())
    }

    fn wants(&self, layer: usize, group: ProjGroup) -> bool {
        self.index.contains_key(&(layer, group))
    }
}

/// A drafter's hook: adds `bias` ([`DraftBias`]) and, with a recorder, keeps every adapted group's
/// input of the position fed.
pub(crate) struct Recording<'a> {
    pub bias: &'a mut DraftBias,
    pub inputs: Option<&'a mut DraftedInputs>,
}

impl DeltaHook for Recording<'_> {
    fn deltas(
        &mut self,
        layer: usize,
        group: ProjGroup,
        x: &Tensor,
    ) -> Result<GroupDeltas, ModelError> {
        if let Some(inputs) = self.inputs.as_deref_mut() {
            inputs.record(layer, group, x)?;
        }
        if self.bias.wants(layer, group) {
            self.bias.deltas(layer, group, x)
        } else {
            Ok(GroupDeltas::none())
        }
    }

    fn wants(&self, layer: usize, group: ProjGroup) -> bool {
        self.bias.wants(layer, group)
            || self
                .inputs
                .as_deref()
                .is_some_and(|inputs| inputs.wants(layer, group))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    fn row(v: f32) -> Tensor {
        Tensor::full(v, (1, 3), &Device::Cpu).unwrap()
    }

    #[test]
    fn the_last_row_of_each_fed_position_becomes_the_window_s_input() {
        let groups = vec![(0, ProjGroup::Qkv), (1, ProjGroup::O)];
        let mut rec = DraftedInputs::new(groups);
        let mut bias = DraftBias::none();
        let mut hook = Recording {
            bias: &mut bias,
            inputs: Some(&mut rec),
        };
        assert!(hook.wants(1, ProjGroup::O) && !hook.wants(0, ProjGroup::O));
        // A first feed of three positions (only its last is in the window), then two single
        // positions.
        let first = Tensor::cat(&[row(9.0), row(8.0), row(1.0)], 0).unwrap();
        for x in [&first, &row(2.0), &row(3.0)] {
            for (l, g) in [(0, ProjGroup::Qkv), (1, ProjGroup::O)] {
                assert!(hook.deltas(l, g, x).unwrap().is_empty());
            }
        }
        // A group the verifier does not adapt is not recorded.
        hook.deltas(0, ProjGroup::GateUp, &row(7.0)).unwrap();
        assert!(rec.take(4).unwrap().is_none(), "three positions, not four");
        assert!(rec.take(3).unwrap().is_none(), "a failed take clears");
        let mut hook = Recording {
            bias: &mut bias,
            inputs: Some(&mut rec),
        };
        for x in [&first, &row(2.0), &row(3.0)] {
            for (l, g) in [(0, ProjGroup::Qkv), (1, ProjGroup::O)] {
                hook.deltas(l, g, x).unwrap();
            }
        }
        let got = rec.take(3).unwrap().unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!((got[1].layer, got[1].group), (1, ProjGroup::O));
        let x = got[0]
            .x
            .to_dtype(DType::F32)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        assert_eq!(x, vec![vec![1.0; 3], vec![2.0; 3], vec![3.0; 3]]);
        assert!(rec.take(3).unwrap().is_none(), "taking clears the record");
    }
}

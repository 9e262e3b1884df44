//! One forward pass whose adapter deltas come from few batched round trips:
//! a fixed point over layers.
//!
//! A hook that answers one group at a time ([`Model::forward`]) costs one
//! round trip per adapted projection group: the input of layer l's group
//! depends on the deltas of every earlier group. Here the client instead
//! *estimates* every group's input, asks for all deltas at once
//! ([`DeltaHook::deltas_many`]), reruns its plaintext pass with those deltas
//! and repeats:
//!
//! ```text
//! pass 0:   x⁰ = inputs of the pass with no deltas (the base model)
//! trip i:   dⁱ = deltas(xⁱ⁻¹)            (one batched round trip)
//! pass i:   xⁱ, logitsⁱ = forward with dⁱ  (plaintext, on the client)
//! ```
//!
//! The map x ↦ inputs(forward with deltas(x)) has the exact, sequentially
//! computed inputs x* as its fixed point. It converges in at most G round
//! trips for G groups in forward order (after trip i the first i groups'
//! inputs are exact, since they depend only on earlier groups), and in
//! practice far faster: a LoRA delta is a small perturbation, so the error
//! contracts by roughly the relative size of the deltas per trip
//! (BENCHMARKS.md, "Fewer round trips": ≈ 30-100× per trip on our adapters).
//! This is Jacobi iteration on the layer recurrence, the same idea as
//! Jacobi decoding across positions (Santilli et al., "Accelerating
//! Transformer Inference for Translation via Parallel Decoding", ACL 2023;
//! Fu et al., "Break the Sequential Dependency of LLM Inference Using
//! Lookahead Decoding", ICML 2024), applied across layers instead.
//!
//! [`FixedPointStep`] reports after each trip how much the inputs and the
//! logits still moved; the caller decides when the result is exact enough
//! (`cipherlora_spec` certifies greedy tokens by their top-1/top-2 logit
//! margin against the last step's change).

use std::collections::HashMap;

use candle_core::{D, Tensor};

use crate::hook::{DeltaHook, GroupDeltas, GroupInput, ProjGroup};
use crate::{AttentionMask, KvCache, Model, ModelError};

/// How much one round trip of a [`FixedPointPass`] moved the pass.
#[derive(Debug, Clone, PartialEq)]
pub struct FixedPointStep {
    /// Largest relative change of a group's input over this trip:
    /// max over groups of `max|xⁱ − xⁱ⁻¹| / max|xⁱ|` (∞-norms over the
    /// group's (T, d_in) input).
    pub input_change: f32,
    /// Per position (row of the logits), the largest absolute change of a
    /// logit over this trip, `max_v |logitsⁱ[p, v] − logitsⁱ⁻¹[p, v]|`.
    pub logit_change: Vec<f32>,
}

/// Records every group input of a pass and answers from a table of deltas.
struct Recorder<'a> {
    wanted: &'a [(usize, ProjGroup)],
    table: &'a HashMap<(usize, ProjGroup), GroupDeltas>,
    recorded: Vec<GroupInput>,
}

impl DeltaHook for Recorder<'_> {
    fn deltas(
        &mut self,
        layer: usize,
        group: ProjGroup,
        x: &Tensor,
    ) -> Result<GroupDeltas, ModelError> {
        self.recorded.push(GroupInput {
            layer,
            group,
            x: x.clone(),
        });
        Ok(self.table.get(&(layer, group)).cloned().unwrap_or_default())
    }

    fn wants(&self, layer: usize, group: ProjGroup) -> bool {
        self.wanted.contains(&(layer, group))
    }
}

/// A forward pass of T positions whose deltas are computed as a fixed point
/// over layers, one batched round trip per [`FixedPointPass::iterate`]; see
/// the module docs.
///
/// The KV cache always holds the positions before the pass plus the T of the
/// latest plaintext pass (as after [`Model::forward`]); each iteration rolls
/// them back and recomputes them.
#[derive(Debug)]
pub struct FixedPointPass<'m> {
    model: &'m Model,
    tokens: Vec<u32>,
    mask: AttentionMask,
    start: usize,
    wanted: Vec<(usize, ProjGroup)>,
    inputs: Vec<GroupInput>,
    logits: Tensor,
    steps: Vec<FixedPointStep>,
}

impl<'m> FixedPointPass<'m> {
    /// Pass 0: runs `tokens` after the cached positions with no deltas (the
    /// base model), recording the input of every group `hook` wants: the
    /// first estimate. No round trip.
    ///
    /// # Errors
    /// As [`Model::forward`].
    pub fn start(
        model: &'m Model,
        tokens: &[u32],
        cache: &mut KvCache,
        mask: &AttentionMask,
        hook: &dyn DeltaHook,
    ) -> Result<Self, ModelError> {
        let wanted: Vec<(usize, ProjGroup)> = (0..model.config().num_layers)
            .flat_map(|l| ProjGroup::ALL.into_iter().map(move |g| (l, g)))
            .filter(|&(l, g)| hook.wants(l, g))
            .collect();
        let start = cache.len();
        let table = HashMap::new();
        let mut rec = Recorder {
            wanted: &wanted,
            table: &table,
            recorded: Vec::with_capacity(wanted.len()),
        };
        let logits = model.forward(tokens, cache, mask, &mut rec)?;
        let inputs = rec.recorded;
        Ok(Self {
            model,
            tokens: tokens.to_vec(),
            mask: mask.clone(),
            start,
            wanted,
            inputs,
            logits,
            steps: Vec::new(),
        })
    }

    /// One round trip: sends every group's current input estimate through
    /// `hook` at once, then reruns the plaintext pass with the returned
    /// deltas (rolling the cache back first). Returns what moved.
    ///
    /// # Errors
    /// Whatever `hook` or the forward pass raise; [`ModelError::Hook`] when
    /// the hook answers a different number of groups than asked. On error
    /// the cache holds the previous pass's positions.
    pub fn iterate(
        &mut self,
        cache: &mut KvCache,
        hook: &mut dyn DeltaHook,
    ) -> Result<&FixedPointStep, ModelError> {
        self.iterate_within(cache, hook, None)
    }

    /// [`FixedPointPass::iterate`] with deltas that may be off by
    /// `tolerance` (relative, [`DeltaHook::deltas_many_within`]; `None`:
    /// as exact as the hook can): for trips whose inputs are still
    /// estimates, whose own error dwarfs that.
    ///
    /// # Errors
    /// As [`FixedPointPass::iterate`].
    pub fn iterate_within(
        &mut self,
        cache: &mut KvCache,
        hook: &mut dyn DeltaHook,
        tolerance: Option<f64>,
    ) -> Result<&FixedPointStep, ModelError> {
        let answers = match tolerance {
            Some(t) => hook.deltas_many_within(&self.inputs, t)?,
            None => hook.deltas_many(&self.inputs)?,
        };
        if answers.len() != self.inputs.len() {
            let proj = self
                .inputs
                .first()
                .map_or(crate::Proj::Q, |g| g.group.projs()[0]);
            return Err(ModelError::Hook {
                layer: 0,
                proj,
                reason: format!(
                    "{} group deltas returned for {} inputs",
                    answers.len(),
                    self.inputs.len()
                ),
            });
        }
        let table: HashMap<(usize, ProjGroup), GroupDeltas> = self
            .inputs
            .iter()
            .map(|g| (g.layer, g.group))
            .zip(answers)
            .collect();
        cache.truncate(self.start);
        let mut rec = Recorder {
            wanted: &self.wanted,
            table: &table,
            recorded: Vec::with_capacity(self.wanted.len()),
        };
        let logits = self
            .model
            .forward(&self.tokens, cache, &self.mask, &mut rec)?;
        let inputs = rec.recorded;
        let input_change = max_relative_change(&self.inputs, &inputs)?;
        let logit_change = (&logits - &self.logits)?
            .abs()?
            .max(D::Minus1)?
            .to_vec1::<f32>()?;
        self.inputs = inputs;
        self.logits = logits;
        self.steps.push(FixedPointStep {
            input_change,
            logit_change,
        });
        Ok(self.steps.last().expect("just pushed"))
    }

    /// Logits (T, vocab) of the latest plaintext pass.
    #[must_use]
    pub fn logits(&self) -> &Tensor {
        &self.logits
    }

    /// What each round trip so far moved, in order.
    #[must_use]
    pub fn steps(&self) -> &[FixedPointStep] {
        &self.steps
    }

    /// Round trips made so far.
    #[must_use]
    pub fn round_trips(&self) -> usize {
        self.steps.len()
    }

    /// The inputs of the latest pass (what the next trip would send).
    #[must_use]
    pub fn inputs(&self) -> &[GroupInput] {
        &self.inputs
    }

    /// The tokens of the pass.
    #[must_use]
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Cache length before the pass.
    #[must_use]
    pub fn cache_start(&self) -> usize {
        self.start
    }
}

/// `max over groups of max|new − old| / max|new|` (0 for identical inputs).
fn max_relative_change(old: &[GroupInput], new: &[GroupInput]) -> Result<f32, ModelError> {
    let mut worst = 0f32;
    for (a, b) in old.iter().zip(new) {
        let diff = (&b.x - &a.x)?.abs()?.max_all()?.to_scalar::<f32>()?;
        let size = b.x.abs()?.max_all()?.to_scalar::<f32>()?;
        let rel = if size > 0.0 { diff / size } else { diff };
        worst = worst.max(rel);
    }
    Ok(worst)
}

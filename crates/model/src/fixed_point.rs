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
//! With a hook that streams ([`DeltaHook::stream`]), the trips overlap as a
//! wavefront over layers: [`FixedPointPass::start_sending`] and
//! [`FixedPointPass::iterate_sending`] send each group's input of the next
//! trip as soon as the running pass produces it, and take each delta of the
//! current trip only when the pass reaches its group. The deltas and
//! inputs are the same as with batched trips, only the waiting differs.
//!
//! [`FixedPointStep`] reports after each trip how much the inputs and the
//! logits still moved; the caller decides when the result is exact enough
//! (`cipherlora_spec` certifies greedy tokens by their top-1/top-2 logit
//! margin against the last step's change).

use std::collections::HashMap;

use candle_core::{D, Tensor};

use crate::hook::{DeltaHook, DeltaStream, GroupDeltas, GroupInput, PassDeltas, ProjGroup, TripId};
use crate::{AttentionMask, KvCache, Model, ModelError};

/// How much one round trip of a [`FixedPointPass`] moved the pass.
#[derive(Debug, Clone, PartialEq)]
pub struct FixedPointStep {
    /// Largest relative change of a group's input over this trip:
    /// max over groups of `max|xⁱ − xⁱ⁻¹| / max|xⁱ|` (∞-norms over the
    /// group's (T, d_in) input).
    pub input_change: f32,
    /// Per position (row of the logits), the largest absolute change of a
    /// logit over this trip, `max_v |logitsⁱ[p, v] − logitsⁱ⁻¹[p, v]|`;
    /// +∞ (unknown) on the first trip of a pass that had no pass 0
    /// ([`FixedPointPass::start_from_inputs`]).
    pub logit_change: Vec<f32>,
}

/// Where a pass's deltas come from.
enum Answers {
    /// A trip answered as one batch, or a guess, by (layer, group); a
    /// group missing from it runs unadapted (empty: the base model).
    Table(PassDeltas),
    /// A trip sent ahead on the stream, taken group by group.
    Stream(TripId),
}

/// The hook of one plaintext pass: records every group input it wants,
/// sends it on as part of the next trip when one is being streamed, and
/// answers with the current trip's deltas.
struct Relay<'w, 's> {
    wanted: &'w [(usize, ProjGroup)],
    answers: Answers,
    /// The hook's stream (when a trip is streamed in or out) and the trip
    /// this pass sends, if any.
    stream: Option<&'s mut dyn DeltaStream>,
    sending: Option<TripId>,
    recorded: Vec<GroupInput>,
    /// The deltas the pass added, by (layer, group).
    added: PassDeltas,
}

impl<'w, 's> Relay<'w, 's> {
    /// A pass's hook that answers from `answers` and, with a `stream` and
    /// a `sending` trip, sends each input on as that trip.
    fn new(
        wanted: &'w [(usize, ProjGroup)],
        answers: Answers,
        stream: Option<&'s mut dyn DeltaStream>,
        sending: Option<TripId>,
    ) -> Self {
        Relay {
            wanted,
            answers,
            stream,
            sending,
            recorded: Vec::with_capacity(wanted.len()),
            added: HashMap::new(),
        }
    }
}

impl DeltaHook for Relay<'_, '_> {
    fn deltas(
        &mut self,
        layer: usize,
        group: ProjGroup,
        x: &Tensor,
    ) -> Result<GroupDeltas, ModelError> {
        let input = GroupInput {
            layer,
            group,
            x: x.clone(),
        };
        if let (Some(trip), Some(stream)) = (self.sending, self.stream.as_deref_mut()) {
            stream.send(trip, &input)?;
        }
        self.recorded.push(input);
        let deltas = match &mut self.answers {
            Answers::Table(t) => t.remove(&(layer, group)).unwrap_or_default(),
            Answers::Stream(trip) => match self.stream.as_deref_mut() {
                Some(stream) => stream.receive(*trip, layer, group)?,
                None => {
                    return Err(ModelError::Hook {
                        layer,
                        proj: group.projs()[0],
                        reason: "a streamed trip without the hook's stream".into(),
                    });
                }
            },
        };
        // Tensors share their storage: keeping them costs no copy.
        self.added.insert((layer, group), deltas.clone());
        Ok(deltas)
    }

    fn wants(&self, layer: usize, group: ProjGroup) -> bool {
        self.wanted.contains(&(layer, group))
    }
}

/// The next trip of a [`FixedPointPass`], when a pass sends it while it runs
/// ([`FixedPointPass::iterate_sending`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum NextTrip {
    /// Send nothing: this pass is the last of its batch.
    Wait,
    /// Send the pass's inputs as the next trip, within this tolerance
    /// (`None`: exact), group by group as they are produced.
    Send(Option<f64>),
}

/// A trip whose inputs are already known to the hook.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Pending {
    /// Nothing sent: the next trip sends the current inputs as one batch.
    Nothing,
    /// The next trip went out on the stream during the latest pass.
    Streamed(TripId),
    /// The next trip's tolerance was fixed by the latest pass, but the
    /// hook does not stream: it goes out as one batch.
    Batched(Option<f64>),
}

/// A forward pass of T positions whose deltas are computed as a fixed point
/// over layers, one round trip per [`FixedPointPass::iterate`]; see the
/// module docs.
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
    /// The deltas the latest pass added (none after pass 0).
    deltas: PassDeltas,
    /// The latest plaintext pass's logits; none before the first trip of a
    /// pass started from given inputs ([`FixedPointPass::start_from_inputs`]).
    logits: Option<Tensor>,
    steps: Vec<FixedPointStep>,
    pending: Pending,
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
        Self::start_guessed(model, tokens, cache, mask, hook, PassDeltas::new())
    }

    /// [`FixedPointPass::start_guessed`] that also sends the first trip
    /// (`next`) while pass 0 runs, group by group, when `hook` streams
    /// ([`DeltaHook::stream`]); otherwise the trip goes out as one batch at
    /// the next iteration, with the tolerance `next` fixes. An empty
    /// `guess` is [`FixedPointPass::start`]'s pass 0 (the base model).
    ///
    /// # Errors
    /// As [`Model::forward`], and whatever the hook's stream raises.
    pub fn start_sending(
        model: &'m Model,
        tokens: &[u32],
        cache: &mut KvCache,
        mask: &AttentionMask,
        hook: &mut dyn DeltaHook,
        guess: PassDeltas,
        next: NextTrip,
    ) -> Result<Self, ModelError> {
        let wanted = wanted_groups(model, hook);
        let sending = open_next(hook, tokens.len(), next, false)?;
        Self::pass_zero(
            model,
            tokens,
            cache,
            mask,
            wanted,
            sending,
            Answers::Table(guess),
        )
    }

    /// [`FixedPointPass::start`] whose pass 0 adds guessed deltas instead of
    /// none: `guess` maps (layer, group) to (T, d_out) deltas (a group
    /// missing from it runs unadapted). A better first estimate than the
    /// base model's inputs leaves a smaller residual after the same number
    /// of trips; the fixed point itself does not depend on it.
    ///
    /// # Errors
    /// As [`Model::forward`].
    pub fn start_guessed(
        model: &'m Model,
        tokens: &[u32],
        cache: &mut KvCache,
        mask: &AttentionMask,
        hook: &dyn DeltaHook,
        guess: PassDeltas,
    ) -> Result<Self, ModelError> {
        let wanted = wanted_groups(model, hook);
        Self::pass_zero(
            model,
            tokens,
            cache,
            mask,
            wanted,
            Sending::nothing(),
            Answers::Table(guess),
        )
    }

    /// Pass 0 with the deltas of `answers` (none, or a guess), sending what
    /// `sending` says.
    fn pass_zero(
        model: &'m Model,
        tokens: &[u32],
        cache: &mut KvCache,
        mask: &AttentionMask,
        wanted: Vec<(usize, ProjGroup)>,
        sending: Sending<'_>,
        answers: Answers,
    ) -> Result<Self, ModelError> {
        let start = cache.len();
        let mut relay = Relay::new(&wanted, answers, sending.stream, sending.trip);
        let logits = model.forward(tokens, cache, mask, &mut relay)?;
        let (inputs, deltas) = (relay.recorded, relay.added);
        Ok(Self {
            model,
            tokens: tokens.to_vec(),
            mask: mask.clone(),
            start,
            wanted,
            inputs,
            deltas,
            logits: Some(logits),
            steps: Vec::new(),
            pending: sending.pending,
        })
    }

    /// A pass whose first estimate is given instead of computed by pass 0:
    /// `inputs` holds every group `hook` wants, in forward order, each
    /// (T, d_in) for the T `tokens` — e.g. the inputs a drafter computed
    /// while it drafted those tokens (`cipherlora_spec`'s drafted start).
    /// No plaintext pass runs and `cache` is not touched: the first trip
    /// leaves at once, on the hook's stream when it streams and `next` is
    /// [`NextTrip::Send`] (else as one batch at the first iteration, with
    /// `next`'s tolerance). The fixed point is the same; only the start
    /// differs, and the first trip's logit change is unknown: reported as
    /// +∞ for every row ([`FixedPointStep::logit_change`]).
    ///
    /// # Errors
    /// [`ModelError::Input`] when `inputs` are not the wanted groups in
    /// forward order or a group's input is not (T, _); whatever the hook's
    /// stream raises.
    pub fn start_from_inputs(
        model: &'m Model,
        tokens: &[u32],
        cache: &KvCache,
        mask: &AttentionMask,
        hook: &mut dyn DeltaHook,
        inputs: Vec<GroupInput>,
        next: NextTrip,
    ) -> Result<Self, ModelError> {
        let wanted = wanted_groups(model, hook);
        let t = tokens.len();
        let groups: Vec<(usize, ProjGroup)> = inputs.iter().map(|g| (g.layer, g.group)).collect();
        if groups != wanted {
            return Err(ModelError::Input(format!(
                "a pass's given inputs must be the {} wanted groups in forward order, not {} groups",
                wanted.len(),
                groups.len()
            )));
        }
        if let Some(g) = inputs
            .iter()
            .find(|g| g.x.dims().len() != 2 || g.x.dims()[0] != t)
        {
            return Err(ModelError::Input(format!(
                "layer {}'s given input has shape {:?}, not ({t}, d_in)",
                g.layer,
                g.x.dims()
            )));
        }
        let Sending {
            stream,
            trip,
            pending,
        } = open_next(hook, t, next, false)?;
        if let (Some(stream), Some(trip)) = (stream, trip) {
            for input in &inputs {
                stream.send(trip, input)?;
            }
        }
        Ok(Self {
            model,
            tokens: tokens.to_vec(),
            mask: mask.clone(),
            start: cache.len(),
            wanted,
            inputs,
            deltas: PassDeltas::new(),
            logits: None,
            steps: Vec::new(),
            pending,
        })
    }

    /// One round trip: sends every group's current input estimate through
    /// `hook` at once (or takes the trip the previous pass sent ahead), then
    /// reruns the plaintext pass with the returned deltas (rolling the
    /// cache back first). Returns what moved.
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
        self.iterate_sending(cache, hook, tolerance, NextTrip::Wait)
    }

    /// One round trip, streamed: the pass takes the deltas of the trip the
    /// previous pass sent ahead group by group as it reaches them (or,
    /// when none was sent, sends its current inputs as one batch within
    /// `tolerance` first), and when `next` is [`NextTrip::Send`] sends its
    /// own inputs as the next trip while it runs (module docs). Returns
    /// what moved.
    ///
    /// # Errors
    /// As [`FixedPointPass::iterate`], and whatever the hook's stream
    /// raises. On error the cache holds the previous pass's positions.
    pub fn iterate_sending(
        &mut self,
        cache: &mut KvCache,
        hook: &mut dyn DeltaHook,
        tolerance: Option<f64>,
        next: NextTrip,
    ) -> Result<&FixedPointStep, ModelError> {
        let answers = match self.pending {
            Pending::Streamed(trip) => Answers::Stream(trip),
            Pending::Nothing => Answers::Table(self.batch(hook, tolerance)?),
            Pending::Batched(t) => Answers::Table(self.batch(hook, t)?),
        };
        self.pending = Pending::Nothing;
        let t = self.tokens.len();
        let receiving = matches!(answers, Answers::Stream(_));
        let Sending {
            stream,
            trip,
            pending,
        } = open_next(hook, t, next, receiving)?;
        cache.truncate(self.start);
        let mut relay = Relay::new(&self.wanted, answers, stream, trip);
        let logits = self
            .model
            .forward(&self.tokens, cache, &self.mask, &mut relay)?;
        let (inputs, deltas) = (relay.recorded, relay.added);
        let input_change = max_relative_change(&self.inputs, &inputs)?;
        let logit_change = match &self.logits {
            Some(before) => (&logits - before)?
                .abs()?
                .max(D::Minus1)?
                .to_vec1::<f32>()?,
            None => vec![f32::INFINITY; t],
        };
        self.inputs = inputs;
        self.deltas = deltas;
        self.logits = Some(logits);
        self.pending = pending;
        self.steps.push(FixedPointStep {
            input_change,
            logit_change,
        });
        Ok(self.steps.last().expect("just pushed"))
    }

    /// Runs the next passes (and [`FixedPointPass::replay`]) on `model`
    /// instead: the same architecture with other weights, e.g. quantized
    /// weights for the passes whose only use is the next trip's inputs, and
    /// the target's own for the pass whose logits and keys and values are
    /// kept. The fixed point is the target model's only if the pass that
    /// ends on it runs on the target. The cache is shared: both models'
    /// keys and values have the same shape.
    ///
    /// # Errors
    /// [`ModelError::Input`] when `model`'s configuration differs from the
    /// pass's model's.
    pub fn run_on(&mut self, model: &'m Model) -> Result<(), ModelError> {
        if model.config() != self.model.config() {
            return Err(ModelError::Input(
                "a fixed-point pass can only move to a model of the same configuration".into(),
            ));
        }
        self.model = model;
        Ok(())
    }

    /// The latest pass again, with the deltas it added, against another
    /// cache that holds the same positions `..cache_start()` computed
    /// differently: appends the pass's T positions to `cache` and returns
    /// their logits (T, vocab). No trip; nothing is sent. `cipherlora_spec`
    /// replays the pass before a round's last trip against a cache one trip
    /// less converged everywhere (its *shadow*), which bounds the residual
    /// the kept keys and values carry into later rounds.
    ///
    /// # Errors
    /// [`ModelError::Input`] if `cache` does not hold exactly
    /// `cache_start()` positions, or if no plaintext pass has run yet;
    /// otherwise as [`Model::forward`].
    pub fn replay(&self, cache: &mut KvCache) -> Result<Tensor, ModelError> {
        if self.logits.is_none() {
            return Err(ModelError::Input(
                "no plaintext pass to replay before the first trip".into(),
            ));
        }
        if cache.len() != self.start {
            return Err(ModelError::Input(format!(
                "a replay needs a cache of {} positions, not {}",
                self.start,
                cache.len()
            )));
        }
        let answers = Answers::Table(self.deltas.clone());
        let mut relay = Relay::new(&self.wanted, answers, None, None);
        self.model
            .forward(&self.tokens, cache, &self.mask, &mut relay)
    }

    /// The current inputs' deltas as one batch, by (layer, group).
    fn batch(
        &self,
        hook: &mut dyn DeltaHook,
        tolerance: Option<f64>,
    ) -> Result<PassDeltas, ModelError> {
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
        Ok(self
            .inputs
            .iter()
            .map(|g| (g.layer, g.group))
            .zip(answers)
            .collect())
    }

    /// Logits (T, vocab) of the latest plaintext pass; `None` before the
    /// first trip of a pass started from given inputs
    /// ([`FixedPointPass::start_from_inputs`]).
    #[must_use]
    pub fn logits(&self) -> Option<&Tensor> {
        self.logits.as_ref()
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

    /// The deltas the latest pass added, by (layer, group): (T, d_out)
    /// per adapted projection (empty after pass 0 unless it was guessed).
    #[must_use]
    pub fn deltas(&self) -> &PassDeltas {
        &self.deltas
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

/// The groups `hook` wants, in forward order: what every pass of a
/// [`FixedPointPass`] records and every trip sends.
#[must_use]
pub fn wanted_groups(model: &Model, hook: &dyn DeltaHook) -> Vec<(usize, ProjGroup)> {
    (0..model.config().num_layers)
        .flat_map(|l| ProjGroup::ALL.into_iter().map(move |g| (l, g)))
        .filter(|&(l, g)| hook.wants(l, g))
        .collect()
}

/// What a pass sends as it runs: the hook's stream (when it uses one), the
/// trip it sends on it, and what is pending after the pass.
struct Sending<'a> {
    stream: Option<&'a mut dyn DeltaStream>,
    trip: Option<TripId>,
    pending: Pending,
}

impl Sending<'_> {
    /// A pass that sends nothing and leaves nothing pending.
    fn nothing() -> Self {
        Self {
            stream: None,
            trip: None,
            pending: Pending::Nothing,
        }
    }
}

/// Opens the trip a pass of `t` positions sends as it runs: on the hook's
/// stream when it has one, else a trip to batch at the next iteration with
/// the tolerance `next` fixes. The hook is borrowed once, so the stream is
/// also what a pass `receiving` a streamed trip takes its deltas from.
fn open_next(
    hook: &mut dyn DeltaHook,
    t: usize,
    next: NextTrip,
    receiving: bool,
) -> Result<Sending<'_>, ModelError> {
    let NextTrip::Send(tolerance) = next else {
        return Ok(Sending {
            stream: if receiving { hook.stream(t) } else { None },
            trip: None,
            pending: Pending::Nothing,
        });
    };
    match hook.stream(t) {
        Some(stream) => {
            let trip = stream.open_trip(tolerance)?;
            Ok(Sending {
                stream: Some(stream),
                trip: Some(trip),
                pending: Pending::Streamed(trip),
            })
        }
        None => Ok(Sending {
            stream: None,
            trip: None,
            pending: Pending::Batched(tolerance),
        }),
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

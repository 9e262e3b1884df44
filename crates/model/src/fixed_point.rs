//! One forward pass whose adapter deltas come from few batched round trips: a fixed point over
//! layers (Jacobi iteration; cf. Santilli et al., ACL 2023; Fu et al., ICML 2024), G groups
//! converging in at most G trips. Notes: docs/design/code-notes.md, "model: fixed_point".

use std::collections::HashMap;

use candle_core::{D, Tensor};

use crate::hook::{DeltaHook, DeltaStream, GroupDeltas, GroupInput, PassDeltas, ProjGroup, TripId};
use crate::{AttentionMask, KvCache, Model, ModelError};

/// How much one round trip of a [`FixedPointPass`] moved the pass.
#[derive(Debug, Clone, PartialEq)]
pub struct FixedPointStep {
    /// Largest relative input change of any group over this trip (∞-norms over (T, d_in)).
    pub input_change: f32,
    /// Per row, the largest absolute logit change over this trip (+∞: unknown).
    pub logit_change: Vec<f32>,
}

/// Where a pass's deltas come from.
enum Answers {
    /// A trip answered as one batch, or a guess, by (layer, group); missing groups run unadapted.
    Table(PassDeltas),
    /// A trip sent ahead on the stream, taken group by group.
    Stream(TripId),
}

/// One plaintext pass's hook: records wanted inputs, streams them, answers this trip's deltas.
struct Relay<'w, 's> {
    wanted: &'w [(usize, ProjGroup)],
    answers: Answers,
    /// The hook's stream (when a trip is streamed in or out) and the trip this pass sends, if any.
    stream: Option<&'s mut dyn DeltaStream>,
    sending: Option<TripId>,
    recorded: Vec<GroupInput>,
    /// The deltas the pass added, by (layer, group).
    added: PassDeltas,
}

impl<'w, 's> Relay<'w, 's> {
    /// A hook answering from `answers`, sending each input on as the `sending` trip.
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

/// The next trip, when a pass sends it while it runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum NextTrip {
    /// Send nothing: this pass is the last of its batch.
    Wait,
    /// Send the pass's inputs as the next trip within this tolerance (`None`: exact).
    Send(Option<f64>),
}

/// A trip whose inputs are already known to the hook.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Pending {
    /// Nothing sent: the next trip sends the current inputs as one batch.
    Nothing,
    /// The next trip went out on the stream during the latest pass.
    Streamed(TripId),
    /// The next trip's tolerance, for a hook that does not stream (one batch).
    Batched(Option<f64>),
}

/// A forward pass of T positions with fixed-point deltas, one round trip per
/// [`FixedPointPass::iterate`]; the cache holds the prefix plus the latest pass's T positions.
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
    /// The latest plaintext pass's logits (none before the first trip from given inputs).
    logits: Option<Tensor>,
    steps: Vec<FixedPointStep>,
    /// Round trips whose answers were discarded ([`FixedPointPass::repeat_trip`]).
    repeated: usize,
    pending: Pending,
}

impl<'m> FixedPointPass<'m> {
    /// Pass 0: `tokens` with no deltas, recording every wanted group input; no round trip. Errors
    /// as [`Model::forward`].
    pub fn start(
        model: &'m Model,
        tokens: &[u32],
        cache: &mut KvCache,
        mask: &AttentionMask,
        hook: &dyn DeltaHook,
    ) -> Result<Self, ModelError> {
        Self::start_guessed(model, tokens, cache, mask, hook, PassDeltas::new())
    }

    /// [`FixedPointPass::start_guessed`], sending the first trip while pass 0 runs when `hook`
    /// streams. Errors as [`Model::forward`] and the hook's stream.
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

    /// [`FixedPointPass::start`] with pass 0 adding `guess` ((T, d_out) by (layer, group)).
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

    /// Pass 0 with the deltas of `answers` (none, or a guess), sending what `sending` says.
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
            repeated: 0,
            pending: sending.pending,
        })
    }

    /// A pass from given first inputs ((T, d_in) per wanted group, forward order); no plaintext
    /// pass. Errors: [`ModelError::Input`] for wrong groups or shapes; the hook's stream's.
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
            repeated: 0,
            pending,
        })
    }

    /// One round trip: every group's input at once (or the trip sent ahead), then the plaintext
    /// pass rerun with the deltas. Errors: the hook's or forward pass's; [`ModelError::Hook`] for a
    /// wrong group count. On error the cache holds the previous pass's positions.
    pub fn iterate(
        &mut self,
        cache: &mut KvCache,
        hook: &mut dyn DeltaHook,
    ) -> Result<&FixedPointStep, ModelError> {
        self.iterate_within(cache, hook, None)
    }

    /// [`FixedPointPass::iterate`] with deltas within relative `tolerance` (`None`: exact).
    pub fn iterate_within(
        &mut self,
        cache: &mut KvCache,
        hook: &mut dyn DeltaHook,
        tolerance: Option<f64>,
    ) -> Result<&FixedPointStep, ModelError> {
        self.iterate_sending(cache, hook, tolerance, NextTrip::Wait)
    }

    /// One streamed round trip, sending its own inputs as the next trip with [`NextTrip::Send`].
    /// Errors as [`FixedPointPass::iterate`] and the hook's stream.
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

    /// A round trip whose answers are discarded: the latest inputs sent again as one batch
    /// within `tolerance` (`None`: exact). The pass, its steps and its next inputs are unchanged;
    /// [`FixedPointPass::round_trips`] counts the trip. A continuation of a round keeps the
    /// round's shape this way without taking a coarse trip's error into its inputs (see
    /// docs/design/schedules.md, "Continuations"). Errors: [`ModelError::Input`] while a trip is
    /// pending; the hook's.
    pub fn repeat_trip(
        &mut self,
        hook: &mut dyn DeltaHook,
        tolerance: Option<f64>,
    ) -> Result<(), ModelError> {
        if self.pending != Pending::Nothing {
            return Err(ModelError::Input(
                "a trip can only be repeated when none is pending".into(),
            ));
        }
        self.batch(hook, tolerance)?;
        self.repeated += 1;
        Ok(())
    }

    /// Runs the next passes on `model` (same shape, other weights). Errors: [`ModelError::Input`]
    /// when the configuration differs.
    pub fn run_on(&mut self, model: &'m Model) -> Result<(), ModelError> {
        if model.config() != self.model.config() {
            return Err(ModelError::Input(
                "a fixed-point pass can only move to a model of the same configuration".into(),
            ));
        }
        self.model = model;
        Ok(())
    }

    /// The latest pass replayed with its deltas against `cache` (holding `..cache_start()`),
    /// returning logits (T, vocab). Errors: [`ModelError::Input`]; otherwise as [`Model::forward`].
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

    /// Logits (T, vocab) of the latest plaintext pass, if any.
    #[must_use]
    pub fn logits(&self) -> Option<&Tensor> {
        self.logits.as_ref()
    }

    /// What each round trip so far moved, in order.
    #[must_use]
    pub fn steps(&self) -> &[FixedPointStep] {
        &self.steps
    }

    /// Round trips made so far, repeated ones included.
    #[must_use]
    pub fn round_trips(&self) -> usize {
        self.steps.len() + self.repeated
    }

    /// The inputs of the latest pass (what the next trip would send).
    #[must_use]
    pub fn inputs(&self) -> &[GroupInput] {
        &self.inputs
    }

    /// The deltas the latest pass added, by (layer, group), (T, d_out) each.
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

/// The groups `hook` wants, in forward order.
#[must_use]
pub fn wanted_groups(model: &Model, hook: &dyn DeltaHook) -> Vec<(usize, ProjGroup)> {
    (0..model.config().num_layers)
        .flat_map(|l| ProjGroup::ALL.into_iter().map(move |g| (l, g)))
        .filter(|&(l, g)| hook.wants(l, g))
        .collect()
}

/// What a pass sends as it runs: the stream, its trip, and what is pending after.
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

/// Opens the trip a pass of `t` positions sends (streamed, else batched later).
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

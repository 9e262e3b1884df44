//! Verify-pass schedules: one round trip per layer group, or a fixed point over layers in a
//! constant number of batched trips with certified rows. Rationale: docs/design/code-notes.md,
//! "spec: schedule".

use std::borrow::Cow;

use cipherlora_model::{
    AttentionMask, DeltaHook, FixedPointPass, FixedPointStep, GroupDeltas, GroupInput, KeepDeltas,
    KvCache, KvRows, Model, NextTrip, PassDeltas, Tensor,
};

use crate::draft_bias::DraftBias;
use crate::row_deltas::RowDeltas;
use crate::{ConfigError, SpecError};

/// Batched round trips per prefill pass by default (see [`FixedPoint::prefill`]).
pub const PREFILL_ROUND_TRIPS: usize = 5;

/// How a prefill pass gets its deltas under the fixed-point schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefill {
    /// One round trip per adapted layer group, in forward order: exact, G round trips per pass.
    PerGroup,
    /// This many batched round trips of the fixed point (≥ 1).
    FixedPoint(usize),
}

impl std::fmt::Display for Prefill {
    /// `per-group` or `fixed-point:N`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Prefill::PerGroup => f.write_str("per-group"),
            Prefill::FixedPoint(n) => write!(f, "fixed-point:{n}"),
        }
    }
}

/// The fixed-point schedule's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FixedPoint {
    /// Batched round trips per verify round (the server always sees this many).
    pub round_trips: usize,
    /// A greedy row is certified when top-1 − top-2 > `margin` × its last logit change.
    pub margin: f32,
    /// A sampled row is certified when its logits' error bound is at most this (logits).
    pub sampling_tolerance: f32,
    /// Sampled chains: rows with logit bound ≤ this × min(1, temperature) get their draws
    /// certified.
    pub draw_tolerance: f32,
    /// How prefill passes get their deltas ([`Prefill::PerGroup`] leaves no residual).
    pub prefill: Prefill,
    /// Greedy, base drafter: draft the next round during the last round trip (same output).
    pub draft_ahead: bool,
    /// Coarse deltas on every trip but a pass's last ([`FixedPoint::trip_tolerance`]).
    pub coarse_trips: bool,
    /// Stream a round's trips as a wavefront over layers (same deltas, less waiting).
    pub streamed: bool,
    /// Trips after a round's tokens are decided, refining only the kept rows (1: certified draws).
    pub settle_trips: usize,
    /// Also certify against the cached rows' inherited residual, using a shadow cache.
    pub shadow: bool,
    /// Pass 0 adds the previous round's last kept rows' mean deltas ([`DraftBias::from_rows`]).
    pub guessed_start: bool,
    /// Pass 0 of a chain round is the drafter's LoRA inputs (needs ≥ 2 trips per round).
    pub drafted_start: bool,
    /// Estimate passes on the drafter's quantized weights; last passes and continuations on the
    /// target.
    pub drafter_estimates: bool,
}

/// First-trip delta tolerance with coarse trips: 2^-11 of a group's largest delta.
pub const FIRST_TRIP_TOLERANCE: f64 = 1.0 / 2048.0;

/// Tolerance of the later trips before a pass's last: 2^-15 (relative).
pub const LATER_TRIP_TOLERANCE: f64 = 1.0 / 32768.0;

impl Default for FixedPoint {
    /// Three round trips per round, margin 1, five batched trips per prefill pass.
    fn default() -> Self {
        Self {
            round_trips: 3,
            margin: 1.0,
            sampling_tolerance: 1e-4,
            draw_tolerance: DRAW_TOLERANCE,
            prefill: Prefill::FixedPoint(5),
            draft_ahead: true,
            coarse_trips: true,
            streamed: true,
            settle_trips: 0,
            shadow: false,
            guessed_start: true,
            drafted_start: false,
            drafter_estimates: false,
        }
    }
}

impl FixedPoint {
    /// This fixed point for sampling: no coarse trips, shadow or drafter estimates.
    #[must_use]
    pub fn for_sampling(self) -> Self {
        Self {
            coarse_trips: false,
            shadow: false,
            drafter_estimates: false,
            ..self
        }
    }

    /// This sampled fixed point for certified draws: one exact settle trip after each decision.
    #[must_use]
    pub fn for_certified_draws(self) -> Self {
        Self {
            settle_trips: self.settle_trips.max(1),
            ..self
        }
    }

    /// The tolerance of trip `j` (0-based) of a pass with `batch`-trip rounds; a batch's last is
    /// exact.
    #[must_use]
    pub fn tolerance_of_trip(&self, j: usize, batch: usize) -> Option<f64> {
        let batch = batch.max(1);
        self.trip_tolerance(j % batch, batch, (j + 1).is_multiple_of(batch))
    }

    /// What a pass sends while it runs: the next trip when streaming and `send` holds.
    fn next_trip(&self, tolerance: Option<f64>, send: bool) -> NextTrip {
        if self.streamed && send {
            NextTrip::Send(tolerance)
        } else {
            NextTrip::Wait
        }
    }

    /// The tolerance after `done` trips (`None`: exact), from the trip's index in its batch alone.
    #[must_use]
    pub fn trip_tolerance(&self, done: usize, batch: usize, last: bool) -> Option<f64> {
        if !self.coarse_trips || last || done >= batch {
            None
        } else if done == 0 {
            Some(FIRST_TRIP_TOLERANCE)
        } else {
            Some(LATER_TRIP_TOLERANCE)
        }
    }
}

/// The verify pass's schedule.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Schedule {
    /// One round trip per adapted layer group, in forward order.
    #[default]
    PerGroup,
    /// All groups in each batched round trip, iterated to a fixed point.
    FixedPoint(FixedPoint),
}

impl Schedule {
    /// The schedule a generation runs with: [`FixedPoint::for_sampling`] unless greedy.
    #[must_use]
    pub fn for_decoding(self, greedy: bool) -> Self {
        match self {
            Schedule::FixedPoint(fp) if !greedy => Schedule::FixedPoint(fp.for_sampling()),
            other => other,
        }
    }
}

impl std::fmt::Display for Schedule {
    /// `per-group` or `fixed-point:N`, then any of `/prefill:per-group`, `/prefill:M`, `/shadow`,
    /// `/base-start`, `/drafted-start`, `/drafter-estimates`, `/exact-trips`, `/batched`,
    /// `/no-ahead`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Schedule::PerGroup => f.write_str("per-group"),
            Schedule::FixedPoint(fp) => {
                write!(f, "fixed-point:{}", fp.round_trips)?;
                match fp.prefill {
                    Prefill::PerGroup => f.write_str("/prefill:per-group"),
                    Prefill::FixedPoint(n) if n != fp.round_trips.max(PREFILL_ROUND_TRIPS) => {
                        write!(f, "/prefill:{n}")
                    }
                    Prefill::FixedPoint(_) => Ok(()),
                }?;
                if fp.shadow {
                    f.write_str("/shadow")?;
                }
                if !fp.guessed_start {
                    f.write_str("/base-start")?;
                }
                if fp.drafted_start {
                    f.write_str("/drafted-start")?;
                }
                if fp.drafter_estimates {
                    f.write_str("/drafter-estimates")?;
                }
                if !fp.coarse_trips {
                    f.write_str("/exact-trips")?;
                }
                if !fp.streamed {
                    f.write_str("/batched")?;
                }
                if !fp.draft_ahead {
                    f.write_str("/no-ahead")?;
                }
                Ok(())
            }
        }
    }
}

impl std::str::FromStr for Schedule {
    type Err = SpecError;

    /// Parses what `Display` writes (`fixed-point:N` prefills with max(N, 5) trips). Errors:
    /// [`SpecError::Config`] on an unknown or out-of-range part.
    fn from_str(s: &str) -> Result<Self, SpecError> {
        let bad = || {
            SpecError::from(ConfigError::unparsed(
                "schedule",
                s,
                "per-group, fixed-point, fixed-point:N, \
                 each fixed point optionally /prefill:per-group or /prefill:M, \
                 /shadow, /base-start, /drafted-start, /drafter-estimates, /exact-trips, /batched \
                 and /no-ahead",
            ))
        };
        let positive = |n: &str| match n.parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(bad()),
        };
        let (s, no_ahead) = match s.strip_suffix("/no-ahead") {
            Some(rest) => (rest, true),
            None => (s, false),
        };
        let (s, batched) = match s.strip_suffix("/batched") {
            Some(rest) => (rest, true),
            None => (s, false),
        };
        let (s, exact) = match s.strip_suffix("/exact-trips") {
            Some(rest) => (rest, true),
            None => (s, false),
        };
        let (s, drafter_estimates) = match s.strip_suffix("/drafter-estimates") {
            Some(rest) => (rest, true),
            None => (s, false),
        };
        let (s, drafted_start) = match s.strip_suffix("/drafted-start") {
            Some(rest) => (rest, true),
            None => (s, false),
        };
        let (s, base_start) = match s.strip_suffix("/base-start") {
            Some(rest) => (rest, true),
            None => (s, false),
        };
        let (s, shadow) = match s.strip_suffix("/shadow") {
            Some(rest) => (rest, true),
            None => (s, false),
        };
        let (main, prefill) = match s.split_once("/prefill:") {
            Some((m, "per-group")) => (m, Some(Prefill::PerGroup)),
            Some((m, n)) => (m, Some(Prefill::FixedPoint(positive(n)?))),
            None => (s, None),
        };
        let fixed_point_only = exact
            || batched
            || no_ahead
            || shadow
            || base_start
            || drafted_start
            || drafter_estimates;
        if fixed_point_only && main == "per-group" {
            return Err(bad());
        }
        let mut fp = match main.split_once(':') {
            None if main == "per-group" && prefill.is_none() => return Ok(Schedule::PerGroup),
            None if main == "fixed-point" => FixedPoint::default(),
            Some(("fixed-point", n)) => {
                let n = positive(n)?;
                FixedPoint {
                    round_trips: n,
                    prefill: Prefill::FixedPoint(n.max(PREFILL_ROUND_TRIPS)),
                    ..FixedPoint::default()
                }
            }
            _ => return Err(bad()),
        };
        if let Some(p) = prefill {
            fp.prefill = p;
        }
        fp.coarse_trips = !exact;
        fp.streamed = !batched;
        fp.draft_ahead = !no_ahead;
        fp.shadow = shadow;
        fp.guessed_start = !base_start;
        fp.drafted_start = drafted_start;
        fp.drafter_estimates = drafter_estimates;
        Ok(Schedule::FixedPoint(fp))
    }
}

/// A verified pass.
#[derive(Debug)]
pub(crate) struct Verified {
    /// Logits of the pass, (T, vocab).
    pub logits: Tensor,
    /// The deltas the pass added, (T, d_out) per adapted projection.
    pub deltas: PassDeltas,
    /// Leading rows the round may use (≥ 1).
    pub usable: usize,
    /// Batched round trips made (0 on the per-group schedule).
    pub round_trips: usize,
    /// Extra rounds spent on this pass because no row was certified yet.
    pub continuations: usize,
    /// No row is usable because of the cached rows' residual: [`settle`] them and verify again.
    pub stalled: bool,
    /// The first trip sent the drafter's inputs ([`FixedPoint::drafted_start`]).
    pub drafted_start: bool,
}

/// Work run on another thread during the last round trip; returns e.g. the next draft.
pub(crate) type Ahead<'a, G> =
    &'a mut (dyn FnMut(&Tensor, &PassDeltas, &KvRows) -> Result<G, SpecError> + Send);

/// `certify(logits, last_change, previous_change)`: how many leading rows are certified.
pub(crate) type Certify<'a> =
    &'a dyn Fn(&Tensor, &[f32], Option<&[f32]>) -> Result<usize, SpecError>;

/// One verify pass: `tokens` (T, the first `real` not padding) under `schedule`.
#[derive(Clone, Copy)]
pub(crate) struct Window<'a> {
    pub model: &'a Model,
    pub tokens: &'a [u32],
    /// Causal for a chain, a tree mask for a draft tree.
    pub mask: &'a AttentionMask,
    pub real: usize,
    pub schedule: &'a Schedule,
    pub certify: Certify<'a>,
    /// The deltas pass 0 adds at every position (empty: the base model).
    pub estimate: &'a DraftBias,
    /// Whether a pass blocked only by the inherited residual may return [`Verified::stalled`].
    pub may_stall: bool,
    /// The drafter's inputs per adapted group, (T, d_in) each, forward order.
    pub drafted: Option<&'a [GroupInput]>,
    /// The model of the estimate passes ([`FixedPoint::drafter_estimates`]).
    pub estimator: &'a Model,
    /// Rows the previous round verified but could not use: `(deltas, from, count)`.
    pub carried: Option<(&'a PassDeltas, usize, usize)>,
}

/// Runs one verify pass; `certify` counts certified leading rows, `ahead` runs during the last
/// round trip, `shadow` is the shadow cache. Errors: those of the forward pass, hook and `ahead`.
pub(crate) fn verify<G: Send>(
    window: &Window<'_>,
    cache: &mut KvCache,
    hook: &mut dyn DeltaHook,
    mut ahead: Option<Ahead<'_, G>>,
    mut shadow: Option<&mut KvCache>,
) -> Result<(Verified, Option<G>), SpecError> {
    let Window {
        model,
        tokens,
        mask,
        real,
        schedule,
        certify,
        estimate,
        may_stall,
        drafted,
        estimator,
        carried,
    } = *window;
    let fp = match schedule {
        Schedule::PerGroup => {
            let mut keeping = KeepDeltas::new(hook);
            let logits = model.forward(tokens, cache, mask, &mut keeping)?;
            let verified = Verified {
                logits,
                deltas: keeping.added,
                usable: real,
                round_trips: 0,
                continuations: 0,
                stalled: false,
                drafted_start: false,
            };
            return Ok((verified, None));
        }
        Schedule::FixedPoint(fp) => fp,
    };
    let trips = fp.round_trips.max(1);
    let first = fp.next_trip(fp.tolerance_of_trip(0, trips), true);
    let drafted = drafted.filter(|_| fp.drafted_start && trips >= 2);
    let drafted_start = drafted.is_some();
    let mut pass = match drafted {
        Some(inputs) => FixedPointPass::start_from_inputs(
            model,
            tokens,
            cache,
            mask,
            hook,
            inputs.to_vec(),
            first,
        )?,
        None => {
            let guess = if fp.guessed_start {
                let guess = estimate.pass_deltas(tokens.len())?;
                match carried {
                    Some((rows, from, count)) => with_carried_rows(guess, rows, from, count)?,
                    None => guess,
                }
            } else {
                PassDeltas::new()
            };
            let pass0 = if fp.drafter_estimates {
                estimator
            } else {
                model
            };
            FixedPointPass::start_sending(pass0, tokens, cache, mask, hook, guess, first)?
        }
    };
    // After as many exact trips as groups every input is exact: this bounds continuations.
    let groups = pass.inputs().len().max(1);
    let tol = |j: usize| {
        if j < groups {
            fp.tolerance_of_trip(j, trips)
        } else {
            None
        }
    };
    let given = usize::from(pass.logits().is_none());
    let exact_after = if fp.coarse_trips || fp.drafter_estimates {
        2 * groups
    } else {
        groups
    } + given
        + usize::from(fp.drafter_estimates);
    // Estimate passes on the drafter; continuations on the target (their model difference never
    // shrinks).
    let runs_on = |j: usize| {
        if fp.drafter_estimates && j < trips.min(groups) {
            estimator
        } else {
            model
        }
    };
    let mut continuations = 0;
    let mut guess = None;
    loop {
        for _ in 0..trips - 1 {
            let j = pass.round_trips();
            pass.run_on(runs_on(j))?;
            pass.iterate_sending(cache, hook, tol(j), fp.next_trip(tol(j + 1), true))?;
        }
        let tolerance = tol(pass.round_trips());
        // Shadow replay of the pass before the last trip; its logit distance is the inherited
        // residual.
        let mut replay = |pass: &FixedPointPass<'_>| -> Result<Option<Vec<f32>>, SpecError> {
            match shadow
                .as_deref_mut()
                .filter(|_| fp.shadow && continuations == 0)
            {
                Some(sh) => {
                    sh.truncate(pass.cache_start());
                    let replayed = pass.replay(sh)?;
                    Ok(Some(distance(latest(pass)?, &replayed)?))
                }
                None => Ok(None),
            }
        };
        let mut inherited;
        match ahead.take() {
            Some(work) => {
                let before_last = latest(&pass)?.clone();
                let deltas = pass.deltas().clone();
                let rows = cache.rows(pass.cache_start())?;
                let (last, g) = std::thread::scope(|scope| {
                    let helper = scope.spawn(move || work(&before_last, &deltas, &rows));
                    let last = replay(&pass).and_then(|r| {
                        pass.run_on(model)?;
                        pass.iterate_sending(cache, hook, tolerance, NextTrip::Wait)?;
                        Ok(r)
                    });
                    let g = helper.join().map_err(|_| SpecError::DraftAheadPanicked);
                    (last, g)
                });
                inherited = last?;
                guess = Some(g??);
            }
            None => {
                inherited = replay(&pass)?;
                pass.run_on(model)?;
                pass.iterate_sending(cache, hook, tolerance, NextTrip::Wait)?;
            }
        }
        if continuations > 0 {
            // A continuation replays its latest pass (more trips do not shrink the inherited term).
            if let Some(sh) = shadow.as_deref_mut().filter(|_| fp.shadow) {
                sh.truncate(pass.cache_start());
                let replayed = pass.replay(sh)?;
                inherited = Some(distance(latest(&pass)?, &replayed)?);
            }
        }
        let steps = pass.steps();
        let own = &steps[steps.len() - 1].logit_change;
        let previous = previous_changes(steps);
        let previous = previous.as_deref();
        let logits = latest(&pass)?;
        let usable = if pass.round_trips() >= exact_after {
            real
        } else {
            match &inherited {
                Some(inh) => {
                    let (change, previous) = with_inherited(own, previous, inh);
                    certify(logits, &change, Some(&previous))?.min(real)
                }
                None => certify(logits, own, previous)?.min(real),
            }
        };
        let stalled = usable == 0
            && may_stall
            && continuations > 0
            && inherited.is_some()
            && certify(logits, own, previous)? > 0;
        if usable > 0 || stalled {
            let (logits, deltas) = (logits.clone(), pass.deltas().clone());
            for _ in 0..fp.settle_trips {
                pass.iterate_sending(cache, hook, None, NextTrip::Wait)?;
            }
            let verified = Verified {
                logits,
                deltas,
                usable,
                round_trips: pass.round_trips(),
                continuations,
                stalled,
                drafted_start,
            };
            return Ok((verified, guess));
        }
        continuations += 1;
    }
}

/// Per row, the logit change of the trip before the last (`None` after one trip).
fn previous_changes(steps: &[FixedPointStep]) -> Option<Cow<'_, [f32]>> {
    let n = steps.len();
    let before = &steps[n.checked_sub(2)?];
    if before.logit_change.iter().all(|c| c.is_finite()) {
        return Some(Cow::Borrowed(&before.logit_change));
    }
    let last = &steps[n - 1];
    let rho = last.input_change / before.input_change;
    if !(rho.is_finite() && rho > 0.0) {
        return Some(Cow::Borrowed(&before.logit_change));
    }
    Some(Cow::Owned(
        last.logit_change
            .iter()
            .zip(&before.logit_change)
            .map(|(&c, &b)| if b.is_finite() { b } else { c / rho })
            .collect(),
    ))
}

/// The logits of `pass`'s latest plaintext pass (every pass [`verify`] reads has run one).
fn latest<'p>(pass: &'p FixedPointPass<'_>) -> Result<&'p Tensor, SpecError> {
    pass.logits().ok_or(SpecError::Invariant {
        what: "a fixed-point pass read before its first pass",
    })
}

/// A (change, previous) pair bounding the row's own error plus [`INHERITED_FACTOR`] × `inherited`.
fn with_inherited(
    own: &[f32],
    previous: Option<&[f32]>,
    inherited: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    own.iter()
        .zip(inherited)
        .enumerate()
        .map(
            |(j, (&o, &i))| match previous.and_then(|p| p.get(j).copied()) {
                Some(p) if p > 0.0 && p.is_finite() && o > 0.0 && o.is_finite() => {
                    let c = o + INHERITED_FACTOR * i / error_factor(o, Some(p));
                    (c, p * c / o)
                }
                // Without a usable previous change the factor is 2 either way.
                _ => (o + INHERITED_FACTOR * i / 2.0, 0.0),
            },
        )
        .unzip()
}

/// `guess` with rows `0..count` replaced by rows `from..from + count` of `rows`.
fn with_carried_rows(
    mut guess: PassDeltas,
    rows: &PassDeltas,
    from: usize,
    count: usize,
) -> Result<PassDeltas, SpecError> {
    let model = |e: candle_core::Error| SpecError::Model(e.into());
    for (key, group) in &mut guess {
        let Some(carried) = rows.get(key) else {
            continue;
        };
        let mut merged = GroupDeltas::none();
        for (proj, d) in group.iter() {
            let t = d.dim(0).map_err(model)?;
            let n = count.min(t);
            match carried.get(proj) {
                Some(c) if n > 0 && c.dim(0).map_err(model)? >= from + n => {
                    let head = c.narrow(0, from, n).map_err(model)?;
                    let all = if n < t {
                        let tail = d.narrow(0, n, t - n).map_err(model)?;
                        Tensor::cat(&[&head, &tail], 0).map_err(model)?
                    } else {
                        head
                    };
                    merged.push(proj, all);
                }
                _ => merged.push(proj, d.clone()),
            }
        }
        *group = merged;
    }
    Ok(guess)
}

/// Per row, the largest absolute difference between two (T, vocab) logits.
fn distance(a: &Tensor, b: &Tensor) -> Result<Vec<f32>, SpecError> {
    (a - b)
        .and_then(|d| d.abs())
        .and_then(|d| d.max(1))
        .and_then(|d| d.to_vec1::<f32>())
        .map_err(|e| SpecError::Model(cipherlora_model::ModelError::from(e)))
}

/// The inherited residual's share of a row's error bound: 2ρ/(1−ρ) at ρ = [`RHO_FLOOR`].
const INHERITED_FACTOR: f32 = 2.0 * RHO_FLOOR / (1.0 - RHO_FLOOR);

/// Settles cached rows after a stalled pass in ordinary `width` rounds; returns the trips made.
/// Errors: those of the forward pass and the hook.
#[allow(clippy::too_many_arguments)]
pub(crate) fn settle(
    model: &Model,
    tokens: &[u32],
    from: usize,
    width: usize,
    (cache, shadow): (&mut KvCache, &mut KvCache),
    log: &mut RowDeltas,
    hook: &mut dyn DeltaHook,
    fp: &FixedPoint,
) -> Result<usize, SpecError> {
    let batch = fp.round_trips.max(1);
    let width = width.max(1);
    // Every chunk's start, read before the log is rewritten chunk by chunk.
    let starts = tokens
        .chunks(width)
        .enumerate()
        .map(|(i, chunk)| {
            let at = from + i * width;
            log.start(at..at + chunk.len(), width.max(chunk.len()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut made = 0;
    for ((i, chunk), start) in tokens.chunks(width).enumerate().zip(starts) {
        let at = from + i * width;
        cache.truncate(at);
        let mut inputs = chunk.to_vec();
        inputs.resize(
            width.max(chunk.len()),
            *chunk.last().expect("chunks are non-empty"),
        );
        let rounds = if start.is_some() {
            1
        } else {
            BASE_START_ROUNDS
        };
        let trips = rounds * batch;
        let mut pass = FixedPointPass::start_sending(
            model,
            &inputs,
            cache,
            &AttentionMask::Causal,
            hook,
            start.unwrap_or_default(),
            fp.next_trip(fp.tolerance_of_trip(0, batch), true),
        )?;
        for j in 0..trips - 1 {
            let next = fp.next_trip(fp.tolerance_of_trip(j + 1, batch), true);
            pass.iterate_sending(cache, hook, fp.tolerance_of_trip(j, batch), next)?;
        }
        shadow.truncate(at);
        pass.replay(shadow)?;
        pass.iterate_sending(
            cache,
            hook,
            fp.tolerance_of_trip(trips - 1, batch),
            NextTrip::Wait,
        )?;
        made += pass.round_trips();
        cache.truncate(at + chunk.len());
        shadow.truncate(at + chunk.len());
        log.truncate(at);
        log.push_first(pass.deltas(), chunk.len())?;
    }
    Ok(made)
}

/// Rounds a settling pass whose rows are not in the log gets (it starts from the base model).
pub const BASE_START_ROUNDS: usize = 2;

/// What a prefill pass leaves besides the prompt chunk's keys and values.
pub(crate) struct PrefillPass {
    /// Batched round trips made (0 group by group).
    pub round_trips: usize,
    /// The pass's logits when they are exact (group by group).
    pub logits: Option<Tensor>,
    /// The deltas the pass added ((T, d_out) per adapted projection).
    pub deltas: PassDeltas,
}

/// A prefill pass under `schedule` into `cache` (and `shadow`). Errors: forward pass and hook.
pub(crate) fn prefill_pass(
    model: &Model,
    tokens: &[u32],
    cache: &mut KvCache,
    hook: &mut dyn DeltaHook,
    schedule: &Schedule,
    mut shadow: Option<&mut KvCache>,
) -> Result<PrefillPass, SpecError> {
    let start = cache.len();
    match schedule {
        Schedule::PerGroup
        | Schedule::FixedPoint(FixedPoint {
            prefill: Prefill::PerGroup,
            ..
        }) => {
            let mut keeping = KeepDeltas::new(hook);
            let logits = model.forward(tokens, cache, &AttentionMask::Causal, &mut keeping)?;
            if let Some(sh) = shadow {
                sh.truncate(start);
                sh.sync_from(cache, start)?;
            }
            Ok(PrefillPass {
                round_trips: 0,
                logits: Some(logits),
                deltas: keeping.added,
            })
        }
        Schedule::FixedPoint(
            fp @ FixedPoint {
                prefill: Prefill::FixedPoint(n),
                ..
            },
        ) => {
            let trips = (*n).max(1);
            let mut pass = FixedPointPass::start_sending(
                model,
                tokens,
                cache,
                &AttentionMask::Causal,
                hook,
                PassDeltas::new(),
                fp.next_trip(fp.tolerance_of_trip(0, trips), true),
            )?;
            for i in 0..trips {
                if i + 1 == trips
                    && let Some(sh) = shadow.as_deref_mut()
                {
                    sh.truncate(start);
                    pass.replay(sh)?;
                }
                let next = fp.next_trip(fp.tolerance_of_trip(i + 1, trips), i + 1 < trips);
                pass.iterate_sending(cache, hook, fp.tolerance_of_trip(i, trips), next)?;
            }
            Ok(PrefillPass {
                round_trips: pass.round_trips(),
                logits: None,
                deltas: pass.deltas().clone(),
            })
        }
    }
}

/// 2ρ/(1−ρ), ρ the observed contraction clamped to [[`RHO_FLOOR`], 1/2] (1/2 without `previous`).
#[must_use]
pub fn error_factor(change: f32, previous: Option<f32>) -> f32 {
    let rho = match previous {
        Some(p) if p > 0.0 && p.is_finite() && change.is_finite() => {
            (change / p).clamp(RHO_FLOOR, 0.5)
        }
        _ => 0.5,
    };
    2.0 * rho / (1.0 - rho)
}

/// [`FixedPoint::draw_tolerance`] by default, 5·10⁻³ logits.
pub const DRAW_TOLERANCE: f32 = 5e-3;

/// Verify row `j`'s remaining-error bound: last change × [`error_factor`]; +∞ without a change.
#[must_use]
pub fn remaining_error(change: &[f32], previous: Option<&[f32]>, j: usize) -> f32 {
    let moved = change.get(j).copied().unwrap_or(f32::INFINITY);
    moved * error_factor(moved, previous.and_then(|p| p.get(j).copied()))
}

/// The smallest contraction per round trip the certification assumes.
pub const RHO_FLOOR: f32 = 0.2;

/// Greedy certification: the index of the first row whose top-1/top-2 margin is not above `margin`
/// × its error bound or whose argmax rejects `drafts[j]`, else one past the last real row.
#[must_use]
pub fn certify_greedy(
    rows: &[Vec<f32>],
    change: &[f32],
    previous: Option<&[f32]>,
    drafts: &[u32],
    margin: f32,
) -> usize {
    for (j, row) in rows.iter().enumerate() {
        let Some(arg) = certified_argmax(row, j, change, previous, margin) else {
            return j;
        };
        if drafts.get(j).is_none_or(|&d| d != arg) {
            return j + 1;
        }
    }
    rows.len()
}

/// Row `j`'s argmax if its margin is above `margin` × its remaining-error bound.
fn certified_argmax(
    row: &[f32],
    j: usize,
    change: &[f32],
    previous: Option<&[f32]>,
    margin: f32,
) -> Option<u32> {
    let (top, second, arg) = top_two(row);
    (top - second > margin * remaining_error(change, previous, j)).then_some(arg)
}

/// Greedy certification of a tree pass: how many rows along the greedy path are certified (0: not
/// even the root's); [`crate::tree::accept_tree_greedy`] then walks that path.
#[must_use]
pub fn certify_tree_greedy(
    rows: &[Vec<f32>],
    change: &[f32],
    previous: Option<&[f32]>,
    tree: &crate::tree::DraftTree,
    margin: f32,
) -> usize {
    let children = tree.children();
    let (mut row, mut certified) = (0, 0);
    while let Some(arg) = rows
        .get(row)
        .and_then(|r| certified_argmax(r, row, change, previous, margin))
    {
        certified += 1;
        match children
            .get(row)
            .and_then(|c| c.iter().find(|&&n| tree.tokens[n] == arg))
        {
            Some(&n) => row = n + 1,
            None => break,
        }
    }
    certified
}

/// Sampling certification: the leading rows (of `real`) whose error bound is at most `tolerance`.
#[must_use]
pub fn certify_sampled(
    change: &[f32],
    previous: Option<&[f32]>,
    real: usize,
    tolerance: f32,
) -> usize {
    (0..real.min(change.len()))
        .take_while(|&j| remaining_error(change, previous, j) <= tolerance)
        .count()
}

/// Largest value, second largest, and the index of the largest (first on ties).
fn top_two(row: &[f32]) -> (f32, f32, u32) {
    let (mut top, mut second, mut arg) = (f32::NEG_INFINITY, f32::NEG_INFINITY, 0u32);
    for (i, &v) in row.iter().enumerate() {
        if v > top {
            second = top;
            top = v;
            arg = i as u32;
        } else if v > second {
            second = v;
        }
    }
    (top, second, arg)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Carried rows replace the guess's head; everything else stays as guessed.
    #[test]
    fn carried_rows_replace_the_head_of_the_guess() {
        use cipherlora_model::{Proj, ProjGroup};
        let dev = candle_core::Device::Cpu;
        let t = |rows: &[[f32; 2]]| Tensor::from_vec(rows.concat(), (rows.len(), 2), &dev).unwrap();
        let group = |pairs: Vec<(Proj, Tensor)>| {
            let mut g = GroupDeltas::none();
            for (p, d) in pairs {
                g.push(p, d);
            }
            g
        };
        let guess_rows = [[9.0, 9.0]; 4];
        let mut guess = PassDeltas::new();
        guess.insert(
            (0, ProjGroup::Qkv),
            group(vec![(Proj::Q, t(&guess_rows)), (Proj::K, t(&guess_rows))]),
        );
        guess.insert((1, ProjGroup::Qkv), group(vec![(Proj::Q, t(&guess_rows))]));
        let mut carried = PassDeltas::new();
        carried.insert(
            (0, ProjGroup::Qkv),
            group(vec![(
                Proj::Q,
                t(&[[0.0, 0.0], [1.0, 1.0], [2.0, 2.0], [3.0, 3.0], [4.0, 4.0]]),
            )]),
        );
        let merged = with_carried_rows(guess, &carried, 3, 2).unwrap();
        let rows = |key: (usize, ProjGroup), p: Proj| {
            merged[&key].get(p).unwrap().to_vec2::<f32>().unwrap()
        };
        assert_eq!(
            rows((0, ProjGroup::Qkv), Proj::Q),
            vec![
                vec![3.0, 3.0],
                vec![4.0, 4.0],
                vec![9.0, 9.0],
                vec![9.0, 9.0]
            ]
        );
        assert_eq!(rows((0, ProjGroup::Qkv), Proj::K), vec![vec![9.0, 9.0]; 4]);
        assert_eq!(rows((1, ProjGroup::Qkv), Proj::Q), vec![vec![9.0, 9.0]; 4]);
    }

    #[test]
    fn greedy_certification_stops_at_an_uncertain_row_or_a_rejection() {
        let rows = vec![
            vec![0.0, 5.0, 1.0], // argmax 1, margin 4
            vec![3.0, 0.0, 2.9], // argmax 0, margin 0.1
            vec![0.0, 0.0, 9.0],
        ];
        // No previous trip: ρ = 1/2, so row 1 (moved 0.05) fails and only row 0 is usable.
        assert_eq!(
            certify_greedy(&rows, &[0.1, 0.05, 0.1], None, &[1, 0], 1.0),
            1
        );
        // Row 1 barely moved: certified; it accepts draft 0; row 2 gives the bonus.
        assert_eq!(
            certify_greedy(&rows, &[0.1, 0.01, 0.1], None, &[1, 0], 1.0),
            3
        );
        // A fast contraction (ρ clamped to 0.2) certifies row 1 at change 0.1 …
        let prev = [1.0, 1.0, 1.0];
        assert_eq!(
            certify_greedy(&rows, &[0.1, 0.1, 0.1], Some(&prev), &[1, 0], 1.0),
            3
        );
        // … a slow one (0.1 after 0.12) does not.
        let slow = [0.12, 0.12, 0.12];
        assert_eq!(
            certify_greedy(&rows, &[0.1, 0.1, 0.1], Some(&slow), &[1, 0], 1.0),
            1
        );
        // Row 0 rejects its draft (argmax 1 ≠ 2): row 0 alone decides.
        assert_eq!(
            certify_greedy(&rows, &[0.1, 5.0, 5.0], None, &[2, 0], 1.0),
            1
        );
        // Row 0 uncertain: nothing usable.
        assert_eq!(
            certify_greedy(&rows, &[3.0, 0.0, 0.0], None, &[1, 0], 1.0),
            0
        );
        // Exact ties are never certified.
        assert_eq!(certify_greedy(&[vec![1.0, 1.0]], &[0.0], None, &[], 1.0), 0);
    }

    #[test]
    fn schedules_parse_and_print() {
        for s in [
            "per-group",
            "fixed-point:1",
            "fixed-point:3",
            "fixed-point:2/prefill:per-group",
            "fixed-point:2/prefill:3",
            "fixed-point:3/exact-trips",
            "fixed-point:2/prefill:per-group/exact-trips",
            "fixed-point:3/batched",
            "fixed-point:3/exact-trips/batched",
            "fixed-point:3/no-ahead",
            "fixed-point:3/exact-trips/batched/no-ahead",
            "fixed-point:2/shadow",
            "fixed-point:2/prefill:per-group/shadow/exact-trips/no-ahead",
            "fixed-point:3/base-start",
            "fixed-point:2/shadow/base-start/batched",
            "fixed-point:2/shadow/drafted-start",
            "fixed-point:3/drafted-start/exact-trips/no-ahead",
            "fixed-point:2/shadow/drafter-estimates",
            "fixed-point:2/shadow/drafted-start/drafter-estimates/batched",
        ] {
            assert_eq!(s.parse::<Schedule>().unwrap().to_string(), s);
        }
        match "fixed-point:2/shadow".parse::<Schedule>().unwrap() {
            Schedule::FixedPoint(fp) => assert!(fp.shadow && fp.round_trips == 2),
            other => panic!("{other}"),
        }
        match "fixed-point/no-ahead".parse::<Schedule>().unwrap() {
            Schedule::FixedPoint(fp) => assert!(!fp.draft_ahead),
            other => panic!("{other}"),
        }
        match "fixed-point/prefill:per-group".parse::<Schedule>().unwrap() {
            Schedule::FixedPoint(fp) => {
                assert_eq!((fp.round_trips, fp.prefill), (3, Prefill::PerGroup));
            }
            other => panic!("{other}"),
        }
        assert!(matches!(
            "fixed-point".parse::<Schedule>().unwrap(),
            Schedule::FixedPoint(_)
        ));
        for bad in [
            "",
            "fixed-point:0",
            "fixed-point:x",
            "sequential",
            "per-group:2",
            "per-group/prefill:per-group",
            "fixed-point:2/prefill:0",
            "fixed-point:2/prefill:all",
            "per-group/exact-trips",
            "fixed-point/exact-trips/prefill:3",
            "per-group/batched",
            "fixed-point/batched/exact-trips",
            "per-group/no-ahead",
            "fixed-point/no-ahead/batched",
            "per-group/shadow",
            "fixed-point/exact-trips/shadow",
            "per-group/base-start",
            "fixed-point/base-start/shadow",
            "per-group/drafted-start",
            "fixed-point/drafted-start/base-start",
            "per-group/drafter-estimates",
            "fixed-point/drafter-estimates/drafted-start",
            "fixed-point/target-estimates",
        ] {
            assert!(bad.parse::<Schedule>().is_err(), "{bad}");
        }
    }

    /// Coarse trips: every trip of a batch but the last, never a continuation, none when off.
    #[test]
    fn only_the_trips_before_a_batch_s_last_are_coarse() {
        let fp = FixedPoint::default();
        let tol: Vec<_> = (0..3).map(|i| fp.trip_tolerance(i, 3, i == 2)).collect();
        assert_eq!(
            tol,
            [Some(FIRST_TRIP_TOLERANCE), Some(LATER_TRIP_TOLERANCE), None]
        );
        assert_eq!(fp.trip_tolerance(0, 1, true), None);
        assert_eq!(fp.trip_tolerance(3, 3, false), None);
        let exact = FixedPoint {
            coarse_trips: false,
            ..fp
        };
        assert_eq!(exact.trip_tolerance(0, 3, false), None);
    }

    /// Every sampled trip asks full precision, so sizes do not reveal continuations.
    #[test]
    fn sampled_generations_ask_every_trip_exactly() {
        let fp = FixedPoint::default();
        assert!(fp.coarse_trips);
        let sampled = Schedule::FixedPoint(fp).for_decoding(false);
        let Schedule::FixedPoint(s) = sampled else {
            panic!("still a fixed point");
        };
        assert!((0..8).all(|j| s.tolerance_of_trip(j, s.round_trips).is_none()));
        assert_eq!(
            s,
            FixedPoint {
                coarse_trips: false,
                ..fp
            }
        );
        let two: Schedule = "fixed-point:2/shadow/drafter-estimates".parse().unwrap();
        let Schedule::FixedPoint(t) = two.for_decoding(false) else {
            panic!("still a fixed point");
        };
        assert!(!t.shadow && !t.drafter_estimates && !t.coarse_trips);
        assert_eq!(t.round_trips, 2);
        assert_eq!(
            Schedule::FixedPoint(fp).for_decoding(true),
            Schedule::FixedPoint(fp)
        );
        assert_eq!(Schedule::PerGroup.for_decoding(false), Schedule::PerGroup);
    }

    #[test]
    fn a_continuation_asks_the_precision_a_round_asks() {
        let fp = FixedPoint::default();
        for batch in [1, 2, 3] {
            let round: Vec<_> = (0..batch).map(|j| fp.tolerance_of_trip(j, batch)).collect();
            for k in 1..4 {
                let continuation: Vec<_> = (k * batch..(k + 1) * batch)
                    .map(|j| fp.tolerance_of_trip(j, batch))
                    .collect();
                assert_eq!(continuation, round, "batch {batch}, continuation {k}");
            }
            assert_eq!(round[batch - 1], None, "a batch's last trip is exact");
        }
    }

    #[test]
    fn sampled_certification_takes_the_leading_settled_rows() {
        // No previous trip: bound = 2 × change.
        assert_eq!(certify_sampled(&[1e-5, 4e-4, 1e-2, 0.0], None, 4, 1e-3), 2);
        assert_eq!(certify_sampled(&[1e-5, 1e-5], None, 1, 1e-3), 1);
        // Fast contraction: bound = 0.5 × change.
        let prev = [1.0, 1.0];
        assert_eq!(certify_sampled(&[1.5e-3, 1.5e-3], Some(&prev), 2, 1e-3), 2);
        assert_eq!(certify_sampled(&[1.5e-3, 1.5e-3], None, 2, 1e-3), 0);
    }

    /// An unknown previous change (+∞) means ρ = 1/2, not the floor.
    #[test]
    fn an_unknown_previous_change_is_no_contraction() {
        assert_eq!(error_factor(0.1, Some(f32::INFINITY)), 2.0);
        assert_eq!(error_factor(0.1, None), 2.0);
        assert_eq!(error_factor(0.1, Some(10.0)), 0.5);
        let (change, previous) = with_inherited(&[0.1], Some(&[f32::INFINITY]), &[0.0]);
        assert_eq!(error_factor(change[0], Some(previous[0])), 2.0);
    }

    /// After a drafted start the previous change comes from the inputs' contraction; known ones
    /// stay.
    #[test]
    fn a_drafted_start_observes_the_contraction_of_its_inputs() {
        let step = |input_change: f32, logit_change: Vec<f32>| FixedPointStep {
            input_change,
            logit_change,
        };
        let inf = f32::INFINITY;
        let drafted = [step(0.4, vec![inf, inf]), step(0.1, vec![0.02, 0.0])];
        let prev = previous_changes(&drafted).unwrap();
        assert!((prev[0] - 0.08).abs() < 1e-6 && prev[1] == 0.0, "{prev:?}");
        // ρ = 0.25 for row 0: factor 2·0.25/0.75; row 1 did not move.
        assert!((error_factor(0.02, Some(prev[0])) - 2.0 / 3.0).abs() < 1e-6);
        // A slow contraction is clamped at 1/2.
        let slow = [step(0.1, vec![inf]), step(0.09, vec![0.02])];
        let prev = previous_changes(&slow).unwrap();
        assert_eq!(error_factor(0.02, Some(prev[0])), 2.0);
        // Inputs that did not move on the first trip: no evidence, ρ = 1/2.
        let still = [step(0.0, vec![inf]), step(0.01, vec![0.02])];
        let prev = previous_changes(&still).unwrap();
        assert_eq!(error_factor(0.02, Some(prev[0])), 2.0);
        // After pass 0, and after a continuation, the logits' own changes.
        let known = [step(0.4, vec![0.5]), step(0.1, vec![0.02])];
        assert_eq!(&previous_changes(&known).unwrap()[..], &[0.5]);
        let continued = [
            step(0.4, vec![inf]),
            step(0.1, vec![0.02]),
            step(0.01, vec![0.001]),
        ];
        assert_eq!(&previous_changes(&continued).unwrap()[..], &[0.02]);
        assert!(previous_changes(&drafted[..1]).is_none());
    }
}

//! One pass under a schedule: a verify pass (group by group, or fixed-point trips with their
//! certification inputs), the settling of cached rows after a stall, and a prefill pass.

use std::borrow::Cow;

use cipherlora_model::{
    AttentionMask, DeltaHook, FixedPointPass, FixedPointStep, GroupDeltas, GroupInput, KeepDeltas,
    KvCache, KvRows, Model, NextTrip, PassDeltas, Tensor,
};

use super::certify::{RHO_FLOOR, error_factor};
use super::{FixedPoint, Prefill, Schedule};
use crate::SpecError;
use crate::draft_bias::DraftBias;
use crate::row_deltas::RowDeltas;

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
    // After as many exact steps as groups every input is exact: this bounds continuations. The
    // first round's steps may be coarse or on the drafter; a continuation's step is exact.
    let groups = pass.inputs().len().max(1);
    let tol = |j: usize| {
        if j < groups {
            fp.tolerance_of_trip(j, trips)
        } else {
            None
        }
    };
    let given = usize::from(pass.logits().is_none());
    let exact_after = groups + trips + given + usize::from(fp.drafter_estimates);
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
            if continuations > 0 && tol(j).is_some() {
                // Its inputs are near the fixed point: a coarse answer would only add its error.
                pass.repeat_trip(hook, tol(j))?;
            } else {
                pass.run_on(runs_on(j))?;
                pass.iterate_sending(cache, hook, tol(j), fp.next_trip(tol(j + 1), true))?;
            }
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
        let mut usable = if steps.len() >= exact_after {
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
        // Rows blocked only by the inherited residual, which more trips of this pass do not lower.
        let own_only = if usable == 0 && continuations > 0 && inherited.is_some() {
            certify(logits, own, previous)?.min(real)
        } else {
            0
        };
        let stalled = own_only > 0 && may_stall;
        if own_only > 0 && !may_stall {
            // The cached rows were settled already: the own bound decides, as it would once every
            // input is exact.
            usable = own_only;
        }
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
    /// The residual stream after the last layer, (T, hidden), when the pass is exact (group by
    /// group): [`Model::head`] of its last prompt row gives the first token.
    pub hidden: Option<Tensor>,
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
            let (hidden, deltas) = model.forward_wavefront(tokens, cache, hook)?;
            if let Some(sh) = shadow {
                sh.truncate(start);
                sh.sync_from(cache, start)?;
            }
            Ok(PrefillPass {
                round_trips: 0,
                hidden: Some(hidden),
                deltas,
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
                hidden: None,
                deltas: pass.deltas().clone(),
            })
        }
    }
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

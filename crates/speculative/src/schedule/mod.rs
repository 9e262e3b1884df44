//! Verify-pass schedules: one round trip per layer group, or a fixed point over layers in a
//! constant number of batched trips with certified rows. This file holds the settings and their
//! text form; `pass` runs a verify, settling or prefill pass under them, `certify` decides which
//! rows of a pass are final. Rationale: docs/design/code-notes.md, "spec: schedule".

mod certify;
mod pass;

pub use certify::{
    DRAW_TOLERANCE, RHO_FLOOR, certify_greedy, certify_sampled, certify_tree_greedy, error_factor,
    remaining_error,
};
pub use pass::BASE_START_ROUNDS;
pub(crate) use pass::{Verified, Window, prefill_pass, settle, verify};

use cipherlora_model::NextTrip;

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
    /// Whether prefill passes run group by group ([`Schedule::PerGroup`], or a fixed point with
    /// [`Prefill::PerGroup`]): their rows are exact, so the last one gives the first token.
    pub fn prefills_per_group(&self) -> bool {
        matches!(
            self,
            Schedule::PerGroup
                | Schedule::FixedPoint(FixedPoint {
                    prefill: Prefill::PerGroup,
                    ..
                })
        )
    }

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

#[cfg(test)]
mod tests {
    use super::*;

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
}

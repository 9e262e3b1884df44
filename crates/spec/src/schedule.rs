//! How a verify pass gets its adapter deltas: one round trip per layer
//! group, or a fixed point over layers in a constant number of batched
//! round trips, with the rows it can vouch for.
//!
//! # Exactness of the fixed-point schedule
//!
//! [`cipherlora_model::FixedPointPass`] converges to the sequentially
//! computed pass; after a finite number of round trips its logits differ
//! from the exact ones by a residual that shrinks by a large factor per trip
//! (BENCHMARKS.md, "Fewer round trips": the convergence table). A row's
//! greedy token is *certified* when its top-1/top-2 logit margin exceeds
//! `margin` × a bound on its logits' remaining error. With a contraction
//! factor ρ per trip, that error is at most change·ρ/(1−ρ), where change is
//! the largest move of any of its logits over the last round trip; the
//! argmax cannot flip while every logit is off by less than half the
//! margin. The bound uses the row's own observed contraction (last change
//! over the one before), clamped to [0.2, 1/2] ([`error_factor`]), and 1/2
//! after a single trip. Measured on the committed
//! adapters, on random all-linear ones and on q,k,v,o adapters at 4× the
//! trained strength (BENCHMARKS.md, convergence table): ρ ≈ 0.1 per trip
//! (median), 0.2 in the worst window, and no certified row was ever wrong.
//! The encrypted deltas carry CKKS noise either way; the sequential
//! protocol has the same noise, and greedy equality with the plaintext
//! reference rests on the same margins. Sampling needs the whole
//! distribution, so a row is certified there only when the same bound on
//! its logits' remaining error is at most `sampling_tolerance` (1e-4 by
//! default: every probability within a relative 2·10⁻⁴ of the exact
//! pass's); that takes about two more trips than greedy, spent as
//! continuation rounds.
//!
//! The keys and values a round keeps come from its last pass, whose inputs
//! are off by the residual of the fixed point (relative 1e-2 after two trips,
//! 1e-3 after three; 3e-6, the float32 floor, after six). Later rounds read
//! them, so their logits carry that residual too; the margin rule of each
//! later round measures only its own iteration, not the inherited residual.
//! Measured in plaintext, two trips per round changed the greedy output of
//! 7 of 80 generations of 64 tokens at a later near-tie, three (the
//! default) changed none (BENCHMARKS.md, "How often the fixed point changes
//! the greedy output"): the schedule is exact only as far as measured. This is why prefill passes make five trips (or run group by
//! group, [`Prefill::PerGroup`]) and why the end-to-end tests compare every
//! private output with the plaintext reference token for token.
//!
//! Only certified rows are used: the round accepts greedily along them
//! (drafts before the first uncertified row, and the bonus token only if its
//! row is certified). When even row 0 is uncertified, the round is
//! *continued*: the same pass gets `round_trips` more round trips. The
//! server sees every round as exactly `round_trips` round trips of the same
//! width, asking the same precision trip by trip (a continuation's trips
//! repeat a round's pattern of coarse and exact trips; streamed or batched:
//! [`FixedPoint::streamed`] changes when each request leaves, which follows
//! the client's compute, not which or how many), so a continuation looks
//! like a round that accepted few tokens: it reveals nothing beyond the
//! rounds-per-token count that speculative decoding already reveals (threat
//! model, guarantee 5; README).
//!
//! # The inherited residual
//!
//! With [`FixedPoint::shadow`] the certification also bounds the residual
//! the cached rows carry. The decoder keeps a second cache, the *shadow*,
//! whose rows are each round's pass before its last (one trip less
//! converged, everywhere, the prompt's rows included). Each round replays
//! the pass before its last trip against the shadow
//! ([`FixedPointPass::replay`], while that trip is on the network); the
//! replay and the pass itself add the same deltas, so their logits differ
//! only by what the two caches differ by. A row's bound adds
//! [`INHERITED_FACTOR`] × that distance (the shadow's error is ≈ 1/ρ times
//! the cache's). Measured in plaintext (BENCHMARKS.md, "Two trips per
//! round"), the term separates exactly: on the general-English prompt whose
//! output two trips changed at token 34 (a near-tie 0.005 logits wide, its
//! inherited bound 0.13), it blocked that row and none of the four other
//! near-ties of the generation. A row blocked only by the inherited term
//! cannot be helped by more trips of its own pass: the pass returns
//! [`Verified::stalled`], the decoder *settles* the rows kept since the
//! last settling ([`settle`]: one round per pass of the verify width,
//! started from the deltas each row was last computed with, so a round's
//! trips more converged) and verifies the same draft again; if that round
//! stalls too, the prompt's rows are settled as well. The server sees
//! rounds of the verify width and trip count throughout.
//!
//! # A drafted start
//!
//! Pass 0 only estimates the inputs of the first trip, and the base
//! drafter has just computed the same quantities for the same positions
//! while it drafted them (its LoRA inputs at every adapted group, with its
//! own weights and guide). With [`FixedPoint::drafted_start`] those are
//! the first trip's inputs (`crate::drafted_inputs`,
//! [`FixedPointPass::start_from_inputs`]): the first trip leaves when the
//! round starts, and the client saves a plaintext pass of the verify width
//! per round for one more single-position drafter step. The start is a
//! guess like pass 0's, and the fixed point does not depend on it (one
//! trip more to be exact by construction: the first group's input is a
//! guess too). Without pass 0 the first trip's logit change is unknown;
//! the rows' contraction after the second trip is then the pass's observed
//! contraction of its inputs (`previous_changes`), clamped to
//! [[`RHO_FLOOR`], 1/2] as every observed ρ is. The server sees the same
//! trips, groups and widths.
//!
//! # A carried start
//!
//! A greedy chain round that stops at an uncertified row (a near-tie its
//! trips could not settle) leaves its later rows verified to within the
//! round's residual but unused, and the next round starts at that row. When
//! the next draft repeats those rows' tokens (the drafter is deterministic
//! and sees the same prefix), their deltas from the round's last pass
//! replace the estimate's guess in pass 0 ([`Window::carried`]), so they
//! start the new round as converged as the old one left them, and the
//! near-tie now at row 0 is certified after the new round's trips instead
//! of stopping it again (a continuation). Only pass 0's guess changes, so
//! the server sees the same trips, and the fixed point, which does not
//! depend on its start, the same result. Measured in plaintext
//! (`code-lora-r16`, T = 12, two shadowed trips, 6 prompts × 64 tokens):
//! continuations 6 → 3, tokens per round 6.51 → 6.86, batched trips per
//! token 0.31 → 0.29; at T = 8 it changed nothing (5.26 tokens per
//! round either way; BENCHMARKS.md, "A carried start").

use std::borrow::Cow;

use cipherlora_model::{
    AttentionMask, DeltaHook, FixedPointPass, FixedPointStep, GroupDeltas, GroupInput, KeepDeltas,
    KvCache, KvRows, Model, NextTrip, PassDeltas, Tensor,
};

use crate::SpecError;
use crate::draft_bias::DraftBias;
use crate::row_deltas::RowDeltas;

/// Batched round trips per prefill pass by default (see
/// [`FixedPoint::prefill`]).
pub const PREFILL_ROUND_TRIPS: usize = 5;

/// How a prefill pass gets its deltas under the fixed-point schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefill {
    /// One round trip per adapted layer group, in forward order: exact
    /// keys and values, G round trips per pass (G = 60 for q,k,v,o on the
    /// default model), the pass's bytes once.
    PerGroup,
    /// This many batched round trips of the fixed point (≥ 1), each
    /// carrying the whole pass's bytes.
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
    /// Batched round trips per verify round (the server always sees this
    /// many per round).
    pub round_trips: usize,
    /// A greedy row is certified when top-1 − top-2 > `margin` × its last
    /// logit change.
    pub margin: f32,
    /// A sampled row is certified when the bound on its logits' remaining
    /// error ([`error_factor`] × last change) is at most this (absolute, in
    /// logits).
    pub sampling_tolerance: f32,
    /// A sampled chain round whose sampler the draw bounds cover
    /// ([`crate::draw_bounds::log_weight_bound`]) uses the leading rows
    /// whose logit bound is at most this × min(1, temperature) (absolute,
    /// in logits), and certifies their *draws* instead of their
    /// distributions ([`crate::draw_bounds`]); the round then settles its
    /// kept rows ([`FixedPoint::for_certified_draws`]).
    pub draw_tolerance: f32,
    /// How prefill passes get their deltas. With [`Prefill::FixedPoint`]
    /// there are no logits to certify: the prompt's keys and values are
    /// kept as the last pass computed them, and no later certification
    /// sees their residual error, which every later row inherits. Three
    /// trips were once too few: on a general-English prompt of ~90 tokens
    /// the residual flipped a near-tie 0.003 logits wide 26 tokens later
    /// (K = 16, plaintext and HE alike; found by `bench e2e`); four were
    /// enough, five are the default (BENCHMARKS.md, "A hole in the fixed
    /// point's exactness"). [`Prefill::PerGroup`] leaves no residual at
    /// all, and on a link of moderate latency costs less than five trips
    /// of a wide pass (`cipherlora_private::schedule_plan` models both).
    pub prefill: Prefill,
    /// Greedy decoding with the base drafter: while the last round trip is
    /// on the network, draft the next round from the outcome the pass
    /// before it predicts — the next chain, or for tree drafts the next tree
    /// grown after the predicted path and bonus token (used when the round
    /// ends that way; the output is unchanged either way).
    pub draft_ahead: bool,
    /// Ask for coarse deltas on every trip of a pass but its last
    /// ([`FixedPoint::trip_tolerance`]): fewer bytes per trip, the same
    /// result to within the residual the fixed point leaves anyway.
    pub coarse_trips: bool,
    /// Stream the trips of a round as a wavefront over layers
    /// ([`cipherlora_model::DeltaStream`]): each group's request of the next
    /// trip leaves as soon as the running pass has its input, so the trips'
    /// transfers, the server's compute and the client's passes overlap. The
    /// deltas are the same as with one batch per trip; only the waiting
    /// differs. Used when the hook streams ([`DeltaHook::stream`]).
    pub streamed: bool,
    /// Round trips made after a round's tokens are decided, which refine
    /// only the keys and values the round keeps: 1 for sampled chains
    /// whose draws are certified ([`FixedPoint::for_certified_draws`]), 0
    /// (the default) for every other schedule. As a diagnostic, with
    /// `round_trips = 2` and a few of these, a run isolates the residual
    /// the kept rows carry from the certification of the decided rows
    /// (`cipherlora-spec --example exactness -- --settle N`).
    pub settle_trips: usize,
    /// Certify against the residual the cached rows carry, not only the
    /// round's own (module docs, "The inherited residual"): a second cache
    /// one trip less converged, one plaintext replay per round (run while
    /// the last trip is on the network), and settling the cached rows when
    /// a round stalls on their residual. Costs the memory of a second
    /// cache and of the deltas each cached row was computed with (where a
    /// settling starts; ≈ 92 kB per row for the default model's q,k,v,o
    /// adapter, `crate::row_deltas`); what two trips per round need to
    /// be exact.
    pub shadow: bool,
    /// Pass 0 of a verify round adds a guess of the deltas instead of none:
    /// the mean of the deltas of the last (up to four) rows the previous
    /// round kept, at every position ([`DraftBias::from_rows`]). Trip 1's
    /// inputs then start nearer the fixed point (the residual after two
    /// trips falls 1.2–2.9×, BENCHMARKS.md "Two trips per round"), so more
    /// rows are certified after the same trips; the fixed point itself,
    /// and what the server sees (the same trips, encrypted), do not change.
    pub guessed_start: bool,
    /// Pass 0 of a chain round is the drafter's: the first trip sends the
    /// LoRA inputs the base drafter computed while it drafted the window
    /// (its last draft fed once more for the last position), and no
    /// plaintext pass runs before it. The client saves one pass of the
    /// verify width per round for one single-position drafter step; the
    /// start is off by the drafter's weights (quantized or f16) and its own
    /// guide, a guess as pass 0's is, and the fixed point does not depend
    /// on it. What the server sees is unchanged (the same trips, groups and
    /// widths). The first trip's logit change is then unknown: after the
    /// round's second trip a row's contraction is the pass's observed
    /// contraction of its inputs (module docs, "A drafted start"), from
    /// the third trip on its own logits' as always. Used only with at
    /// least two trips per round, greedy or sampled chains from the base
    /// drafter whose draft fills the window; other rounds run pass 0.
    /// Measured, it does not pay when the server is the slower side of a
    /// trip (BENCHMARKS.md, "The drafter's share of a round").
    pub drafted_start: bool,
    /// The passes of a round that only estimate the next trip's inputs
    /// (pass 0 and every pass before a batch's last) run on the drafter's
    /// model instead of the target's, when the drafter holds quantized
    /// weights: the same function up to the 16-bit rounding of its
    /// activations, 2.2× faster than an f32 pass at 9 positions
    /// (BENCHMARKS.md, "Plaintext model"). (The decoder keeps the target
    /// for them when the drafter is f16 or f32, which is no faster there.)
    /// The batch's last pass, whose logits are certified and whose keys and
    /// values are kept, runs on the target, as does every pass of a
    /// continuation, so the fixed point is the target's. The last trip's
    /// inputs then carry the estimate pass's rounding (relative ≈ 3·10⁻⁵
    /// of a block's largest activation, below the later trips'
    /// tolerance), and the round's last logit change, which the
    /// certification reads, spans the two models: it carries their
    /// difference (≈ 4·10⁻³ logits on the default model), which no trip
    /// shrinks. Rows nearer a tie than that continue, on the target only
    /// (continuing on the drafter too tripled the all-linear adapter's
    /// continuations on prose: the difference blocked them round after
    /// round). Measured in plaintext on code and prose, the rounds were
    /// then those of target-only passes (BENCHMARKS.md, "The drafter's
    /// share of a round"); it is off in [`FixedPoint::default`] because
    /// only the client's time falls, which pays where the client bounds
    /// the round (two shadowed trips at wan20, which a client runs by
    /// default for a high acceptance prior:
    /// `cipherlora_private::width_plan::default_fixed_point`), not under
    /// three trips. The shadow's replay runs on the model of the pass it
    /// replays.
    pub drafter_estimates: bool,
}

/// Relative tolerance of the deltas of a pass's first trip when
/// [`FixedPoint::coarse_trips`] is on: 2^-11 of the largest delta a group
/// can return. The first trip's inputs are the base model's activations,
/// off by 5e-2 to 4e-1 relative (BENCHMARKS.md, convergence table: input
/// error after trip 1), so its deltas are that far from the exact ones
/// whatever their precision; 2^-11 ≈ 5e-4 adds under 1 % to that.
pub const FIRST_TRIP_TOLERANCE: f64 = 1.0 / 2048.0;

/// Relative tolerance of the deltas of the later trips before a pass's
/// last (2^-15 ≈ 3e-5): their inputs are still off by 1e-3 to 3e-2.
/// Coarser settings were tried: 8 bits on the first trip and 12 on the
/// second changed one of 30 outputs (general-lora-r16, token 26) with
/// deltas perturbed by 16 × the tolerance, where 12 and 16 bits changed
/// none (BENCHMARKS.md, "Streamed trips").
pub const LATER_TRIP_TOLERANCE: f64 = 1.0 / 32768.0;

impl Default for FixedPoint {
    /// Three round trips per round, margin 1, five batched trips per
    /// prefill pass. Two trips certify the first rows' greedy tokens
    /// (the measured convergence) but leave keys and values ≈ 1e-2 off,
    /// which changed about one 64-token generation in eleven at a later
    /// near-tie; three left none in the same 80 runs (BENCHMARKS.md, "How
    /// often the fixed point changes the greedy output").
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
    /// This fixed point as a sampled generation runs it. A sampled row is
    /// certified only when its logits' remaining error is at most
    /// [`FixedPoint::sampling_tolerance`] (10⁻⁴ logits), so a sampled
    /// generation's fixed point leaves out what only a greedy margin
    /// tolerates:
    /// - coarse trips ([`FixedPoint::coarse_trips`]): a coarse trip's
    ///   deltas are off by 2⁻¹¹ or 2⁻¹⁵ of a group's largest delta,
    ///   10⁻³–10⁻² logits once through the model, so the last logit change
    ///   of every batch measured that rounding, not the fixed point's
    ///   residual, and no row was certified until the pass ran out of
    ///   coarse trips (one per group): 9.7 batched trips per token against
    ///   1.1 with exact trips (`code-lora-r16`, T = 12, two trips per
    ///   round; BENCHMARKS.md, "Sampling under the fixed point");
    /// - the shadow ([`FixedPoint::shadow`]): its rows are a round's pass
    ///   before its first batch's last trip, 10⁻²-converged, while a
    ///   sampled round keeps rows converged to the tolerance after its
    ///   continuations; the inherited term then blocked every later row
    ///   until a settling (166 trips for 16 tokens in
    ///   `tests/real_model_sampled_trips.rs`). Without it the kept rows'
    ///   residual is what their own certification bounds, the tolerance;
    /// - the drafter's estimate passes ([`FixedPoint::drafter_estimates`]):
    ///   the two models differ by ≈ 4·10⁻³ logits, which no trip shrinks,
    ///   so a batch's last change never reached the tolerance.
    ///
    /// The request sizes then tell the server that the client samples (a
    /// setting, not the text).
    #[must_use]
    pub fn for_sampling(self) -> Self {
        Self {
            coarse_trips: false,
            shadow: false,
            drafter_estimates: false,
            ..self
        }
    }

    /// This (sampled) fixed point for chain rounds whose draws are
    /// certified ([`crate::draw_bounds`]): one exact trip after each
    /// round's decision ([`FixedPoint::settle_trips`]). Those rows are
    /// decided while their logits may still be
    /// [`FixedPoint::draw_tolerance`] off; the keys and values they leave
    /// in the cache are every later row's, and no later certification
    /// bounds them (no shadow under sampling). One trip takes them from
    /// 10⁻³–5·10⁻³ to 3–5·10⁻⁴ logits (`code-lora-r16`, T = 12): below
    /// what three greedy trips keep, a little above the 10⁻⁴ of rows
    /// certified whole, which is also the floor the changes stop at.
    #[must_use]
    pub fn for_certified_draws(self) -> Self {
        Self {
            settle_trips: self.settle_trips.max(1),
            ..self
        }
    }

    /// The tolerance of trip `j` (0-based, continuations included) of a
    /// pass whose rounds make `batch` trips: [`FixedPoint::trip_tolerance`]
    /// of its index within its batch, the batch's last trip exact. A
    /// continuation's batch asks what a round's does, so the requested
    /// precision does not tell the server which rounds are continuations.
    #[must_use]
    pub fn tolerance_of_trip(&self, j: usize, batch: usize) -> Option<f64> {
        let batch = batch.max(1);
        self.trip_tolerance(j % batch, batch, (j + 1).is_multiple_of(batch))
    }

    /// What a pass sends while it runs: the next trip, within `tolerance`,
    /// when streaming and `send` holds, else nothing (the trip then goes
    /// out as one batch when the next pass starts).
    fn next_trip(&self, tolerance: Option<f64>, send: bool) -> NextTrip {
        if self.streamed && send {
            NextTrip::Send(tolerance)
        } else {
            NextTrip::Wait
        }
    }

    /// The tolerance to ask of the trip after `done` trips of a pass
    /// (`None`: exact): with [`FixedPoint::coarse_trips`], the first trip
    /// gets [`FIRST_TRIP_TOLERANCE`], later ones [`LATER_TRIP_TOLERANCE`],
    /// and the `last` trip of a batch of `batch` trips — the one whose
    /// deltas the kept keys and values and the certified logits come from —
    /// full precision (as is any `done ≥ batch`). The tolerances depend only
    /// on the trip's index within its batch, so the response sizes tell the
    /// server nothing beyond the trip count.
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
    /// One round trip per adapted layer group, in forward order (each
    /// group's input is exact when it is sent).
    #[default]
    PerGroup,
    /// All groups in each batched round trip, iterated to a fixed point.
    FixedPoint(FixedPoint),
}

impl Schedule {
    /// The schedule a generation runs with, given whether it decodes
    /// greedily: a sampled generation's fixed point is
    /// [`FixedPoint::for_sampling`]; greedy generations are unchanged.
    #[must_use]
    pub fn for_decoding(self, greedy: bool) -> Self {
        match self {
            Schedule::FixedPoint(fp) if !greedy => Schedule::FixedPoint(fp.for_sampling()),
            other => other,
        }
    }
}

impl std::fmt::Display for Schedule {
    /// `per-group` or `fixed-point:N` (N round trips per round), followed
    /// by `/prefill:per-group` when prefill passes go group by group (or
    /// `/prefill:M` for M trips other than the default), `/shadow` when
    /// rounds certify against a shadow cache ([`FixedPoint::shadow`]),
    /// `/base-start` when pass 0 runs the base model
    /// ([`FixedPoint::guessed_start`] off), `/drafted-start` when the
    /// drafter's inputs replace pass 0 ([`FixedPoint::drafted_start`]),
    /// `/drafter-estimates` when a round's estimate passes run on the
    /// drafter's weights ([`FixedPoint::drafter_estimates`]),
    /// `/exact-trips` when every trip asks for full precision, `/batched`
    /// when trips are not streamed and `/no-ahead` when nothing is drafted
    /// during a round's last trip.
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

    /// `per-group`, `fixed-point` (the default round trips) or
    /// `fixed-point:N` (N ≥ 1 round trips per round, prefill max(N, 5)),
    /// optionally followed by `/prefill:per-group` or `/prefill:M` (M ≥ 1
    /// batched trips per prefill pass), `/shadow` ([`FixedPoint::shadow`]),
    /// `/base-start` (pass 0 without a guess), `/drafted-start`
    /// ([`FixedPoint::drafted_start`]), `/drafter-estimates`
    /// ([`FixedPoint::drafter_estimates`]),
    /// `/exact-trips` (no coarse trips),
    /// `/batched` (one batch per trip instead of streamed trips) and
    /// `/no-ahead` (no drafting during a round's last trip), in that order.
    /// Parses what `Display` writes.
    fn from_str(s: &str) -> Result<Self, SpecError> {
        let bad = || {
            SpecError::Config(format!(
                "unknown schedule {s:?} (per-group, fixed-point, fixed-point:N, \
                 each fixed point optionally /prefill:per-group or /prefill:M, \
                 /shadow, /base-start, /drafted-start, /drafter-estimates, /exact-trips, /batched \
                 and /no-ahead)"
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
    /// The deltas the pass added, (T, d_out) per adapted projection: the
    /// drafter's guess for the next round ([`crate::draft_bias`]).
    pub deltas: PassDeltas,
    /// Leading rows the round may use (≥ 1).
    pub usable: usize,
    /// Batched round trips made (0 on the per-group schedule).
    pub round_trips: usize,
    /// Extra rounds spent on this pass because no row was certified yet.
    pub continuations: usize,
    /// No row is usable because of the residual the cached rows carry
    /// ([`FixedPoint::shadow`]); the caller settles them ([`settle`]) and
    /// verifies the window again.
    pub stalled: bool,
    /// The first trip sent the drafter's inputs
    /// ([`FixedPoint::drafted_start`]).
    pub drafted_start: bool,
}

/// Work to run on another thread while the last round trip of a
/// fixed-point pass is on the network: it gets the logits of the pass
/// before the last trip (its argmax is nearly always final, BENCHMARKS.md),
/// the deltas that pass added and the keys and values it computed (the
/// window's T rows, adapted up to the residual of one trip less), and
/// returns what the next round may use, e.g. a draft grown from the
/// predicted outcome over those rows.
pub(crate) type Ahead<'a, G> =
    &'a mut (dyn FnMut(&Tensor, &PassDeltas, &KvRows) -> Result<G, SpecError> + Send);

/// `certify(logits, last_change, previous_change)`: how many leading rows
/// are certified.
pub(crate) type Certify<'a> =
    &'a dyn Fn(&Tensor, &[f32], Option<&[f32]>) -> Result<usize, SpecError>;

/// One verify pass to run: `tokens` (T, the first `real` of them not
/// padding) under `schedule`.
#[derive(Clone, Copy)]
pub(crate) struct Window<'a> {
    pub model: &'a Model,
    pub tokens: &'a [u32],
    /// Causal for a chain, a tree mask for a draft tree.
    pub mask: &'a AttentionMask,
    pub real: usize,
    pub schedule: &'a Schedule,
    pub certify: Certify<'a>,
    /// The fixed point's first estimate ([`FixedPoint::guessed_start`]):
    /// the deltas pass 0 adds at every position (empty: the base model).
    pub estimate: &'a DraftBias,
    /// Whether a pass blocked only by the inherited residual returns
    /// [`Verified::stalled`] instead of continuing (false once the caller
    /// has settled the cached rows for this round).
    pub may_stall: bool,
    /// The first estimate as the drafter computed it
    /// ([`FixedPoint::drafted_start`]): every adapted group's input for the
    /// window, (T, d_in) each, in forward order. Used instead of pass 0 when
    /// the schedule asks for it and makes at least two trips per round.
    pub drafted: Option<&'a [GroupInput]>,
    /// The model of the passes that only estimate the next trip's inputs
    /// when [`FixedPoint::drafter_estimates`] is on (the drafter's: same
    /// architecture, cheaper weights).
    pub estimator: &'a Model,
    /// Rows the round before verified but could not use, carried into
    /// this window's first rows: `(deltas, from, count)`, the deltas that
    /// round's last pass added, whose rows `from..from + count` hold this
    /// window's rows `0..count` (same tokens after the same prefix). They
    /// replace the estimate's guess there, so those rows start a round's
    /// trips more converged (module docs, "A carried start").
    pub carried: Option<(&'a PassDeltas, usize, usize)>,
}

/// Runs one verify pass of `window.tokens` under `window.schedule`. `certify(logits,
/// last_change, previous_change)` returns how many leading rows are
/// certified (0: none); it is not called on the per-group schedule, whose
/// rows are all exact. `ahead`, on the fixed-point schedule, runs on a
/// second thread during the round's last round trip (not during
/// continuations); its result comes back with the pass.
///
/// `shadow`, with [`FixedPoint::shadow`], is the shadow cache (as many
/// positions as `cache`; module docs, "The inherited residual"): the pass
/// before the round's last trip is replayed against it, which appends the
/// window's rows to it one trip less converged, and a row's error bound
/// adds [`INHERITED_FACTOR`] × its distance to that replay. A continuation
/// replays its latest pass instead. When a continuation's row 0 would be
/// certified but for that inherited term and `window.may_stall` holds, the
/// pass returns [`Verified::stalled`] (no usable rows): more trips of this
/// pass cannot help, the cached rows need settling ([`settle`]). A round
/// whose own trips end that way continues once first: stalling at once
/// settled 1.5× as often on prose (BENCHMARKS.md, "Settling from the rows'
/// own deltas"), the continuation's replay of its own latest pass often
/// clearing the row.
///
/// # Errors
/// Those of the forward pass, the hook and `ahead`.
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
    // After as many exact trips as groups every input is exact (module docs
    // of `FixedPointPass`): the bound that ends any run of continuations.
    // Trips follow the round's precision pattern for the first `groups`
    // trips, exact after that.
    let groups = pass.inputs().len().max(1);
    let tol = |j: usize| {
        if j < groups {
            fp.tolerance_of_trip(j, trips)
        } else {
            None
        }
    };
    // (From given inputs one trip more: the first group's input is then an
    // estimate too.)
    let given = usize::from(pass.logits().is_none());
    // With drafter estimates the target's first trip takes inputs the
    // drafter's pass computed: one more.
    let exact_after = if fp.coarse_trips || fp.drafter_estimates {
        2 * groups
    } else {
        groups
    } + given
        + usize::from(fp.drafter_estimates);
    // The model of the pass after trip j: with drafter estimates, the
    // drafter's for the passes of the round's own batch but its last;
    // a continuation runs on the target throughout (its changes then
    // compare target passes: the two models' difference does not shrink
    // with more trips, so certifying against it could not end).
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
        // Each pass takes trip j (sent ahead by the pass before it when
        // streaming, else now as one batch) and sends trip j + 1 but the
        // batch's last, which sends nothing.
        for _ in 0..trips - 1 {
            let j = pass.round_trips();
            pass.run_on(runs_on(j))?;
            pass.iterate_sending(cache, hook, tol(j), fp.next_trip(tol(j + 1), true))?;
        }
        let tolerance = tol(pass.round_trips());
        // The shadow replay runs while the last trip is on the network: the
        // pass before it, against the shadow; its distance to that pass's
        // own logits is the inherited residual's (the deltas are the same).
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
                    let g = helper
                        .join()
                        .map_err(|_| SpecError::Config("the draft-ahead thread panicked".into()));
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
            // A continuation: the latest pass itself against the shadow
            // (more trips of this pass do not shrink the inherited residual).
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

/// Per row, the logit change of the trip before the last of `steps`
/// (`None` after a single trip): what [`error_factor`] divides the last
/// change by to observe the row's contraction. After a drafted start
/// ([`FixedPoint::drafted_start`]) the first trip's logit change is
/// unknown (+∞); its stand-in is the last change divided by the pass's
/// observed contraction of its inputs (the second trip's
/// [`cipherlora_model::FixedPointStep::input_change`] over the first's),
/// so the row's ρ is that contraction, clamped as any ρ is. The inputs of
/// the start are known, the drafter's, and near the fixed point the logits'
/// error is a linear image of the inputs' (module docs of
/// `cipherlora_model::fixed_point`): both contract at the same rate. Rows
/// stay at ρ = 1/2 when the inputs did not move on the first trip.
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

/// The logits of `pass`'s latest plaintext pass (every pass
/// [`verify`] reads has run one).
fn latest<'p>(pass: &'p FixedPointPass<'_>) -> Result<&'p Tensor, SpecError> {
    pass.logits()
        .ok_or_else(|| SpecError::Config("a fixed-point pass read before its first pass".into()))
}

/// A (change, previous) pair whose certification bound ([`error_factor`]
/// × change) is the row's own, `f(own, previous) × own`, plus
/// [`INHERITED_FACTOR`] × `inherited`: the change grows by the inherited
/// term and the previous change with it, so the row's observed
/// contraction, and hence its factor, stay as they were.
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

/// `guess` ((T, d_out) per projection) with its rows `0..count` replaced by
/// rows `from..from + count` of `rows` where `rows` has the projection
/// (module docs, "A carried start").
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

/// The inherited residual's share of a row's error bound: its distance to
/// the shadow times 2ρ/(1−ρ) at ρ = [`RHO_FLOOR`] (the shadow's rows are
/// one trip less converged).
const INHERITED_FACTOR: f32 = 2.0 * RHO_FLOOR / (1.0 - RHO_FLOOR);

/// Settles cached rows after a [`Verified::stalled`] pass: reruns the rows
/// at `from..from + tokens.len()` (their `tokens`; `cache` and `shadow`
/// hold at least those positions) in passes of `width` positions, padded
/// like a verify window, so the server sees ordinary rounds of the verify
/// width (a round's trips, with a round's precision pattern).
///
/// Each pass starts from the deltas its rows were last computed with
/// (`log`, [`crate::row_deltas`]): its first pass reproduces the cached
/// rows and one round of trips leaves them that round's trips more
/// converged. Rows the log lacks start from the base model and get
/// [`BASE_START_ROUNDS`] rounds. The rows' shadow rows become the pass
/// before the last, and their log entries the new deltas. Returns the
/// round trips made; both caches and the log end at `from + tokens.len()`.
///
/// # Errors
/// Those of the forward pass and the hook.
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

/// Rounds a settling pass whose rows are not in the log gets: it starts
/// from the base model, as a verify pass's fixed point does, and two
/// rounds leave it a round's trips more converged than the verify pass
/// left the row it replaces.
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

/// A prefill pass under `schedule`: the prompt chunk's keys and values go
/// to `cache`, and with a `shadow` cache ([`FixedPoint::shadow`]) the same
/// rows one trip less converged to it (group by group: the same rows);
/// see [`PrefillPass`] for the rest.
///
/// # Errors
/// Those of the forward pass and the hook.
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

/// The factor a row's last logit change is multiplied by to bound its
/// remaining error, 2·ρ/(1−ρ) (a flip needs an error of half the margin),
/// with ρ the row's observed contraction `change / previous change`,
/// clamped to [[`RHO_FLOOR`], 1/2]; with no previous change, or an unknown
/// (infinite) one, ρ = 1/2.
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

/// [`FixedPoint::draw_tolerance`] by default, 5·10⁻³ logits: after four
/// exact trips nearly every row's bound is within it (10⁻³–5·10⁻³ on
/// `code-lora-r16`, T = 12, where two trips leave 0.05–0.3), and decisions
/// at that bound left 2 of 69 rounds undecided (BENCHMARKS.md,
/// "Certifying draws").
pub const DRAW_TOLERANCE: f32 = 5e-3;

/// The bound on verify row `j`'s remaining logit error: its last change
/// times [`error_factor`] (`previous`: the trip before's changes); +∞ for
/// a row without a change.
#[must_use]
pub fn remaining_error(change: &[f32], previous: Option<&[f32]>, j: usize) -> f32 {
    let moved = change.get(j).copied().unwrap_or(f32::INFINITY);
    moved * error_factor(moved, previous.and_then(|p| p.get(j).copied()))
}

/// The smallest contraction per round trip the certification assumes
/// (measured: 0.1 median, 0.2 in the worst window; BENCHMARKS.md).
pub const RHO_FLOOR: f32 = 0.2;

/// Greedy certification (the margin rule of the module docs): walks the
/// rows in order and stops at the first row whose top-1/top-2 margin is not
/// above `margin` × its remaining-error bound ([`error_factor`] × its last
/// change; `previous`: the changes of the trip before, if any) — returns
/// its index: the rows before it are usable — or at the first row whose
/// argmax rejects its draft, or at the last real row (returns one past it:
/// that row gives the bonus token). `drafts[j]` is the token row `j` is
/// checked against.
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

/// The argmax of verify row `j` if its top-1/top-2 margin is above
/// `margin` × its remaining-error bound (the margin rule of the module docs).
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

/// Greedy certification of a tree pass ([`crate::tree`]): walks the path
/// greedy acceptance would take (root row first, then the child whose
/// token is the row's argmax) and returns how many of its rows are
/// certified by the margin rule before the first that is not (0: not even
/// the root's). [`crate::tree::accept_tree_greedy`] limited to that many
/// rows then walks the same, exact, path.
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

/// Sampling certification: the leading rows (of the first `real`) whose
/// bound on the remaining logit error ([`error_factor`] × last change;
/// `previous`: the trip before's changes) is at most `tolerance`.
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

/// Largest value, second largest, and the index of the largest (the first
/// one on ties, as [`cipherlora_model::argmax`]).
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

    /// Rows `0..count` of the guess become rows `from..from + count` of the
    /// carried deltas; the rest of the guess, and projections or groups
    /// the carried deltas lack, stay as guessed.
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
        // No previous trip: ρ = 1/2, bound = 2·change. Row 1 moved 0.05:
        // 0.1 > 2·0.05 fails → only row 0 usable.
        assert_eq!(
            certify_greedy(&rows, &[0.1, 0.05, 0.1], None, &[1, 0], 1.0),
            1
        );
        // Row 1 barely moved: certified; it accepts draft 0; row 2 gives the bonus.
        assert_eq!(
            certify_greedy(&rows, &[0.1, 0.01, 0.1], None, &[1, 0], 1.0),
            3
        );
        // A fast contraction (0.04 after 1.0: ρ clamped to 0.2, bound =
        // 0.5·change) certifies row 1 at change 0.1 (0.1 > 0.05) …
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

    /// Coarse trips: every trip of a batch but the last, never a
    /// continuation, and none when switched off.
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

    /// Regression: a continuation's trips all asked full precision, so the
    /// response sizes told the server which rounds were continuations.
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

    /// An unknown previous change (+∞, a drafted start's first trip) is no
    /// evidence of contraction: ρ = 1/2, not the floor a huge change would
    /// give.
    #[test]
    fn an_unknown_previous_change_is_no_contraction() {
        assert_eq!(error_factor(0.1, Some(f32::INFINITY)), 2.0);
        assert_eq!(error_factor(0.1, None), 2.0);
        assert_eq!(error_factor(0.1, Some(10.0)), 0.5);
        let (change, previous) = with_inherited(&[0.1], Some(&[f32::INFINITY]), &[0.0]);
        assert_eq!(error_factor(change[0], Some(previous[0])), 2.0);
    }

    /// After a drafted start, a row's previous change is its last one over
    /// the pass's input contraction (so its ρ is that contraction, clamped);
    /// known previous changes are kept as they are.
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

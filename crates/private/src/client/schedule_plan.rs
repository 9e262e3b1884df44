//! Choosing the verify schedule from the link and the pass's costs: a round
//! priced per group and as a (streamed) fixed point of N trips, drafting
//! included; the server's time is the plans' op counts at
//! [`OpCosts::default`] × [`SessionOffer::server_cost_ratio`], the bytes the
//! engine's wire sizes. Formulas: docs/design/planners.md, code-notes.md
//! ("private: schedule_plan").

use std::sync::Arc;

use cipherlora_ckks::Context;
use cipherlora_helora::{GroupPlan, OpCosts};
use cipherlora_service::LinkProfile;
use cipherlora_speculative::schedule::{FixedPoint, PREFILL_ROUND_TRIPS, Prefill, Schedule};

use crate::PrivateError;
use crate::protocol::SessionOffer;

/// The modelled cost of one verify pass of an offer, all groups.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PassModel {
    /// Adapted layer groups (round trips of a per-group pass).
    pub groups: usize,
    /// Bytes uploaded per pass.
    pub bytes_up: f64,
    /// Bytes uploaded per pass on a coarse trip ([`FixedPoint::coarse_trips`]).
    pub bytes_up_coarse: f64,
    /// Bytes downloaded per pass.
    pub bytes_down: f64,
    /// Bytes downloaded per pass on a coarse trip.
    pub bytes_down_coarse: f64,
    /// Server compute per pass, ms.
    pub server_ms: f64,
    /// Client encryption and decryption per pass, ms.
    pub client_he_ms: f64,
}

impl PassModel {
    /// Models one pass of `offer`'s plans (`ctx`: its preset's context).
    /// Errors: [`PrivateError::Helora`] (no layout, or sizing the wire formats).
    pub fn of(offer: &SessionOffer, ctx: &Arc<Context>) -> Result<Self, PrivateError> {
        Self::of_plans(
            offer.groups.iter().map(|g| &g.plan),
            &wire_sizes(ctx)?,
            offer.server_cost_ratio,
        )
    }

    /// Models one pass of `plans` with `sizes` and the server at [`OpCosts::default`]
    /// × `server_cost_ratio`. Errors: [`PrivateError::Helora`] for a plan without a layout.
    pub fn of_plans<'a>(
        plans: impl IntoIterator<Item = &'a GroupPlan>,
        sizes: &WireSizes,
        server_cost_ratio: f64,
    ) -> Result<Self, PrivateError> {
        let costs = OpCosts::default();
        let mut m = PassModel {
            groups: 0,
            bytes_up: 0.0,
            bytes_up_coarse: 0.0,
            bytes_down: 0.0,
            bytes_down_coarse: 0.0,
            server_ms: 0.0,
            client_he_ms: 0.0,
        };
        for plan in plans {
            let c = plan.counts()?;
            m.groups += 1;
            let upload = |by_level: &[f64]| {
                c.encryptions
                    .iter()
                    .zip(by_level)
                    .map(|(&n, &b)| n as f64 * b)
                    .sum::<f64>()
            };
            m.bytes_up += upload(&sizes.up);
            m.bytes_up_coarse += upload(&sizes.up_coarse);
            m.bytes_down += c.decryptions as f64 * sizes.down;
            m.bytes_down_coarse += c.decryptions as f64 * sizes.down_coarse;
            m.server_ms += costs.server_ms(&c) * server_cost_ratio;
            m.client_he_ms += costs.client_ms(&c);
        }
        Ok(m)
    }
}

/// The engine's wire sizes, bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WireSizes {
    /// A seeded upload at each level.
    pub up: [f64; cipherlora_helora::counts::LEVELS],
    /// An upload at each level at a coarse trip's precision ([`wire_sizes`]).
    pub up_coarse: [f64; cipherlora_helora::counts::LEVELS],
    /// A level-0 download as a default server returns it.
    pub down: f64,
    /// A download at the precision of a coarse trip ([`wire_sizes`]).
    pub down_coarse: f64,
    /// One Galois key.
    pub key: f64,
}

/// The [`WireSizes`] of `ctx`'s engine (coarse trips at 16 response bits).
/// Errors: engine errors.
pub fn wire_sizes(ctx: &Arc<Context>) -> Result<WireSizes, PrivateError> {
    let (up, down, key) = cipherlora_helora::measure::wire_sizes(ctx)?;
    let tolerance = cipherlora_speculative::schedule::LATER_TRIP_TOLERANCE;
    let bits = crate::client::response_bits::response_bits(tolerance);
    let coarse = cipherlora_helora::measure::compressed_download_bytes(ctx, bits).unwrap_or(down);
    // The rounded upload keeps limb 0 of `c0` whole: N·d/8 bytes smaller.
    let dropped = cipherlora_ckks::rounded::max_dropped_bits(
        ctx,
        ctx.params().scale(),
        crate::client::response_bits::upload_error(tolerance),
    );
    let saved = match dropped {
        0 => 0.0,
        d => (ctx.degree() * d as usize / 8) as f64 - 4.0,
    };
    let up_coarse = up.map(|b| if b > 0.0 { b - saved } else { b });
    Ok(WireSizes {
        up,
        up_coarse,
        down,
        down_coarse: coarse.min(down),
        key,
    })
}

/// A schedule and the modelled time per verify round of both candidates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScheduleChoice {
    /// The cheaper schedule for greedy decoding (prefill too, [`choose_for_session`]).
    pub schedule: Schedule,
    /// The cheaper schedule for sampled decoding ([`Schedule::for_decoding`]).
    pub sampled: Schedule,
    /// Modelled per-group round, ms (drafting included where priced).
    pub per_group_ms: f64,
    /// Modelled fixed-point round, ms (drafting included likewise).
    pub fixed_point_ms: f64,
    /// Modelled fixed-point round of a sampled generation, ms.
    pub sampled_fixed_point_ms: f64,
    /// One prefill pass per group and as batched trips, ms.
    pub prefill: Option<PrefillChoice>,
}

/// Mean batched trips of a sampled round under the fixed point (all included;
/// certified draws, [`cipherlora_speculative::draw_bounds`]).
pub const SAMPLED_TRIPS_PER_ROUND: usize = 5;

/// The modelled cost of one prefill pass both ways.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefillChoice {
    /// One round trip per group (exact keys and values), ms.
    pub per_group_ms: f64,
    /// The fixed point's prefill trips, ms.
    pub fixed_point_ms: f64,
}

fn transfer_ms(bytes: f64, bps: Option<u64>) -> f64 {
    bps.map_or(0.0, |b| bytes * 8.0 / b as f64 * 1e3)
}

/// Picks the cheaper schedule on `link`; `forward_ms`: one client pass.
#[must_use]
pub fn choose_schedule(
    pass: &PassModel,
    link: &LinkProfile,
    forward_ms: f64,
    fixed: FixedPoint,
) -> ScheduleChoice {
    choose_schedule_grouped(pass, pass, link, forward_ms, 0.0, fixed)
}

/// [`choose_schedule`] with per-group on `per_group`, the fixed point on
/// `fixed_point` (e.g. by layers) and `draft_ms` of drafting (0: none).
#[must_use]
pub fn choose_schedule_grouped(
    per_group: &PassModel,
    fixed_point: &PassModel,
    link: &LinkProfile,
    forward_ms: f64,
    draft_ms: f64,
    fixed: FixedPoint,
) -> ScheduleChoice {
    let rtt = link.rtt().as_secs_f64() * 1e3;
    let (up, down) = (
        transfer_ms(per_group.bytes_up, link.up_bps()),
        transfer_ms(per_group.bytes_down, link.down_bps()),
    );
    let per_group_ms = per_group.groups as f64 * rtt
        + per_group.server_ms
        + up
        + down
        + per_group.client_he_ms
        + forward_ms
        + draft_ms;
    let fixed_point_ms = fixed_point_round_ms(fixed_point, link, forward_ms, draft_ms, fixed);
    // Sampled: more trips, all exact, nothing drafted ahead.
    let sampled_fixed = fixed.for_sampling();
    let sampled_fixed_point_ms = fixed_point_round_ms(
        fixed_point,
        link,
        forward_ms,
        draft_ms,
        FixedPoint {
            round_trips: SAMPLED_TRIPS_PER_ROUND.max(fixed.round_trips),
            draft_ahead: false,
            ..sampled_fixed
        },
    );
    let cheaper = |fp: FixedPoint, fixed_point_ms: f64| {
        if fixed_point_ms < per_group_ms {
            Schedule::FixedPoint(fp)
        } else {
            Schedule::PerGroup
        }
    };
    ScheduleChoice {
        schedule: cheaper(fixed, fixed_point_ms),
        sampled: cheaper(sampled_fixed, sampled_fixed_point_ms),
        per_group_ms,
        fixed_point_ms,
        sampled_fixed_point_ms,
        prefill: None,
    }
}

/// One fixed-point round over `pass` on `link`, drafting included, ms.
fn fixed_point_round_ms(
    pass: &PassModel,
    link: &LinkProfile,
    forward_ms: f64,
    draft_ms: f64,
    fixed: FixedPoint,
) -> f64 {
    let rtt = link.rtt().as_secs_f64() * 1e3;
    let up = transfer_ms(pass.bytes_up, link.up_bps());
    let trip = |up: f64, down_bytes: f64| {
        let down = transfer_ms(down_bytes, link.down_bps());
        rtt + pass.server_ms.max(up).max(down) + pass.client_he_ms
    };
    let n = fixed.round_trips.max(1) as f64;
    let (coarse_up, coarse_down) = if fixed.coarse_trips {
        (
            transfer_ms(pass.bytes_up_coarse, link.up_bps()),
            pass.bytes_down_coarse,
        )
    } else {
        (up, pass.bytes_down)
    };
    // The shadow's replay of the pass before the last trip.
    let replay_ms = if fixed.shadow { forward_ms } else { 0.0 };
    // One client pass per trip plus pass 0, unless drafted inputs replace it.
    let passes = if fixed.drafted_start && n >= 2.0 {
        n
    } else {
        n + 1.0
    };
    let last_down = transfer_ms(pass.bytes_down, link.down_bps());
    // Drafting left over once the last trip's wait has hidden what it can.
    let exposed = |wait_ms: f64| {
        if fixed.draft_ahead {
            (draft_ms - wait_ms).max(0.0)
        } else {
            draft_ms
        }
    };
    if fixed.streamed {
        let down = transfer_ms((n - 1.0) * coarse_down + pass.bytes_down, link.down_bps());
        let client = n * pass.client_he_ms + passes * forward_ms + replay_ms;
        let groups = pass.groups.max(1) as f64;
        let one_group = (up + last_down + pass.server_ms + pass.client_he_ms + forward_ms) / groups;
        let busiest = ((n - 1.0) * coarse_up + up)
            .max(down)
            .max(n * pass.server_ms)
            .max(n * (rtt + one_group));
        let last_trip_wait = rtt + up.max(last_down).max(pass.server_ms);
        let link_bound = busiest + rtt + one_group + exposed(last_trip_wait);
        let client_bound = client + draft_ms + rtt + one_group;
        link_bound.max(client_bound)
    } else {
        let last = trip(up, pass.bytes_down);
        (n - 1.0) * trip(coarse_up, coarse_down)
            + last.max(replay_ms)
            + passes * forward_ms
            + exposed(last - replay_ms.min(last))
    }
}

/// [`choose_schedule`] for the verify session of `width` behind `hook` with
/// the fixed point the client would run, timing one pass of `model` and
/// `width − 1` steps of `drafter` here, or taking them from `timed`
/// ([`crate::width_plan::time_client`] up to at least `width` positions). When the fixed point
/// wins and `hook` has a session of `prefill_width`, prefill passes are priced both ways and
/// run group by group when cheaper (exact prompt rows, bytes sent once); with `timed` the
/// prefill width's pass is extrapolated from the widest two timed ones (a pass's time is close
/// to affine in its width).
///
/// Errors: [`PrivateError::NoSessionOfWidth`] when `hook` has no session of that
/// width; [`PrivateError::Model`] when the pass fails.
pub fn choose_for_session<T: crate::Transport>(
    (model, drafter): (&cipherlora_model::Model, Option<&cipherlora_model::Model>),
    hook: &crate::ByWidth<T>,
    width: usize,
    prefill_width: Option<usize>,
    (link, alpha): (&LinkProfile, Option<f64>),
    timed: Option<&crate::width_plan::ClientCosts>,
) -> Result<ScheduleChoice, PrivateError> {
    let session = hook
        .session(width)
        .ok_or(PrivateError::NoSessionOfWidth { width })?;
    let fixed = crate::width_plan::auto_fixed_point(session.plan_space(), alpha);
    let timed = timed.filter(|c| c.forward_ms.len() >= width.max(2));
    let forward_ms = |t: usize| -> Result<f64, PrivateError> {
        match timed {
            Some(c) => Ok(extrapolated(&c.forward_ms, t)),
            None => time_pass(model, t),
        }
    };
    let draft_ms = match (drafter, timed) {
        (Some(_), Some(c)) => width.saturating_sub(1) as f64 * c.draft_ms,
        (Some(d), None) => width.saturating_sub(1) as f64 * time_pass(d, 1)?.min(time_pass(d, 1)?),
        (None, _) => 0.0,
    };
    let pass = session.pass_model();
    let mut choice = choose_schedule_grouped(pass, pass, link, forward_ms(width)?, draft_ms, fixed);
    if session.plan_space().grouping.layers().is_some() {
        // Its requests need a whole layer's inputs: only the fixed point.
        choice.per_group_ms = f64::INFINITY;
        choice.schedule = Schedule::FixedPoint(fixed);
        choice.sampled = Schedule::FixedPoint(fixed.for_sampling());
    }
    let wide = prefill_width
        .filter(|&w| w != width)
        .and_then(|w| Some((w, hook.session(w)?)));
    if let (Schedule::FixedPoint(mut fp), Some((w, wide))) = (choice.schedule, wide) {
        let trips = match fp.prefill {
            Prefill::FixedPoint(n) => n,
            Prefill::PerGroup => PREFILL_ROUND_TRIPS,
        };
        let c = choose_schedule(
            wide.pass_model(),
            link,
            forward_ms(w)?,
            FixedPoint {
                round_trips: trips,
                ..fp
            },
        );
        let cheaper = c.schedule == Schedule::PerGroup;
        fp.prefill = prefill_of(fp, cheaper);
        choice.schedule = Schedule::FixedPoint(fp);
        if let Schedule::FixedPoint(sampled) = &mut choice.sampled {
            sampled.prefill = prefill_of(*sampled, cheaper);
        }
        choice.prefill = Some(PrefillChoice {
            per_group_ms: c.per_group_ms,
            fixed_point_ms: c.fixed_point_ms,
        });
    }
    Ok(choice)
}

/// `forward_ms[t − 1]` of a pass of `t` positions, past the table on the line through its last two
/// entries (at least two).
fn extrapolated(forward_ms: &[f64], t: usize) -> f64 {
    let n = forward_ms.len();
    match t.checked_sub(1).and_then(|i| forward_ms.get(i)) {
        Some(&ms) => ms,
        None => {
            let (a, b) = (forward_ms[n - 2], forward_ms[n - 1]);
            b + t.saturating_sub(n) as f64 * (b - a).max(0.0)
        }
    }
}

/// How `fp` prefills when a group-by-group session is at hand: group by group when that is
/// `cheaper`, and always under the shadow, whose certification would count fixed-point
/// prompt rows' residual and settle them as verify rounds (docs/design/schedules.md).
fn prefill_of(fp: FixedPoint, cheaper: bool) -> Prefill {
    if cheaper || fp.shadow {
        Prefill::PerGroup
    } else {
        fp.prefill
    }
}

/// One plaintext pass of `width` positions of `model`, ms.
pub(crate) fn time_pass(
    model: &cipherlora_model::Model,
    width: usize,
) -> Result<f64, PrivateError> {
    let mut cache = model.new_cache(width)?;
    let t0 = std::time::Instant::now();
    model.forward(
        &vec![0; width],
        &mut cache,
        &cipherlora_model::AttentionMask::Causal,
        &mut cipherlora_model::NoAdapter,
    )?;
    Ok(t0.elapsed().as_secs_f64() * 1e3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pass_times_past_the_table_continue_its_last_slope() {
        let ms = [10.0, 12.0, 14.0, 17.0];
        assert_eq!(extrapolated(&ms, 2), 12.0);
        assert_eq!(extrapolated(&ms, 4), 17.0);
        assert_eq!(extrapolated(&ms, 8), 17.0 + 4.0 * 3.0);
        // A last step that went down (noise) never makes a wider pass cheaper.
        assert_eq!(extrapolated(&[10.0, 9.0], 5), 9.0);
    }

    fn pass() -> PassModel {
        // The default model's FFA verify pass at T = 9.
        PassModel {
            groups: 60,
            bytes_up: 5.5e6,
            bytes_up_coarse: 5.5e6,
            bytes_down: 7.2e6,
            bytes_down_coarse: 5.5e6,
            server_ms: 110.0,
            client_he_ms: 13.0,
        }
    }

    #[test]
    fn sampled_rounds_are_priced_at_more_exact_trips() {
        // Standard LoRA at T = 12: the server's pass dominates a trip.
        let standard = PassModel {
            groups: 60,
            bytes_up: 16e6,
            bytes_up_coarse: 16e6,
            bytes_down: 12e6,
            bytes_down_coarse: 9e6,
            server_ms: 1300.0,
            client_he_ms: 100.0,
        };
        let two = FixedPoint {
            round_trips: 2,
            shadow: true,
            ..FixedPoint::default()
        };
        let c = choose_schedule(&standard, &LinkProfile::WAN20, 60.0, two);
        assert_eq!(c.schedule, Schedule::FixedPoint(two), "{c:?}");
        assert_eq!(c.sampled, Schedule::PerGroup, "{c:?}");
        // Five exact trips against two coarse ones, nothing drafted ahead.
        assert!(c.sampled_fixed_point_ms > 2.0 * c.fixed_point_ms, "{c:?}");
        // FFA at wan80: latency dominates; sampled rounds keep the fixed point.
        let c = choose_schedule(&pass(), &LinkProfile::WAN80, 40.0, FixedPoint::default());
        let exact = FixedPoint {
            coarse_trips: false,
            shadow: false,
            drafter_estimates: false,
            ..FixedPoint::default()
        };
        assert_eq!(c.sampled, Schedule::FixedPoint(exact), "{c:?}");
        // On loopback neither pays.
        let c = choose_schedule(&pass(), &LinkProfile::LOOPBACK, 40.0, two);
        assert_eq!(
            (c.schedule, c.sampled),
            (Schedule::PerGroup, Schedule::PerGroup)
        );
    }

    #[test]
    fn loopback_keeps_one_pass_per_round() {
        let c = choose_schedule(&pass(), &LinkProfile::LOOPBACK, 40.0, FixedPoint::default());
        assert_eq!(c.schedule, Schedule::PerGroup);
        assert!(c.per_group_ms < c.fixed_point_ms);
    }

    #[test]
    fn a_wan_pays_for_the_extra_passes() {
        let c = choose_schedule(&pass(), &LinkProfile::WAN80, 40.0, FixedPoint::default());
        assert!(matches!(c.schedule, Schedule::FixedPoint(_)), "{c:?}");
        // 60 latencies of 80 ms alone exceed two pipelined passes.
        assert!(c.per_group_ms > 4800.0);
    }

    /// Streamed trips overlap: a bandwidth-bound round costs its bytes about once.
    #[test]
    fn streamed_trips_cost_the_busiest_resource_not_the_sum() {
        let batched = FixedPoint {
            streamed: false,
            ..FixedPoint::default()
        };
        let link = LinkProfile::WAN80;
        let s = choose_schedule(&pass(), &link, 40.0, FixedPoint::default());
        let b = choose_schedule(&pass(), &link, 40.0, batched);
        assert!(s.fixed_point_ms < b.fixed_point_ms, "{s:?} {b:?}");
        // Bound below by three trips' download plus one latency.
        let down_ms = (2.0 * 5.5e6 + 7.2e6) * 8.0 / 1e8 * 1e3;
        assert!(s.fixed_point_ms >= down_ms + 80.0, "{s:?}");
        assert!(s.fixed_point_ms < down_ms + 80.0 + 41.0 + 1.0, "{s:?}");
    }

    /// A shadowed fixed point prefills group by group even where its own prefill is cheaper.
    #[test]
    fn a_shadowed_fixed_point_prefills_group_by_group() {
        let plain = FixedPoint::default();
        let shadowed = FixedPoint {
            shadow: true,
            ..plain
        };
        assert_eq!(prefill_of(plain, false), plain.prefill);
        assert_eq!(prefill_of(plain, true), Prefill::PerGroup);
        assert_eq!(prefill_of(shadowed, false), Prefill::PerGroup);
    }

    /// The shadow's replay lengthens only a client-bound round.
    #[test]
    fn a_shadow_costs_one_pass_where_the_client_is_busiest() {
        let shadow = |fp: FixedPoint| FixedPoint { shadow: true, ..fp };
        let link = LinkProfile::WAN20;
        // A slow client (500 ms passes): streamed rounds are client-bound.
        let plain = choose_schedule(&pass(), &link, 500.0, FixedPoint::default());
        let shadowed = choose_schedule(&pass(), &link, 500.0, shadow(FixedPoint::default()));
        let added = shadowed.fixed_point_ms - plain.fixed_point_ms;
        assert!((added - 500.0).abs() < 1e-6, "{plain:?} {shadowed:?}");
        // Batched trips: a 10 ms pass hides behind the last trip.
        let batched = FixedPoint {
            streamed: false,
            ..FixedPoint::default()
        };
        let plain = choose_schedule(&pass(), &link, 10.0, batched);
        let shadowed = choose_schedule(&pass(), &link, 10.0, shadow(batched));
        assert_eq!(plain.fixed_point_ms, shadowed.fixed_point_ms);
    }

    #[test]
    fn a_drafted_start_saves_one_pass_from_two_trips_on() {
        let drafted = |fp: FixedPoint| FixedPoint {
            drafted_start: true,
            ..fp
        };
        let link = LinkProfile::WAN20;
        let two = FixedPoint {
            round_trips: 2,
            ..FixedPoint::default()
        };
        // Client-bound streamed rounds (500 ms passes) and batched ones.
        for fp in [
            two,
            FixedPoint::default(),
            FixedPoint {
                streamed: false,
                ..two
            },
        ] {
            let plain = choose_schedule(&pass(), &link, 500.0, fp);
            let started = choose_schedule(&pass(), &link, 500.0, drafted(fp));
            let saved = plain.fixed_point_ms - started.fixed_point_ms;
            assert!(
                (saved - 500.0).abs() < 1e-6,
                "{fp:?}: {plain:?} {started:?}"
            );
        }
        // One trip per round runs pass 0.
        let one = FixedPoint {
            round_trips: 1,
            ..FixedPoint::default()
        };
        assert_eq!(
            choose_schedule(&pass(), &link, 500.0, one).fixed_point_ms,
            choose_schedule(&pass(), &link, 500.0, drafted(one)).fixed_point_ms
        );
    }

    /// Drafting shorter than the last trip is free on the fixed point only.
    #[test]
    fn drafting_hides_under_the_last_trip_only_where_the_client_idles() {
        let link = LinkProfile::WAN80;
        let fp = FixedPoint::default();
        let round = |forward: f64, draft: f64, fp: FixedPoint| {
            choose_schedule_grouped(&pass(), &pass(), &link, forward, draft, fp)
        };
        let (bare, drafted) = (round(40.0, 0.0, fp), round(40.0, 100.0, fp));
        assert_eq!(bare.fixed_point_ms, drafted.fixed_point_ms);
        assert!((drafted.per_group_ms - bare.per_group_ms - 100.0).abs() < 1e-6);
        let behind = FixedPoint {
            draft_ahead: false,
            ..fp
        };
        let added =
            round(40.0, 100.0, behind).fixed_point_ms - round(40.0, 0.0, behind).fixed_point_ms;
        assert!((added - 100.0).abs() < 1e-6, "{added}");
        // 500 ms passes: the client is the busiest resource.
        let added = round(500.0, 100.0, fp).fixed_point_ms - round(500.0, 0.0, fp).fixed_point_ms;
        assert!((added - 100.0).abs() < 1e-6, "{added}");
    }

    /// Pinned by a measured download-bound FFA round at wan20: drains one group's share.
    #[test]
    fn a_download_bound_round_drains_one_group_s_share_not_a_pass() {
        let pass = PassModel {
            groups: 15,
            bytes_up: 1_383_240.0,
            bytes_up_coarse: 1_383_240.0,
            bytes_down: 3_595_500.0,
            bytes_down_coarse: 2_766_060.0,
            server_ms: 200.0,
            client_he_ms: 21.0,
        };
        let c = choose_schedule_grouped(
            &pass,
            &pass,
            &LinkProfile::WAN20,
            89.0,
            7.0 * 13.7,
            FixedPoint::default(),
        );
        assert!((c.fixed_point_ms - 801.0).abs() < 0.06 * 801.0, "{c:?}");
    }

    #[test]
    fn all_linear_adapters_favour_the_fixed_point_sooner() {
        let mut p = pass();
        let link: LinkProfile = "rtt=10,mbps=100".parse().unwrap();
        let few = choose_schedule(&p, &link, 40.0, FixedPoint::default());
        p.groups = 120;
        let many = choose_schedule(&p, &link, 40.0, FixedPoint::default());
        assert!(many.per_group_ms - few.per_group_ms > 599.0);
        // The fixed point's round changes only by one group's fill and drain.
        assert!(many.fixed_point_ms <= few.fixed_point_ms);
        assert!(few.fixed_point_ms - many.fixed_point_ms < 20.0);
    }
}

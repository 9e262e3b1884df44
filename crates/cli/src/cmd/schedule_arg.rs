//! `--schedule`: the verify schedule named on the command line, or chosen by the planner for `auto`
//! (used by `generate` and `demo`).

use cipherlora_model::Model;
use cipherlora_service::LinkProfile;
use cipherlora_spec::schedule::Schedule;

/// The verify schedule for `arg`; `auto` models one round of each schedule on `link` with the
/// session's plans and timed client passes ([`cipherlora_private::choose_for_session`]), greedy or
/// sampled, and logs the choice. Errors: an unknown schedule, a failed forward pass, no session of
/// `width`.
pub fn resolve_schedule<T: cipherlora_private::Transport>(
    arg: &str,
    (model, drafter): (&Model, Option<&Model>),
    hook: &cipherlora_private::ByWidth<T>,
    (width, prefill_width): (usize, usize),
    (link, alpha): (&LinkProfile, Option<f64>),
    greedy: bool,
) -> anyhow::Result<Schedule> {
    if arg != "auto" {
        return Ok(arg.parse::<Schedule>()?.for_decoding(greedy));
    }
    let choice = cipherlora_private::choose_for_session(
        (model, drafter),
        hook,
        width,
        Some(prefill_width),
        (link, alpha),
    )?;
    let prefill = choice.prefill.map_or(String::new(), |p| {
        format!(
            "; prefill pass: per-group {:.0} ms, fixed-point {:.0} ms",
            p.per_group_ms, p.fixed_point_ms
        )
    });
    let (schedule, fixed_point_ms) = if greedy {
        (choice.schedule, choice.fixed_point_ms)
    } else {
        (choice.sampled, choice.sampled_fixed_point_ms)
    };
    eprintln!(
        "schedule: {schedule} (modelled {} round: per-group {:.0} ms, fixed-point {fixed_point_ms:.0} ms{prefill}; link RTT {:.0} ms)",
        if greedy { "greedy" } else { "sampled" },
        choice.per_group_ms,
        link.rtt().as_secs_f64() * 1e3
    );
    Ok(schedule)
}

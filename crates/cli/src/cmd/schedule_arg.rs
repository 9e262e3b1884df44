//! How `generate` and `demo` report the verify schedule the planner chose
//! for `--schedule auto`.

use cipherlora_private::ScheduleChoice;
use cipherlora_service::LinkProfile;

/// One line on the modelled schedules: the choice for a greedy or sampled
/// generation, each schedule's modelled round (and prefill pass), the link.
pub fn schedule_report(choice: &ScheduleChoice, greedy: bool, link: &LinkProfile) -> String {
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
    format!(
        "schedule: {schedule} (modelled {} round: per-group {:.0} ms, fixed-point {fixed_point_ms:.0} ms{prefill}; link RTT {:.0} ms)",
        if greedy { "greedy" } else { "sampled" },
        choice.per_group_ms,
        link.rtt().as_secs_f64() * 1e3
    )
}

//! Choosing the verify width T = K + 1 from the link, the plans' costs and
//! an acceptance prior α: K maximises `E(K) / round`, `E(K) = (1 − α^(K+1))
//! / (1 − α)` (Leviathan et al., ICML 2023, Eq. 1), each round priced by
//! [`crate::schedule_plan`] with the plans the server picks for T, as a chain
//! or a tree ([`DraftLimits::trees`]). K is fixed before the first token from
//! public inputs. Rationale: docs/design/planners.md, code-notes.md
//! ("private: width_plan").

use std::sync::Arc;

use cipherlora_ckks::{CkksParameters, Context, Preset};
use cipherlora_helora::planner::choose;
use cipherlora_helora::{GroupPlan, GroupShape, Link, Mode, OpCosts};
use cipherlora_service::LinkProfile;
use cipherlora_speculative::adaptive::expected_tokens;
use cipherlora_speculative::schedule::{FixedPoint, Schedule};
use cipherlora_speculative::tree_draft::TreeParams;
use cipherlora_speculative::tree_plan::{RankAcceptance, TreeEstimate, best_tree};

use crate::PrivateError;
use crate::protocol::{Grouping, SessionOffer, layer_runs};
use crate::schedule_plan::{
    PassModel, ScheduleChoice, WireSizes, choose_schedule_grouped, time_pass,
};

/// What the client knows of the server's plans at any width (from one offer).
#[derive(Debug, Clone, PartialEq)]
pub struct PlanSpace {
    /// CKKS parameter preset.
    pub preset: Preset,
    /// LoRA variant of the plans.
    pub mode: Mode,
    /// Whether the plans rerandomise their outputs (circuit privacy).
    pub rerandomize: bool,
    /// Public shape of each adapted group, in forward order.
    pub shapes: Vec<GroupShape>,
    /// The decoder layer of each shape.
    pub layers: Vec<usize>,
    /// How the shapes group the projections.
    pub grouping: Grouping,
    /// The offer's [`SessionOffer::server_cost_ratio`].
    pub server_cost_ratio: f64,
    /// Positions per pass of the offer's session (`None`: none); a verify session of that width shares it.
    pub width: Option<usize>,
    /// The offer's [`SessionOffer::acceptance`] hint.
    pub acceptance: Option<f64>,
}

/// The per-token acceptance prior when neither client nor offer gives one (code-notes).
pub const DEFAULT_ACCEPTANCE_PRIOR: f64 = 0.83;

/// The lowest prior α at which the default fixed point is two shadowed trips, not three (code-notes).
pub const SHADOWED_TWO_TRIPS_MIN_ACCEPTANCE: f64 = 0.85;

/// The fixed point `auto` runs (and the width model prices) at prior
/// `alpha`: `fixed-point:2/shadow/drafter-estimates` from
/// [`SHADOWED_TWO_TRIPS_MIN_ACCEPTANCE`] on, else `fixed-point:3/shadow`.
/// Both certify against the cached rows' residual: without the shadow, three
/// trips changed a greedy output on prose (docs/design/schedules.md).
#[must_use]
pub fn default_fixed_point(alpha: f64) -> FixedPoint {
    if alpha >= SHADOWED_TWO_TRIPS_MIN_ACCEPTANCE {
        FixedPoint {
            round_trips: 2,
            shadow: true,
            drafter_estimates: true,
            ..FixedPoint::default()
        }
    } else {
        FixedPoint {
            shadow: true,
            ..FixedPoint::default()
        }
    }
}

/// [`default_fixed_point`] of the [`acceptance_prior`] (client's `given`, `space`).
#[must_use]
pub fn auto_fixed_point(space: &PlanSpace, given: Option<f64>) -> FixedPoint {
    default_fixed_point(acceptance_prior(space, given))
}

/// The α of the width model: `given`, else `space`'s hint, else [`DEFAULT_ACCEPTANCE_PRIOR`].
#[must_use]
pub fn acceptance_prior(space: &PlanSpace, given: Option<f64>) -> f64 {
    given
        .or(space.acceptance)
        .unwrap_or(DEFAULT_ACCEPTANCE_PRIOR)
}

impl PlanSpace {
    /// The space of `offer`.
    #[must_use]
    pub fn of(offer: &SessionOffer) -> Self {
        PlanSpace {
            preset: offer.preset,
            mode: offer.kind.mode(),
            rerandomize: offer.groups.iter().any(|g| g.plan.rerandomize),
            shapes: offer.groups.iter().map(|g| g.plan.shape.clone()).collect(),
            layers: offer.groups.iter().map(|g| g.layer).collect(),
            grouping: offer.grouping,
            server_cost_ratio: offer.server_cost_ratio,
            width: offer.groups.first().map(|g| g.plan.t),
            acceptance: offer.acceptance,
        }
    }

    /// Whether a verify session of `t` positions is the offer's own.
    #[must_use]
    pub fn is_own_width(&self, t: usize) -> bool {
        self.width == Some(t)
    }

    /// The same adapter grouped by runs of `n` layers, as a
    /// [`Grouping::ByLayers`]`(n)` offer would be. `None` for standard LoRA,
    /// `n` outside `1..=`[`Grouping::MAX_LAYERS`], or a space fused otherwise.
    #[must_use]
    pub fn by_layers(&self, n: usize) -> Option<PlanSpace> {
        if self.mode != Mode::Ffa || n == 0 || n > Grouping::MAX_LAYERS {
            return None;
        }
        match self.grouping {
            g if g == Grouping::ByLayers(n) => return Some(self.clone()),
            Grouping::ByLayers(_) => return None,
            Grouping::ByInput => {}
        }
        let mut shapes: Vec<GroupShape> = Vec::new();
        let mut layers: Vec<usize> = Vec::new();
        let known = self.shapes.len().min(self.layers.len());
        for run in layer_runs(&self.layers[..known], n) {
            let mut fused = self.shapes[run.start].clone();
            for shape in &self.shapes[run.start + 1..run.end] {
                fused.d_in += shape.d_in;
                fused.d_outs.extend_from_slice(&shape.d_outs);
                fused.ranks.extend_from_slice(&shape.ranks);
            }
            shapes.push(fused);
            layers.push(self.layers[run.start]);
        }
        Some(PlanSpace {
            shapes,
            layers,
            grouping: Grouping::ByLayers(n),
            ..self.clone()
        })
    }

    /// The plans a server with default op costs offers at width `t`, one per group.
    /// Errors: [`PrivateError::Helora`] when no plan fits T; [`PrivateError::Ckks`].
    pub fn plans(&self, t: usize) -> Result<Vec<GroupPlan>, PrivateError> {
        let slots = CkksParameters::preset(self.preset)?.slots();
        let (costs, link) = (OpCosts::default(), Link::default());
        let mut out: Vec<GroupPlan> = Vec::with_capacity(self.shapes.len());
        for shape in &self.shapes {
            // Groups of one shape get one plan (as the server caches them).
            let plan = match out.iter().find(|p| &p.shape == shape) {
                Some(p) => p.clone(),
                None => choose(shape, self.mode, t, slots, self.rerandomize, &costs, &link)?.0,
            };
            out.push(plan);
        }
        Ok(out)
    }
}

/// The client-side costs the width model needs, ms.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientCosts {
    /// `forward_ms[t − 1]`: one plaintext pass of t positions.
    pub forward_ms: Vec<f64>,
    /// One draft step of the drafter.
    pub draft_ms: f64,
}

/// The drafts the width model chooses among.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DraftLimits {
    /// The largest K considered (≥ 1).
    pub k_max: usize,
    /// Draft trees within these limits compete with chains (`None`: chains).
    pub trees: Option<TreeParams>,
}

impl From<usize> for DraftLimits {
    /// Chains of at most `k_max` drafts.
    fn from(k_max: usize) -> Self {
        Self { k_max, trees: None }
    }
}

/// One candidate K and its modelled round.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WidthCandidate {
    /// Drafted tokens per round (T = K + 1).
    pub k: usize,
    /// The schedule the round would use, with both schedules' round times.
    pub schedule: ScheduleChoice,
    /// How the verify session groups the projections ([`Grouping::ByLayers`]: fixed point on FFA).
    pub grouping: Grouping,
    /// The cheaper schedule's round, its drafting included, ms.
    pub round_ms: f64,
    /// Expected tokens per round at the prior α (bonus token included).
    pub expected_tokens: f64,
    /// The tree the model prefers to the chain of K drafts (`None`: a chain).
    pub tree: Option<TreeParams>,
    /// `expected_tokens / round_ms`, tokens/s.
    pub tok_per_s: f64,
}

/// The chosen K and every candidate's model.
#[derive(Debug, Clone, PartialEq)]
pub struct WidthChoice {
    /// The candidate with the most modelled tokens per second.
    pub best: WidthCandidate,
    /// All candidates, by K.
    pub candidates: Vec<WidthCandidate>,
    /// The client costs they were modelled with.
    pub client: ClientCosts,
    /// The acceptance prior α they were modelled with.
    pub alpha: f64,
}

/// Models every K in `1..=drafts.k_max` as a chain (and a tree with
/// [`DraftLimits::trees`]) at prior `alpha` (clamped to [0, 1]) and picks
/// the fastest.
///
/// Errors: [`PrivateError::Helora`] when no plan fits a width;
/// [`PrivateError::WidthModel`] when `k_max` is 0 or `client.forward_ms`
/// has fewer than `k_max + 1` entries.
pub fn choose_width(
    space: &PlanSpace,
    sizes: &WireSizes,
    link: &LinkProfile,
    client: &ClientCosts,
    alpha: f64,
    drafts: DraftLimits,
    fixed: FixedPoint,
) -> Result<WidthChoice, PrivateError> {
    let k_max = drafts.k_max;
    if k_max == 0 || client.forward_ms.len() < k_max + 1 {
        return Err(PrivateError::WidthModel {
            k_max,
            needed: k_max + 1,
            timed: client.forward_ms.len(),
        });
    }
    let mut candidates = Vec::with_capacity(k_max);
    let fusions: Vec<PlanSpace> = (1..=Grouping::MAX_LAYERS)
        .filter_map(|n| space.by_layers(n))
        .collect();
    let ranks = RankAcceptance::from_first(alpha);
    for k in 1..=k_max {
        let plans = space.plans(k + 1)?;
        let ratio = space.server_cost_ratio;
        let pass = PassModel::of_plans(&plans, sizes, ratio)?;
        let forward_ms = client.forward_ms[k];
        // The offer's own session keeps its grouping; else the fastest run length.
        let own = space.is_own_width(k + 1);
        let fused_passes = if own {
            Vec::new()
        } else {
            fusions
                .iter()
                .map(|f| {
                    Ok((
                        f.grouping,
                        PassModel::of_plans(&f.plans(k + 1)?, sizes, ratio)?,
                    ))
                })
                .collect::<Result<Vec<_>, PrivateError>>()?
        };
        let round = |draft_ms: f64| -> (ScheduleChoice, Grouping) {
            let mut schedule =
                choose_schedule_grouped(&pass, &pass, link, forward_ms, draft_ms, fixed);
            if own {
                return (schedule, space.grouping);
            }
            let mut grouping = Grouping::ByInput;
            for (fused, fused_pass) in &fused_passes {
                let c =
                    choose_schedule_grouped(&pass, fused_pass, link, forward_ms, draft_ms, fixed);
                if c.fixed_point_ms < schedule.fixed_point_ms {
                    schedule = c;
                    grouping = *fused;
                }
            }
            if !matches!(schedule.schedule, Schedule::FixedPoint(_)) {
                grouping = Grouping::ByInput;
            }
            (schedule, grouping)
        };
        let candidate = |(schedule, grouping): (ScheduleChoice, Grouping),
                         expected: f64,
                         tree: Option<TreeParams>| {
            let round_ms = schedule.per_group_ms.min(schedule.fixed_point_ms);
            WidthCandidate {
                k,
                schedule,
                grouping,
                round_ms,
                expected_tokens: expected,
                tree,
                tok_per_s: expected / round_ms.max(1e-9) * 1e3,
            }
        };
        let chain = candidate(
            round(k as f64 * client.draft_ms),
            expected_tokens(alpha, k),
            None,
        );
        // The same width as a tree: more tokens, its own drafting time.
        let tree = match drafts.trees {
            Some(limits) => {
                let estimate = best_tree(&ranks, k, &limits);
                if estimate.is_chain() {
                    None
                } else {
                    let draft_ms = tree_draft_ms(&estimate, &limits, client);
                    Some(candidate(round(draft_ms), estimate.tokens, Some(limits)))
                }
            }
            None => None,
        };
        candidates.push(match tree {
            Some(t) if t.tok_per_s > chain.tok_per_s => t,
            _ => chain,
        });
    }
    let best = *candidates
        .iter()
        .max_by(|a, b| a.tok_per_s.total_cmp(&b.tok_per_s))
        .unwrap_or(&candidates[0]);
    Ok(WidthChoice {
        best,
        candidates,
        client: client.clone(),
        alpha,
    })
}

/// A tree's drafting time, ms (levels wider than one as one batched pass).
fn tree_draft_ms(estimate: &TreeEstimate, limits: &TreeParams, client: &ClientCosts) -> f64 {
    // The root, then every level whose nodes get children.
    let fed = estimate
        .widths
        .iter()
        .take(estimate.widths.len().saturating_sub(1));
    client.draft_ms
        + fed
            .map(|&w| match w.min(limits.branch.max(1)) {
                1 => client.draft_ms,
                n => client
                    .forward_ms
                    .get(n - 1)
                    .or(client.forward_ms.last())
                    .copied()
                    .unwrap_or(client.draft_ms),
            })
            .sum::<f64>()
}

impl WidthChoice {
    /// The same candidates priced for the per-group schedule only (forced, or a client whose passes
    /// the fixed point cannot certify): every round at its per-group time, grouped by input, and the
    /// best of them.
    #[must_use]
    pub fn per_group(mut self) -> Self {
        for c in &mut self.candidates {
            c.round_ms = c.schedule.per_group_ms;
            c.tok_per_s = c.expected_tokens / c.round_ms.max(1e-9) * 1e3;
            c.grouping = Grouping::ByInput;
            c.schedule.schedule = Schedule::PerGroup;
            c.schedule.sampled = Schedule::PerGroup;
        }
        if let Some(best) = self
            .candidates
            .iter()
            .max_by(|a, b| a.tok_per_s.total_cmp(&b.tok_per_s))
        {
            self.best = *best;
        }
        self
    }
}

impl WidthCandidate {
    /// The verify session's grouping under `forced` (`--schedule`; `None`: modelled).
    #[must_use]
    pub fn grouping_for(&self, space: &PlanSpace, forced: Option<&Schedule>) -> Grouping {
        match forced {
            _ if space.is_own_width(self.k + 1) => space.grouping,
            None => self.grouping,
            Some(Schedule::PerGroup) => Grouping::ByInput,
            Some(Schedule::FixedPoint(_)) => match self.grouping {
                fused @ Grouping::ByLayers(_) => fused,
                Grouping::ByInput if space.by_layers(1).is_some() => Grouping::BY_LAYER,
                Grouping::ByInput => Grouping::ByInput,
            },
        }
    }
}

/// Widths whose passes [`time_client`] times: 1, 2, 3, then doubling (5, 9, 17, …), and `t_max`.
fn timed_widths(t_max: usize) -> Vec<usize> {
    let mut ts: Vec<usize> = [1, 2, 3]
        .into_iter()
        .chain(std::iter::successors(Some(5usize), |t| Some(2 * t - 1)))
        .take_while(|&t| t < t_max)
        .collect();
    ts.push(t_max);
    ts
}

/// `forward_ms[t − 1]` for every `t` in `1..=t_max`, linear between the timed widths `ts`
/// (ascending, from 1 to `t_max`) and their times `ms`.
fn interpolate(ts: &[usize], ms: &[f64], t_max: usize) -> Vec<f64> {
    (1..=t_max)
        .map(|t| {
            let i = ts.partition_point(|&x| x < t);
            if ts[i] == t {
                return ms[i];
            }
            let (t0, t1) = (ts[i - 1] as f64, ts[i] as f64);
            let w = (t as f64 - t0) / (t1 - t0);
            ms[i - 1] + w * (ms[i] - ms[i - 1])
        })
        .collect()
}

/// Times one plaintext pass of `model` at the widths of [`timed_widths`] (best of two; a pass's
/// time is close to affine in its width, so the widths between are interpolated) and one draft
/// step of `drafter`: `forward_ms` covers every width `1..=t_max`. Errors:
/// [`PrivateError::Model`]; `t_max` = 0 gives an empty `forward_ms`.
pub fn time_client(
    model: &cipherlora_model::Model,
    drafter: &cipherlora_model::Model,
    t_max: usize,
) -> Result<ClientCosts, PrivateError> {
    // The better of two timings of each pass (the first may pay warm-up).
    let pass = |m: &cipherlora_model::Model, t: usize| -> Result<f64, PrivateError> {
        Ok(time_pass(m, t)?.min(time_pass(m, t)?))
    };
    let forward_ms = if t_max == 0 {
        Vec::new()
    } else {
        let ts = timed_widths(t_max);
        let ms = ts
            .iter()
            .map(|&t| pass(model, t))
            .collect::<Result<Vec<_>, _>>()?;
        interpolate(&ts, &ms, t_max)
    };
    Ok(ClientCosts {
        forward_ms,
        draft_ms: pass(drafter, 1)?,
    })
}

/// [`choose_width`] for a client about to open its verify session, from an
/// offer it holds, its timed passes, the engine's wire sizes and the
/// [`acceptance_prior`] with its [`default_fixed_point`].
///
/// Errors: as [`choose_width`] and [`time_client`]; [`PrivateError::Ckks`].
pub fn choose_width_for_client(
    space: &PlanSpace,
    model: &cipherlora_model::Model,
    drafter: &cipherlora_model::Model,
    link: &LinkProfile,
    alpha: Option<f64>,
    drafts: DraftLimits,
) -> Result<WidthChoice, PrivateError> {
    let client = time_client(model, drafter, drafts.k_max + 1)?;
    choose_width_on_costs(space, &client, link, alpha, drafts)
}

/// [`choose_width_for_client`] on passes timed before ([`time_client`] up to `drafts.k_max + 1`
/// positions): pure computation, so it may run beside other work without skewing a timing.
///
/// Errors: as [`choose_width`]; [`PrivateError::Ckks`].
pub fn choose_width_on_costs(
    space: &PlanSpace,
    client: &ClientCosts,
    link: &LinkProfile,
    alpha: Option<f64>,
    drafts: DraftLimits,
) -> Result<WidthChoice, PrivateError> {
    let alpha = acceptance_prior(space, alpha);
    choose_width_priced(
        space,
        client,
        link,
        alpha,
        drafts,
        default_fixed_point(alpha),
    )
}

/// [`choose_width`] at the engine's wire sizes for `space`'s preset.
fn choose_width_priced(
    space: &PlanSpace,
    client: &ClientCosts,
    link: &LinkProfile,
    alpha: f64,
    drafts: DraftLimits,
    fixed: FixedPoint,
) -> Result<WidthChoice, PrivateError> {
    let ctx = Arc::new(Context::new(CkksParameters::preset(space.preset)?)?);
    let sizes = crate::schedule_plan::wire_sizes(&ctx)?;
    choose_width(space, &sizes, link, client, alpha, drafts, fixed)
}

/// [`choose_width`] with the client's passes timed here.
fn choose_width_timed(
    space: &PlanSpace,
    (model, drafter): (&cipherlora_model::Model, &cipherlora_model::Model),
    link: &LinkProfile,
    alpha: f64,
    drafts: DraftLimits,
    fixed: FixedPoint,
) -> Result<WidthChoice, PrivateError> {
    let client = time_client(model, drafter, drafts.k_max + 1)?;
    choose_width_priced(space, &client, link, alpha, drafts, fixed)
}

/// How a client with a fixed K (`--k N`) groups its verify session: as the
/// width model prefers at K ([`WidthCandidate::grouping_for`], `forced`
/// from `--schedule`), with the fixed point `auto` would run. The prior
/// does not enter the choice at one width.
///
/// Errors: as [`choose_width_for_client`] (K = 0 included).
pub fn grouping_for_given_k(
    space: &PlanSpace,
    (model, drafter): (&cipherlora_model::Model, &cipherlora_model::Model),
    link: &LinkProfile,
    (k, alpha): (usize, Option<f64>),
    forced: Option<&Schedule>,
) -> Result<Grouping, PrivateError> {
    let fixed = match forced {
        Some(Schedule::FixedPoint(fp)) => *fp,
        _ => auto_fixed_point(space, alpha),
    };
    let choice = choose_width_timed(space, (model, drafter), link, 0.5, k.into(), fixed)?;
    let candidate = choice
        .candidates
        .iter()
        .find(|c| c.k == k)
        .unwrap_or(&choice.best);
    Ok(candidate.grouping_for(space, forced))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn timed_widths_start_dense_then_double_and_end_at_t_max() {
        assert_eq!(timed_widths(1), vec![1]);
        assert_eq!(timed_widths(2), vec![1, 2]);
        assert_eq!(timed_widths(6), vec![1, 2, 3, 5, 6]);
        assert_eq!(timed_widths(9), vec![1, 2, 3, 5, 9]);
        assert_eq!(timed_widths(17), vec![1, 2, 3, 5, 9, 17]);
        assert_eq!(timed_widths(33), vec![1, 2, 3, 5, 9, 17, 33]);
    }

    proptest! {
        /// Pass times affine in the width are reproduced at every width; timed widths keep their time.
        #[test]
        fn interpolation_is_exact_on_affine_times(a in 0.0f64..500.0, b in 0.0f64..50.0, t_max in 1usize..40) {
            let ts = timed_widths(t_max);
            let ms: Vec<f64> = ts.iter().map(|&t| a + b * t as f64).collect();
            let all = interpolate(&ts, &ms, t_max);
            prop_assert_eq!(all.len(), t_max);
            for (i, v) in all.iter().enumerate() {
                let want = a + b * (i + 1) as f64;
                prop_assert!((v - want).abs() <= 1e-9 * want.max(1.0), "t = {}: {} vs {}", i + 1, v, want);
            }
            for (t, m) in ts.iter().zip(&ms) {
                prop_assert_eq!(all[t - 1], *m);
            }
        }
    }

    /// The default model's q,k,v,o groups at rank 16, 30 layers.
    fn space(mode: Mode) -> PlanSpace {
        let qkv = GroupShape::new(576, vec![576, 192, 192], vec![16, 16, 16]).unwrap();
        let o = GroupShape::new(576, vec![576], vec![16]).unwrap();
        PlanSpace {
            preset: Preset::N8192Depth2Fast,
            mode,
            rerandomize: false,
            shapes: (0..30).flat_map(|_| [qkv.clone(), o.clone()]).collect(),
            layers: (0..30).flat_map(|l| [l, l]).collect(),
            grouping: Grouping::ByInput,
            server_cost_ratio: 1.0,
            width: None,
            acceptance: None,
        }
    }

    fn sizes() -> WireSizes {
        // Seeded uploads by level, a compressed download, one Galois key.
        WireSizes {
            up: [51e3, 92e3, 133e3, 174e3],
            up_coarse: [51e3, 92e3, 133e3, 174e3],
            down: 79e3,
            down_coarse: 61e3,
            key: 786e3,
        }
    }

    /// Client passes that cost 40 ms plus 4 ms per position.
    fn client() -> ClientCosts {
        ClientCosts {
            forward_ms: (1..=24).map(|t| 40.0 + 4.0 * t as f64).collect(),
            draft_ms: 12.0,
        }
    }

    /// [`choose_width`] of `space` on `link` at `alpha`, K ≤ 16, costs above.
    fn model(space: &PlanSpace, link: &LinkProfile, alpha: f64) -> WidthChoice {
        choose_width(
            space,
            &sizes(),
            link,
            &client(),
            alpha,
            16.into(),
            FixedPoint::default(),
        )
        .unwrap()
    }

    #[test]
    fn priced_per_group_every_candidate_runs_per_group_and_the_fastest_is_best() {
        for mode in [Mode::Ffa, Mode::Standard] {
            let modelled = model(&space(mode), &LinkProfile::WAN80, 0.8);
            let c = modelled.clone().per_group();
            assert_eq!(c.candidates.len(), modelled.candidates.len());
            for (x, m) in c.candidates.iter().zip(&modelled.candidates) {
                assert_eq!(x.schedule.schedule, Schedule::PerGroup);
                assert_eq!(x.grouping, Grouping::ByInput);
                assert_eq!(x.round_ms, m.schedule.per_group_ms);
                assert!(x.round_ms >= m.round_ms, "{mode:?}, K = {}", x.k);
            }
            let fastest = c
                .candidates
                .iter()
                .map(|x| x.tok_per_s)
                .fold(f64::MIN, f64::max);
            assert_eq!(c.best.tok_per_s, fastest, "{mode:?}");
            // At 80 ms the fixed point is cheaper somewhere, so pricing per group changes the rounds.
            assert!(
                c.best.tok_per_s < modelled.best.tok_per_s,
                "{mode:?}: {} vs {}",
                c.best.tok_per_s,
                modelled.best.tok_per_s
            );
        }
    }

    #[test]
    fn output_ciphertexts_jump_between_widths_8_and_9_for_ffa() {
        // The step of the plans is what makes K = 7 worth considering.
        let s = space(Mode::Ffa);
        let downs = |t| {
            s.plans(t)
                .unwrap()
                .iter()
                .map(|p| p.counts().unwrap().decryptions)
                .sum::<u64>()
        };
        assert_eq!(downs(8), 60);
        assert_eq!(downs(9), 90);
    }

    #[test]
    fn a_bandwidth_bound_link_picks_a_width_before_a_step() {
        let c = model(&space(Mode::Ffa), &LinkProfile::WAN80, 0.9);
        // The best is at the end of a flat stretch of the step function.
        assert_eq!(c.candidates.len(), 16);
        let t = c.best.k + 1;
        let next = c
            .candidates
            .iter()
            .find(|x| x.k == c.best.k + 1)
            .map(|x| x.schedule.fixed_point_ms);
        assert!(
            next.is_none_or(|n| n > c.best.schedule.fixed_point_ms),
            "T = {t}: {c:?}"
        );
        assert!(c.candidates.iter().all(|x| x.tok_per_s <= c.best.tok_per_s));
    }

    /// Standard LoRA on wan20: a server publishing cheaper op costs gets the fixed point.
    #[test]
    fn a_faster_server_s_published_costs_choose_the_fixed_point_on_wan20() {
        let choose = |ratio| {
            let space = PlanSpace {
                server_cost_ratio: ratio,
                ..space(Mode::Standard)
            };
            model(&space, &LinkProfile::WAN20, 0.85)
        };
        let (default, fast) = (choose(1.0), choose(0.6));
        eprintln!("default {:?}\nfast {:?}", default.best, fast.best);
        for (d, f) in default.candidates.iter().zip(&fast.candidates) {
            assert!(f.schedule.fixed_point_ms < d.schedule.fixed_point_ms);
            assert!(f.schedule.per_group_ms < d.schedule.per_group_ms);
        }
        assert!(
            matches!(fast.best.schedule.schedule, Schedule::FixedPoint(_)),
            "{fast:?}"
        );
    }

    #[test]
    fn poor_acceptance_shortens_the_draft() {
        let at = |alpha| {
            model(&space(Mode::Standard), &LinkProfile::LOOPBACK, alpha)
                .best
                .k
        };
        assert!(
            at(0.3) < at(0.95),
            "α = 0.3: {}, α = 0.95: {}",
            at(0.3),
            at(0.95)
        );
    }

    /// The client's prior wins, then the adapter's hint, then the default.
    #[test]
    fn the_adapter_s_published_hint_is_the_prior_unless_the_client_gives_one() {
        let hinted = PlanSpace {
            acceptance: Some(0.3),
            ..space(Mode::Standard)
        };
        assert_eq!(acceptance_prior(&hinted, Some(0.95)), 0.95);
        assert_eq!(acceptance_prior(&hinted, None), 0.3);
        assert_eq!(
            acceptance_prior(&space(Mode::Standard), None),
            DEFAULT_ACCEPTANCE_PRIOR
        );
        let k = |space: &PlanSpace| {
            let alpha = acceptance_prior(space, None);
            model(space, &LinkProfile::LOOPBACK, alpha).best.k
        };
        assert!(k(&hinted) < k(&space(Mode::Standard)));
    }

    /// The prior picks two shadowed trips or three shadowed ones; on wan20 the model picks the two.
    #[test]
    fn a_high_agreement_prior_runs_two_shadowed_trips_and_prices_them() {
        let two = default_fixed_point(0.9);
        assert_eq!((two.round_trips, two.shadow), (2, true));
        assert!(two.drafter_estimates);
        assert_eq!(default_fixed_point(SHADOWED_TWO_TRIPS_MIN_ACCEPTANCE), two);
        let three = FixedPoint {
            shadow: true,
            ..FixedPoint::default()
        };
        assert_eq!(default_fixed_point(0.84), three);
        assert_eq!(default_fixed_point(DEFAULT_ACCEPTANCE_PRIOR), three);
        for mode in [Mode::Ffa, Mode::Standard] {
            let s = space(mode);
            let with = |fixed| {
                choose_width(
                    &s,
                    &sizes(),
                    &LinkProfile::WAN20,
                    &client(),
                    0.9,
                    16.into(),
                    fixed,
                )
                .unwrap()
            };
            let (three, shadowed) = (with(three), with(two));
            for (a, b) in three.candidates.iter().zip(&shadowed.candidates) {
                assert!(
                    b.schedule.fixed_point_ms < a.schedule.fixed_point_ms,
                    "{mode:?} K = {}: {b:?} vs {a:?}",
                    a.k
                );
            }
            assert_eq!(
                shadowed.best.schedule.schedule,
                Schedule::FixedPoint(two),
                "{mode:?}: {:?}",
                shadowed.best
            );
        }
    }

    #[test]
    fn too_few_timed_widths_is_an_error_not_a_panic() {
        let mut c = client();
        c.forward_ms.truncate(4);
        let r = choose_width(
            &space(Mode::Ffa),
            &sizes(),
            &LinkProfile::WAN20,
            &c,
            0.8,
            8.into(),
            FixedPoint::default(),
        );
        assert!(matches!(r, Err(PrivateError::WidthModel { .. })), "{r:?}");
    }

    /// [`choose_width`] with default tree limits, K ≤ `k_max`, on loopback.
    fn with_trees(
        space: &PlanSpace,
        client: &ClientCosts,
        alpha: f64,
        k_max: usize,
    ) -> WidthChoice {
        let drafts = DraftLimits {
            k_max,
            trees: Some(TreeParams::default()),
        };
        let link = LinkProfile::LOOPBACK;
        choose_width(
            space,
            &sizes(),
            &link,
            client,
            alpha,
            drafts,
            FixedPoint::default(),
        )
        .unwrap()
    }

    /// At the base drafter's acceptance the model keeps chains up to K = 16.
    #[test]
    fn a_strong_drafter_keeps_chains() {
        for mode in [Mode::Ffa, Mode::Standard] {
            let s = space(mode);
            let trees = with_trees(&s, &client(), 0.88, 16);
            assert!(
                trees.candidates.iter().all(|c| c.tree.is_none()),
                "{mode:?}"
            );
            assert_eq!(trees.best, model(&s, &LinkProfile::LOOPBACK, 0.88).best);
        }
    }

    /// A weak drafter (0.6): trees win at wide T where batched levels are cheap.
    #[test]
    fn a_weak_drafter_gets_a_tree_unless_its_levels_are_dear() {
        let s = space(Mode::Ffa);
        let cheap = ClientCosts {
            forward_ms: vec![12.0; 24],
            draft_ms: 12.0,
        };
        let c = with_trees(&s, &cheap, 0.6, 16);
        let at16 = c.candidates.iter().find(|c| c.k == 16).unwrap();
        assert_eq!(at16.tree, Some(TreeParams::default()), "{at16:?}");
        let chain = expected_tokens(0.6, 16);
        let tree = best_tree(&RankAcceptance::from_first(0.6), 16, &TreeParams::default());
        assert_eq!(at16.expected_tokens, tree.tokens);
        assert!(at16.expected_tokens > 1.1 * chain);
        let dear = ClientCosts {
            forward_ms: vec![5_000.0; 24],
            draft_ms: 12.0,
        };
        let c = with_trees(&s, &dear, 0.6, 16);
        assert!(c.candidates.iter().all(|c| c.tree.is_none()), "{c:?}");
    }

    /// A tree's drafting: the deepest level is not fed.
    #[test]
    fn a_tree_s_drafting_is_priced_by_its_levels() {
        let client = ClientCosts {
            forward_ms: vec![100.0, 200.0, 300.0, 400.0, 500.0],
            draft_ms: 10.0,
        };
        let limits = TreeParams {
            branch: 3,
            max_depth: 8,
        };
        let estimate = TreeEstimate {
            tokens: 0.0,
            depth: 4,
            widths: vec![2, 5, 1, 1],
        };
        // Root 10 + 200 + 300 (5 nodes capped at 3) + 10; level 4 is not fed.
        assert_eq!(tree_draft_ms(&estimate, &limits, &client), 520.0);
        let chain = TreeEstimate {
            tokens: 0.0,
            depth: 3,
            widths: vec![1, 1, 1],
        };
        assert_eq!(tree_draft_ms(&chain, &limits, &client), 30.0);
    }

    /// Regression: a verify width equal to the prefill width is priced with that session's grouping.
    #[test]
    fn a_verify_width_equal_to_the_offer_s_keeps_the_offer_s_grouping() {
        let choose = |width| {
            let space = PlanSpace {
                width,
                ..space(Mode::Ffa)
            };
            model(&space, &LinkProfile::HOME80, 0.85)
        };
        let (free, shared) = (choose(None), choose(Some(16)));
        let (f15, s15) = (&free.candidates[14], &shared.candidates[14]);
        assert_eq!((f15.k, s15.k), (15, 15));
        assert!(matches!(f15.grouping, Grouping::ByLayers(_)), "{f15:?}");
        assert_eq!(s15.grouping, Grouping::ByInput, "{s15:?}");
        assert!(s15.round_ms > f15.round_ms, "{s15:?} vs {f15:?}");
        // Every other width is modelled as before.
        for (f, s) in free.candidates.iter().zip(&shared.candidates) {
            if f.k != 15 {
                assert_eq!(f, s);
            }
        }
        let space = PlanSpace {
            width: Some(16),
            ..space(Mode::Ffa)
        };
        let forced = Schedule::FixedPoint(FixedPoint::default());
        assert_eq!(s15.grouping_for(&space, Some(&forced)), Grouping::ByInput);
        let k14 = &shared.candidates[13];
        assert!(matches!(k14.grouping, Grouping::ByLayers(_)), "{k14:?}");
        assert_eq!(k14.grouping_for(&space, Some(&forced)), k14.grouping);
    }

    /// Runs of n adapted layers: ⌈30/n⌉ shapes keyed by the run's first layer.
    #[test]
    fn by_layers_fuses_runs_of_n_adapted_layers() {
        let s = space(Mode::Ffa);
        for n in 1..=Grouping::MAX_LAYERS {
            let f = s.by_layers(n).unwrap();
            assert_eq!(f.grouping, Grouping::ByLayers(n));
            assert_eq!(f.shapes.len(), 30usize.div_ceil(n), "n = {n}");
            let first: Vec<usize> = (0..30).step_by(n).collect();
            assert_eq!(f.layers, first);
            let layers_in = |i: usize| (30 - first[i]).min(n);
            for (i, shape) in f.shapes.iter().enumerate() {
                assert_eq!(shape.d_in, 1152 * layers_in(i));
                assert_eq!(shape.d_outs.len(), 4 * layers_in(i));
                assert_eq!(&shape.d_outs[..4], &[576, 192, 192, 576]);
            }
            // Fusing is idempotent; a space fused one way is not re-fused.
            assert_eq!(f.by_layers(n).as_ref(), Some(&f));
            assert!(f.by_layers(n % Grouping::MAX_LAYERS + 1).is_none());
        }
        // Layers 0, 2 and 5 adapted: runs of two adapted layers.
        let sparse = PlanSpace {
            shapes: s.shapes[..6].to_vec(),
            layers: vec![0, 0, 2, 2, 5, 5],
            ..s.clone()
        };
        assert_eq!(sparse.by_layers(2).unwrap().layers, [0, 5]);
        for bad in [0, Grouping::MAX_LAYERS + 1] {
            assert!(s.by_layers(bad).is_none());
        }
        assert!(space(Mode::Standard).by_layers(2).is_none());
    }

    /// More layers per request upload about 1/n as much; upload-bound links group several.
    #[test]
    fn an_upload_bound_link_groups_several_layers_per_request() {
        let s = space(Mode::Ffa);
        let up = |n: usize| {
            let plans = s.by_layers(n).unwrap().plans(8).unwrap();
            PassModel::of_plans(&plans, &sizes(), 1.0).unwrap().bytes_up
        };
        let one = up(1);
        for n in 2..=Grouping::MAX_LAYERS {
            let expected = one * 30usize.div_ceil(n) as f64 / 30.0;
            assert!(
                (up(n) - expected).abs() < 1.0,
                "n = {n}: {} vs {expected}",
                up(n)
            );
        }
        let c = model(&s, &LinkProfile::HOME80, 0.85);
        assert!(
            matches!(c.best.grouping, Grouping::ByLayers(n) if n >= 2),
            "{:?}",
            c.best
        );
    }
}

//! Choosing the verify width T = K + 1 from the link, the plans' costs and
//! an acceptance prior.
//!
//! # The model
//! A round that drafts K tokens, each accepted with probability α, yields
//! `E(K) = (1 − α^(K+1)) / (1 − α)` tokens (Leviathan et al., "Fast
//! Inference from Transformers via Speculative Decoding", ICML 2023, Eq. 1)
//! and costs K draft steps and one verify round of T = K + 1 positions,
//! modelled as in [`crate::schedule_plan`] (the cheaper of the per-group and
//! the fixed-point schedule on the link, with the plans the server's planner
//! picks for width T; a fixed point drafts the next round while its last
//! trip is on the network, so only the drafting that outlasts that wait
//! counts). K is the one that maximises `E(K) / round`.
//!
//! # Why it is worth choosing
//! The cost of a verify round is a step function of T: a returned
//! ciphertext holds `⌊slots / T'⌋` output dimensions of every position
//! (T' = ⌈T/2⌉ slot positions with two positions per complex slot,
//! [`cipherlora_helora::plan`]), so the number of ciphertexts per group —
//! bytes, server products and decryptions — jumps at a few widths and stays
//! flat between them. On the default model with a rank-16 q,k,v,o adapter,
//! FFA needs 2 output ciphertexts per layer at T ≤ 8, 3 at T = 9–12 and 5 at
//! T = 15–22 when each layer's groups travel alone: T = 8 moves a third
//! fewer bytes than T = 9 for one position less. Runs of several layers
//! with dense outputs ([`cipherlora_helora::Reach::TwoSided`]) need 1.5
//! per layer at T = 8. Which step wins depends on the link (bytes against round trips),
//! the client's speed (a pass of T positions) and α, so it is computed, not
//! fixed.
//!
//! # Chain or tree
//! With [`DraftLimits::trees`] set, each K is also modelled as a draft
//! tree of K nodes ([`cipherlora_spec::tree_plan`]: the best tree under
//! positional acceptance, the first choice's rate α and later ranks'
//! from [`RankAcceptance::from_first`]), drafted level by level: the root's
//! step and single-node levels at the drafter's step cost, a level of w > 1
//! nodes as one pass of min(w, branch) positions of the verified model
//! (`tree_draft::grow` batches levels on the target's weights). The server
//! sees T = K + 1 positions either way, so the choice reveals nothing; it
//! trades tokens per round against drafting time, which a fixed point
//! hides behind its last trip only as far as that trip lasts. With the
//! base drafter over the adapted prefix (α ≈ 0.85–0.9 in context) the
//! model keeps chains up to T ≈ 17 and prices trees at 1.08× (T = 32) and
//! 1.22× (T = 64) a chain, against 1.17× and 1.23× measured; at the
//! widths the link and the server make worth verifying, a tree's batched
//! levels cost more than its few extra tokens, so the model keeps chains
//! for every committed adapter (BENCHMARKS.md, "Chain or tree: the
//! planner").
//!
//! # The acceptance prior
//! α is the client's `--acceptance-prior` when given, else the hint the
//! adapter's owner publishes in the offer ([`SessionOffer::acceptance`],
//! the base drafter's measured per-token agreement with the adapted model on
//! the owner's text, from the adapter's `cipherlora.json`), else
//! [`DEFAULT_ACCEPTANCE_PRIOR`] ([`acceptance_prior`]). The geometric
//! model with one α undervalues long drafts where acceptance runs in
//! streaks (code: 3.43 tokens per round at K = 3 and 6.40 at K = 7, where
//! the α that fits K = 3, 0.90, predicts 5.7), so a hint near the measured
//! agreement errs towards shorter drafts.
//!
//! # What it reveals
//! K is fixed for the session before the first token, from the link, the
//! adapter's public shapes and published hint, the client's own timings and
//! a prior α — not from acceptance observed during generation — so the
//! verify width tells the server nothing about the text (it already sees T).

use std::sync::Arc;

use cipherlora_ckks::{CkksParameters, Context, Preset};
use cipherlora_helora::planner::choose;
use cipherlora_helora::{GroupPlan, GroupShape, Link, Mode, OpCosts};
use cipherlora_service::LinkProfile;
use cipherlora_spec::adaptive::expected_tokens;
use cipherlora_spec::schedule::{FixedPoint, Schedule};
use cipherlora_spec::tree_draft::TreeParams;
use cipherlora_spec::tree_plan::{RankAcceptance, TreeEstimate, best_tree};

use crate::PrivateError;
use crate::schedule_plan::{
    PassModel, ScheduleChoice, WireSizes, choose_schedule_grouped, time_pass,
};
use crate::server::{Grouping, LoraKind, SessionOffer, layer_runs};

/// What the client knows of the server's plans at any width: the preset,
/// the LoRA variant and the public shape of every adapted group (from any
/// one offer).
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
    /// Positions per pass of the session whose offer this is (`None` when
    /// no session stands behind the space). A verify session of that
    /// width *is* that session (`crate::connect_chosen_width` shares the
    /// prefill session when the widths coincide), so it keeps the offer's
    /// grouping: [`choose_width`] models it so.
    pub width: Option<usize>,
    /// The offer's [`SessionOffer::acceptance`] hint.
    pub acceptance: Option<f64>,
}

/// The per-token acceptance rate the width model assumes when neither the
/// client (`--acceptance-prior`) nor the adapter's offer gives one. Fitted
/// to the measured tokens per round with the Leviathan et al. formula, the
/// base drafter's acceptance is ≈ 0.9–0.93 on the committed code adapters
/// (5.65–6.4 tokens per round at K = 7) but ≈ 0.6–0.72 on general English
/// (`general-lora-r16`: 3.1 at K = 4 and 3.2 at K = 9; `general-all-r8`:
/// 2.5 at K = 5; BENCHMARKS.md, "General English across a network"). The
/// model's choice is flat between K = 5, 7 and 9 for standard LoRA, and
/// measured side by side K = 7 was the best or near it on code (loopback:
/// 1.24× K = 5; wan20: 1.03× K = 5, and 1.1× K = 9 in session 11) while
/// prose at wan20 lost 11 % at K = 9: 0.83 puts standard LoRA at K = 7 on
/// loopback, wan20 and wan80 (0.85 picked 9 on the WANs, 0.8 picked 5
/// everywhere).
pub const DEFAULT_ACCEPTANCE_PRIOR: f64 = 0.83;

/// The lowest acceptance prior α for which a client's default fixed point
/// is two trips per round certified against the cached rows' residual
/// ([`default_fixed_point`]). Two shadowed trips are exact where three
/// unshadowed ones have one measured divergence, and move two thirds of
/// the bytes and server work of three; what they cost is the shadow's
/// settlings, whose number is a property of the text: in plaintext, 5
/// prompts × 64 tokens at T = 8, the adapters whose base drafter agrees
/// 0.885–0.906 of the time (code) settled 1–2 times and kept 0.80–0.84 of
/// three trips' tokens per round, the two at 0.77 (prose) settled 13–16
/// times and kept 0.35 (BENCHMARKS.md, "Settling from the rows' own
/// deltas"). End to end on code, two shadowed trips were 1.2–1.3× three
/// (FFA at wan20 and wan80, standard LoRA at wan20). 0.85 sits between the
/// two measured groups; below it the client keeps three trips.
pub const SHADOWED_TWO_TRIPS_MIN_ACCEPTANCE: f64 = 0.85;

/// The fixed point a client runs when the schedule is `auto` (and models
/// when it chooses K), for acceptance prior `alpha` ([`acceptance_prior`]):
/// two trips per round with the shadow cache and the drafter's estimate
/// passes (`fixed-point:2/shadow/drafter-estimates`) from
/// [`SHADOWED_TWO_TRIPS_MIN_ACCEPTANCE`] on, else [`FixedPoint::default`]
/// (three trips). The prior is public (the client's own or the adapter's
/// published hint) and fixed before the first token, so the trips per
/// round tell the server nothing about the text.
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
        FixedPoint::default()
    }
}

/// The fixed point `auto` runs for a client with its own prior `given`
/// (if any) on `space`: [`default_fixed_point`] of the
/// [`acceptance_prior`].
#[must_use]
pub fn auto_fixed_point(space: &PlanSpace, given: Option<f64>) -> FixedPoint {
    default_fixed_point(acceptance_prior(space, given))
}

/// The α the width model uses (module docs, "The acceptance prior"): the
/// client's own `given` prior, else `space`'s published hint, else
/// [`DEFAULT_ACCEPTANCE_PRIOR`].
#[must_use]
pub fn acceptance_prior(space: &PlanSpace, given: Option<f64>) -> f64 {
    given
        .or(space.acceptance)
        .unwrap_or(DEFAULT_ACCEPTANCE_PRIOR)
}

impl PlanSpace {
    /// The space of `offer` (its width matters only to a verify session of
    /// the same width, [`PlanSpace::width`]).
    #[must_use]
    pub fn of(offer: &SessionOffer) -> Self {
        PlanSpace {
            preset: offer.preset,
            mode: match offer.kind {
                LoraKind::Ffa => Mode::Ffa,
                LoraKind::Standard => Mode::Standard,
            },
            rerandomize: offer.groups.iter().any(|g| g.plan.rerandomize),
            shapes: offer.groups.iter().map(|g| g.plan.shape.clone()).collect(),
            layers: offer.groups.iter().map(|g| g.layer).collect(),
            grouping: offer.grouping,
            server_cost_ratio: offer.server_cost_ratio,
            width: offer.groups.first().map(|g| g.plan.t),
            acceptance: offer.acceptance,
        }
    }

    /// Whether a verify session of `t` positions is the offer's own session
    /// ([`PlanSpace::width`]), which keeps the offer's grouping.
    #[must_use]
    pub fn is_own_width(&self, t: usize) -> bool {
        self.width == Some(t)
    }

    /// The same adapter grouped by runs of `n` layers, as a
    /// [`Grouping::ByLayers`]`(n)` offer would be (the server's
    /// `AdapterGroups::fuse_layers`): one shape per run of `n` adapted
    /// layers, the inputs concatenated and the projections listed in
    /// forward order. `None` for standard LoRA, whose offers stay by input,
    /// for `n` outside `1..=`[`Grouping::MAX_LAYERS`], and for a space
    /// already fused some other way.
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

    /// The plans a server with default op costs and link offers at width
    /// `t`, one per group (the server's own may differ where its measured
    /// costs tip a choice; the model needs only their order of magnitude).
    ///
    /// # Errors
    /// [`PrivateError::Helora`] when no plan fits T; [`PrivateError::Ckks`]
    /// for the preset.
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
    /// `forward_ms[t − 1]`: one plaintext pass of t positions of the
    /// verified model (t = 1 ..= the largest width considered).
    pub forward_ms: Vec<f64>,
    /// One draft step of the drafter.
    pub draft_ms: f64,
}

/// The drafts the width model chooses among.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DraftLimits {
    /// The largest K considered (≥ 1).
    pub k_max: usize,
    /// Draft trees of K nodes within these shape limits compete with
    /// chains of K drafts (module docs, "Chain or tree"); `None`: chains
    /// only.
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
    /// How the verify session should group the projections:
    /// [`Grouping::ByLayers`] when the fixed point wins and the adapter
    /// allows it (FFA), with the layers per group whose plans give the
    /// fastest fixed-point round (the time it is modelled on).
    pub grouping: Grouping,
    /// The cheaper schedule's round, its drafting included, ms.
    pub round_ms: f64,
    /// Expected tokens per round at the prior α (bonus token included).
    pub expected_tokens: f64,
    /// A draft tree of K nodes within these limits where the model
    /// prefers one to the chain of K drafts ([`DraftLimits::trees`]);
    /// `None`: a chain.
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

/// Models every K in `1..=drafts.k_max` (module docs), as a chain and,
/// with [`DraftLimits::trees`], as a tree, and picks the fastest.
///
/// `alpha` is the prior per-token acceptance rate (clamped to [0, 1]).
///
/// # Errors
/// [`PrivateError::Helora`] when no plan fits a width;
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
        // The offer's own session serves this width with the offer's
        // grouping: no fused alternative for it. Otherwise the fixed point
        // runs on whichever layers per group make its round fastest.
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
        // The schedule and grouping of a round at this width whose drafting
        // takes `draft_ms`.
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
        // The same width as a tree where the model spends nodes off the
        // chain: more tokens per round, its own drafting time.
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

/// The drafting time of a tree of `estimate`'s shape, ms: the root's step
/// and every single-node level at the drafter's step cost, every wider
/// level as one pass of min(width, branch) positions of the verified model
/// (module docs, "Chain or tree"). A chain's shape costs its K steps.
fn tree_draft_ms(estimate: &TreeEstimate, limits: &TreeParams, client: &ClientCosts) -> f64 {
    // Levels fed to the drafter: the root, then every level whose nodes
    // get children (all but the deepest).
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

impl WidthCandidate {
    /// The verify session's grouping when the schedule is `forced` (parsed
    /// from `--schedule`; `None` for `auto`, which keeps the modelled
    /// choice): for a forced fixed point the modelled layers per group, or
    /// one layer per group where the model chose per-group and `space`
    /// allows it; by input for a forced per-group schedule.
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

/// Times the client side for [`choose_width`]: one plaintext pass of each
/// width `1..=t_max` of `model` (the best of two) and one draft step of
/// `drafter`.
///
/// # Errors
/// [`PrivateError::Model`] when a pass fails.
pub fn time_client(
    model: &cipherlora_model::Model,
    drafter: &cipherlora_model::Model,
    t_max: usize,
) -> Result<ClientCosts, PrivateError> {
    // The better of two timings of each pass (the first may pay warm-up).
    let pass = |m: &cipherlora_model::Model, t: usize| -> Result<f64, PrivateError> {
        Ok(time_pass(m, t)?.min(time_pass(m, t)?))
    };
    let forward_ms = (1..=t_max)
        .map(|t| pass(model, t))
        .collect::<Result<_, _>>()?;
    Ok(ClientCosts {
        forward_ms,
        draft_ms: pass(drafter, 1)?,
    })
}

/// [`choose_width`] for a client about to open its verify session: the
/// plan space of an offer it already holds (e.g. its prefill session's),
/// its own timed passes ([`time_client`]), the engine's wire sizes, and the
/// [`acceptance_prior`] of `alpha` (the client's own, if any) and the
/// offer's hint, with that prior's [`default_fixed_point`].
///
/// # Errors
/// As [`choose_width`] and [`time_client`]; [`PrivateError::Ckks`] for the
/// preset.
pub fn choose_width_for_client(
    space: &PlanSpace,
    model: &cipherlora_model::Model,
    drafter: &cipherlora_model::Model,
    link: &LinkProfile,
    alpha: Option<f64>,
    drafts: DraftLimits,
) -> Result<WidthChoice, PrivateError> {
    let alpha = acceptance_prior(space, alpha);
    let client_side = (model, drafter);
    choose_width_timed(
        space,
        client_side,
        link,
        alpha,
        drafts,
        default_fixed_point(alpha),
    )
}

/// [`choose_width`] with the client's passes timed here and the engine's
/// wire sizes.
fn choose_width_timed(
    space: &PlanSpace,
    (model, drafter): (&cipherlora_model::Model, &cipherlora_model::Model),
    link: &LinkProfile,
    alpha: f64,
    drafts: DraftLimits,
    fixed: FixedPoint,
) -> Result<WidthChoice, PrivateError> {
    let ctx = Arc::new(Context::new(CkksParameters::preset(space.preset)?)?);
    let sizes = crate::schedule_plan::wire_sizes(&ctx)?;
    let client = time_client(model, drafter, drafts.k_max + 1)?;
    choose_width(space, &sizes, link, &client, alpha, drafts, fixed)
}

/// How a client with a given K (`--k N`) groups its verify session's
/// requests: as the width model prefers at that width (the model up to K,
/// then [`WidthCandidate::grouping_for`] of its candidate for K, `forced`
/// the schedule from `--schedule`). With dense FFA outputs
/// ([`cipherlora_helora::Reach::TwoSided`]) runs of several layers return
/// a quarter fewer ciphertexts per layer than one layer at T = 8. The
/// fixed point modelled is the forced one, else the
/// [`default_fixed_point`] of the [`acceptance_prior`] of `alpha` (the
/// client's own, if any) and the offer's hint: the one `auto` runs.
///
/// The prior otherwise only weighs widths against each other (a
/// candidate's expected tokens), never the schedule or the grouping at one
/// width, so it does not enter the choice at K.
///
/// # Errors
/// As [`choose_width_for_client`] (K = 0 included).
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
        // Seeded uploads by level, a compressed download (measured sizes of
        // the N = 8192 preset, BENCHMARKS.md), one Galois key.
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

    /// [`choose_width`] of `space` on `link` at prior `alpha`, K ≤ 16, with
    /// the sizes and client costs above and the default fixed point.
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
    fn output_ciphertexts_jump_between_widths_8_and_9_for_ffa() {
        // The step the module docs describe, read from the plans
        // themselves: it is what makes K = 7 worth considering.
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
        // Every candidate is modelled; the best is at the end of a flat
        // stretch of the step function (T = 8, 12 or 22 for FFA): one more
        // position there would cost another ciphertext per group.
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

    /// Standard LoRA on wan20 (measured, session 12: the per-group schedule
    /// at 1.34 tok/s where three fixed-point trips gave ≈ 2.1): priced at
    /// the default op costs the server's work makes the fixed point look
    /// dear; a server that publishes its costs as 0.6 of the defaults (this
    /// project's machine measured ≈ 1 / 1.7) gets the fixed point chosen.
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

    /// The client's own prior wins, then the adapter's published hint,
    /// then the default; a hint changes the modelled choice as a prior
    /// does.
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

    /// A prior at or above [`SHADOWED_TWO_TRIPS_MIN_ACCEPTANCE`] makes the
    /// default fixed point two shadowed trips, below it three plain ones;
    /// on wan20 the two trips' round is modelled cheaper at every K, and
    /// the width model, given that fixed point, picks it.
    #[test]
    fn a_high_agreement_prior_runs_two_shadowed_trips_and_prices_them() {
        let two = default_fixed_point(0.9);
        assert_eq!((two.round_trips, two.shadow), (2, true));
        assert!(two.drafter_estimates);
        assert_eq!(default_fixed_point(SHADOWED_TWO_TRIPS_MIN_ACCEPTANCE), two);
        assert_eq!(default_fixed_point(0.84), FixedPoint::default());
        assert_eq!(default_fixed_point(DEFAULT_ACCEPTANCE_PRIOR).round_trips, 3);
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
            let (three, shadowed) = (with(FixedPoint::default()), with(two));
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

    /// [`choose_width`] with trees of the default shape limits allowed, K ≤
    /// `k_max`, on loopback (no link time to hide drafting behind).
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

    /// The base drafter over the adapted prefix agrees ≈ 0.85–0.9 of the
    /// time: the model keeps chains at every width up to 16 (measured on
    /// prose at T = 16: trees 1.02× a chain), so allowing trees changes
    /// nothing.
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

    /// A weak drafter (first choice 0.6): at a wide T the model spends
    /// nodes on second choices; where batched levels cost what a draft
    /// step costs the tree wins at that width, where a level is dear (a
    /// slow client's batched pass) the chain stays.
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

    /// The drafting a tree costs: the root and single-node levels at a
    /// draft step, wider levels as a batched pass of at most `branch`
    /// positions, the deepest level not fed.
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
        // Root 10 + level 1 (2 nodes) 200 + level 2 (5, capped at 3) 300
        // + level 3 (1) 10; level 4 is not fed.
        assert_eq!(tree_draft_ms(&estimate, &limits, &client), 520.0);
        let chain = TreeEstimate {
            tokens: 0.0,
            depth: 3,
            widths: vec![1, 1, 1],
        };
        assert_eq!(tree_draft_ms(&chain, &limits, &client), 30.0);
    }

    /// Regression (session 14, `bench e2e --links home80`): the model
    /// priced K = 15 with one upload per layer (by layer), but a verify
    /// width equal to the prefill width shares the prefill session, which
    /// is grouped by input: two uploads per layer, and the run uploaded
    /// twice what the model said. That width is now modelled with its
    /// session's grouping.
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

    /// Runs of n adapted layers: ⌈30/n⌉ shapes, each the sum of its
    /// layers' inputs and the concatenation of their outputs, keyed by the
    /// run's first layer; unadapted layers do not count towards a run (as
    /// on the server, `layer_runs`).
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
            // Fusing is idempotent, and a space fused one way is not
            // re-fused another.
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

    /// More layers per request: one upload per run instead of per layer,
    /// so a pass uploads about 1/n as much; and on an upload-bound home
    /// link the model groups several layers per request.
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

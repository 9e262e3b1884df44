//! One way to open a private session: [`connect`] chooses the verify width
//! K + 1, the draft shape, the grouping of the verify session's requests and
//! the verify schedule from the link, the server's offer and the acceptance
//! prior, and opens a prefill session and a verify session on the adapter
//! server. `generate`, `api`, `demo` and `bench e2e` all open theirs here,
//! over gRPC ([`crate::remote::connect`]).
//!
//! The order follows what each choice needs: an offer first (it carries
//! the plan space the width model prices and, with
//! [`PrefillWidth::Auto`], the shapes the prefill width is chosen from),
//! the client's passes timed, then the prefill session opening (keys
//! uploaded, plans prepared on the server) while the width model computes,
//! then the verify session beside it, then the schedule, which the width
//! model's round model and the open sessions' plans decide.

use std::sync::Arc;

use cipherlora_model::{Model, ModelConfig};
use cipherlora_service::LinkProfile;
use cipherlora_speculative::schedule::Schedule;
use cipherlora_speculative::tree_draft::TreeParams;

use crate::PrivateError;
use crate::client::width_plan::{
    ClientCosts, DraftLimits, PlanSpace, WidthChoice, choose_width_on_costs, grouping_for_given_k,
    time_client,
};
use crate::client::{
    AUTO_CANDIDATES, ByWidth, HeHook, InProcess, PrefillWidth, ScheduleChoice, Transport,
    choose_for_session, choose_prefill_width,
};
use crate::protocol::Grouping;
use crate::server::HeAdapter;

/// How many tokens a verify round drafts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DraftLength {
    /// Exactly K (0: no drafts, one position per round).
    Fixed(usize),
    /// Chosen by the width model ([`choose_width_on_costs`]) when the
    /// session opens: K ≤ `k_max`, and a tree of at most `trees` instead of
    /// a chain where the model prefers one.
    Auto {
        /// The largest K considered.
        k_max: usize,
        /// Draft trees that compete with chains (`None`: chains only).
        trees: Option<TreeParams>,
    },
}

impl DraftLength {
    /// The largest K this can come to.
    #[must_use]
    pub fn max_k(&self) -> usize {
        match *self {
            DraftLength::Fixed(k) => k,
            DraftLength::Auto { k_max, .. } => k_max,
        }
    }
}

/// What [`connect`] needs to know.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Drafted tokens per verify round.
    pub draft: DraftLength,
    /// Per-token acceptance rate the width and schedule models assume
    /// (`None`: the adapter's published hint, else the default).
    pub acceptance_prior: Option<f64>,
    /// Positions per prefill request (the prefill session's width), given or chosen.
    pub prefill_width: PrefillWidth,
    /// A schedule to run instead of the modelled one.
    pub schedule: Option<Schedule>,
    /// A grouping of the verify session's requests to use instead of the
    /// modelled one (comparisons).
    pub grouping: Option<Grouping>,
    /// The link the models plan on (`None`: measured by the opener).
    pub planning_link: Option<LinkProfile>,
}

/// An open private session: the hook with one session per width, and
/// what was chosen for it.
pub struct PrivateSession<T: Transport> {
    /// The delta hook: the prefill session and the verify session.
    pub hook: ByWidth<T>,
    /// The verify width K + 1.
    pub verify_width: usize,
    /// The prefill session's width (the verify width where the server had no room for one).
    pub prefill_width: usize,
    /// The draft tree shape the width model chose (`None`: chains).
    pub tree: Option<TreeParams>,
    /// The verify schedule of greedy generations.
    pub schedule: Schedule,
    /// The verify schedule of sampled generations.
    pub sampled_schedule: Schedule,
    /// The link the models planned on (`None`: none was needed).
    pub link: Option<LinkProfile>,
    /// The width model's choice, when it made one.
    pub width_choice: Option<WidthChoice>,
    /// The schedule model's choice, when it made one.
    pub schedule_choice: Option<ScheduleChoice>,
}

impl<T: Transport> PrivateSession<T> {
    /// The schedule a generation runs: greedy or sampled.
    #[must_use]
    pub fn schedule_for(&self, greedy: bool) -> Schedule {
        if greedy {
            self.schedule
        } else {
            self.sampled_schedule
        }
    }
}

/// Two sessions' hooks ([`SessionOpener::open_pair`]).
pub type HookPair<T> = (HeHook<T>, HeHook<T>);

/// Opens sessions of one adapter on one server at a given width.
pub trait SessionOpener {
    /// The transport of the sessions it opens.
    type Transport: Transport;

    /// A session of width `t` whose requests are grouped by `grouping`
    /// (offer, fresh keys, key upload).
    ///
    /// # Errors
    /// The server's refusal or the transport's failure.
    fn open(
        &self,
        t: usize,
        grouping: Grouping,
        config: &ModelConfig,
    ) -> Result<HeHook<Self::Transport>, PrivateError>;

    /// The plans a session of width `t` grouped by `grouping` would run, without opening it
    /// (an offer, no keys).
    ///
    /// # Errors
    /// The server's refusal or the transport's failure.
    fn plan_space(&mut self, t: usize, grouping: Grouping) -> Result<PlanSpace, PrivateError>;

    /// Two sessions, `a` and `b` as (width, grouping). The default opens them one after the other;
    /// a network opener opens them at once, so one's key upload overlaps the other's preparation
    /// on the server.
    ///
    /// # Errors
    /// As [`SessionOpener::open`].
    fn open_pair(
        &mut self,
        a: (usize, Grouping),
        b: (usize, Grouping),
        config: &ModelConfig,
    ) -> Result<HookPair<Self::Transport>, PrivateError> {
        Ok((self.open(a.0, a.1, config)?, self.open(b.0, b.1, config)?))
    }

    /// The link to the server, measured (used when the options give none).
    ///
    /// # Errors
    /// When the server cannot be reached.
    fn measure_link(&self) -> Result<LinkProfile, PrivateError>;
}

/// Sessions on an adapter server in this process ([`InProcess`]), on a
/// given link: tests and examples.
pub struct InProcessOpener {
    /// The adapter server.
    pub server: Arc<HeAdapter>,
    /// The link [`SessionOpener::measure_link`] reports.
    pub link: LinkProfile,
}

impl SessionOpener for InProcessOpener {
    type Transport = InProcess;

    fn open(
        &self,
        t: usize,
        grouping: Grouping,
        config: &ModelConfig,
    ) -> Result<HeHook<InProcess>, PrivateError> {
        let offer = self.server.offer_grouped(t, grouping)?;
        HeHook::connect(&offer, config, |keys, _| {
            Ok(InProcess::new(Arc::new(
                self.server.open_session(&offer, keys)?,
            )))
        })
    }

    fn plan_space(&mut self, t: usize, grouping: Grouping) -> Result<PlanSpace, PrivateError> {
        Ok(PlanSpace::of(&self.server.offer_grouped(t, grouping)?))
    }

    fn measure_link(&self) -> Result<LinkProfile, PrivateError> {
        Ok(self.link)
    }
}

/// Opens a prefill and a verify session through `opener` for the target
/// `model` and its `drafter` (whose passes the width model times), with
/// the verify width, draft shape, grouping and schedule chosen as the
/// module docs say. Without drafts or with a forced per-group schedule and
/// a given K, nothing is modelled: the verify session groups by layer
/// under a forced fixed point, by input otherwise.
///
/// # Errors
/// [`PrivateError::Service`] and the server's refusals while opening;
/// the width and schedule models' errors.
pub fn connect_with<O>(
    opener: &mut O,
    options: &ConnectOptions,
    (model, drafter): (&Model, &Model),
) -> Result<PrivateSession<O::Transport>, PrivateError>
where
    O: SessionOpener + Sync,
    O::Transport: Send,
{
    let forced = options.schedule.or_else(|| exact_only(model));
    if let (Some(Schedule::FixedPoint(_)), Some(_)) = (options.schedule, exact_only(model)) {
        tracing::warn!(
            weights = model.weights_held(),
            "a fixed point on weights that round their activations: its certification does not \
             bound their steps, so greedy output may leave the plaintext reference at a near-tie"
        );
    }
    let config = model.config();
    let modelled = matches!(options.draft, DraftLength::Auto { .. })
        || forced.is_none()
        || matches!(forced, Some(Schedule::FixedPoint(_)));
    let link = match options.planning_link {
        Some(l) => Some(l),
        None if modelled => Some(opener.measure_link()?),
        None => None,
    };
    // `auto` chooses from the narrowest candidate's offer, which serves the width model too
    // when the choice is that width (one offer request, not two).
    let (prefill_width, mut probed) = match options.prefill_width {
        PrefillWidth::Fixed(w) => (w, None),
        PrefillWidth::Auto => {
            let space = opener.plan_space(AUTO_CANDIDATES[0], Grouping::ByInput)?;
            let w = choose_prefill_width(&space)?;
            (w, Some(space))
        }
    };
    let mut prefill_space = |opener: &mut O| match probed.take() {
        Some(space) if space.width == Some(prefill_width) => Ok(space),
        _ => opener.plan_space(prefill_width, Grouping::ByInput),
    };
    let fallback = (options.prefill_width == PrefillWidth::Auto).then_some(AUTO_CANDIDATES[0]);
    let mut width_choice = None;
    // The client's pass times, when the width model took them (the schedule model reuses them).
    let mut timed = None;
    let (hook, verify_width, tree) = match (options.draft, link) {
        (DraftLength::Auto { k_max, trees }, Some(link)) => {
            let space = prefill_space(opener)?;
            // The client's passes are timed alone; the prefill session then opens (keys, their
            // upload, the server's plans) while the width model computes and the verify session
            // opens.
            let client = timed.insert(time_client(model, drafter, k_max + 1)?);
            let (hook, choice) =
                open_beside_choice(opener, (prefill_width, fallback), config, || {
                    choose_verify_session(
                        &space,
                        client,
                        &link,
                        (options.acceptance_prior, DraftLimits { k_max, trees }),
                        (forced.as_ref(), options.grouping),
                    )
                })?;
            let (k, tree) = (choice.best.k, choice.best.tree);
            width_choice = Some(choice);
            (hook, k + 1, tree)
        }
        (DraftLength::Fixed(k), Some(link)) if k > 0 && options.grouping.is_none() => {
            let space = prefill_space(opener)?;
            let grouping = given_k_grouping(&space, options, (model, drafter), &link, k)?;
            let hook = open_widths(opener, (prefill_width, fallback), (k + 1, grouping), config)?;
            (hook, k + 1, None)
        }
        (draft, _) => {
            let width = draft.max_k() + 1;
            let grouping = options.grouping.unwrap_or(match forced {
                Some(Schedule::FixedPoint(_)) => Grouping::BY_LAYER,
                _ => Grouping::ByInput,
            });
            let hook = open_widths(opener, (prefill_width, fallback), (width, grouping), config)?;
            (hook, width, None)
        }
    };
    let prefill_width = hook
        .widths()
        .into_iter()
        .find(|&w| w != verify_width)
        .unwrap_or(verify_width);
    let schedule_choice = match (forced, link) {
        (None, Some(link)) => Some(choose_for_session(
            (model, Some(drafter)),
            &hook,
            verify_width,
            Some(prefill_width),
            (&link, options.acceptance_prior),
            timed.as_ref(),
        )?),
        _ => None,
    };
    let (schedule, sampled_schedule) = match (forced, &schedule_choice) {
        (Some(s), _) => (s, s.for_decoding(false)),
        (None, Some(c)) => (c.schedule, c.sampled),
        (None, None) => (Schedule::PerGroup, Schedule::PerGroup),
    };
    Ok(PrivateSession {
        hook,
        verify_width,
        prefill_width,
        tree,
        schedule,
        sampled_schedule,
        link,
        width_choice,
        schedule_choice,
    })
}

/// [`Schedule::PerGroup`] for a target whose projections round their activations (quantized or f16
/// weights): they move in steps, which the fixed point's certification cannot bound
/// (docs/design/schedules.md, "Whose weights run the passes"), while the per-group schedule is
/// exact on any weights. `None` for f32 weights.
fn exact_only(model: &Model) -> Option<Schedule> {
    (model.weights_held() != "f32").then_some(Schedule::PerGroup)
}

/// The verify session a client choosing K (at most `drafts.k_max`) opens beside a prefill
/// session of `space`'s width: (K + 1, grouping) from the width model on the client's pass times
/// `client`, the `link` and the acceptance prior (`None`: the adapter's hint, else the default), and
/// the width model's choice. The grouping is `given` where one is, unless the verify width equals
/// the prefill width (then the prefill session serves both); otherwise the width model's, or the
/// one a `forced` schedule needs. [`connect_with`] opens this session, and an adapter server
/// guesses it to encode its diagonals before the first client asks
/// ([`crate::HeBackend::prewarm_verify`]).
///
/// # Errors
/// As [`choose_width_on_costs`].
pub fn choose_verify_session(
    space: &PlanSpace,
    client: &ClientCosts,
    link: &LinkProfile,
    (acceptance_prior, drafts): (Option<f64>, DraftLimits),
    (forced, given): (Option<&Schedule>, Option<Grouping>),
) -> Result<((usize, Grouping), WidthChoice), PrivateError> {
    let mut choice = choose_width_on_costs(space, client, link, acceptance_prior, drafts)?;
    if forced == Some(&Schedule::PerGroup) {
        choice = choice.per_group();
    }
    let width = choice.best.k + 1;
    let grouping = match given {
        Some(g) if Some(width) != space.width => g,
        _ => choice.best.grouping_for(space, forced),
    };
    Ok(((width, grouping), choice))
}

/// [`open_widths`] for a verify session `choose` decides while the prefill session of
/// `prefill_width` (grouped by input) already opens on another thread: its key upload and the
/// server's plans overlap the client's computation, and the verify session opens as soon as it is
/// chosen, beside it. When the widths agree the prefill session serves both if it is grouped as
/// the verify session needs; otherwise, or where the server had no room for either,
/// [`open_widths`] opens them again with its fallbacks.
///
/// # Errors
/// `choose`'s; as [`SessionOpener::open`].
fn open_beside_choice<O, C>(
    opener: &mut O,
    (prefill_width, fallback): (usize, Option<usize>),
    config: &ModelConfig,
    choose: impl FnOnce() -> Result<((usize, Grouping), C), PrivateError>,
) -> Result<(ByWidth<O::Transport>, C), PrivateError>
where
    O: SessionOpener + Sync,
    O::Transport: Send,
{
    let shared = &*opener;
    let (early, verify, chosen) = std::thread::scope(|s| {
        let early = s.spawn(|| shared.open(prefill_width, Grouping::ByInput, config));
        let chosen = choose();
        let verify = match &chosen {
            Ok(((width, grouping), _)) if *width != prefill_width => {
                Some(shared.open(*width, *grouping, config))
            }
            _ => None,
        };
        let early = early
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (early, verify, chosen)
    });
    let ((width, grouping), choice) = chosen?;
    let no_room = |e: &PrivateError| e.is_at_capacity() || e.is_over_limit();
    let hook = match (early, verify) {
        (Ok(wide), Some(Ok(verify))) => {
            ByWidth::new().with(prefill_width, wide).with(width, verify)
        }
        (Ok(wide), None) if grouping == Grouping::ByInput => ByWidth::new().with(width, wide),
        (Err(e), _) | (_, Some(Err(e))) if !no_room(&e) => return Err(e),
        opened => {
            // Closed before the server is asked again, so their memory is free.
            drop(opened);
            open_widths(opener, (prefill_width, fallback), (width, grouping), config)?
        }
    };
    Ok((hook, choice))
}

/// A prefill session of `prefill_width` grouped by input and a verify session of `(width,
/// grouping)`, opened together ([`SessionOpener::open_pair`]); one session of `(width, grouping)`
/// when the widths agree. When the server has no room for the prefill width's diagonals
/// ([`PrivateError::is_at_capacity`], [`PrivateError::is_over_limit`]) the pair is tried again
/// with the `fallback` width if one is given and narrower, and otherwise (room being short) the
/// verify session alone, grouped by input, serves the prompt too, in requests of its width.
///
/// # Errors
/// As [`SessionOpener::open`].
pub(crate) fn open_widths<O: SessionOpener>(
    opener: &mut O,
    (prefill_width, fallback): (usize, Option<usize>),
    (width, grouping): (usize, Grouping),
    config: &ModelConfig,
) -> Result<ByWidth<O::Transport>, PrivateError> {
    if width == prefill_width {
        return Ok(ByWidth::new().with(width, opener.open(width, grouping, config)?));
    }
    match opener.open_pair(
        (prefill_width, Grouping::ByInput),
        (width, grouping),
        config,
    ) {
        Ok((wide, verify)) => Ok(ByWidth::new().with(prefill_width, wide).with(width, verify)),
        Err(e) if e.is_at_capacity() || e.is_over_limit() => match fallback {
            Some(narrower) if narrower < prefill_width => {
                tracing::warn!(
                    prefill_width,
                    narrower,
                    "the adapter server has no room for the prefill width: trying a narrower one ({e})"
                );
                open_widths(opener, (narrower, None), (width, grouping), config)
            }
            // A large adapter's diagonals for two widths may not fit the server's memory.
            _ if e.is_at_capacity() && grouping == Grouping::ByInput => {
                tracing::warn!(
                    prefill_width,
                    width,
                    "the adapter server cannot hold a second width: the prompt goes through the verify session ({e})"
                );
                Ok(ByWidth::new().with(width, opener.open(width, grouping, config)?))
            }
            _ => Err(e),
        },
        Err(e) => Err(e),
    }
}

/// The grouping the width model prefers at a given K.
fn given_k_grouping(
    space: &PlanSpace,
    options: &ConnectOptions,
    models: (&Model, &Model),
    link: &LinkProfile,
    k: usize,
) -> Result<Grouping, PrivateError> {
    grouping_for_given_k(
        space,
        models,
        link,
        (k, options.acceptance_prior),
        options.schedule.as_ref(),
    )
}

//! Warm sessions: one adapter's HE sessions, kept open across requests.
//!
//! Opening a session is the slow part of a private request (a fresh CKKS
//! secret key, Galois keys for the plans' rotation steps, their upload, the
//! server encoding the adapter's diagonals: tens of seconds). A
//! [`WarmAdapter`] opens its sessions once (a verify width K+1 and a prefill
//! width) and keeps them for every later request, so a request pays only
//! its own passes.
//!
//! States, one type each: [`Warm::Closed`] (never opened, or dropped after
//! a failure: the next request opens afresh) and [`Warm::Open`] (keys and
//! sessions live). The lock around the state is the adapter's queue:
//! requests for one adapter run one at a time, in arrival order of the
//! lock, and at most `max_queue` wait ([`WarmAdapter::enter`]).
//!
//! Restarts and evictions: the gRPC client replays a round on the same
//! keys when its connection drops or its session is gone; if that fails the
//! request ends with a 502, the sessions are dropped, and the next request
//! opens new ones (fresh keys).

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cipherlora_model::Model;
use cipherlora_private::width_plan::{choose_width_for_client, grouping_for_given_k};
use cipherlora_private::{ByWidth, Grouping, GrpcTransport, connect_chosen_width, connect_widths};
use cipherlora_service::{ClientConfig, LinkProfile};
use cipherlora_spec::prefix_cache::{CachedContext, PrefixCache, PrefixHit};
use cipherlora_spec::schedule::Schedule;

use crate::ApiError;
use crate::queue::{Queue, Ticket};

/// An adapter's sessions, when open.
pub struct OpenSessions {
    /// The HE hook: one session per width.
    pub hook: ByWidth<GrpcTransport>,
    /// The verify schedule chosen for this link (greedy requests).
    pub schedule: Schedule,
    /// The verify schedule of sampled requests
    /// ([`cipherlora_private::schedule_plan::ScheduleChoice::sampled`]; a
    /// forced schedule serves both).
    pub sampled_schedule: Schedule,
    /// The verify width K + 1 (fixed, or chosen when the sessions opened).
    pub verify_width: usize,
}

/// The state of one adapter's sessions.
pub enum Warm {
    /// No sessions (not opened yet, or dropped after a failure); the reason
    /// of the last failure, if any.
    Closed(Option<String>),
    /// Keys made, sessions open.
    Open(OpenSessions),
}

/// How many tokens a verify round drafts (K; the verify width is K + 1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DraftLength {
    /// Exactly K.
    Fixed(usize),
    /// Chosen once, when the sessions open, by the client's width model
    /// ([`cipherlora_private::width_plan::choose_width`]): from the link,
    /// the server's plans, this machine's timed passes and a per-token
    /// acceptance prior, never from any request's text. The session is
    /// opened with the grouping the model priced (by runs of layers for an FFA
    /// adapter under the fixed point).
    Auto {
        /// The largest K considered.
        k_max: usize,
        /// Per-token acceptance rate the model assumes (0 < α < 1); `None`:
        /// the adapter's published hint, else the default
        /// ([`cipherlora_private::width_plan::acceptance_prior`]).
        acceptance_prior: Option<f64>,
    },
}

impl DraftLength {
    /// The largest K this can come to.
    pub fn max_k(&self) -> usize {
        match *self {
            DraftLength::Fixed(k) => k,
            DraftLength::Auto { k_max, .. } => k_max,
        }
    }
}

/// How sessions are opened.
#[derive(Debug, Clone)]
pub struct SessionSettings {
    /// The adapter server.
    pub client: ClientConfig,
    /// Drafted tokens per verify round.
    pub k: DraftLength,
    /// Positions per prefill pass (a second session of this width).
    pub prefill_width: usize,
    /// `auto`, `per-group` or `fixed-point[:N]`.
    pub schedule: String,
    /// The link to plan `auto` on (`None`: measured, 100 Mbit/s).
    pub planning_link: Option<LinkProfile>,
    /// Requests that may wait for one adapter (beyond it: 429).
    pub max_queue: usize,
    /// Memory budget of the adapter's prefix cache in bytes (the adapted
    /// keys and values of recent conversations, reused by the next
    /// request that repeats their tokens); `None`: no prefix caching.
    pub prefix_cache_bytes: Option<usize>,
}

/// One adapter of the adapter server, with its warm sessions.
pub struct WarmAdapter {
    id: String,
    settings: SessionSettings,
    state: Mutex<Warm>,
    queue: Queue,
    prefix: Option<Mutex<PrefixCache>>,
}

impl WarmAdapter {
    /// An adapter whose sessions are not open yet.
    ///
    /// # Errors
    /// [`ApiError::InvalidSetting`] for a prefix cache budget of 0 bytes.
    pub fn new(id: String, settings: SessionSettings) -> Result<Self, ApiError> {
        let prefix = settings
            .prefix_cache_bytes
            .map(|b| PrefixCache::new(b).map(Mutex::new))
            .transpose()
            .map_err(|e| ApiError::InvalidSetting {
                setting: "--prompt-cache-mib",
                reason: e.to_string(),
            })?;
        Ok(Self {
            queue: Queue::new(id.clone(), settings.max_queue),
            id,
            settings,
            state: Mutex::new(Warm::Closed(None)),
            prefix,
        })
    }

    /// The cached context sharing the longest token prefix with `prompt`
    /// under `schedule`, removed from the prefix cache until
    /// [`WarmAdapter::keep_context`] puts the generation's context back.
    /// `None` without prefix caching, or when no context shares a token.
    pub fn take_context(&self, prompt: &[u32], schedule: &Schedule) -> Option<PrefixHit> {
        let cache = self.prefix.as_ref()?;
        let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
        match cache.take(prompt, schedule) {
            Ok(hit) => hit,
            Err(e) => {
                tracing::warn!(adapter = %self.id, error = %e, "prefix cache lookup failed");
                None
            }
        }
    }

    /// Keeps a generation's context for the next request (evicting the
    /// least recently used contexts beyond the budget).
    pub fn keep_context(&self, context: CachedContext) {
        let Some(cache) = self.prefix.as_ref() else {
            return;
        };
        let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
        match cache.put(context) {
            Ok(evicted) if evicted > 0 => {
                tracing::debug!(adapter = %self.id, evicted, "prefix cache evicted contexts");
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(adapter = %self.id, error = %e, "prefix cache insert failed"),
        }
    }

    /// Drops every cached context.
    pub fn clear_contexts(&self) {
        if let Some(cache) = self.prefix.as_ref() {
            let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
            let budget = cache.budget();
            if let Ok(empty) = PrefixCache::new(budget) {
                *cache = empty;
            }
        }
    }

    /// `(contexts, bytes)` held by the prefix cache.
    pub fn cached_contexts(&self) -> (usize, usize) {
        self.prefix.as_ref().map_or((0, 0), |c| {
            let c = c.lock().unwrap_or_else(|p| p.into_inner());
            (c.len(), c.bytes())
        })
    }

    /// The adapter id (the `model` of requests).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The largest verify width K + 1 the sessions can have (the width
    /// itself when K is fixed; with [`DraftLength::Auto`] the width is
    /// chosen when they open: [`OpenSessions::verify_width`]).
    pub fn max_verify_width(&self) -> usize {
        self.settings.k.max_k() + 1
    }

    /// How sessions are opened.
    pub fn settings(&self) -> &SessionSettings {
        &self.settings
    }

    /// Takes a place in the adapter's queue.
    ///
    /// # Errors
    /// [`ApiError::QueueFull`] when `max_queue` requests already wait or run.
    pub fn enter(&self) -> Result<Ticket<'_>, ApiError> {
        self.queue.enter()
    }

    /// Waits for the adapter (its queue), opens its sessions if they are
    /// closed, and returns them locked for one generation.
    ///
    /// # Errors
    /// [`ApiError::Upstream`] when the sessions cannot be opened.
    pub fn acquire<'a>(
        &'a self,
        _ticket: &Ticket<'a>,
        model: &Model,
        drafter: &Model,
    ) -> Result<MutexGuard<'a, Warm>, ApiError> {
        let mut state = self.lock(_ticket);
        if let Warm::Closed(_) = &*state {
            match self.open(model, drafter) {
                Ok(open) => *state = Warm::Open(open),
                Err(e) => {
                    *state = Warm::Closed(Some(e.to_string()));
                    return Err(e);
                }
            }
        }
        Ok(state)
    }

    /// Waits for the adapter (its queue) and returns its state locked,
    /// open or not.
    pub fn lock<'a>(&'a self, _ticket: &Ticket<'a>) -> MutexGuard<'a, Warm> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens the sessions now unless they are open (warm-up at start).
    ///
    /// # Errors
    /// As [`WarmAdapter::acquire`].
    pub fn warm_up(&self, model: &Model, drafter: &Model) -> Result<(), ApiError> {
        let ticket = self.enter()?;
        self.acquire(&ticket, model, drafter).map(drop)
    }

    /// Drops the sessions after a failure; the next request reopens them.
    pub fn close(state: &mut Warm, reason: String) {
        *state = Warm::Closed(Some(reason));
    }

    /// Whether the sessions are open (without waiting for the queue).
    pub fn is_open(&self) -> Option<bool> {
        self.state
            .try_lock()
            .ok()
            .map(|s| matches!(&*s, Warm::Open(_)))
    }

    /// Opens the sessions: with [`DraftLength::Auto`] the prefill session
    /// first, whose plans the width model prices K and the grouping on,
    /// then the verify session of the chosen width; then the schedule.
    fn open(&self, model: &Model, drafter: &Model) -> Result<OpenSessions, ApiError> {
        let s = &self.settings;
        let spinner = indicatif::ProgressBar::new_spinner();
        spinner.set_message(format!(
            "adapter {}: making keys and opening sessions (T ≤ {} and {})",
            self.id,
            self.max_verify_width(),
            s.prefill_width
        ));
        spinner.enable_steady_tick(Duration::from_millis(120));
        let t0 = Instant::now();
        let upstream = |e: &dyn std::fmt::Display| ApiError::Upstream(e.to_string());
        let forced = match s.schedule.as_str() {
            "auto" => None,
            other => Some(
                other
                    .parse::<Schedule>()
                    .map_err(|e| ApiError::Internal(format!("schedule: {e}")))?,
            ),
        };
        let link = match (s.planning_link, &forced, s.k) {
            (Some(l), _, _) => Some(l),
            (None, None | Some(Schedule::FixedPoint(_)), _)
            | (None, _, DraftLength::Auto { .. }) => {
                Some(LinkProfile::measure_tcp(&s.client.endpoint).map_err(|e| upstream(&e))?)
            }
            (None, Some(_), DraftLength::Fixed(_)) => None,
        };
        // The client's own acceptance prior, if any (else the adapter's
        // hint): it sets the fixed point `auto` runs.
        let alpha = match s.k {
            DraftLength::Auto {
                acceptance_prior, ..
            } => acceptance_prior,
            DraftLength::Fixed(_) => None,
        };
        let (hook, verify_width) = match (s.k, link) {
            (
                DraftLength::Auto {
                    k_max,
                    acceptance_prior,
                },
                Some(link),
            ) => connect_chosen_width(
                s.client.clone(),
                &self.id,
                s.prefill_width,
                model.config(),
                |space| {
                    let choice = choose_width_for_client(
                        space,
                        model,
                        drafter,
                        &link,
                        acceptance_prior,
                        k_max.into(),
                    )?;
                    Ok((
                        choice.best.k,
                        choice.best.grouping_for(space, forced.as_ref()),
                    ))
                },
            )
            .map_err(|e| upstream(&e))?,
            // A given K groups its requests as the width model prefers at
            // that width (runs of layers under a fixed point, FFA).
            (DraftLength::Fixed(k), Some(link)) if k > 0 => connect_chosen_width(
                s.client.clone(),
                &self.id,
                s.prefill_width,
                model.config(),
                |space| {
                    let grouping = grouping_for_given_k(
                        space,
                        (model, drafter),
                        &link,
                        (k, alpha),
                        forced.as_ref(),
                    )?;
                    Ok((k, grouping))
                },
            )
            .map_err(|e| upstream(&e))?,
            (k, _) => {
                let width = k.max_k() + 1;
                // No drafts, or a forced per-group schedule (no link to
                // model on): a forced fixed point groups FFA requests by
                // layer, anything else by input.
                let grouping = match forced {
                    Some(Schedule::FixedPoint(_)) => Grouping::BY_LAYER,
                    _ => Grouping::ByInput,
                };
                let hook = connect_widths(
                    s.client.clone(),
                    &self.id,
                    (width, grouping),
                    s.prefill_width,
                    model.config(),
                )
                .map_err(|e| upstream(&e))?;
                (hook, width)
            }
        };
        let (schedule, sampled_schedule) = match (forced, link) {
            (Some(schedule), _) => (schedule, schedule.for_decoding(false)),
            (None, link) => {
                let link = link.ok_or_else(|| ApiError::Internal("no link to plan on".into()))?;
                let choice = cipherlora_private::choose_for_session(
                    (model, Some(drafter)),
                    &hook,
                    verify_width,
                    Some(s.prefill_width),
                    (&link, alpha),
                )
                .map_err(|e| upstream(&e))?;
                (choice.schedule, choice.sampled)
            }
        };
        spinner.finish_and_clear();
        eprintln!(
            "adapter {}: sessions open in {:.1} s (K = {}, schedule {schedule}, sampled {sampled_schedule})",
            self.id,
            t0.elapsed().as_secs_f64(),
            verify_width - 1
        );
        Ok(OpenSessions {
            hook,
            schedule,
            sampled_schedule,
            verify_width,
        })
    }
}

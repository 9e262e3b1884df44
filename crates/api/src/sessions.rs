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

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cipherlora_model::{Model, ModelConfig};
pub use cipherlora_private::DraftLength;
use cipherlora_private::client::masked::MaskedClient;
use cipherlora_private::{ByWidth, ConnectOptions, GrpcTransport};
use cipherlora_service::{ClientConfig, LinkProfile};
use cipherlora_speculative::prefix_cache::{CachedContext, PrefixCache, PrefixHit};
use cipherlora_speculative::schedule::Schedule;

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
    /// The prefill session's width (given, or chosen when the sessions opened).
    pub prefill_width: usize,
    /// The masked session and its pools, once the idle filler opened it.
    pub masked: Option<Box<MaskedState>>,
}

/// A masked session: the client's pools and the transport to the session.
pub struct MaskedState {
    /// Offline keys and pools.
    pub client: MaskedClient,
    /// The session's stream.
    pub transport: GrpcTransport,
}

/// Masked ring values for the prompt's passes (docs/design/wire.md, "Masked ring values"): a
/// second session whose masks the endpoint makes while it idles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaskedSettings {
    /// Bytes the client's mask pools may hold.
    pub pool_bytes: usize,
    /// Positions of masks to keep ready per adapted group.
    pub positions: usize,
    /// Positions per offline batch.
    pub batch: usize,
}

/// The state of one adapter's sessions.
pub enum Warm {
    /// No sessions (not opened yet, or dropped after a failure); the reason
    /// of the last failure, if any.
    Closed(Option<String>),
    /// Keys made, sessions open.
    Open(OpenSessions),
}

/// How sessions are opened.
#[derive(Debug, Clone)]
pub struct SessionSettings {
    /// The adapter server.
    pub client: ClientConfig,
    /// Drafted tokens per verify round.
    pub k: DraftLength,
    /// Per-token acceptance rate the width and schedule models assume
    /// (`None`: the adapter's published hint, else the default).
    pub acceptance_prior: Option<f64>,
    /// Positions per prefill request (a second session of this width), given or chosen when the
    /// sessions open.
    pub prefill_width: cipherlora_private::PrefillWidth,
    /// Positions per group-by-group prefill pass, split into pipelined
    /// requests ([`SpecConfig::prefill_span`](cipherlora_speculative::decode::SpecConfig::prefill_span)).
    pub prefill_span: cipherlora_speculative::decode::PrefillSpan,
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
    /// Masked ring values for prompts (`None`: every pass runs on CKKS).
    pub masked: Option<MaskedSettings>,
}

/// One adapter of the adapter server, with its warm sessions.
pub struct WarmAdapter {
    id: String,
    settings: SessionSettings,
    state: Mutex<Warm>,
    queue: Queue,
    prefix: Option<Mutex<PrefixCache>>,
    /// Whether an idle filler runs ([`WarmAdapter::fill_idle`]).
    filling: AtomicBool,
    /// Masks ready per group, as last seen by the filler or a request.
    ready: AtomicUsize,
    /// When opening the masked session last failed: the filler waits [`MASKED_RETRY`] before it
    /// tries again (an opening uploads tens of MB of keys).
    masked_failed: Mutex<Option<Instant>>,
}

/// How long the idle filler waits after a failed opening of the masked session.
const MASKED_RETRY: Duration = Duration::from_secs(600);

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
            filling: AtomicBool::new(false),
            ready: AtomicUsize::new(0),
            masked_failed: Mutex::new(None),
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
            cache.lock().unwrap_or_else(|p| p.into_inner()).clear();
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

    /// `(verify width, prefill width)` of the open sessions (`None` when closed, or busy now).
    pub fn opened_widths(&self) -> Option<(usize, usize)> {
        match &*self.state.try_lock().ok()? {
            Warm::Open(o) => Some((o.verify_width, o.prefill_width)),
            Warm::Closed(_) => None,
        }
    }

    /// Whether the sessions are open (without waiting for the queue).
    pub fn is_open(&self) -> Option<bool> {
        self.state
            .try_lock()
            .ok()
            .map(|s| matches!(&*s, Warm::Open(_)))
    }

    /// Opens the sessions ([`cipherlora_private::connect`]).
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
        let schedule = match s.schedule.as_str() {
            "auto" => None,
            other => Some(
                other
                    .parse::<Schedule>()
                    .map_err(|e| ApiError::InvalidSetting {
                        setting: "--schedule",
                        reason: e.to_string(),
                    })?,
            ),
        };
        let options = ConnectOptions {
            draft: s.k,
            acceptance_prior: s.acceptance_prior,
            prefill_width: s.prefill_width,
            schedule,
            grouping: None,
            planning_link: s.planning_link,
        };
        let session =
            cipherlora_private::connect(s.client.clone(), &self.id, &options, (model, drafter))
                .map_err(ApiError::upstream)?;
        spinner.finish_and_clear();
        eprintln!(
            "adapter {}: sessions open in {:.1} s (K = {}, prefill width {}, schedule {}, sampled {})",
            self.id,
            t0.elapsed().as_secs_f64(),
            session.verify_width - 1,
            session.prefill_width,
            session.schedule,
            session.sampled_schedule
        );
        Ok(OpenSessions {
            verify_width: session.verify_width,
            prefill_width: session.prefill_width,
            schedule: session.schedule,
            sampled_schedule: session.sampled_schedule,
            hook: session.hook,
            masked: None,
        })
    }

    /// Makes masks while no request waits or runs: opens the masked session first if the
    /// sessions are open without one (outside the lock, so a request does not wait for it),
    /// then runs one offline batch at a time, each under the lock, until every group has
    /// [`MaskedSettings::positions`] masks, a request arrives, or the server refuses. At most
    /// one filler runs per adapter; returns the batches run.
    pub fn fill_idle(&self, config: &ModelConfig) -> usize {
        let Some(m) = self.settings.masked else {
            return 0;
        };
        if self.filling.swap(true, Ordering::AcqRel) {
            return 0;
        }
        let batches = self.fill(m, config);
        self.filling.store(false, Ordering::Release);
        batches
    }

    fn fill(&self, m: MaskedSettings, config: &ModelConfig) -> usize {
        let unopened = self
            .state
            .try_lock()
            .is_ok_and(|s| matches!(&*s, Warm::Open(o) if o.masked.is_none()));
        let failed = self.masked_failed.lock().unwrap_or_else(|p| p.into_inner());
        let retry = failed.is_none_or(|at| at.elapsed() >= MASKED_RETRY);
        drop(failed);
        if unopened && retry && self.queue.is_idle() {
            let t0 = Instant::now();
            match cipherlora_private::remote::open_masked(
                self.settings.client.clone(),
                &self.id,
                m.batch,
                m.pool_bytes,
                config,
            ) {
                Ok((client, transport)) => {
                    let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
                    if let Warm::Open(open) = &mut *state {
                        open.masked = Some(Box::new(MaskedState { client, transport }));
                        tracing::info!(adapter = %self.id, secs = t0.elapsed().as_secs_f64(), "masked session open");
                    }
                }
                Err(e) => {
                    tracing::warn!(adapter = %self.id, error = %e, "masked session not opened; retrying in 10 minutes");
                    *self.masked_failed.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(Instant::now());
                    return 0;
                }
            }
        }
        let mut batches = 0;
        while self.queue.is_idle() {
            let Ok(mut state) = self.state.try_lock() else {
                break;
            };
            let Warm::Open(OpenSessions {
                masked: Some(s), ..
            }) = &mut *state
            else {
                break;
            };
            let filled = s.client.fill_one(&mut s.transport, m.positions);
            self.ready.store(s.client.ready(), Ordering::Release);
            match filled {
                Ok(true) => batches += 1,
                Ok(false) => break,
                Err(e) => {
                    tracing::warn!(adapter = %self.id, error = %e, "offline batch failed; pools cleared");
                    s.client.clear();
                    break;
                }
            }
        }
        batches
    }

    /// Positions every adapted group has masks for (0 without a masked session), as last seen.
    pub fn masks_ready(&self) -> usize {
        self.ready.load(Ordering::Acquire)
    }

    /// Whether the idle filler is making masks now.
    pub fn is_filling(&self) -> bool {
        self.filling.load(Ordering::Acquire)
    }

    /// Records the masks ready after a request used some.
    pub fn note_masks(&self, ready: usize) {
        self.ready.store(ready, Ordering::Release);
    }
}

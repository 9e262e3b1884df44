//! The generation engine behind the HTTP routes: the base model (for the
//! bare base model and as the drafter), the tokenizer, and the adapters of
//! the adapter server with their warm sessions.
//!
//! A [`Job`] is one request after parsing: prompt tokens, limits, sampling,
//! stop sequences. [`Engine::run`] generates it on the caller's thread
//! (blocking; the routes run it on a thread of its own), hands text to a
//! sink as it is produced and returns the [`Finished`] summary. A sink that
//! returns `false` (the HTTP client went away) cancels the generation at
//! the end of the current round.
//!
//! Private requests use speculative decoding with the base model as
//! drafter (`cipherlora_speculative::decode`), verified through the adapter's warm
//! HE sessions; their greedy output equals the plaintext adapted model's.
//! Requests for the base model run it alone, in plaintext, here.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use cipherlora_model::{
    ChatMessage, LoadOptions, Model, NoAdapter, SamplingParams, TextStream, Tokenizer, WeightMode,
};
use cipherlora_private::client::masked::MaskedHook;
use cipherlora_private::{HeTimings, WireDensity};
use cipherlora_service::{AdapterClient, ClientConfig};
use cipherlora_speculative::SpecError;
use cipherlora_speculative::decode::{
    self, ChainDrafter, Drafting, PrefillSpan, SpecConfig, SpecOutput,
};
use cipherlora_speculative::schedule::Schedule;

use crate::openai::{PrivateCost, PromptTokensDetails, Usage};
use crate::queue::Queue;
use crate::sessions::{SessionSettings, Warm, WarmAdapter};
use crate::stop::StopMatcher;
use crate::{ApiError, InternalError};

/// What the engine is built from.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// GGUF file or HF folder of the base model.
    pub model_path: PathBuf,
    /// How to hold its weights.
    pub weights: WeightMode,
    /// The id the base model is listed under (default: the file stem).
    pub base_id: Option<String>,
    /// The adapter server and how to open sessions on it; `None`: the base
    /// model only.
    pub sessions: Option<SessionSettings>,
    /// Largest `max_tokens` a request may ask for (and the default of chat
    /// requests that give none).
    pub max_tokens_cap: usize,
    /// Requests that may wait or run for the base model (beyond: 429);
    /// adapters have theirs in [`SessionSettings::max_queue`].
    pub max_queue: usize,
}

/// One request, parsed.
#[derive(Debug, Clone)]
pub struct Job {
    /// Model id (base or adapter).
    pub model: String,
    /// Prompt token ids (chat template applied).
    pub prompt: Vec<u32>,
    /// Most new tokens.
    pub max_tokens: usize,
    /// Temperature, top-p, seed.
    pub sampling: SamplingParams,
    /// Stop sequences.
    pub stops: Vec<String>,
    /// When the request arrived (for time to first token).
    pub received: Instant,
}

/// How a generation ended.
#[derive(Debug, Clone)]
pub struct Finished {
    /// `stop` (EOS or stop sequence) or `length`.
    pub finish_reason: &'static str,
    /// Token counts.
    pub usage: Usage,
    /// What the private path cost.
    pub cost: PrivateCost,
}

/// The base model, the tokenizer and the adapters.
pub struct Engine {
    base_id: String,
    model: Model,
    drafter: Model,
    tokenizer: Tokenizer,
    adapters: Vec<Arc<WarmAdapter>>,
    max_tokens_cap: usize,
    created: u64,
    base_queue: Queue,
    cancelled: AtomicU64,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("base_id", &self.base_id)
            .field(
                "adapters",
                &self.adapters.iter().map(|a| a.id()).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Loads the model and tokenizer, and lists the adapter server's
    /// adapters (sessions are opened later: [`Engine::warm_up`] or the first
    /// request).
    ///
    /// # Errors
    /// [`ApiError::Internal`] when the model cannot be loaded;
    /// [`ApiError::Upstream`] when the adapter server cannot be reached.
    pub fn new(config: EngineConfig) -> Result<Self, ApiError> {
        let internal = |e| ApiError::from(InternalError::Load(e));
        let path = &config.model_path;
        // With an adapter server the model also verifies drafts: f32 unless
        // asked otherwise (`WeightMode::for_private_verify`).
        let weights = match &config.sessions {
            Some(_) => config.weights.for_private_verify(),
            None => config.weights,
        };
        let model = Model::load_with(path, &LoadOptions { weights }).map_err(internal)?;
        let drafter = model.fast_drafter().map_err(internal)?.into_owned();
        let tokenizer = Tokenizer::for_model(path).map_err(internal)?;
        let base_id = config.base_id.clone().unwrap_or_else(|| {
            path.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "base".into())
        });
        let adapters = match &config.sessions {
            Some(s) => list_adapters(&s.client)?
                .into_iter()
                .map(|id| WarmAdapter::new(id, s.clone()).map(Arc::new))
                .collect::<Result<_, _>>()?,
            None => Vec::new(),
        };
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Ok(Self {
            model,
            drafter,
            tokenizer,
            adapters,
            max_tokens_cap: config.max_tokens_cap,
            created,
            base_queue: Queue::new(base_id.clone(), config.max_queue),
            cancelled: AtomicU64::new(0),
            base_id,
        })
    }

    /// The base model's id.
    pub fn base_id(&self) -> &str {
        &self.base_id
    }

    /// The adapters, in the server's order.
    pub fn adapters(&self) -> &[Arc<WarmAdapter>] {
        &self.adapters
    }

    /// Unix seconds when the engine started.
    pub fn created(&self) -> u64 {
        self.created
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Largest `max_tokens`.
    pub fn max_tokens_cap(&self) -> usize {
        self.max_tokens_cap
    }

    /// Opens every adapter's sessions, one after the other, and runs one
    /// throw-away request of a fixed prompt through them (the server's and
    /// this process's first pass of each width pays one-time costs that
    /// the first real request would otherwise wait for). Failures are
    /// logged; the first request for a failed adapter tries again.
    pub fn warm_up(&self) {
        for a in &self.adapters {
            // Longer than any verify width, so that the prefill session
            // runs a pass too (shorter prompts go through the verify
            // session).
            let word = self.encode(" Hello").unwrap_or_default();
            let len = a.max_verify_width() + 2;
            let prompt = word.iter().copied().cycle().take(len).collect();
            let job = Job {
                model: a.id().to_string(),
                prompt,
                max_tokens: 2,
                sampling: SamplingParams::greedy(),
                stops: Vec::new(),
                received: Instant::now(),
            };
            if let Err(e) = self.run(&job, &mut |_| true) {
                tracing::warn!(adapter = a.id(), error = %e, "warm-up failed");
                eprintln!("adapter {}: warm-up failed: {e}", a.id());
            }
            a.clear_contexts();
            self.fill_later(a);
        }
    }

    /// Closes every adapter's sessions on the server (at shutdown), after
    /// the generations running on them.
    pub fn close_all(&self) {
        for a in &self.adapters {
            if let Ok(t) = a.enter() {
                let mut state = a.lock(&t);
                let old = std::mem::replace(&mut *state, Warm::Closed(Some("shut down".into())));
                if let Warm::Open(open) = old {
                    let masked = open.masked.map(|m| m.transport);
                    let ckks = open
                        .hook
                        .into_sessions()
                        .into_iter()
                        .map(|(_, h)| h.into_transport());
                    for transport in ckks.chain(masked) {
                        if let Err(e) = transport.close() {
                            tracing::debug!(adapter = a.id(), error = %e, "closing a session");
                        }
                    }
                }
            }
        }
    }

    /// Prompt tokens of a chat.
    ///
    /// # Errors
    /// [`ApiError::BadRequest`] when the model's template refuses the
    /// messages or the model has none.
    pub fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, ApiError> {
        let text = self
            .tokenizer
            .render_chat(messages, true)
            .map_err(|e| ApiError::bad("messages", e.to_string()))?;
        self.encode(&text)
    }

    /// Prompt tokens of raw text.
    ///
    /// # Errors
    /// [`ApiError::BadRequest`] for text the tokenizer refuses.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ApiError> {
        self.tokenizer
            .encode(text)
            .map_err(|e| ApiError::bad("prompt", e.to_string()))
    }

    fn adapter(&self, id: &str) -> Option<&Arc<WarmAdapter>> {
        self.adapters.iter().find(|a| a.id() == id)
    }

    /// Checks `job` before any work: known model, prompt and limits within
    /// the model's context (the prompt, `max_tokens` and the drafts of a last
    /// verify round).
    ///
    /// # Errors
    /// [`ApiError::ModelNotFound`], [`ApiError::BadRequest`].
    pub fn check(&self, job: &Job) -> Result<(), ApiError> {
        if job.model != self.base_id && self.adapter(&job.model).is_none() {
            return Err(ApiError::model_not_found(&job.model));
        }
        if job.prompt.is_empty() {
            return Err(ApiError::bad("prompt", "the prompt is empty"));
        }
        let context = self.model.config().max_position_embeddings;
        // The last verify round computes its drafts past the answer's last token; a prefill
        // request's padding rows are dropped after their pass and need no context.
        let reserve = self.adapter(&job.model).map_or(1, |a| a.max_verify_width());
        if job.prompt.len() + job.max_tokens + reserve > context {
            return Err(ApiError::BadRequest {
                message: format!(
                    "the prompt ({} tokens) plus max_tokens ({}) exceeds the model's context of {context} tokens",
                    job.prompt.len(),
                    job.max_tokens
                ),
                param: Some("max_tokens"),
            });
        }
        Ok(())
    }

    /// Generates `job`, handing each new piece of text to `sink` (which
    /// returns `false` to cancel).
    ///
    /// # Errors
    /// Those of [`Engine::check`]; [`ApiError::QueueFull`];
    /// [`ApiError::Upstream`] when the adapter server fails (the adapter's
    /// sessions are then dropped and reopened by the next request);
    /// [`ApiError::Internal`] for model failures.
    pub fn run(
        &self,
        job: &Job,
        sink: &mut dyn FnMut(String) -> bool,
    ) -> Result<Finished, ApiError> {
        self.check(job)?;
        let mut text = TextOut::new(&self.tokenizer, job, sink);
        let (out, cost) = match self.adapter(&job.model) {
            None => {
                let _ticket = self.base_queue.enter()?;
                let cfg = self.spec_config(
                    job,
                    Drafting::None,
                    Schedule::PerGroup,
                    (64, PrefillSpan::Positions(64)),
                );
                let out =
                    decode::generate(&self.model, &job.prompt, &cfg, &mut NoAdapter, &mut |t| {
                        text.push(t)
                    })
                    .map_err(InternalError::Decoding)?;
                (out, PrivateCost::default())
            }
            Some(adapter) => {
                let ticket = adapter.enter()?;
                let mut state = adapter.acquire(&ticket, &self.model, &self.drafter)?;
                let Warm::Open(open) = &mut *state else {
                    return Err(InternalError::SessionsNotOpen.into());
                };
                let schedule = if job.sampling.is_greedy() {
                    open.schedule
                } else {
                    open.sampled_schedule
                };
                let cfg = self.spec_config(
                    job,
                    Drafting::chain(ChainDrafter::Base, open.verify_width - 1),
                    schedule,
                    (open.prefill_width, adapter.settings().prefill_span),
                );
                let before = open.hook.timings();
                let cached = adapter
                    .take_context(&job.prompt, &cfg.effective_schedule())
                    .map(|hit| hit.context);
                let masked_before = open.masked.as_ref().map(|m| m.client.online.clone());
                let mut masked_positions = 0;
                let result = match open.masked.as_mut() {
                    // The prompt's passes on pooled masks when every group has enough.
                    Some(m) => {
                        let mut hook =
                            MaskedHook::new(&mut open.hook, &mut m.client, &mut m.transport)
                                .prompt_only();
                        let r = decode::generate_cached(
                            &self.model,
                            &self.drafter,
                            &job.prompt,
                            &cfg,
                            &mut hook,
                            &mut |t| text.push(t),
                            cached,
                        );
                        masked_positions = hook.masked_positions;
                        r
                    }
                    None => decode::generate_cached(
                        &self.model,
                        &self.drafter,
                        &job.prompt,
                        &cfg,
                        &mut open.hook,
                        &mut |t| text.push(t),
                        cached,
                    ),
                };
                let mut he = open.hook.timings();
                he.subtract(&before);
                if let (Some(m), Some(before)) = (open.masked.as_ref(), masked_before) {
                    he.add(&m.client.online.without(&before));
                    adapter.note_masks(m.client.ready());
                }
                let decode = open.hook.timings_since_prefill();
                let schedule = cfg.schedule.to_string();
                match result {
                    Ok((out, context)) => {
                        tracing::debug!(adapter = adapter.id(), stats = ?out.stats, "generation done");
                        adapter.keep_context(context);
                        let mut cost = private_cost(&out, &he, &decode, schedule);
                        cost.masked_tokens = masked_positions as u64;
                        drop(state);
                        drop(ticket);
                        self.fill_later(adapter);
                        (out, cost)
                    }
                    Err(e) => {
                        WarmAdapter::close(&mut state, e.to_string());
                        return Err(match e {
                            SpecError::Model(m) => ApiError::upstream(m),
                            other => InternalError::Decoding(other).into(),
                        });
                    }
                }
            }
        };
        if text.cancelled {
            self.cancelled.fetch_add(1, Ordering::Relaxed);
        }
        Ok(text.finish(job, &out, cost))
    }

    /// Generations cancelled because their HTTP client went away.
    pub fn cancelled(&self) -> u64 {
        self.cancelled.load(Ordering::Relaxed)
    }

    /// Positions every adapted group of adapter `id` has masks for (0: none, not masked, or
    /// busy).
    pub fn masks_ready(&self, id: &str) -> usize {
        self.adapter(id).map_or(0, |a| a.masks_ready())
    }

    /// Whether adapter `id`'s idle filler is making masks now.
    pub fn masks_filling(&self, id: &str) -> bool {
        self.adapter(id).is_some_and(|a| a.is_filling())
    }

    /// Starts the adapter's idle filler ([`WarmAdapter::fill_idle`]) on its own thread when it
    /// makes masks.
    fn fill_later(&self, adapter: &Arc<WarmAdapter>) {
        if adapter.settings().masked.is_none() {
            return;
        }
        let (adapter, config) = (adapter.clone(), self.model.config().clone());
        std::thread::spawn(move || {
            let batches = adapter.fill_idle(&config);
            tracing::debug!(
                adapter = adapter.id(),
                batches,
                ready = adapter.masks_ready(),
                "idle fill done"
            );
        });
    }

    /// `(prefill_width, prefill_span)`: positions per prefill request and
    /// pass.
    fn spec_config(
        &self,
        job: &Job,
        drafting: Drafting,
        schedule: Schedule,
        (prefill_width, prefill_span): (usize, PrefillSpan),
    ) -> SpecConfig {
        SpecConfig {
            pad_to_k: !matches!(drafting, Drafting::None),
            drafting,
            prefill_width: Some(prefill_width),
            optimistic: false,
            draft_stop_below: 0.0,
            delta_guided: true,
            max_tokens: job.max_tokens,
            sampling: job.sampling.clone(),
            eos: self.tokenizer.eos_tokens().to_vec(),
            first_token_from_prefill: true,
            prefill_span,
            schedule,
        }
    }
}

/// The adapter ids the server lists.
fn list_adapters(config: &ClientConfig) -> Result<Vec<String>, ApiError> {
    let mut client = AdapterClient::connect(config.clone()).map_err(ApiError::upstream)?;
    let list = client.list_adapters().map_err(ApiError::upstream)?;
    Ok(list.into_iter().map(|a| a.adapter_id).collect())
}

/// `he`: the request's HE traffic; `decode`: its part after the prompt's
/// passes.
fn private_cost(
    out: &SpecOutput,
    he: &HeTimings,
    decode: &HeTimings,
    schedule: String,
) -> PrivateCost {
    let prefill = he.without(decode);
    PrivateCost {
        masked_tokens: 0,
        private: true,
        schedule: Some(schedule),
        rounds: out.stats.rounds as u64,
        tokens_per_round: out.stats.mean_accepted_length(out.tokens.len()),
        round_trips: he.round_trips,
        bytes_up: he.bytes_up,
        bytes_down: he.bytes_down,
        client_he_ms: he.encrypt_ms + he.decrypt_ms,
        server_ms: he.server_ms,
        network_ms: he.network_ms,
        ttft_ms: 0.0,
        total_ms: 0.0,
        cached_tokens: out.stats.cached_tokens as u64,
        prefilled_tokens: out.stats.prefilled_tokens as u64,
        wire_prefill: WireDensity::of(&prefill),
        wire_decode: WireDensity::of(decode),
    }
}

/// Token ids → text pieces → stop sequences → the sink; counts tokens and
/// times the first one.
struct TextOut<'a> {
    stream: TextStream<'a>,
    stop: StopMatcher,
    sink: &'a mut dyn FnMut(String) -> bool,
    tokens: usize,
    first: Option<Instant>,
    cancelled: bool,
}

impl<'a> TextOut<'a> {
    fn new(tokenizer: &'a Tokenizer, job: &Job, sink: &'a mut dyn FnMut(String) -> bool) -> Self {
        Self {
            stream: TextStream::new(tokenizer),
            stop: StopMatcher::new(job.stops.clone()),
            sink,
            tokens: 0,
            first: None,
            cancelled: false,
        }
    }

    /// One round's tokens; `Err(Stopped)` ends the generation.
    fn push(&mut self, tokens: &[u32]) -> Result<(), SpecError> {
        self.first.get_or_insert_with(Instant::now);
        for &t in tokens {
            self.tokens += 1;
            if let Some(piece) = self.stream.push(t)? {
                let out = self.stop.push(&piece);
                if !out.is_empty() && !(self.sink)(out) {
                    self.cancelled = true;
                    return Err(SpecError::Stopped);
                }
                if self.stop.stopped() {
                    return Err(SpecError::Stopped);
                }
            }
        }
        Ok(())
    }

    fn finish(mut self, job: &Job, out: &SpecOutput, mut cost: PrivateCost) -> Finished {
        let rest = self.stop.finish();
        if !rest.is_empty() && !self.cancelled {
            (self.sink)(rest);
        }
        let finish_reason = if self.stop.stopped() || out.stopped_at_eos {
            "stop"
        } else {
            "length"
        };
        let now = Instant::now();
        cost.ttft_ms = self
            .first
            .map_or(0.0, |f| (f - job.received).as_secs_f64() * 1e3);
        cost.total_ms = (now - job.received).as_secs_f64() * 1e3;
        let prompt_tokens = job.prompt.len() as u32;
        let completion_tokens = self.tokens as u32;
        Finished {
            finish_reason,
            usage: Usage {
                prompt_tokens,
                completion_tokens,
                total_tokens: prompt_tokens + completion_tokens,
                prompt_tokens_details: Some(PromptTokensDetails {
                    cached_tokens: cost.cached_tokens as u32,
                }),
            },
            cost,
        }
    }
}

//! The HTTP routes (axum): `GET /v1/models`, `POST /v1/chat/completions`,
//! `POST /v1/completions`, `GET /health`. Each generation runs on its own
//! thread ([`Engine::run`] blocks) and sends server-sent events or one JSON
//! object through a channel; a client disconnect stops it after its round.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use cipherlora_model::SamplingParams;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::engine::{Engine, Finished, Job};
use crate::openai::{
    ChatChoice, ChatChunk, ChatRequest, ChatResponse, ChunkChoice, ChunkDelta, CompletionChoice,
    CompletionRequest, CompletionResponse, ModelCard, ModelList, PrivateCost, Prompt,
    ResponseMessage, SamplingFields, Usage,
};
use crate::{ApiError, InternalError};

/// Largest request body, bytes.
pub const MAX_BODY_BYTES: usize = 4 << 20;

/// Default `max_tokens` of `/v1/completions` (OpenAI's).
pub const COMPLETION_DEFAULT_MAX_TOKENS: usize = 16;

/// The router over `engine`.
pub fn router(engine: Arc<Engine>) -> Router {
    Router::new()
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/health", get(health))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(engine)
}

async fn health(State(engine): State<Arc<Engine>>) -> Json<Value> {
    let adapters: serde_json::Map<String, Value> = engine
        .adapters()
        .iter()
        .map(|a| {
            let state = match a.is_open() {
                Some(true) => "open",
                Some(false) => "closed",
                None => "busy",
            };
            (a.id().to_string(), json!(state))
        })
        .collect();
    Json(json!({"status": "ok", "adapters": adapters}))
}

async fn models(State(engine): State<Arc<Engine>>) -> Json<ModelList> {
    let base = engine.base_id().to_string();
    let mut data = vec![ModelCard {
        id: base.clone(),
        object: "model".into(),
        created: engine.created(),
        owned_by: "local".into(),
        parent: None,
    }];
    data.extend(engine.adapters().iter().map(|a| ModelCard {
        id: a.id().to_string(),
        object: "model".into(),
        created: engine.created(),
        owned_by: "adapter-server".into(),
        parent: Some(base.clone()),
    }));
    Json(ModelList {
        object: "list".into(),
        data,
    })
}

/// Parses a JSON body; errors name the fault, never the body's text.
fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::BadRequest {
        message: match e.classify() {
            serde_json::error::Category::Data => format!(
                "the request body does not have the expected fields or types (line {}, column {})",
                e.line(),
                e.column()
            ),
            _ => format!(
                "the request body is not valid JSON (line {}, column {})",
                e.line(),
                e.column()
            ),
        },
        param: None,
    })
}

/// A [`Job`] from the shared request fields.
fn job(
    engine: &Engine,
    fields: &SamplingFields,
    prompt: Vec<u32>,
    default_max: usize,
    received: Instant,
) -> Result<Job, ApiError> {
    if fields.n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad("n", "only n = 1 is supported"));
    }
    let cap = engine.max_tokens_cap();
    let max_tokens = match fields.max_completion_tokens.or(fields.max_tokens) {
        None => default_max.min(cap),
        Some(0) => return Err(ApiError::bad("max_tokens", "max_tokens must be at least 1")),
        Some(n) if n as usize > cap => {
            return Err(ApiError::bad(
                "max_tokens",
                format!("max_tokens is at most {cap} on this endpoint"),
            ));
        }
        Some(n) => n as usize,
    };
    let temperature = fields.temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::bad(
            "temperature",
            "temperature must be in [0, 2]",
        ));
    }
    let top_p = match fields.top_p {
        Some(p) if !(p > 0.0 && p <= 1.0) => {
            return Err(ApiError::bad("top_p", "top_p must be in (0, 1]"));
        }
        Some(p) if p < 1.0 => Some(p),
        _ => None,
    };
    let stops = fields
        .stop
        .clone()
        .map(|s| s.into_vec())
        .unwrap_or_default();
    if stops.len() > 4 {
        return Err(ApiError::bad("stop", "at most 4 stop sequences"));
    }
    let job = Job {
        model: fields.model.clone(),
        prompt,
        max_tokens,
        sampling: SamplingParams {
            temperature,
            top_k: None,
            top_p,
            repetition_penalty: 1.0,
            seed: fields.seed.unwrap_or(0),
        },
        stops,
        received,
    };
    engine.check(&job)?;
    Ok(job)
}

async fn chat(State(engine): State<Arc<Engine>>, body: Bytes) -> Response {
    let received = Instant::now();
    let result = (|| {
        let req: ChatRequest = parse(&body)?;
        if req.messages.is_empty() {
            return Err(ApiError::bad("messages", "messages is empty"));
        }
        let messages = req
            .messages
            .iter()
            .map(|m| m.to_chat().map_err(|e| ApiError::bad("messages", e)))
            .collect::<Result<Vec<_>, _>>()?;
        let prompt = engine.chat_prompt(&messages)?;
        let job = job(&engine, &req.sampling, prompt, usize::MAX, received)?;
        Ok((job, req.sampling))
    })();
    match result {
        Ok((job, fields)) => respond(engine, job, &fields, Shape::Chat).await,
        Err(e) => e.into_response(),
    }
}

async fn completions(State(engine): State<Arc<Engine>>, body: Bytes) -> Response {
    let received = Instant::now();
    let result = (|| {
        let req: CompletionRequest = parse(&body)?;
        let text = match req.prompt {
            Prompt::One(s) => s,
            Prompt::Many(mut v) if v.len() == 1 => v.remove(0),
            Prompt::Many(_) => {
                return Err(ApiError::bad("prompt", "only one prompt per request"));
            }
        };
        let prompt = engine.encode(&text)?;
        let job = job(
            &engine,
            &req.sampling,
            prompt,
            COMPLETION_DEFAULT_MAX_TOKENS,
            received,
        )?;
        Ok((job, req.sampling))
    })();
    match result {
        Ok((job, fields)) => respond(engine, job, &fields, Shape::Completion).await,
        Err(e) => e.into_response(),
    }
}

/// Which OpenAI object a response is.
#[derive(Debug, Clone, Copy)]
enum Shape {
    Chat,
    Completion,
}

/// What the generation thread sends.
enum Produced {
    Text(String),
    /// Boxed: a finished request's costs are large beside a text piece.
    Done(Box<Result<Finished, ApiError>>),
}

/// Starts the generation thread; its output arrives on the receiver.
fn start(engine: Arc<Engine>, job: Job) -> mpsc::Receiver<Produced> {
    let (tx, rx) = mpsc::channel(64);
    std::thread::spawn(move || {
        let result = engine.run(&job, &mut |text| {
            tx.blocking_send(Produced::Text(text)).is_ok()
        });
        let _ = tx.blocking_send(Produced::Done(Box::new(result)));
    });
    rx
}

/// The id, time and model every object of one response shares.
struct Envelope {
    id: String,
    created: u64,
    model: String,
    shape: Shape,
}

impl Envelope {
    fn new(model: &str, shape: Shape) -> Self {
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let nonce = created.wrapping_mul(6364136223846793005) ^ u64::from(std::process::id());
        let prefix = match shape {
            Shape::Chat => "chatcmpl",
            Shape::Completion => "cmpl",
        };
        Self {
            id: format!("{prefix}-{nonce:016x}{:08x}", next_serial()),
            created,
            model: model.to_string(),
            shape,
        }
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.shape, chunk) {
            (Shape::Chat, false) => "chat.completion",
            (Shape::Chat, true) => "chat.completion.chunk",
            (Shape::Completion, _) => "text_completion",
        }
    }

    /// A streamed chunk with new text (or the first, role-only one), or the last.
    fn chunk(&self, text: Option<&str>, role: bool, finished: Option<&Finished>) -> Value {
        let finish_reason = finished.map(|f| f.finish_reason.to_string());
        let cipherlora = finished.map(|f| f.cost.clone());
        match self.shape {
            Shape::Chat => json!(self.chat_chunk(
                vec![ChunkChoice {
                    index: 0,
                    delta: ChunkDelta {
                        role: role.then(|| "assistant".into()),
                        content: text.map(String::from),
                    },
                    finish_reason,
                }],
                None,
                cipherlora,
            )),
            Shape::Completion => json!(self.completion(
                vec![CompletionChoice {
                    index: 0,
                    text: text.unwrap_or_default().into(),
                    finish_reason,
                    logprobs: None,
                }],
                None,
                cipherlora,
            )),
        }
    }

    fn chat_chunk(
        &self,
        choices: Vec<ChunkChoice>,
        usage: Option<Usage>,
        cipherlora: Option<PrivateCost>,
    ) -> ChatChunk {
        ChatChunk {
            id: self.id.clone(),
            object: self.object(true).into(),
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
            cipherlora,
        }
    }

    fn completion(
        &self,
        choices: Vec<CompletionChoice>,
        usage: Option<Usage>,
        cipherlora: Option<PrivateCost>,
    ) -> CompletionResponse {
        CompletionResponse {
            id: self.id.clone(),
            object: self.object(false).into(),
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
            cipherlora,
        }
    }

    /// The usage chunk (`stream_options.include_usage`).
    fn usage_chunk(&self, finished: &Finished) -> Value {
        match self.shape {
            Shape::Chat => json!(self.chat_chunk(Vec::new(), Some(finished.usage), None)),
            Shape::Completion => json!(self.completion(Vec::new(), Some(finished.usage), None)),
        }
    }

    /// The whole (non-streamed) response.
    fn full(&self, text: String, finished: &Finished) -> Value {
        let finish_reason = finished.finish_reason.to_string();
        match self.shape {
            Shape::Chat => json!(ChatResponse {
                id: self.id.clone(),
                object: self.object(false).into(),
                created: self.created,
                model: self.model.clone(),
                choices: vec![ChatChoice {
                    index: 0,
                    message: ResponseMessage {
                        role: "assistant".into(),
                        content: text,
                    },
                    finish_reason,
                }],
                usage: finished.usage,
                cipherlora: finished.cost.clone(),
            }),
            Shape::Completion => json!(self.completion(
                vec![CompletionChoice {
                    index: 0,
                    text,
                    finish_reason: Some(finish_reason),
                    logprobs: None,
                }],
                Some(finished.usage),
                Some(finished.cost.clone()),
            )),
        }
    }
}

fn next_serial() -> u32 {
    static SERIAL: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

async fn respond(engine: Arc<Engine>, job: Job, fields: &SamplingFields, shape: Shape) -> Response {
    let envelope = Envelope::new(&job.model, shape);
    let mut rx = start(engine, job);
    if !fields.stream {
        let mut text = String::new();
        while let Some(p) = rx.recv().await {
            match p {
                Produced::Text(t) => text.push_str(&t),
                Produced::Done(done) => match *done {
                    Ok(f) => return Json(envelope.full(text, &f)).into_response(),
                    Err(e) => return e.into_response(),
                },
            }
        }
        return ApiError::from(InternalError::NoAnswer).into_response();
    }
    let include_usage = fields
        .stream_options
        .as_ref()
        .is_some_and(|o| o.include_usage);
    let (tx, events) = mpsc::channel::<Result<Event, Infallible>>(64);
    tokio::spawn(async move {
        let send = |v: Value| {
            let tx = tx.clone();
            async move {
                tx.send(Ok(Event::default().data(v.to_string())))
                    .await
                    .is_ok()
            }
        };
        if matches!(envelope.shape, Shape::Chat)
            && !send(envelope.chunk(Some(""), true, None)).await
        {
            return;
        }
        while let Some(p) = rx.recv().await {
            let ok = match p {
                Produced::Text(t) => send(envelope.chunk(Some(&t), false, None)).await,
                Produced::Done(done) => {
                    match *done {
                        Ok(f) => {
                            let _ = send(envelope.chunk(None, false, Some(&f))).await;
                            if include_usage {
                                let _ = send(envelope.usage_chunk(&f)).await;
                            }
                        }
                        Err(e) => {
                            let _ = send(json!(e.body())).await;
                        }
                    }
                    break;
                }
            };
            if !ok {
                return; // the client went away; dropping `rx` cancels the generation
            }
        }
        let _ = tx.send(Ok(Event::default().data("[DONE]"))).await;
    });
    Sse::new(ReceiverStream::new(events))
        .keep_alive(KeepAlive::default())
        .into_response()
}

//! A local OpenAI-compatible HTTP endpoint for private generation
//! (`cipherlora api`).
//!
//! Tools that speak the OpenAI API (editors, chat UIs, the `openai` Python
//! client) point their base URL at this endpoint on the user's own machine.
//! The base model runs here in plaintext; each adapter of the remote
//! adapter server is listed as a model of its own (`parent` = the base
//! model, as vLLM lists LoRA adapters), and a request for it runs private
//! speculative generation: the adapter's deltas come back under CKKS, and
//! the prompt and the output never leave this process except as
//! ciphertexts (`shared/threat-model.md`).
//!
//! - [`routes`]: `GET /v1/models`, `POST /v1/chat/completions`,
//!   `POST /v1/completions` (streamed as server-sent events or not),
//!   `GET /health`, on axum.
//! - [`Engine`]: the model, the tokenizer (with the model's own chat
//!   template) and the adapters; runs one request.
//! - [`sessions`]: each adapter's warm HE sessions, opened once and kept
//!   across requests, with a bounded queue.
//! - [`openai`]: the request and response bodies.
//! - [`Queue`]: the bounded queue of requests per model (429 beyond it).
//! - [`StopMatcher`]: stop sequences over streamed text.
//! - [`ApiError`]: every failure, as OpenAI's JSON error with its HTTP status.

mod engine;
mod error;
pub mod openai;
mod queue;
pub mod routes;
pub mod sessions;
mod stop;

pub use engine::{Engine, EngineConfig, Finished, Job};
pub use error::ApiError;
pub use queue::{Queue, Ticket};
pub use routes::router;
pub use sessions::{DraftLength, SessionSettings, WarmAdapter};
pub use stop::StopMatcher;

use std::future::Future;
use std::sync::Arc;

/// Serves the routes of `engine` on `listener` until `shutdown` resolves,
/// then closes the adapters' sessions.
///
/// # Errors
/// [`ApiError::Internal`] when serving fails.
pub async fn serve(
    listener: tokio::net::TcpListener,
    engine: Arc<Engine>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ApiError> {
    axum::serve(listener, router(engine.clone()))
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|e| ApiError::Internal(format!("serving: {e}")))?;
    tokio::task::spawn_blocking(move || engine.close_all())
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(())
}

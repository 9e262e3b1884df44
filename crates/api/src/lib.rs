//! A local OpenAI-compatible HTTP endpoint for private generation
//! (`cipherlora api`). The base model runs here in plaintext; each adapter
//! of the remote adapter server is listed as a model (`parent` = the base
//! model, as vLLM lists LoRA adapters) and runs private speculative
//! generation, so the prompt and output leave this process only as
//! ciphertexts. Start with [`routes`] and [`Engine`]; [`sessions`] keeps each
//! adapter's warm HE sessions, [`openai`] the bodies, [`ApiError`] the errors.

mod engine;
mod error;
pub mod openai;
mod queue;
pub mod routes;
pub mod sessions;
mod stop;

pub use engine::{Engine, EngineConfig, Finished, Job};
pub use error::{ApiError, InternalError, UpstreamError};
pub use queue::{Queue, Ticket};
pub use routes::router;
pub use sessions::{DraftLength, MaskedSettings, SessionSettings, WarmAdapter};
pub use stop::StopMatcher;

use std::future::Future;
use std::sync::Arc;

/// Serves `engine` on `listener` until `shutdown`, then closes the sessions.
/// Errors: [`ApiError::Internal`] when serving fails.
pub async fn serve(
    listener: tokio::net::TcpListener,
    engine: Arc<Engine>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ApiError> {
    axum::serve(listener, router(engine.clone()))
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(InternalError::Serve)?;
    tokio::task::spawn_blocking(move || engine.close_all())
        .await
        .map_err(InternalError::Shutdown)?;
    Ok(())
}

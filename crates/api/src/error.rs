//! The crate's one error type, sent as OpenAI's JSON error shape with the
//! status OpenAI uses; messages never quote the prompt or the output, and
//! quoted fields are cut to 64 characters.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use cipherlora_model::ModelError;
use cipherlora_private::PrivateError;
use cipherlora_service::ServiceError;

use crate::openai::{ErrorBody, ErrorDetail, truncate};

/// Everything a request can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApiError {
    /// Malformed, or asks for something not served (400, `invalid_request_error`).
    #[error("{message}")]
    BadRequest {
        /// What is wrong.
        message: String,
        /// The field at fault.
        param: Option<&'static str>,
    },
    /// `model` names neither the base model nor an adapter (404, `model_not_found`).
    #[error("the model {model:?} does not exist")]
    ModelNotFound {
        /// The requested id, cut to 64 characters.
        model: String,
    },
    /// Too many requests are queued for this model (429).
    #[error("{queued} requests are already queued for {model:?}; retry later")]
    QueueFull {
        /// The model.
        model: String,
        /// Requests waiting or running.
        queued: usize,
    },
    /// The adapter server failed, refused or is unreachable (502; 503 when
    /// it refused for lack of capacity); sessions are reopened.
    #[error("adapter server: {0}")]
    Upstream(#[source] UpstreamError),
    /// A failure of this process (500).
    #[error("internal error: {0}")]
    Internal(#[source] InternalError),
    /// A setting the endpoint cannot run with (at start-up; 500 on a request).
    #[error("invalid setting {setting}: {reason}")]
    InvalidSetting {
        /// The setting (its command-line flag).
        setting: &'static str,
        /// Why it is refused.
        reason: String,
    },
}

/// A failure of the endpoint's own process ([`ApiError::Internal`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InternalError {
    /// Loading the model, its quantized drafter or its tokenizer failed (at start-up).
    #[error("loading the model: {0}")]
    Load(#[source] ModelError),
    /// A plaintext generation failed (the base model, or decoding itself).
    #[error("decoding: {0}")]
    Decoding(#[source] cipherlora_speculative::SpecError),
    /// A request reached an adapter whose sessions were not open.
    #[error("the adapter's sessions are not open")]
    SessionsNotOpen,
    /// The generation thread ended without sending its answer.
    #[error("the generation thread ended without an answer")]
    NoAnswer,
    /// The HTTP server failed.
    #[error("serving: {0}")]
    Serve(#[source] std::io::Error),
    /// Closing the sessions at shutdown did not finish.
    #[error("closing the sessions: {0}")]
    Shutdown(#[source] tokio::task::JoinError),
}

impl From<InternalError> for ApiError {
    fn from(e: InternalError) -> Self {
        ApiError::Internal(e)
    }
}

/// What went wrong on the adapter server's side of a request.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UpstreamError {
    /// The service failed or refused (connection, TLS, token, limits).
    #[error(transparent)]
    Service(#[from] ServiceError),
    /// Opening the HE sessions failed (offer, keys, plans).
    #[error(transparent)]
    Sessions(#[from] PrivateError),
    /// A pass through the adapter server failed mid-generation.
    #[error(transparent)]
    Generation(#[from] ModelError),
}

impl UpstreamError {
    /// Whether the server serves no adapter of the requested id.
    pub fn is_unknown_adapter(&self) -> bool {
        match self {
            UpstreamError::Sessions(PrivateError::UnknownAdapter { .. }) => true,
            UpstreamError::Service(e) | UpstreamError::Sessions(PrivateError::Service(e)) => {
                e.is_unknown_adapter()
            }
            _ => false,
        }
    }

    /// Whether the server refused for lack of capacity (a limit that
    /// clears by itself: retry later).
    pub fn is_capacity(&self) -> bool {
        let service = match self {
            UpstreamError::Service(e) => Some(e),
            UpstreamError::Sessions(PrivateError::Service(e)) => Some(e),
            _ => None,
        };
        service.is_some_and(ServiceError::is_capacity)
    }
}

impl ApiError {
    /// A 502 (503 at capacity, 404 for an adapter the server does not
    /// serve) for an adapter server failure.
    pub fn upstream(e: impl Into<UpstreamError>) -> Self {
        Self::Upstream(e.into())
    }

    /// A 400 about `param`.
    pub fn bad(param: &'static str, message: impl Into<String>) -> Self {
        Self::BadRequest {
            message: message.into(),
            param: Some(param),
        }
    }

    /// A 404 for `model`.
    pub fn model_not_found(model: &str) -> Self {
        Self::ModelNotFound {
            model: truncate(model, 64),
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::ModelNotFound { .. } => StatusCode::NOT_FOUND,
            ApiError::QueueFull { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Upstream(e) if e.is_unknown_adapter() => StatusCode::NOT_FOUND,
            ApiError::Upstream(e) if e.is_capacity() => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Upstream(_) => StatusCode::BAD_GATEWAY,
            ApiError::Internal(_) | ApiError::InvalidSetting { .. } => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }

    /// OpenAI's error body.
    pub fn body(&self) -> ErrorBody {
        let (kind, param, code) = match self {
            ApiError::BadRequest { param, .. } => ("invalid_request_error", *param, None),
            ApiError::ModelNotFound { .. } => (
                "invalid_request_error",
                Some("model"),
                Some("model_not_found"),
            ),
            ApiError::QueueFull { .. } => ("rate_limit_error", None, Some("rate_limit_exceeded")),
            ApiError::Upstream(e) if e.is_unknown_adapter() => (
                "invalid_request_error",
                Some("model"),
                Some("model_not_found"),
            ),
            ApiError::Upstream(e) if e.is_capacity() => {
                ("api_error", None, Some("adapter_server_busy"))
            }
            ApiError::Upstream(_) => ("api_error", None, Some("adapter_server_error")),
            ApiError::Internal(_) | ApiError::InvalidSetting { .. } => ("api_error", None, None),
        };
        ErrorBody {
            error: ErrorDetail {
                message: truncate(&self.to_string(), 512),
                kind: kind.into(),
                param: param.map(String::from),
                code: code.map(String::from),
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status().is_server_error() {
            tracing::warn!(status = %self.status(), error = %self, "request failed");
        }
        (self.status(), axum::Json(self.body())).into_response()
    }
}

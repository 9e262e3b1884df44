//! The crate's one error type.

use std::time::Duration;

use cipherlora_proto::{ErrorReason, ProtoError};
use thiserror::Error;

/// Everything that can go wrong in `cipherlora-service` (server setup and client calls).
/// Server-side refusals reach the client as [`ServiceError::Rpc`].
#[non_exhaustive]
#[derive(Debug, Error)]
pub enum ServiceError {
    /// Reading or writing a file (certificate, key, token file) failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, with the path.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A configuration value is invalid (empty token file, bad endpoint, ...).
    #[error("invalid configuration: {reason}")]
    Config {
        /// What is wrong, in words.
        reason: String,
    },
    /// Making a certificate failed.
    #[error("certificate generation failed: {0}")]
    Certificate(String),
    /// The transport failed (connect, TLS handshake, bind, serve).
    #[error("transport error: {0}")]
    Transport(#[source] TransportError),
    /// The server (or the gRPC layer) refused a call.
    #[error("rpc failed: {code:?} ({reason:?}): {message}")]
    Rpc {
        /// gRPC status code.
        code: tonic::Code,
        /// Machine-readable reason, when the server sent one.
        reason: Option<ErrorReason>,
        /// The status message.
        message: String,
    },
    /// The response stream ended before every pending request was answered.
    #[error("response stream closed with {pending} requests unanswered")]
    StreamClosed {
        /// Requests still waiting for a response.
        pending: usize,
    },
    /// A call took longer than the configured timeout.
    #[error("no response within {after:?}")]
    Timeout {
        /// The timeout.
        after: Duration,
    },
    /// A round was requested before a session was opened.
    #[error("no open session: call open_session first")]
    NoSession,
    /// A reopened session runs another plan than the lost one (the server's planner changed); not
    /// transient.
    #[error(
        "the reopened session runs another plan than the lost one (the server's planner changed)"
    )]
    PlanChanged,
    /// The server's answer does not match the request (unknown group, duplicate response, malformed
    /// open-session response).
    #[error("protocol violation by the server: {fault}")]
    Protocol {
        /// What is wrong.
        fault: ServerFault,
    },
}

/// How the server's answer broke the protocol ([`ServiceError::Protocol`]).
#[non_exhaustive]
#[derive(Debug, Error)]
pub enum ServerFault {
    /// A field of its answer did not decode.
    #[error("{what}: {source}")]
    Malformed {
        /// Which answer or field.
        what: &'static str,
        /// The decoding error.
        #[source]
        source: ProtoError,
    },
    /// A group response that no request in flight waits for (unknown, or answered already).
    #[error("unexpected response for round {round} layer {layer} group {group}")]
    UnexpectedResponse {
        /// The round id.
        round: u64,
        /// The layer.
        layer: u32,
        /// The group.
        group: u32,
    },
    /// A split session that starts at another layer than asked for.
    #[error("server runs layers from {got}, asked {asked}")]
    FirstLayer {
        /// The first middle layer asked for.
        asked: u32,
        /// The first layer the server runs.
        got: u32,
    },
    /// Tree passes sent to a split server that does not announce them.
    #[error("the server does not support tree passes (tree_parents, keep)")]
    NoTreePasses,
    /// A split server's cache length after a pass differs from the client's count.
    #[error("server cache holds {got} positions after a pass to {expected}")]
    CacheLength {
        /// Positions the client expects.
        expected: u64,
        /// Positions the server reports.
        got: u64,
    },
}

impl ServerFault {
    pub(crate) fn malformed(what: &'static str) -> impl FnOnce(ProtoError) -> ServiceError {
        move |source| ServiceError::Protocol {
            fault: ServerFault::Malformed { what, source },
        }
    }
}

impl ServiceError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }

    /// True when the failure looks like a dropped connection or a vanished server (a status without
    /// [`ErrorReason`]), so a replay may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Transport(_) | Self::StreamClosed { .. } | Self::Timeout { .. } => true,
            Self::Rpc { code, reason, .. } => match reason {
                Some(r) => matches!(r, ErrorReason::ShuttingDown | ErrorReason::UnknownSession),
                None => matches!(
                    code,
                    tonic::Code::Unavailable
                        | tonic::Code::Unknown
                        | tonic::Code::Cancelled
                        | tonic::Code::Internal
                        | tonic::Code::Aborted
                ),
            },
            _ => false,
        }
    }

    /// True when the server refused for lack of capacity ([`ErrorReason::AtCapacity`]) or
    /// because it is shutting down: a refusal that clears by itself (elsewhere, behind a
    /// balancer).
    pub fn is_capacity(&self) -> bool {
        matches!(
            self.reason(),
            Some(ErrorReason::AtCapacity | ErrorReason::ShuttingDown)
        )
    }

    /// True when the server has no adapter of the id asked for.
    pub fn is_unknown_adapter(&self) -> bool {
        self.reason() == Some(ErrorReason::UnknownAdapter)
    }

    /// The gRPC code, for [`ServiceError::Rpc`].
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            Self::Rpc { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The server's reason, for [`ServiceError::Rpc`].
    pub fn reason(&self) -> Option<ErrorReason> {
        match self {
            Self::Rpc { reason, .. } => *reason,
            _ => None,
        }
    }
}

impl From<tonic::Status> for ServiceError {
    fn from(s: tonic::Status) -> Self {
        Self::Rpc {
            code: s.code(),
            reason: crate::status::reason_of(&s),
            message: s.message().to_string(),
        }
    }
}

impl From<tonic::transport::Error> for ServiceError {
    fn from(e: tonic::transport::Error) -> Self {
        Self::Transport(TransportError::Grpc(e))
    }
}

/// How the transport failed ([`ServiceError::Transport`]).
#[non_exhaustive]
#[derive(Debug, Error)]
pub enum TransportError {
    /// gRPC's transport failed (connect, TLS handshake, bind, serve); the message carries its
    /// whole source chain, since the outermost one is terse.
    #[error("{}", chain(.0))]
    Grpc(tonic::transport::Error),
    /// A TCP connection to `addr` failed.
    #[error("connecting to {addr}: {source}")]
    Connect {
        /// The address.
        addr: std::net::SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The server's thread panicked.
    #[error("the server thread panicked")]
    ServerThreadPanicked,
}

/// An error's message followed by its sources' messages.
fn chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    msg
}

/// Shorthand for `Result<T, ServiceError>`.
pub type Result<T> = std::result::Result<T, ServiceError>;

//! The crate's one error type.

use thiserror::Error;

/// Everything split generation can fail with.
#[non_exhaustive]
#[derive(Debug, Error)]
pub enum SplitError {
    /// The model refused an input or failed (local layers, head, server layers in process).
    #[error(transparent)]
    Model(#[from] cipherlora_model::ModelError),
    /// The split server refused a call or the transport failed.
    #[error(transparent)]
    Service(#[from] cipherlora_service::ServiceError),
    /// Acceptance was given inconsistent inputs (a bug).
    #[error(transparent)]
    Spec(#[from] cipherlora_speculative::SpecError),
    /// The split or the generation settings do not fit the model.
    #[error("invalid split configuration: {reason}")]
    Config {
        /// What is wrong, in words.
        reason: String,
    },
    /// The split session was lost (server restart, idle eviction, a dropped connection) and
    /// reopening it or re-running the positions the server held failed
    /// ([`crate::ReplayingClient`]).
    #[error("split session lost; replaying its {positions} positions failed: {source}")]
    Replay {
        /// Positions the lost session held (the accepted prefix).
        positions: usize,
        /// Why the replay failed.
        #[source]
        source: Box<SplitError>,
    },
    /// The split session was lost again after the replays allowed
    /// ([`crate::ReplayingClient::with_max_replays`]).
    #[error("split session lost after {replays} replays: {source}")]
    SessionLost {
        /// Replays already made.
        replays: usize,
        /// The failed call's error.
        #[source]
        source: cipherlora_service::ServiceError,
    },
    /// The middle layers answered hidden states of the wrong size.
    #[error("middle layers returned {got} values, expected {expected}")]
    MiddleShape {
        /// Values received.
        got: usize,
        /// Values T × d expected.
        expected: usize,
    },
}

impl From<candle_core::Error> for SplitError {
    /// A tensor operation of the client's own passes failed: reported as the model's error.
    fn from(e: candle_core::Error) -> Self {
        Self::Model(e.into())
    }
}

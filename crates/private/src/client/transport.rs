//! One round trip per layer group.

use std::sync::Arc;
use std::time::Instant;

use cipherlora_helora::wire::{GroupRequest, GroupResponse};

use crate::{PrivateError, ServerSession};

/// The server's answer to one group request.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The encrypted deltas.
    pub response: GroupResponse,
    /// Server compute time in ms, when the transport can tell (the rest of
    /// the round trip is network and serialisation).
    pub server_ms: Option<f64>,
}

/// Carries group requests to the adapter server and brings back responses.
///
/// A transport is opened for one session (its Galois keys are on the
/// server); `round` must be idempotent for the same request so that a
/// transport may replay it after a dropped connection.
pub trait Transport {
    /// Sends one group request and waits for its response.
    ///
    /// # Errors
    /// [`PrivateError::Transport`] when the link fails; the server's typed
    /// errors otherwise.
    fn round(&mut self, request: &GroupRequest) -> Result<Reply, PrivateError>;

    /// Sends many group requests of one verify pass together (one round
    /// trip on a network transport: pipelined on the session's stream) and
    /// returns their replies in order. The default sends them one by one.
    ///
    /// # Errors
    /// As [`Transport::round`].
    fn rounds(&mut self, requests: &[GroupRequest]) -> Result<Vec<Reply>, PrivateError> {
        requests.iter().map(|r| self.round(r)).collect()
    }

    /// Starts a streamed round (one trip of a streamed fixed point,
    /// [`cipherlora_model::DeltaStream`]) and returns its number, which
    /// [`Transport::send`] and [`Transport::receive`] take. The default
    /// numbers nothing (0): its `send` answers at once.
    fn open_round(&mut self) -> u64 {
        0
    }

    /// Sends one request of streamed round `round`. Returns its reply when
    /// the transport answered at once (the default: [`Transport::round`]),
    /// `None` when the reply is to be taken with [`Transport::receive`].
    ///
    /// # Errors
    /// As [`Transport::round`].
    fn send(&mut self, round: u64, request: &GroupRequest) -> Result<Option<Reply>, PrivateError> {
        let _ = round;
        self.round(request).map(Some)
    }

    /// Waits for the reply to the request of (`round`, `layer`, `group`)
    /// that [`Transport::send`] did not answer at once.
    ///
    /// # Errors
    /// [`PrivateError::Transport`] when no such request is in flight (the
    /// default: a transport that answers every send at once has none); as
    /// [`Transport::round`] otherwise.
    fn receive(&mut self, round: u64, layer: u32, group: u32) -> Result<Reply, PrivateError> {
        Err(PrivateError::Transport(format!(
            "no request of round {round} layer {layer} group {group} in flight"
        )))
    }
}

/// Calls a [`ServerSession`] in the same process, through the same byte
/// encoding as the network (requests and responses are serialised and
/// parsed, so sizes and validation are the real ones).
#[derive(Debug, Clone)]
pub struct InProcess {
    session: Arc<ServerSession>,
    /// Bytes sent to the server so far (requests).
    pub bytes_up: u64,
    /// Bytes received from the server so far (responses).
    pub bytes_down: u64,
}

impl InProcess {
    /// A transport to `session`.
    #[must_use]
    pub fn new(session: Arc<ServerSession>) -> Self {
        Self {
            session,
            bytes_up: 0,
            bytes_down: 0,
        }
    }
}

impl Transport for InProcess {
    fn round(&mut self, request: &GroupRequest) -> Result<Reply, PrivateError> {
        let up = request.to_bytes();
        self.bytes_up += up.len() as u64;
        let started = Instant::now();
        let parsed = GroupRequest::from_bytes(&up)?;
        let down = self.session.handle(&parsed)?.to_bytes();
        let server_ms = started.elapsed().as_secs_f64() * 1e3;
        self.bytes_down += down.len() as u64;
        Ok(Reply {
            response: GroupResponse::from_bytes(&down)?,
            server_ms: Some(server_ms),
        })
    }
}

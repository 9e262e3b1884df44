//! One round trip per layer group.

use std::sync::Arc;
use std::time::Instant;

use cipherlora_proto::v1::{GroupRequest, GroupResponse};
use prost::Message;

use crate::{PrivateError, ServerSession};

/// The server's answer to one group request.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The encrypted deltas.
    pub response: GroupResponse,
    /// Server compute time in ms, when the transport can tell.
    pub server_ms: Option<f64>,
}

/// Carries group requests to the adapter server; `round` must be idempotent (replayed on reconnect).
pub trait Transport {
    /// Sends one group request and waits for its response. Errors:
    /// [`PrivateError::Service`] when the link fails, else the server's.
    fn round(&mut self, request: &GroupRequest) -> Result<Reply, PrivateError>;

    /// Sends one pass's requests together (pipelined on a network) and returns
    /// the replies in order. Errors: as [`Transport::round`].
    fn rounds(&mut self, requests: &[GroupRequest]) -> Result<Vec<Reply>, PrivateError> {
        requests.iter().map(|r| self.round(r)).collect()
    }

    /// Starts a streamed round ([`cipherlora_model::DeltaStream`]); returns its number.
    fn open_round(&mut self) -> u64 {
        0
    }

    /// Sends one request of streamed round `round`: its reply when answered at
    /// once (default), `None` to take it with [`Transport::receive`].
    /// Errors: as [`Transport::round`].
    fn send(&mut self, round: u64, request: &GroupRequest) -> Result<Option<Reply>, PrivateError> {
        let _ = round;
        self.round(request).map(Some)
    }

    /// Waits for the reply to (`round`, `layer`, `group`). Errors:
    /// [`PrivateError::NotInFlight`] when none is in flight; as [`Transport::round`].
    fn receive(&mut self, round: u64, layer: u32, group: u32) -> Result<Reply, PrivateError> {
        Err(PrivateError::NotInFlight {
            round,
            layer,
            group,
        })
    }
}

/// Calls a [`ServerSession`] in process through the network's encoding (protobuf).
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
        let up = request.encode_to_vec();
        self.bytes_up += up.len() as u64;
        let started = Instant::now();
        let parsed = GroupRequest::decode(up.as_slice()).map_err(PrivateError::Decode)?;
        let down = self.session.handle(&parsed)?.encode_to_vec();
        let server_ms = started.elapsed().as_secs_f64() * 1e3;
        self.bytes_down += down.len() as u64;
        Ok(Reply {
            response: GroupResponse::decode(down.as_slice()).map_err(PrivateError::Decode)?,
            server_ms: Some(server_ms),
        })
    }
}

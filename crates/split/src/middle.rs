//! Where the middle layers `[a, L − b)` run, as the client sees them: the
//! split server over gRPC ([`SplitClient`]) or, for references and tests,
//! the same model in process ([`InProcess`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use cipherlora_model::{KvCache, Model};
use cipherlora_service::SplitClient;

use crate::SplitError;
use crate::backend::ModelSession;

/// One answer of the middle layers, with what it cost.
#[derive(Debug, Clone, PartialEq)]
pub struct Forwarded {
    /// The residual stream after layer L − b, row-major T × d.
    pub hidden: Vec<f32>,
    /// Compute time the server reported (in process: the call's time).
    pub server: Duration,
    /// Request bytes sent (0 in process).
    pub bytes_up: u64,
    /// Response bytes received (0 in process).
    pub bytes_down: u64,
}

/// The middle layers of one split session.
pub trait MiddleLayers {
    /// Runs the middle layers on `hidden` (row-major `positions` × d, the
    /// residual stream after layer a) at positions
    /// `start..start+positions`, first dropping cached positions from
    /// `start` on (the rollback of rejected drafts).
    ///
    /// # Errors
    /// The server's refusal or a transport failure
    /// ([`SplitError::Service`]); [`SplitError::Model`] in process.
    fn forward(
        &mut self,
        start: usize,
        positions: usize,
        hidden: &[f32],
    ) -> Result<Forwarded, SplitError>;
}

impl MiddleLayers for SplitClient {
    fn forward(
        &mut self,
        start: usize,
        positions: usize,
        hidden: &[f32],
    ) -> Result<Forwarded, SplitError> {
        let before = self.stats();
        let hidden = SplitClient::forward(self, start, positions, hidden)?;
        let after = self.stats();
        Ok(Forwarded {
            hidden,
            server: Duration::from_micros(after.server_micros - before.server_micros),
            bytes_up: after.bytes_up - before.bytes_up,
            bytes_down: after.bytes_down - before.bytes_down,
        })
    }
}

/// The middle layers run in this process, with their own KV cache (what
/// the server computes, without a network).
pub struct InProcess(ModelSession);

impl InProcess {
    /// Layers `[a, L − b)` of `model` with a cache of `capacity` positions.
    ///
    /// # Errors
    /// [`SplitError::Model`] for a range outside the model.
    pub fn new(model: Arc<Model>, a: usize, b: usize, capacity: usize) -> Result<Self, SplitError> {
        let n = model.config().num_layers;
        let end = n.checked_sub(b).ok_or_else(|| SplitError::Config {
            reason: format!("{b} tail layers > {n} layers"),
        })?;
        let cache = KvCache::for_layers(model.config(), capacity, a..end)?;
        Ok(Self(ModelSession {
            model,
            layers: a..end,
            cache,
        }))
    }
}

impl MiddleLayers for InProcess {
    fn forward(
        &mut self,
        start: usize,
        positions: usize,
        hidden: &[f32],
    ) -> Result<Forwarded, SplitError> {
        let t0 = Instant::now();
        self.0.cache.truncate(start);
        let hidden = self.0.run(hidden.to_vec(), positions)?;
        Ok(Forwarded {
            hidden,
            server: t0.elapsed(),
            bytes_up: 0,
            bytes_down: 0,
        })
    }
}

//! Where the middle layers `[a, L − b)` run: over gRPC ([`SplitClient`]) or in process
//! ([`LocalMiddle`]).

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

/// One call of the middle layers: the compaction of the previous rows and this pass's rows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MiddlePass<'a> {
    /// Where the cached rows to keep begin: rows before `start` stay.
    pub start: usize,
    /// Cached rows (relative to `start`) moved to `start..`; the rest dropped (empty: truncate).
    pub keep: &'a [usize],
    /// Empty: causal; else the token tree over the pass's rows (Fu et al. 2024, §3).
    pub parents: &'a [Option<usize>],
    /// Rows T of this pass.
    pub positions: usize,
    /// The residual stream after layer a, row-major T × d.
    pub hidden: &'a [f32],
}

impl<'a> MiddlePass<'a> {
    /// A causal pass at `start` (cached rows from `start` on dropped).
    pub fn causal(start: usize, positions: usize, hidden: &'a [f32]) -> Self {
        Self {
            start,
            keep: &[],
            parents: &[],
            positions,
            hidden,
        }
    }

    /// Where this pass's rows are cached: `start + keep.len()`.
    pub fn base(&self) -> usize {
        self.start + self.keep.len()
    }
}

/// The middle layers of one split session.
pub trait MiddleLayers {
    /// Runs the middle layers on `pass.hidden` after compacting by `pass.keep`; returns row-major T
    /// × d. Errors: [`SplitError::Service`]; [`SplitError::Model`] in process.
    fn forward_pass(&mut self, pass: &MiddlePass<'_>) -> Result<Forwarded, SplitError>;

    /// Runs the middle layers causally on `hidden` at `start..`, dropping cached rows from `start`.
    fn forward(
        &mut self,
        start: usize,
        positions: usize,
        hidden: &[f32],
    ) -> Result<Forwarded, SplitError> {
        self.forward_pass(&MiddlePass::causal(start, positions, hidden))
    }
}

impl MiddleLayers for SplitClient {
    fn forward_pass(&mut self, pass: &MiddlePass<'_>) -> Result<Forwarded, SplitError> {
        let before = self.stats();
        let hidden = self.forward_tree(
            pass.start,
            pass.keep,
            pass.parents,
            pass.positions,
            pass.hidden,
        )?;
        let after = self.stats();
        Ok(Forwarded {
            hidden,
            server: Duration::from_micros(after.server_micros - before.server_micros),
            bytes_up: after.bytes_up - before.bytes_up,
            bytes_down: after.bytes_down - before.bytes_down,
        })
    }
}

/// The middle layers in this process, with their own KV cache.
pub struct LocalMiddle(ModelSession);

impl LocalMiddle {
    /// Layers `[a, L − b)` of `model` with a `capacity`-position cache. Errors:
    /// [`SplitError::Model`].
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

impl MiddleLayers for LocalMiddle {
    fn forward_pass(&mut self, pass: &MiddlePass<'_>) -> Result<Forwarded, SplitError> {
        let t0 = Instant::now();
        self.0.compact(pass.start, pass.keep)?;
        let hidden = self
            .0
            .run(pass.hidden.to_vec(), pass.positions, pass.parents)?;
        Ok(Forwarded {
            hidden,
            server: t0.elapsed(),
            bytes_up: 0,
            bytes_down: 0,
        })
    }
}

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

/// One call of the middle layers: what to keep of the previous pass's rows
/// and the rows of this pass, with their attention mask.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MiddlePass<'a> {
    /// Where the cached rows to keep begin: rows before `start` stay.
    pub start: usize,
    /// Cached rows (relative to `start`, strictly increasing) moved to
    /// `start..start+keep.len()`; the rest from `start` on is dropped.
    /// Empty: drop everything from `start` on (a rollback by truncation).
    pub keep: &'a [usize],
    /// Empty: the causal mask. Otherwise the token tree over this pass's
    /// rows: `parents[i]` is row i's parent (an earlier row) or `None` for
    /// a row off the cached prefix; row i sees the prefix, itself and its
    /// ancestors at RoPE position `start + keep.len() + depth(i)`
    /// (lookahead decoding's batch: Fu et al. 2024, §3).
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
    /// Runs the middle layers on `pass.hidden` after keeping the cached
    /// rows `pass.keep` from `pass.start` on (see [`MiddlePass`]); returns
    /// the residual stream after layer L − b, row-major T × d.
    ///
    /// # Errors
    /// The server's refusal or a transport failure
    /// ([`SplitError::Service`]); [`SplitError::Model`] in process (a keep
    /// list or tree that does not fit the cache included).
    fn forward_pass(&mut self, pass: &MiddlePass<'_>) -> Result<Forwarded, SplitError>;

    /// Runs the middle layers on `hidden` (row-major `positions` × d, the
    /// residual stream after layer a) at positions
    /// `start..start+positions` under the causal mask, first dropping
    /// cached positions from `start` on (the rollback of rejected drafts).
    ///
    /// # Errors
    /// As [`MiddleLayers::forward_pass`].
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

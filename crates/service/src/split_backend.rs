//! The seam between split-inference transport and model: the service checks every envelope, the
//! backend only runs layers on (plaintext) hidden states.

use std::ops::Range;

use crate::backend::BackendError;

/// The served model's public shape (mirrors `DescribeResponse`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SplitModelInfo {
    /// Human-readable model name.
    pub model: String,
    /// Decoder layers L.
    pub num_layers: u32,
    /// Residual stream width d.
    pub hidden_size: u32,
    /// Largest KV capacity (positions) one session may ask for.
    pub max_capacity: u32,
}

/// A served base model: opens per-session layer ranges.
pub trait SplitBackend: Send + Sync + 'static {
    /// The model's shape.
    fn info(&self) -> SplitModelInfo;

    /// KV-cache bytes of a session of `layers` and `capacity` positions (what the limits count).
    fn session_bytes(&self, layers: Range<u32>, capacity: u32) -> usize;

    /// A session running `layers` with an empty `capacity`-position KV cache. Errors:
    /// [`BackendError::LimitExceeded`], [`BackendError::Internal`].
    fn open(
        &self,
        layers: Range<u32>,
        capacity: u32,
    ) -> Result<Box<dyn SplitCompute>, BackendError>;
}

/// One session's layers and KV cache.
pub trait SplitCompute: Send {
    /// Cached positions.
    fn len(&self) -> usize;

    /// Positions the cache can hold.
    fn capacity(&self) -> usize;

    /// Whether no position is cached.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops cached positions from `len` on (no-op if `len >= self.len()`).
    fn truncate(&mut self, len: usize);

    /// Keeps cached rows `start + keep[k]` at `start + k`, dropping the rest from `start` (empty:
    /// truncate). Errors: [`BackendError::Internal`].
    fn compact(&mut self, start: usize, keep: &[usize]) -> Result<(), BackendError>;

    /// Runs the layers on `hidden` (row-major `positions` × d) at `len()..`, causal or as the token
    /// tree `parents` (Fu et al. 2024, §3), on a blocking thread. Errors:
    /// [`BackendError::Internal`]; the cache is then unchanged.
    fn forward(
        &mut self,
        hidden: Vec<f32>,
        positions: usize,
        parents: &[Option<usize>],
    ) -> Result<Vec<f32>, BackendError>;
}

//! The seam between the split-inference transport and the model.
//!
//! The service checks every request's envelope (session, positions, byte
//! length, finite values, cache capacity) before a [`SplitCompute`] sees
//! it; the model crate's backend (`cipherlora-split`) only runs layers.
//! Hidden states are plaintext here by design: split inference's privacy
//! is empirical only (BENCHMARKS.md, "Inversion attacks on split
//! activations").

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

    /// Bytes of KV cache a session of `layers` and `capacity` positions
    /// holds (what the per-session and per-token memory limits count).
    fn session_bytes(&self, layers: Range<u32>, capacity: u32) -> usize;

    /// A session running decoder layers `layers` with an empty KV cache of
    /// `capacity` positions. The service has checked `layers` (non-empty,
    /// within `info().num_layers`, leaving the client at least one layer on
    /// each side) and `capacity` (1 ..= `info().max_capacity`).
    ///
    /// # Errors
    /// [`BackendError::LimitExceeded`] if the cache cannot be allocated,
    /// [`BackendError::Internal`] otherwise.
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

    /// Keeps the cached rows `start + keep[k]` at `start + k` and drops
    /// the others from `start` on (the accepted path of a tree pass; the
    /// kept keys and values move as they are). The service has checked
    /// `start <= len()` and that `keep` increases strictly below
    /// `len() − start`; an empty `keep` is [`SplitCompute::truncate`] to
    /// `start`.
    ///
    /// # Errors
    /// [`BackendError::Internal`] if moving the rows fails.
    fn compact(&mut self, start: usize, keep: &[usize]) -> Result<(), BackendError>;

    /// Runs the session's layers on `hidden` (row-major `positions` × d
    /// finite f32, the residual stream entering the first layer) at
    /// positions `len()..len()+positions`; returns the residual stream
    /// leaving the last layer (same shape). `parents` is empty for the
    /// causal mask, else a token tree over the rows (`parents[i]`: row i's
    /// parent, an earlier row, or `None` off the cached prefix; row i sees
    /// the prefix, itself and its ancestors at RoPE position
    /// `len() + depth(i)`; Fu et al. 2024, "Break the Sequential Dependency
    /// of LLM Inference Using Lookahead Decoding", §3). The cache grows by
    /// `positions` (the service has checked that it fits and that the
    /// tree is well formed). Runs on a blocking thread.
    ///
    /// # Errors
    /// [`BackendError::Internal`] if the model fails; the cache length is
    /// then unchanged.
    fn forward(
        &mut self,
        hidden: Vec<f32>,
        positions: usize,
        parents: &[Option<usize>],
    ) -> Result<Vec<f32>, BackendError>;
}

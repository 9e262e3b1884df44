//! What can go wrong with one-time masks, on either side.

use thiserror::Error;

use super::GroupKey;

/// A mask request refused by the ledger or the pool; none of them changes any state.
#[non_exhaustive]
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum MaskError {
    /// The batch was never opened for this group.
    #[error("layer {} group {}: no batch {batch}", key.layer, key.group)]
    UnknownBatch {
        /// The group.
        key: GroupKey,
        /// The batch asked for.
        batch: u64,
    },
    /// Every mask of the batch was used, or its offline exchange failed: it is closed for good.
    #[error("layer {} group {}: batch {batch} is closed", key.layer, key.group)]
    BatchClosed {
        /// The group.
        key: GroupKey,
        /// The batch asked for.
        batch: u64,
    },
    /// A new batch's number is not above every earlier one of its group: batch numbers are
    /// never reused, so a mask can never be drawn twice under one number.
    #[error("layer {} group {}: batch {batch} is not above the last batch {last}", key.layer, key.group)]
    StaleBatch {
        /// The group.
        key: GroupKey,
        /// The batch asked for.
        batch: u64,
        /// The highest batch seen so far.
        last: u64,
    },
    /// A position outside its batch.
    #[error("batch {batch}: position {position} is outside its {positions} positions")]
    PositionOutOfRange {
        /// The batch.
        batch: u64,
        /// The position asked for.
        position: u32,
        /// Positions in the batch.
        positions: usize,
    },
    /// A position whose mask was already used (or is named twice in one request).
    #[error("batch {batch}: the mask of position {position} was already used")]
    MaskReused {
        /// The batch.
        batch: u64,
        /// The position.
        position: u32,
    },
    /// Opening a batch would pass a limit of the server's ledger.
    #[error("mask ledger full: {what} would reach {wanted}, limit {limit}")]
    LedgerFull {
        /// Which limit: open batches or unused positions.
        what: &'static str,
        /// The count the request would reach.
        wanted: usize,
        /// The limit.
        limit: usize,
    },
    /// Reserving a batch would pass the client pool's byte budget.
    #[error("mask pool: {wanted} bytes would pass the budget of {budget}")]
    PoolBudget {
        /// Bytes the pool would hold.
        wanted: usize,
        /// The budget.
        budget: usize,
    },
    /// Fewer pooled masks than a pass needs; the pass runs on CKKS instead.
    #[error("mask pool: {needed} positions needed, {available} ready")]
    PoolEmpty {
        /// Positions the pass needs.
        needed: usize,
        /// Positions ready in the pool.
        available: usize,
    },
    /// A batch of zero positions.
    #[error("a batch needs at least one position")]
    EmptyBatch,
    /// The OS CSPRNG failed.
    #[error("OS random generator: {reason}")]
    Entropy {
        /// The OS's error, in words.
        reason: String,
    },
}

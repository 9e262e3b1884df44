//! The state both parties keep for masked ring values (docs/design/wire.md, "Masked ring
//! values"): the server's [`MaskLedger`] of one-time masks `m`, the client's [`MaskPool`] of
//! one-time masks `r` and kept offline values, and the per-group drivers that run the offline
//! and online exchanges over them ([`MaskedServerGroup`], [`MaskedClientGroup`]).
//!
//! A mask is identified by its group, its batch (one offline request of T positions, numbered
//! by the client in increasing order) and its position in the batch ([`MaskRef`]). Neither side
//! stores masks: each draws a 32-byte seed per batch from the OS CSPRNG and expands the masks
//! from it when it needs them ([`expand`]). Both sides refuse to use a mask twice: the ledger
//! keeps a bitmap of used positions, the pool hands each position out once.

mod error;
mod group;
mod ledger;
mod pool;

use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

use crate::ring::sample_mask;

pub use error::MaskError;
pub use group::{MaskedClientGroup, MaskedServerGroup, OnlineRows};
pub use ledger::{LedgerLimits, MaskLedger};
pub use pool::{MaskPool, PooledMask, Reservation};

/// A layer group of one session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupKey {
    /// Decoder layer.
    pub layer: u32,
    /// Group within the layer.
    pub group: u32,
}

/// One position's masks: `(batch, position)` within a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MaskRef {
    /// The batch: one offline request, numbered by the client.
    pub batch: u64,
    /// The position within the batch, `0..T`.
    pub position: u32,
}

/// `n` uniform elements of `Z_p` from stream `stream` of ChaCha20 keyed by `seed`: a batch's
/// masks for one position (client) or one returned ciphertext (server).
pub fn expand(seed: &[u8; 32], stream: u64, n: usize) -> Vec<u64> {
    let mut rng = ChaCha20Rng::from_seed(*seed);
    rng.set_stream(stream);
    sample_mask(&mut rng, n)
}

/// A fresh seed from the OS CSPRNG. Errors: [`MaskError::Entropy`].
fn fresh_seed() -> Result<[u8; 32], MaskError> {
    cipherlora_ckks::os_seed().map_err(|e| MaskError::Entropy {
        reason: e.to_string(),
    })
}

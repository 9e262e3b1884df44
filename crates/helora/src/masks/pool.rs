//! The client's pool of one-time masks: per group, a seed per batch (its masks `r` are expanded
//! per position when used) and the kept top bits of each position's offline value `M̂·r − m`.
//! Each position is handed out once and then forgotten; the pool never holds more bytes than
//! its budget, counting batches whose offline response is still outstanding.

use std::collections::{HashMap, VecDeque};

use super::{GroupKey, MaskError, MaskRef, expand, fresh_seed};

/// Bytes a batch costs beyond its kept values (seed, bookkeeping).
const BATCH_OVERHEAD: usize = 64;

/// A batch whose offline request is being made: its number and masks (T × width,
/// position-major).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// The batch number to send.
    pub batch: u64,
    /// The masks to encrypt.
    pub r: Vec<u64>,
}

/// One position's masks, taken from the pool for one online use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PooledMask {
    /// Which mask the server must use.
    pub at: MaskRef,
    /// The client's mask `r` (the group's input width).
    pub r: Vec<u64>,
    /// The kept top bits of `M̂·r − m`, every projection's d_out values in order.
    pub kept: Vec<u32>,
}

#[derive(Debug, Clone)]
struct Pending {
    seed: [u8; 32],
    positions: usize,
    width: usize,
    bytes: usize,
}

#[derive(Debug, Clone)]
struct Ready {
    batch: u64,
    seed: [u8; 32],
    width: usize,
    bytes: usize,
    next: usize,
    kept: Vec<Vec<u32>>,
}

/// The client's masks over all groups of a session, within a byte budget.
#[derive(Debug, Clone)]
pub struct MaskPool {
    budget: usize,
    bytes: usize,
    next_batch: u64,
    pending: HashMap<(GroupKey, u64), Pending>,
    ready: HashMap<GroupKey, VecDeque<Ready>>,
}

/// Bytes a batch of `positions` with `kept` values each holds.
fn batch_bytes(positions: usize, kept: usize) -> usize {
    positions * kept * 4 + BATCH_OVERHEAD
}

impl MaskPool {
    /// An empty pool holding at most `budget` bytes.
    pub fn new(budget: usize) -> Self {
        MaskPool {
            budget,
            bytes: 0,
            next_batch: 0,
            pending: HashMap::new(),
            ready: HashMap::new(),
        }
    }

    /// Starts a batch of `positions` masks of `width` values for group `key`, each to keep
    /// `kept` values: draws its seed, charges its bytes and returns its number and masks.
    /// Errors: [`MaskError::EmptyBatch`], [`MaskError::PoolBudget`], [`MaskError::Entropy`].
    pub fn reserve(
        &mut self,
        key: GroupKey,
        positions: usize,
        width: usize,
        kept: usize,
    ) -> Result<Reservation, MaskError> {
        if positions == 0 {
            return Err(MaskError::EmptyBatch);
        }
        let bytes = batch_bytes(positions, kept);
        if self.bytes + bytes > self.budget {
            return Err(MaskError::PoolBudget {
                wanted: self.bytes + bytes,
                budget: self.budget,
            });
        }
        let seed = fresh_seed()?;
        let batch = self.next_batch;
        self.next_batch += 1;
        self.bytes += bytes;
        self.pending.insert(
            (key, batch),
            Pending {
                seed,
                positions,
                width,
                bytes,
            },
        );
        let r = (0..positions)
            .flat_map(|pos| expand(&seed, pos as u64, width))
            .collect();
        Ok(Reservation { batch, r })
    }

    /// Completes a reserved batch with each position's kept values. Errors:
    /// [`MaskError::UnknownBatch`] for a batch not reserved (or already filled);
    /// [`MaskError::PositionOutOfRange`] when `kept` has another number of positions.
    pub fn fill(
        &mut self,
        key: GroupKey,
        batch: u64,
        kept: Vec<Vec<u32>>,
    ) -> Result<(), MaskError> {
        let p = self
            .pending
            .get(&(key, batch))
            .ok_or(MaskError::UnknownBatch { key, batch })?;
        if kept.len() != p.positions {
            return Err(MaskError::PositionOutOfRange {
                batch,
                position: kept.len() as u32,
                positions: p.positions,
            });
        }
        let p = self.pending.remove(&(key, batch)).expect("checked above");
        self.ready.entry(key).or_default().push_back(Ready {
            batch,
            seed: p.seed,
            width: p.width,
            bytes: p.bytes,
            next: 0,
            kept,
        });
        Ok(())
    }

    /// Releases a reserved batch whose offline exchange failed.
    pub fn abandon(&mut self, key: GroupKey, batch: u64) {
        if let Some(p) = self.pending.remove(&(key, batch)) {
            self.bytes -= p.bytes;
        }
    }

    /// Positions ready for group `key`.
    pub fn available(&self, key: GroupKey) -> usize {
        self.ready
            .get(&key)
            .map_or(0, |q| q.iter().map(|b| b.kept.len() - b.next).sum())
    }

    /// Takes `n` positions' masks for group `key`, oldest batch first, each once; a batch's
    /// bytes are released with its last position. Errors: [`MaskError::PoolEmpty`] (nothing
    /// taken) when fewer are ready.
    pub fn take(&mut self, key: GroupKey, n: usize) -> Result<Vec<PooledMask>, MaskError> {
        let available = self.available(key);
        if available < n {
            return Err(MaskError::PoolEmpty {
                needed: n,
                available,
            });
        }
        let mut out = Vec::with_capacity(n);
        let queue = self.ready.entry(key).or_default();
        while out.len() < n {
            let b = queue.front_mut().expect("counted above");
            let position = b.next;
            b.next += 1;
            out.push(PooledMask {
                at: MaskRef {
                    batch: b.batch,
                    position: position as u32,
                },
                r: expand(&b.seed, position as u64, b.width),
                kept: std::mem::take(&mut b.kept[position]),
            });
            if b.next == b.kept.len() {
                self.bytes -= b.bytes;
                queue.pop_front();
            }
        }
        Ok(out)
    }

    /// Forgets every batch, reserved or ready; batch numbers go on from where they were, so
    /// the server never sees one twice.
    pub fn clear(&mut self) {
        self.pending.clear();
        self.ready.clear();
        self.bytes = 0;
    }

    /// Bytes held, reserved batches included.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: GroupKey = GroupKey { layer: 0, group: 0 };

    #[test]
    fn masks_come_back_as_reserved_once_each_oldest_batch_first() {
        let mut pool = MaskPool::new(1 << 20);
        let a = pool.reserve(KEY, 2, 3, 4).unwrap();
        let b = pool.reserve(KEY, 2, 3, 4).unwrap();
        assert!(b.batch > a.batch);
        assert_ne!(a.r, b.r, "every batch draws a fresh seed");
        pool.fill(KEY, b.batch, vec![vec![20; 4], vec![21; 4]])
            .unwrap();
        pool.fill(KEY, a.batch, vec![vec![10; 4], vec![11; 4]])
            .unwrap();
        assert_eq!(
            pool.fill(KEY, a.batch, vec![]),
            Err(MaskError::UnknownBatch {
                key: KEY,
                batch: a.batch
            })
        );
        let taken = pool.take(KEY, 3).unwrap();
        let refs: Vec<(u64, u32)> = taken.iter().map(|m| (m.at.batch, m.at.position)).collect();
        // Filled b first: the pool hands out in filling order.
        assert_eq!(refs, [(b.batch, 0), (b.batch, 1), (a.batch, 0)]);
        assert_eq!(taken[0].r, b.r[..3]);
        assert_eq!(taken[2].r, a.r[..3]);
        assert_eq!(taken[1].kept, vec![21; 4]);
        assert_eq!(pool.available(KEY), 1);
        assert_eq!(
            pool.take(KEY, 2),
            Err(MaskError::PoolEmpty {
                needed: 2,
                available: 1
            })
        );
        assert_eq!(
            pool.take(KEY, 1).unwrap()[0].at,
            MaskRef {
                batch: a.batch,
                position: 1
            }
        );
        assert_eq!((pool.available(KEY), pool.bytes()), (0, 0));
    }

    #[test]
    fn the_budget_counts_reserved_batches_and_abandon_releases_them() {
        let one = batch_bytes(4, 10);
        let mut pool = MaskPool::new(2 * one);
        let a = pool.reserve(KEY, 4, 8, 10).unwrap();
        pool.reserve(KEY, 4, 8, 10).unwrap();
        assert!(matches!(
            pool.reserve(KEY, 4, 8, 10),
            Err(MaskError::PoolBudget { .. })
        ));
        pool.abandon(KEY, a.batch);
        assert_eq!(pool.bytes(), one);
        let c = pool.reserve(KEY, 4, 8, 10).unwrap();
        assert_eq!(pool.reserve(KEY, 0, 8, 10), Err(MaskError::EmptyBatch));
        assert_eq!(pool.available(KEY), 0, "reserved batches are not ready");
        pool.clear();
        assert_eq!(pool.bytes(), 0);
        assert!(
            pool.reserve(KEY, 4, 8, 10).unwrap().batch > c.batch,
            "numbers never repeat"
        );
    }
}

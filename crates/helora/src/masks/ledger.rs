//! The server's record of its one-time masks `m`: a seed per open batch and a bitmap of the
//! positions already answered online. A position is answered once; a batch is forgotten when
//! its last position is used or the session closes.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::{GroupKey, MaskError, MaskRef, fresh_seed};

/// Bounds on one session's ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LedgerLimits {
    /// Batches open at once over all groups.
    pub max_batches: usize,
    /// Unused positions over all open batches.
    pub max_positions: usize,
}

impl Default for LedgerLimits {
    /// 8,192 batches and 65,536 positions: 32 batches of 32 positions for each of 60 groups,
    /// about 300 kB of seeds and bitmaps.
    fn default() -> Self {
        LedgerLimits {
            max_batches: 8192,
            max_positions: 65_536,
        }
    }
}

#[derive(Debug, Clone)]
struct Batch {
    seed: [u8; 32],
    used: Vec<bool>,
    left: usize,
}

#[derive(Debug, Default, Clone)]
struct GroupBatches {
    last: Option<u64>,
    open: BTreeMap<u64, Batch>,
}

/// One session's server-side masks (Mishra et al., "Delphi", USENIX Security 2020, §4: the
/// server's share of each linear layer's preprocessing).
#[derive(Debug, Clone, Default)]
pub struct MaskLedger {
    limits: LedgerLimits,
    groups: HashMap<GroupKey, GroupBatches>,
    batches: usize,
    unused: usize,
}

impl MaskLedger {
    /// An empty ledger with `limits`.
    pub fn new(limits: LedgerLimits) -> Self {
        MaskLedger {
            limits,
            ..MaskLedger::default()
        }
    }

    /// Opens batch `batch` of `positions` positions for group `key` and returns its fresh seed.
    /// Errors: [`MaskError::EmptyBatch`]; [`MaskError::StaleBatch`] unless `batch` is above every
    /// earlier batch of the group; [`MaskError::LedgerFull`]; [`MaskError::Entropy`].
    pub fn open(
        &mut self,
        key: GroupKey,
        batch: u64,
        positions: usize,
    ) -> Result<[u8; 32], MaskError> {
        if positions == 0 {
            return Err(MaskError::EmptyBatch);
        }
        let entry = self.groups.entry(key).or_default();
        if let Some(last) = entry.last.filter(|&last| batch <= last) {
            return Err(MaskError::StaleBatch { key, batch, last });
        }
        let limit = |what, wanted: usize, limit: usize| {
            if wanted > limit {
                Err(MaskError::LedgerFull {
                    what,
                    wanted,
                    limit,
                })
            } else {
                Ok(())
            }
        };
        limit("open batches", self.batches + 1, self.limits.max_batches)?;
        limit(
            "unused positions",
            self.unused + positions,
            self.limits.max_positions,
        )?;
        let seed = fresh_seed()?;
        entry.last = Some(batch);
        entry.open.insert(
            batch,
            Batch {
                seed,
                used: vec![false; positions],
                left: positions,
            },
        );
        self.batches += 1;
        self.unused += positions;
        Ok(seed)
    }

    /// Forgets an open batch whose offline response could not be computed (its masks were
    /// never sent). Unknown batches are ignored.
    pub fn cancel(&mut self, key: GroupKey, batch: u64) {
        if let Some(b) = self
            .groups
            .get_mut(&key)
            .and_then(|g| g.open.remove(&batch))
        {
            self.batches -= 1;
            self.unused -= b.left;
        }
    }

    /// Marks every mask of `rows` used and returns each row's batch seed, or changes nothing.
    /// Errors: [`MaskError::UnknownBatch`], [`MaskError::BatchClosed`],
    /// [`MaskError::PositionOutOfRange`], [`MaskError::MaskReused`] (also for a position named
    /// twice in `rows`).
    pub fn take(&mut self, key: GroupKey, rows: &[MaskRef]) -> Result<Vec<[u8; 32]>, MaskError> {
        let Some(GroupBatches { last, open }) = self.groups.get_mut(&key) else {
            return Err(match rows.first() {
                Some(r) => MaskError::UnknownBatch {
                    key,
                    batch: r.batch,
                },
                None => MaskError::EmptyBatch,
            });
        };
        // Check everything first, so a refused request changes nothing.
        let mut named = HashSet::with_capacity(rows.len());
        for &at in rows {
            let b = open.get(&at.batch).ok_or(match *last {
                Some(last) if at.batch <= last => MaskError::BatchClosed {
                    key,
                    batch: at.batch,
                },
                _ => MaskError::UnknownBatch {
                    key,
                    batch: at.batch,
                },
            })?;
            let used = b
                .used
                .get(at.position as usize)
                .ok_or(MaskError::PositionOutOfRange {
                    batch: at.batch,
                    position: at.position,
                    positions: b.used.len(),
                })?;
            if *used || !named.insert(at) {
                return Err(MaskError::MaskReused {
                    batch: at.batch,
                    position: at.position,
                });
            }
        }
        let mut seeds = Vec::with_capacity(rows.len());
        for at in rows {
            let b = open.get_mut(&at.batch).expect("checked above");
            b.used[at.position as usize] = true;
            b.left -= 1;
            seeds.push(b.seed);
            self.unused -= 1;
            if b.left == 0 {
                open.remove(&at.batch);
                self.batches -= 1;
            }
        }
        Ok(seeds)
    }

    /// Open batches over all groups.
    pub fn open_batches(&self) -> usize {
        self.batches
    }

    /// Unused positions over all open batches.
    pub fn unused_positions(&self) -> usize {
        self.unused
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: GroupKey = GroupKey { layer: 3, group: 1 };

    fn at(batch: u64, position: u32) -> MaskRef {
        MaskRef { batch, position }
    }

    #[test]
    fn each_position_is_answered_once_and_a_used_batch_is_forgotten() {
        let mut l = MaskLedger::new(LedgerLimits::default());
        let seed = l.open(KEY, 0, 2).unwrap();
        assert_eq!(l.take(KEY, &[at(0, 1)]).unwrap(), vec![seed]);
        assert_eq!(
            l.take(KEY, &[at(0, 1)]),
            Err(MaskError::MaskReused {
                batch: 0,
                position: 1
            })
        );
        assert_eq!((l.open_batches(), l.unused_positions()), (1, 1));
        l.take(KEY, &[at(0, 0)]).unwrap();
        assert_eq!((l.open_batches(), l.unused_positions()), (0, 0));
        assert_eq!(
            l.take(KEY, &[at(0, 0)]),
            Err(MaskError::BatchClosed { key: KEY, batch: 0 })
        );
        assert_eq!(
            l.take(KEY, &[at(1, 0)]),
            Err(MaskError::UnknownBatch { key: KEY, batch: 1 })
        );
    }

    #[test]
    fn a_refused_request_changes_nothing() {
        let mut l = MaskLedger::new(LedgerLimits::default());
        l.open(KEY, 5, 4).unwrap();
        for bad in [
            vec![at(5, 0), at(5, 0)],
            vec![at(5, 1), at(5, 4)],
            vec![at(5, 2), at(6, 0)],
        ] {
            assert!(l.take(KEY, &bad).is_err(), "{bad:?}");
        }
        assert_eq!(l.unused_positions(), 4);
        assert_eq!(
            l.take(KEY, &[at(5, 0), at(5, 1), at(5, 2), at(5, 3)])
                .unwrap()
                .len(),
            4
        );
    }

    #[test]
    fn batch_numbers_only_grow_and_limits_hold() {
        let limits = LedgerLimits {
            max_batches: 2,
            max_positions: 5,
        };
        let mut l = MaskLedger::new(limits);
        let a = l.open(KEY, 1, 2).unwrap();
        assert_eq!(
            l.open(KEY, 1, 2),
            Err(MaskError::StaleBatch {
                key: KEY,
                batch: 1,
                last: 1
            })
        );
        assert!(matches!(
            l.open(KEY, 0, 2),
            Err(MaskError::StaleBatch { .. })
        ));
        // Another group numbers its own batches.
        let other = GroupKey { layer: 3, group: 0 };
        let b = l.open(other, 1, 2).unwrap();
        assert_ne!(a, b, "every batch draws a fresh seed");
        assert!(matches!(
            l.open(KEY, 2, 1),
            Err(MaskError::LedgerFull {
                what: "open batches",
                ..
            })
        ));
        l.cancel(other, 1);
        assert!(matches!(
            l.open(KEY, 2, 4),
            Err(MaskError::LedgerFull {
                what: "unused positions",
                ..
            })
        ));
        l.open(KEY, 2, 3).unwrap();
        assert_eq!(l.open(KEY, 3, 0), Err(MaskError::EmptyBatch));
    }
}

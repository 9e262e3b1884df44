//! The adapter server's memory budget for the pre-encoded plaintext diagonals, which dominate its
//! memory: an offer's first session reserves [`crate::SessionOffer::diagonal_bytes`] before
//! encoding anything, and a session that would exceed the budget is refused with
//! `RESOURCE_EXHAUSTED` while open sessions go on. The last few offers stay encoded after their
//! last session closes (*warm*), so the next client that asks for one opens without encoding it
//! again; a reservation that does not fit evicts idle warm offers first, oldest first.

use std::any::Any;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Share of the machine's physical memory the default budget allows.
const DEFAULT_SHARE: f64 = 0.6;
/// Default budget where the physical memory cannot be read.
const FALLBACK_BYTES: u64 = 8 << 30;
/// Offers kept encoded after their last session closes.
const MAX_WARM: usize = 4;

/// Something kept alive for reuse; dropping its last handle returns its reservation.
pub(crate) type Warm = Arc<dyn Any + Send + Sync>;

/// Bytes of memory sessions may hold at once, how many are held, and the warm offers.
#[derive(Debug)]
struct MemoryBudget {
    limit: u64,
    reserved: AtomicU64,
    /// Most recently used last.
    warm: Mutex<VecDeque<Warm>>,
}

/// A session memory budget, shared by every [`crate::HeBackend`] given a clone of it (one per
/// served adapter: the budget is the process's).
#[derive(Debug, Clone)]
pub struct SessionMemory(Arc<MemoryBudget>);

/// Bytes held for one session until dropped.
#[derive(Debug)]
pub(crate) struct Reservation {
    budget: Arc<MemoryBudget>,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.reserved.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

impl SessionMemory {
    /// A budget of `limit` bytes.
    #[must_use]
    pub fn new(limit: u64) -> Self {
        Self(Arc::new(MemoryBudget {
            limit,
            reserved: AtomicU64::new(0),
            warm: Mutex::new(VecDeque::new()),
        }))
    }

    /// The limit, bytes.
    #[must_use]
    pub fn limit(&self) -> u64 {
        self.0.limit
    }

    /// Bytes reserved now, by open sessions and warm offers.
    #[must_use]
    pub fn reserved(&self) -> u64 {
        self.0.reserved.load(Ordering::Acquire)
    }

    /// Keeps `offer` alive after its last session, as the most recently used of at most
    /// [`MAX_WARM`] (the oldest beyond them is let go).
    pub(crate) fn keep_warm(&self, offer: Warm) {
        let mut warm = self.0.warm.lock().unwrap_or_else(|p| p.into_inner());
        warm.retain(|w| !Arc::ptr_eq(w, &offer));
        warm.push_back(offer);
        while warm.len() > MAX_WARM {
            warm.pop_front();
        }
    }

    /// Drops the oldest warm offer no session holds; whether there was one.
    fn evict_idle(&self) -> bool {
        let mut warm = self.0.warm.lock().unwrap_or_else(|p| p.into_inner());
        match warm.iter().position(|w| Arc::strong_count(w) == 1) {
            Some(i) => {
                drop(warm.remove(i));
                true
            }
            None => false,
        }
    }

    /// Reserves `bytes`, evicting idle warm offers while they do not fit, or returns the total
    /// that would have been held.
    pub(crate) fn reserve(&self, bytes: u64) -> Result<Reservation, u64> {
        loop {
            match self.try_reserve(bytes) {
                Err(want) if !self.evict_idle() => return Err(want),
                Err(_) => {}
                ok => return ok,
            }
        }
    }

    fn try_reserve(&self, bytes: u64) -> Result<Reservation, u64> {
        let b = &self.0;
        let mut held = b.reserved.load(Ordering::Acquire);
        loop {
            let want = held.saturating_add(bytes);
            if want > b.limit {
                return Err(want);
            }
            match b
                .reserved
                .compare_exchange_weak(held, want, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    return Ok(Reservation {
                        budget: b.clone(),
                        bytes,
                    });
                }
                Err(now) => held = now,
            }
        }
    }
}

impl Default for SessionMemory {
    /// 60 % of the physical memory (`MemTotal` of `/proc/meminfo`), or 8 GiB where that cannot be
    /// read.
    fn default() -> Self {
        Self::new(default_limit())
    }
}

/// The default limit (see [`SessionMemory::default`]).
fn default_limit() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| limit_from_meminfo(&text))
        .unwrap_or(FALLBACK_BYTES)
}

/// [`DEFAULT_SHARE`] of the `MemTotal` line of a `/proc/meminfo` text.
fn limit_from_meminfo(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut words = line.split_whitespace().skip(1);
    let kib: u64 = words.next()?.parse().ok()?;
    (words.next()? == "kB").then_some((kib as f64 * 1024.0 * DEFAULT_SHARE) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_add_up_refuse_past_the_limit_and_return_on_drop() {
        let b = SessionMemory::new(100);
        let first = b.reserve(60).unwrap();
        assert_eq!(b.reserve(50).unwrap_err(), 110);
        let second = b.reserve(40).unwrap();
        assert_eq!(b.reserve(1).unwrap_err(), 101);
        drop(first);
        let third = b.reserve(60).unwrap();
        assert_eq!(b.reserved(), 100);
        let shared = b.clone();
        assert!(shared.reserve(1).is_err());
        drop((second, third));
        assert_eq!(shared.reserved(), 0);
        assert_eq!(b.reserve(u64::MAX).unwrap_err(), u64::MAX);
    }

    #[test]
    fn warm_offers_stay_reserved_until_a_reservation_needs_them_and_none_in_use_is_evicted() {
        let m = SessionMemory::new(100);
        let a: Warm = Arc::new(m.reserve(60).unwrap());
        m.keep_warm(a.clone());
        drop(a);
        // Idle and warm: still held, given up for a reservation that needs it.
        assert_eq!(m.reserved(), 60);
        let b: Warm = Arc::new(m.reserve(70).unwrap());
        assert_eq!(m.reserved(), 70);
        // In use by a session (a second handle): never evicted.
        m.keep_warm(b.clone());
        assert_eq!(m.reserve(40).unwrap_err(), 110);
        assert_eq!(m.reserved(), 70);
        drop(b);
        let c = m.reserve(40).unwrap();
        assert_eq!(m.reserved(), 40);
        // At most MAX_WARM stay warm.
        drop(c);
        for _ in 0..MAX_WARM + 2 {
            m.keep_warm(Arc::new(m.reserve(10).unwrap()));
        }
        assert_eq!(m.reserved(), 10 * MAX_WARM as u64);
    }

    #[test]
    fn default_limit_is_a_share_of_memtotal() {
        let text = "MemFree:  1000 kB\nMemTotal:       24683820 kB\nBuffers: 3 kB\n";
        let want = (24_683_820.0 * 1024.0 * DEFAULT_SHARE) as u64;
        assert_eq!(limit_from_meminfo(text), Some(want));
        assert_eq!(limit_from_meminfo("MemTotal: 12 MB\n"), None);
        assert_eq!(limit_from_meminfo("MemFree: 12 kB\n"), None);
    }
}

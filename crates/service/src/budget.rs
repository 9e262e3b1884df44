//! The extraction budget: delta evaluations per bearer token and adapter in a sliding window
//! (enough chosen inputs reveal `s·B·A`; see docs/security.md). Each admitted group request charges
//! its `positions`, replays included; beyond the budget requests get `RESOURCE_EXHAUSTED`. The
//! window is [`BUCKETS`] buckets, so memory per pair is bounded.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::auth::Principal;

/// Buckets per window.
pub(crate) const BUCKETS: u32 = 64;

/// Evaluations of one (token, adapter) pair, bucketed by time.
#[derive(Debug, Default)]
struct Window {
    /// `(bucket index since the budget's epoch, evaluations)`, oldest first.
    buckets: VecDeque<(u64, u64)>,
    /// Sum of `buckets`.
    total: u64,
}

/// The budget of every (token, adapter) pair.
#[derive(Debug)]
pub(crate) struct ExtractionBudget {
    limit: u64,
    bucket: Duration,
    epoch: Instant,
    windows: Mutex<HashMap<(Principal, String), Window>>,
}

/// A charge the budget refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OverBudget {
    /// Evaluations in the window, this charge included.
    pub(crate) would_be: u64,
    /// The budget.
    pub(crate) limit: u64,
}

impl ExtractionBudget {
    /// `limit` evaluations per `window` (at least [`BUCKETS`] ms).
    pub(crate) fn new(limit: u64, window: Duration) -> Self {
        let bucket = (window / BUCKETS).max(Duration::from_millis(1));
        Self {
            limit,
            bucket,
            epoch: Instant::now(),
            windows: Mutex::new(HashMap::new()),
        }
    }

    fn bucket_now(&self) -> u64 {
        let nanos = self.epoch.elapsed().as_nanos() / self.bucket.as_nanos().max(1);
        u64::try_from(nanos).unwrap_or(u64::MAX)
    }

    /// Charges `evaluations` to `(who, adapter)`; refused (nothing charged) when the window's total
    /// would pass the limit.
    pub(crate) fn charge(
        &self,
        who: Principal,
        adapter: &str,
        evaluations: u64,
    ) -> Result<(), OverBudget> {
        let now = self.bucket_now();
        let mut map = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        let w = match map.get_mut(&(who, adapter.to_string())) {
            Some(w) => w,
            None => map.entry((who, adapter.to_string())).or_default(),
        };
        while let Some(&(b, n)) = w.buckets.front() {
            if now.saturating_sub(b) < u64::from(BUCKETS) {
                break;
            }
            w.total -= n;
            w.buckets.pop_front();
        }
        let would_be = w.total.saturating_add(evaluations);
        if would_be > self.limit {
            return Err(OverBudget {
                would_be,
                limit: self.limit,
            });
        }
        w.total = would_be;
        match w.buckets.back_mut() {
            Some((b, n)) if *b == now => *n += evaluations,
            _ => w.buckets.push_back((now, evaluations)),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_refuses_past_its_limit_per_token_and_adapter_and_resets_after_the_window() {
        let b = ExtractionBudget::new(100, Duration::from_millis(128));
        let (alice, bob) = (Principal(0), Principal(1));
        b.charge(alice, "a", 60).unwrap();
        b.charge(alice, "a", 40).unwrap();
        assert_eq!(
            b.charge(alice, "a", 1),
            Err(OverBudget {
                would_be: 101,
                limit: 100
            })
        );
        // Other tokens and other adapters have their own windows.
        b.charge(bob, "a", 100).unwrap();
        b.charge(alice, "b", 100).unwrap();
        // A refused charge is not counted.
        assert!(b.charge(alice, "a", 1).is_err());
        std::thread::sleep(Duration::from_millis(200));
        b.charge(alice, "a", 100).unwrap();
        assert!(b.charge(alice, "a", 1).is_err());
    }
}

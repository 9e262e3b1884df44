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

    /// Reserves `bytes` if they fit beside what is held now, warm offers included, or returns the
    /// total that would have been held.
    pub(crate) fn try_reserve(&self, bytes: u64) -> Result<Reservation, u64> {
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
    /// 60 % of the memory this process may use: the physical memory (`MemTotal` of
    /// `/proc/meminfo`) or, when lower, the limit of its control group (a container's or a
    /// Kubernetes pod's `limits.memory`: cgroup v2 `memory.max`, v1 `memory.limit_in_bytes`); 8
    /// GiB where neither can be read.
    fn default() -> Self {
        Self::new(default_limit())
    }
}

/// The default limit (see [`SessionMemory::default`]).
fn default_limit() -> u64 {
    let physical = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| mem_total(&text));
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|own| cgroup_limit(&own, |path| std::fs::read_to_string(path).ok()));
    let usable = match (physical, cgroup) {
        (Some(p), Some(c)) => Some(p.min(c)),
        (p, c) => p.or(c),
    };
    usable.map_or(FALLBACK_BYTES, |bytes| {
        (bytes as f64 * DEFAULT_SHARE) as u64
    })
}

/// Bytes of the `MemTotal` line of a `/proc/meminfo` text.
fn mem_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut words = line.split_whitespace().skip(1);
    let kib: u64 = words.next()?.parse().ok()?;
    (words.next()? == "kB").then_some(kib.saturating_mul(1024))
}

/// The memory limit of the control group a `/proc/self/cgroup` text names, its files read by
/// `read` (a path under `/sys/fs/cgroup`); `None` when it sets none. cgroup v2 names its group on
/// a `0::` line and writes `max` for no limit; v1 on a line whose controllers include `memory`,
/// and writes a number near `i64::MAX` for none. Inside a container's cgroup namespace the group
/// is `/`, the container's own; without one the line names the host's path, which the container
/// does not see, and its own limit is at the root of its mount.
fn cgroup_limit(own: &str, read: impl Fn(&str) -> Option<String>) -> Option<u64> {
    for line in own.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(group)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let (root, file) = if id == "0" && controllers.is_empty() {
            ("/sys/fs/cgroup", "memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            ("/sys/fs/cgroup/memory", "memory.limit_in_bytes")
        } else {
            continue;
        };
        let group = group.trim_end_matches('/');
        let text =
            read(&format!("{root}{group}/{file}")).or_else(|| read(&format!("{root}/{file}")));
        let limit = text
            .and_then(|text| text.trim().parse::<u64>().ok())
            .filter(|&bytes| bytes < 1 << 62);
        if limit.is_some() {
            return limit;
        }
    }
    None
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
    fn memtotal_is_read_in_bytes() {
        let text = "MemFree:  1000 kB\nMemTotal:       24683820 kB\nBuffers: 3 kB\n";
        assert_eq!(mem_total(text), Some(24_683_820 * 1024));
        assert_eq!(mem_total("MemTotal: 12 MB\n"), None);
        assert_eq!(mem_total("MemFree: 12 kB\n"), None);
    }

    #[test]
    fn a_control_group_s_limit_is_read_for_v2_and_v1_and_no_limit_is_none() {
        let files = |entries: &'static [(&'static str, &'static str)]| {
            move |path: &str| {
                entries
                    .iter()
                    .find(|(p, _)| *p == path)
                    .map(|(_, text)| (*text).to_string())
            }
        };
        // v2 inside a pod's namespace (`limits.memory: 8Gi`), and on a host under systemd.
        let pod = files(&[("/sys/fs/cgroup/memory.max", "8589934592\n")]);
        assert_eq!(cgroup_limit("0::/\n", pod), Some(8 << 30));
        let host = files(&[("/sys/fs/cgroup/user.slice/memory.max", "max\n")]);
        assert_eq!(cgroup_limit("0::/user.slice\n", host), None);
        // v1: the memory controller's line, among others; an unlimited group's huge number.
        let own = "12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n";
        let v1 = files(&[(
            "/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes",
            "4294967296",
        )]);
        assert_eq!(cgroup_limit(own, v1), Some(4 << 30));
        // v1 in a container without a cgroup namespace: the host's path is not there.
        let mount = files(&[(
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "2147483648\n",
        )]);
        assert_eq!(cgroup_limit("4:memory:/docker/abc\n", mount), Some(2 << 30));
        let unlimited = files(&[(
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "9223372036854771712",
        )]);
        assert_eq!(cgroup_limit("4:memory:/\n", unlimited), None);
        assert_eq!(cgroup_limit("", files(&[])), None);
    }
}

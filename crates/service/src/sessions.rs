//! The session table: ids, per-session state `C` (HE [`SessionCompute`] or a split KV cache, whose
//! bytes count as `key_bytes`), per-token limits and idle eviction: offer-only sessions after
//! `offer_timeout`, unstarted ones after `unstarted_timeout`, others after `idle_timeout`. A round
//! on any of a token's sessions also refreshes its unstarted keyed sessions (a long prefill must
//! not evict the waiting verify session), and so does another of its sessions opening: none of a
//! token's unstarted sessions goes while one of its `OpenSession` calls runs (encoding a large
//! adapter's diagonals can take longer than `unstarted_timeout`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cipherlora_proto::{ErrorReason, SessionId};
use tonic::{Code, Status};

use crate::auth::Principal;
use crate::backend::SessionCompute;
use crate::limits::Limits;
use crate::status::{internal, status};

/// One open session.
pub(crate) struct Session<C: ?Sized = dyn SessionCompute> {
    pub(crate) id: SessionId,
    pub(crate) adapter_id: String,
    pub(crate) owner: Principal,
    pub(crate) compute: Box<C>,
    /// `cipherlora_proto::plan_id` of the plan returned at opening.
    pub(crate) plan_id: u64,
    /// Public plus Galois key bytes the session holds (split sessions: KV cache bytes).
    key_bytes: usize,
    offer_only: bool,
    /// Milliseconds since the table's epoch at the last admitted request (at opening before that).
    last_used_ms: AtomicU64,
    /// Whether a round was admitted.
    started: AtomicBool,
    /// `Rounds` streams bound to the session now.
    streams: AtomicU64,
    /// Milliseconds since the table's epoch when its last stream ended (0: one is open, or none
    /// ever was).
    detached_ms: AtomicU64,
    /// Layer-group requests admitted so far.
    requests: AtomicU64,
}

impl<C: ?Sized> Session<C> {
    /// Counts one more request; the count including it.
    pub(crate) fn count_request(&self) -> u64 {
        self.requests.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// What a new session brings to the table.
pub(crate) struct NewSession<C: ?Sized = dyn SessionCompute> {
    pub(crate) adapter_id: String,
    pub(crate) owner: Principal,
    pub(crate) compute: Box<C>,
    pub(crate) plan_id: u64,
    pub(crate) key_bytes: usize,
    /// Whether the session computes nothing (see `SessionCompute::offer_only`).
    pub(crate) offer_only: bool,
}

/// All open sessions, bounded in number globally and per token.
pub(crate) struct SessionTable<C: ?Sized = dyn SessionCompute> {
    map: Mutex<HashMap<SessionId, Arc<Session<C>>>>,
    /// `OpenSession` calls running, per token.
    opening: Mutex<HashMap<Principal, usize>>,
    epoch: Instant,
    limits: Limits,
}

/// An `OpenSession` call of `owner` in progress ([`SessionTable::opening`]).
pub(crate) struct Opening<'t, C: ?Sized> {
    table: &'t SessionTable<C>,
    owner: Principal,
}

impl<C: ?Sized> Drop for Opening<'_, C> {
    /// The call is over: the owner's unstarted sessions count their timeout from now.
    fn drop(&mut self) {
        let mut opening = self.table.opening.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = opening.get_mut(&self.owner) {
            *n -= 1;
            if *n == 0 {
                opening.remove(&self.owner);
            }
        }
        drop(opening);
        self.table.refresh_unstarted(self.owner, None);
    }
}

/// Why a session could not be inserted.
pub(crate) enum InsertError {
    /// A count or size limit is reached.
    Full {
        /// Which limit, in words.
        what: &'static str,
        /// Its value.
        limit: usize,
    },
    /// The OS CSPRNG failed.
    Rng(String),
}

impl<C: ?Sized> SessionTable<C> {
    pub(crate) fn new(limits: Limits) -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
            opening: Mutex::new(HashMap::new()),
            epoch: Instant::now(),
            limits,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, Arc<Session<C>>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether `owner` may open another session of `key_bytes`, checked before any key is parsed
    /// ([`SessionTable::insert`] checks again).
    pub(crate) fn check_room(
        &self,
        owner: Principal,
        key_bytes: usize,
        offer_only: Option<bool>,
    ) -> Result<(), InsertError> {
        check(&self.lock(), &self.limits, owner, key_bytes, offer_only)
    }

    /// Stores a session under a fresh random 128-bit id.
    pub(crate) fn insert(&self, new: NewSession<C>) -> Result<SessionId, InsertError> {
        let mut map = self.lock();
        let offer_only = new.offer_only;
        check(
            &map,
            &self.limits,
            new.owner,
            new.key_bytes,
            Some(offer_only),
        )?;
        let id = loop {
            let mut raw = [0u8; 16];
            getrandom::fill(&mut raw).map_err(|e| InsertError::Rng(e.to_string()))?;
            let id = SessionId(raw);
            if !map.contains_key(&id) {
                break id;
            }
        };
        map.insert(
            id,
            Arc::new(Session {
                id,
                adapter_id: new.adapter_id,
                owner: new.owner,
                compute: new.compute,
                plan_id: new.plan_id,
                key_bytes: new.key_bytes,
                offer_only,
                last_used_ms: AtomicU64::new(self.now_ms()),
                started: AtomicBool::new(false),
                streams: AtomicU64::new(0),
                detached_ms: AtomicU64::new(0),
                requests: AtomicU64::new(0),
            }),
        );
        Ok(id)
    }

    /// The session `id`. Its idle timer is not refreshed: see [`SessionTable::touch`].
    pub(crate) fn get(&self, id: &SessionId) -> Option<Arc<Session<C>>> {
        self.lock().get(id).cloned()
    }

    /// Marks `s` used and started once a round passed every check; refreshes the owner's unstarted
    /// keyed sessions.
    pub(crate) fn touch(&self, s: &Session<C>) {
        let now = self.now_ms();
        s.last_used_ms.store(now, Ordering::Relaxed);
        s.started.store(true, Ordering::Relaxed);
        self.refresh_unstarted(s.owner, Some(now));
    }

    /// Restarts the timers of `owner`'s unstarted keyed sessions at `now` (default: now).
    fn refresh_unstarted(&self, owner: Principal, now: Option<u64>) {
        let now = now.unwrap_or_else(|| self.now_ms());
        for other in self.lock().values() {
            if other.owner == owner && !other.offer_only && !other.started.load(Ordering::Relaxed) {
                other.last_used_ms.fetch_max(now, Ordering::Relaxed);
            }
        }
    }

    /// Marks an `OpenSession` call of `owner` as running until the guard drops: meanwhile none of
    /// its unstarted sessions is evicted, and afterwards their timers restart.
    pub(crate) fn opening(&self, owner: Principal) -> Opening<'_, C> {
        *self
            .opening
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(owner)
            .or_default() += 1;
        Opening { table: self, owner }
    }

    /// A `Rounds` stream now carries `s`.
    pub(crate) fn attach(&self, s: &Session<C>) {
        s.streams.fetch_add(1, Ordering::AcqRel);
        s.detached_ms.store(0, Ordering::Release);
    }

    /// A stream that carried `s` ended; with none left, the detached timeout starts.
    pub(crate) fn detach(&self, s: &Session<C>) {
        if s.streams.fetch_sub(1, Ordering::AcqRel) == 1 {
            // At least 1: 0 means attached.
            s.detached_ms.store(self.now_ms().max(1), Ordering::Release);
        }
    }

    /// Removes the session `id`; whether it existed.
    pub(crate) fn remove(&self, id: &SessionId) -> bool {
        self.lock().remove(id).is_some()
    }

    /// Removes sessions past their timeout (see the module docs); returns them. A request already
    /// running keeps its own handle and completes.
    pub(crate) fn evict_idle(&self) -> Vec<Arc<Session<C>>> {
        let now = self.now_ms();
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let l = &self.limits;
        let (idle, unstarted, offer, detached) = (
            ms(l.idle_timeout),
            ms(l.unstarted_timeout.min(l.idle_timeout)),
            ms(l.offer_timeout.min(l.idle_timeout)),
            ms(l.detached_timeout.min(l.idle_timeout)),
        );
        let opening: Vec<Principal> = self
            .opening
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .copied()
            .collect();
        let mut map = self.lock();
        let stale: Vec<SessionId> = map
            .values()
            .filter(|s| {
                let timeout = if s.offer_only {
                    offer
                } else if !s.started.load(Ordering::Relaxed) {
                    if opening.contains(&s.owner) {
                        return false;
                    }
                    unstarted
                } else {
                    idle
                };
                let gone = s.detached_ms.load(Ordering::Acquire);
                now.saturating_sub(s.last_used_ms.load(Ordering::Relaxed)) > timeout
                    || (gone > 0 && now.saturating_sub(gone) > detached)
            })
            .map(|s| s.id)
            .collect();
        stale.iter().filter_map(|id| map.remove(id)).collect()
    }

    /// The shortest of the timeouts: how often eviction should look.
    pub(crate) fn shortest_timeout(&self) -> Duration {
        let l = &self.limits;
        l.idle_timeout
            .min(l.unstarted_timeout)
            .min(l.offer_timeout)
            .min(l.detached_timeout)
    }

    /// Open sessions now.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

/// The limits check of [`SessionTable::check_room`] on a locked map; `offer_only: None` skips the
/// offer count (not known yet).
fn check<C: ?Sized>(
    map: &HashMap<SessionId, Arc<Session<C>>>,
    l: &Limits,
    owner: Principal,
    key_bytes: usize,
    offer_only: Option<bool>,
) -> Result<(), InsertError> {
    let full = |what, limit| Err(InsertError::Full { what, limit });
    if map.len() >= l.max_sessions {
        return full("sessions open on this server", l.max_sessions);
    }
    let mine = map.values().filter(|s| s.owner == owner);
    let (mut sessions, mut offers, mut keys) = (0usize, 0usize, 0usize);
    for s in mine {
        sessions += 1;
        offers += usize::from(s.offer_only);
        keys = keys.saturating_add(s.key_bytes);
    }
    if sessions >= l.max_sessions_per_token {
        return full("sessions open for this token", l.max_sessions_per_token);
    }
    if offer_only == Some(true) && offers >= l.max_offers_per_token {
        return full(
            "offer-only sessions open for this token",
            l.max_offers_per_token,
        );
    }
    if keys.saturating_add(key_bytes) > l.max_key_bytes_per_token {
        return full(
            "key bytes held by this token's sessions",
            l.max_key_bytes_per_token,
        );
    }
    Ok(())
}

/// A refused session-table insert: `RESOURCE_EXHAUSTED` / `at_capacity` naming the limit, or
/// internal (the OS generator).
pub(crate) fn insert_error(e: InsertError) -> Status {
    match e {
        InsertError::Full { what, limit } => status(
            Code::ResourceExhausted,
            ErrorReason::AtCapacity,
            format!("limit reached: {what} (limit {limit})"),
        ),
        InsertError::Rng(e) => internal(&e),
    }
}

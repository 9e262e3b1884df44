//! The session table: ids, per-session compute state, idle eviction.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cipherlora_proto::SessionId;

use crate::backend::SessionCompute;

/// One open session.
pub(crate) struct Session {
    pub(crate) id: SessionId,
    pub(crate) adapter_id: String,
    pub(crate) compute: Box<dyn SessionCompute>,
    /// Milliseconds since the table's epoch at the last request.
    last_used_ms: AtomicU64,
    /// Layer-group requests admitted so far.
    requests: AtomicU64,
}

impl Session {
    /// Counts one more request; the count including it.
    pub(crate) fn count_request(&self) -> u64 {
        self.requests.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// All open sessions, bounded in number.
pub(crate) struct SessionTable {
    map: Mutex<HashMap<SessionId, Arc<Session>>>,
    epoch: Instant,
    max_sessions: usize,
}

/// Why a session could not be inserted.
pub(crate) enum InsertError {
    /// The table is full.
    Full { limit: usize },
    /// The OS CSPRNG failed.
    Rng(String),
}

impl SessionTable {
    pub(crate) fn new(max_sessions: usize) -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
            epoch: Instant::now(),
            max_sessions,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, Arc<Session>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether another session fits (checked before the backend does any key
    /// parsing; [`SessionTable::insert`] checks again).
    pub(crate) fn has_room(&self) -> bool {
        self.lock().len() < self.max_sessions
    }

    /// Stores a session under a fresh random 128-bit id.
    pub(crate) fn insert(
        &self,
        adapter_id: String,
        compute: Box<dyn SessionCompute>,
    ) -> Result<SessionId, InsertError> {
        let mut map = self.lock();
        if map.len() >= self.max_sessions {
            return Err(InsertError::Full {
                limit: self.max_sessions,
            });
        }
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
                adapter_id,
                compute,
                last_used_ms: AtomicU64::new(self.now_ms()),
                requests: AtomicU64::new(0),
            }),
        );
        Ok(id)
    }

    /// The session `id`, marked as used now.
    pub(crate) fn get(&self, id: &SessionId) -> Option<Arc<Session>> {
        let s = self.lock().get(id).cloned()?;
        s.last_used_ms.store(self.now_ms(), Ordering::Relaxed);
        Some(s)
    }

    /// Removes the session `id`; whether it existed.
    pub(crate) fn remove(&self, id: &SessionId) -> bool {
        self.lock().remove(id).is_some()
    }

    /// Removes sessions idle for longer than `idle`; returns them. A request
    /// already running keeps its own handle and completes.
    pub(crate) fn evict_idle(&self, idle: Duration) -> Vec<Arc<Session>> {
        let now = self.now_ms();
        let idle_ms = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX);
        let mut map = self.lock();
        let stale: Vec<SessionId> = map
            .values()
            .filter(|s| now.saturating_sub(s.last_used_ms.load(Ordering::Relaxed)) > idle_ms)
            .map(|s| s.id)
            .collect();
        stale.iter().filter_map(|id| map.remove(id)).collect()
    }

    /// Open sessions now.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

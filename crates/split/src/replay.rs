//! A split client that survives a lost session: [`ReplayingClient`] keeps the hidden states of the
//! rows the server holds and, on a transient failure, opens a new session, replays them and repeats
//! the call ([`ReplayingClient::with_max_replays`], default 1).

use std::time::Duration;

use cipherlora_service::{ClientConfig, ServiceError, SplitClient, SplitSessionInfo};

use crate::{Forwarded, MiddleLayers, MiddlePass, SplitError};

/// Upper bound on a `Forward` request's bytes besides its hidden states.
const REQUEST_OVERHEAD: u64 = 1024;

/// A split session that is reopened and replayed when it is lost (see the module docs).
pub struct ReplayingClient {
    config: ClientConfig,
    client: SplitClient,
    split: (u32, u32),
    capacity: u32,
    info: SplitSessionInfo,
    /// The residual stream after layer a of every position the server holds, row-major.
    sent: Vec<f32>,
    /// Parent row of every held row (`None` for row 0).
    parents: Vec<Option<usize>>,
    max_replays: usize,
    replays: usize,
}

impl ReplayingClient {
    /// Opens a session of split `(a, b)` and `capacity` positions. Errors: [`SplitError::Service`].
    pub fn open(
        config: ClientConfig,
        mut client: SplitClient,
        (a, b): (u32, u32),
        capacity: u32,
    ) -> Result<Self, SplitError> {
        let info = client.open(a, b, capacity)?;
        Ok(Self {
            config,
            client,
            split: (a, b),
            capacity,
            info,
            sent: Vec::new(),
            parents: Vec::new(),
            max_replays: 1,
            replays: 0,
        })
    }

    /// Allows `n` replays per session instead of 1 (0: none, a lost session ends the generation).
    #[must_use]
    pub fn with_max_replays(mut self, n: usize) -> Self {
        self.max_replays = n;
        self
    }

    /// The open session as the server described it (after a replay: the reopened one).
    pub fn session(&self) -> &SplitSessionInfo {
        &self.info
    }

    /// The connection (a new one after a replay that had to reconnect).
    pub fn client(&self) -> &SplitClient {
        &self.client
    }

    /// Replays so far.
    pub fn replays(&self) -> usize {
        self.replays
    }

    /// Closes the session. Errors: the server's status (`NOT_FOUND` if evicted).
    pub fn close(mut self) -> Result<(), SplitError> {
        Ok(self.client.close()?)
    }

    /// Positions per replay call: as many rows as the server's message limit allows (at least one).
    fn rows_per_call(&self) -> usize {
        let row = 4 * u64::from(self.info.hidden_size).max(1);
        let rows = self.info.max_message_bytes.saturating_sub(REQUEST_OVERHEAD) / row;
        usize::try_from(rows).unwrap_or(usize::MAX).max(1)
    }

    /// Opens a new session and runs the first `positions` sent rows through it; returns the cost.
    fn replay(&mut self, positions: usize) -> Result<Forwarded, SplitError> {
        // The lost session's id is void; closing it is best effort.
        let _ = self.client.close();
        let (a, b) = self.split;
        self.info = match self.client.open(a, b, self.capacity) {
            Ok(info) => info,
            Err(e) if e.is_transient() => {
                self.client = SplitClient::connect(&self.config)?;
                self.client.open(a, b, self.capacity)?
            }
            Err(e) => return Err(e.into()),
        };
        let d = self.info.hidden_size as usize;
        let mut cost = Forwarded {
            hidden: Vec::new(),
            server: Duration::ZERO,
            bytes_up: 0,
            bytes_down: 0,
        };
        let rows = self.rows_per_call();
        for (i, chunk) in self.sent[..positions * d].chunks(rows * d).enumerate() {
            let f = MiddleLayers::forward(&mut self.client, i * rows, chunk.len() / d, chunk)?;
            cost.server += f.server;
            cost.bytes_up += f.bytes_up;
            cost.bytes_down += f.bytes_down;
        }
        Ok(cost)
    }
}

impl ReplayingClient {
    /// Compacts the record as `pass` compacts the server's cache; checks it stays a causal chain.
    fn compact_record(&mut self, pass: &MiddlePass<'_>) -> Result<(), SplitError> {
        let d = self.info.hidden_size as usize;
        let held = self.parents.len();
        let start = pass.start;
        if start > held {
            return Err(SplitError::Config {
                reason: format!("a pass from position {start}, the server holds {held}"),
            });
        }
        let not_chain = |row: usize| SplitError::Config {
            reason: format!(
                "the rows kept up to position {row} are not a chain: a replay could not rebuild them"
            ),
        };
        if let Some(r) = (0..start).find(|&r| self.parents[r] != r.checked_sub(1)) {
            return Err(not_chain(r));
        }
        let mut prev = start.checked_sub(1);
        for (k, &row) in pass.keep.iter().enumerate() {
            let old = start + row;
            if old >= held || (k > 0 && row <= pass.keep[k - 1]) {
                return Err(SplitError::Config {
                    reason: format!("keep list {:?} does not fit {held} rows", pass.keep),
                });
            }
            if self.parents[old] != prev {
                return Err(not_chain(start + k));
            }
            prev = Some(old);
        }
        for (k, &row) in pass.keep.iter().enumerate() {
            let (from, to) = ((start + row) * d, (start + k) * d);
            self.sent.copy_within(from..from + d, to);
            self.parents[start + k] = (start + k).checked_sub(1);
        }
        let base = pass.base();
        self.sent.truncate(base * d);
        self.parents.truncate(base);
        Ok(())
    }
}

impl MiddleLayers for ReplayingClient {
    fn forward_pass(&mut self, pass: &MiddlePass<'_>) -> Result<Forwarded, SplitError> {
        self.compact_record(pass)?;
        let fwd = match self.client.forward_pass(pass) {
            Err(SplitError::Service(e)) if e.is_transient() => self.recover(e, pass)?,
            other => other?,
        };
        let base = pass.base();
        self.sent.extend_from_slice(pass.hidden);
        for i in 0..pass.positions {
            let parent = match pass.parents.get(i) {
                None => (base + i).checked_sub(1),
                Some(None) => base.checked_sub(1),
                Some(&Some(p)) => Some(base + p),
            };
            self.parents.push(parent);
        }
        Ok(fwd)
    }
}

impl ReplayingClient {
    /// After `lost`: replays the record and repeats the call without its compaction.
    fn recover(
        &mut self,
        lost: ServiceError,
        pass: &MiddlePass<'_>,
    ) -> Result<Forwarded, SplitError> {
        if self.replays >= self.max_replays {
            return Err(SplitError::SessionLost {
                replays: self.replays,
                source: lost,
            });
        }
        self.replays += 1;
        let base = pass.base();
        tracing::warn!(error = %lost, positions = base, "split session lost: replaying");
        let replayed = |source: SplitError| SplitError::Replay {
            positions: base,
            source: Box::new(source),
        };
        let cost = self.replay(base).map_err(replayed)?;
        let again = MiddlePass {
            start: base,
            keep: &[],
            ..*pass
        };
        let mut fwd = self.client.forward_pass(&again).map_err(replayed)?;
        fwd.server += cost.server;
        fwd.bytes_up += cost.bytes_up;
        fwd.bytes_down += cost.bytes_down;
        Ok(fwd)
    }
}

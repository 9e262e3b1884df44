//! A split client that survives a lost session.
//!
//! The server keeps the KV cache of its layers per session; a restart or an
//! idle eviction loses it, and [`SplitClient`] alone then fails the
//! generation (`NOT_FOUND`, `unknown_session`, or a transport error).
//! [`ReplayingClient`] keeps the hidden states it sent for the positions
//! the server still holds (the accepted prefix: d f32 per position, 2.3 kB
//! for SmolLM2-135M's d = 576) and, when a call fails in a way that
//! reopening may cure ([`cipherlora_service::ServiceError::is_transient`]),
//! opens a new session of the same split and capacity (on a fresh
//! connection if the old one is gone), re-runs those positions through the
//! server in calls of at most the server's message size, and repeats the
//! failed call, all inside one [`MiddleLayers::forward_pass`]. The server's
//! cache is rebuilt from the same inputs, so the generation goes on with
//! the same tokens (up to floating-point summation order: the replay runs
//! the prefix in fewer, longer passes).
//!
//! Tree passes (lookahead decoding, [`MiddlePass::parents`]) leave the
//! server holding a whole token tree until the next call keeps the accepted
//! path ([`MiddlePass::keep`]). The client compacts its record the same
//! way before each call, so the record is always what the server holds
//! once that call's compaction is done: a causal chain (the kept rows form
//! a root-to-node path whose depths are their positions), which a replay
//! re-runs as causal passes before repeating the call without its `keep`.
//! A call whose compaction would keep rows that are not such a chain (a
//! row whose parent is not the row before it) cannot be replayed and is
//! refused ([`SplitError::Config`]) before it is sent. At most
//! [`ReplayingClient::with_max_replays`] replays per session (default 1);
//! a failed replay is [`SplitError::Replay`], a loss beyond the limit
//! [`SplitError::SessionLost`].

use std::time::Duration;

use cipherlora_service::{ClientConfig, ServiceError, SplitClient, SplitSessionInfo};

use crate::{Forwarded, MiddleLayers, MiddlePass, SplitError};

/// Bytes of a `Forward` request besides its hidden states, an upper bound
/// (session id, start, positions, encoding, framing).
const REQUEST_OVERHEAD: u64 = 1024;

/// A split session that is reopened and replayed when it is lost (see the
/// module docs).
pub struct ReplayingClient {
    config: ClientConfig,
    client: SplitClient,
    split: (u32, u32),
    capacity: u32,
    info: SplitSessionInfo,
    /// The residual stream after layer a of every position the server
    /// holds, row-major.
    sent: Vec<f32>,
    /// Parent row of every held row (`None` for row 0): `r − 1` along a
    /// chain, anything else inside a tree pass not compacted yet.
    parents: Vec<Option<usize>>,
    max_replays: usize,
    replays: usize,
}

impl ReplayingClient {
    /// Opens a session of split `(a, b)` and `capacity` positions on
    /// `client`, connected with `config` (kept to reconnect).
    ///
    /// # Errors
    /// [`SplitError::Service`]: the server's refusal of the split or the
    /// capacity, transport failures.
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

    /// Allows `n` replays per session instead of 1 (0: none, a lost
    /// session ends the generation).
    #[must_use]
    pub fn with_max_replays(mut self, n: usize) -> Self {
        self.max_replays = n;
        self
    }

    /// The open session as the server described it (after a replay: the
    /// reopened one).
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

    /// Closes the session.
    ///
    /// # Errors
    /// The server's status (`NOT_FOUND` if it was evicted meanwhile).
    pub fn close(mut self) -> Result<(), SplitError> {
        Ok(self.client.close()?)
    }

    /// Positions per replay call: as many rows as the server's message
    /// limit allows (at least one).
    fn rows_per_call(&self) -> usize {
        let row = 4 * u64::from(self.info.hidden_size).max(1);
        let rows = self.info.max_message_bytes.saturating_sub(REQUEST_OVERHEAD) / row;
        usize::try_from(rows).unwrap_or(usize::MAX).max(1)
    }

    /// Opens a new session (reconnecting when the connection is gone) and
    /// runs the first `positions` sent rows through it; returns what the
    /// replay cost.
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
    /// Compacts the record as `pass` will compact the server's cache and
    /// checks that what remains is a causal chain (module docs).
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
    /// After `lost`: replays the positions the server held once `pass`'s
    /// compaction is done (the record, a causal chain) and repeats the call
    /// without its compaction; the returned cost includes the replay's.
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

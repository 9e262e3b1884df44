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
//! failed call, all inside one [`MiddleLayers::forward`]. The server's
//! cache is rebuilt from the same inputs, so the generation goes on with
//! the same tokens (up to floating-point summation order: the replay runs
//! the prefix in fewer, longer passes). At most
//! [`ReplayingClient::with_max_replays`] replays per session (default 1);
//! a failed replay is [`SplitError::Replay`], a loss beyond the limit
//! [`SplitError::SessionLost`].

use std::time::Duration;

use cipherlora_service::{ClientConfig, ServiceError, SplitClient, SplitSessionInfo};

use crate::{Forwarded, MiddleLayers, SplitError};

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

impl MiddleLayers for ReplayingClient {
    fn forward(
        &mut self,
        start: usize,
        positions: usize,
        hidden: &[f32],
    ) -> Result<Forwarded, SplitError> {
        let d = self.info.hidden_size as usize;
        if start * d > self.sent.len() {
            return Err(SplitError::Config {
                reason: format!(
                    "a pass from position {start}, the server holds {}",
                    self.sent.len() / d.max(1)
                ),
            });
        }
        self.sent.truncate(start * d);
        let fwd = match MiddleLayers::forward(&mut self.client, start, positions, hidden) {
            Err(SplitError::Service(e)) if e.is_transient() => {
                self.recover(e, start, positions, hidden)?
            }
            other => other?,
        };
        self.sent.extend_from_slice(hidden);
        Ok(fwd)
    }
}

impl ReplayingClient {
    /// After `lost`: replays the `start` positions the server held and
    /// repeats the call; the returned cost includes the replay's.
    fn recover(
        &mut self,
        lost: ServiceError,
        start: usize,
        positions: usize,
        hidden: &[f32],
    ) -> Result<Forwarded, SplitError> {
        if self.replays >= self.max_replays {
            return Err(SplitError::SessionLost {
                replays: self.replays,
                source: lost,
            });
        }
        self.replays += 1;
        tracing::warn!(error = %lost, positions = start, "split session lost: replaying");
        let replayed = |source: SplitError| SplitError::Replay {
            positions: start,
            source: Box::new(source),
        };
        let cost = self.replay(start).map_err(replayed)?;
        let mut fwd =
            MiddleLayers::forward(&mut self.client, start, positions, hidden).map_err(replayed)?;
        fwd.server += cost.server;
        fwd.bytes_up += cost.bytes_up;
        fwd.bytes_down += cost.bytes_down;
        Ok(fwd)
    }
}

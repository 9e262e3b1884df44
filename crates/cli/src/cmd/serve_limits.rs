//! `serve`'s resource limits: every [`Limits`] field, settable by a flag or in the `[limits]` table
//! of a TOML file (`--config`); a flag wins over the file, the file over the default.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use cipherlora_service::Limits;
use clap::Args;
use serde::Deserialize;

/// One optional override per [`Limits`] field (durations in seconds or milliseconds, as the name
/// says).
#[derive(Debug, Default, Clone, PartialEq, Args, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitArgs {
    /// Largest gRPC message either way, bytes.
    #[arg(long)]
    pub max_message_bytes: Option<usize>,
    /// Open sessions at once, all tokens.
    #[arg(long)]
    pub max_sessions: Option<usize>,
    /// Open sessions at once per bearer token.
    #[arg(long)]
    pub max_sessions_per_token: Option<usize>,
    /// Offer-only sessions at once per bearer token.
    #[arg(long)]
    pub max_offers_per_token: Option<usize>,
    /// Key bytes the sessions of one token may hold together.
    #[arg(long)]
    pub max_key_bytes_per_token: Option<usize>,
    /// Public plus Galois key bytes per session.
    #[arg(long)]
    pub max_key_bytes_per_session: Option<usize>,
    /// Ciphertexts in one layer-group request.
    #[arg(long)]
    pub max_ciphertexts_per_request: Option<usize>,
    /// Bytes of one serialised ciphertext.
    #[arg(long)]
    pub max_ciphertext_bytes: Option<usize>,
    /// Requests of one stream computed at once.
    #[arg(long)]
    pub max_in_flight_per_stream: Option<usize>,
    /// Layer-group requests one session may make in its lifetime.
    #[arg(long)]
    pub max_requests_per_session: Option<u64>,
    /// Seconds without a request before a session is dropped.
    #[arg(long)]
    pub idle_timeout_secs: Option<u64>,
    /// Seconds an offer-only session lives.
    #[arg(long)]
    pub offer_timeout_secs: Option<u64>,
    /// Seconds a keyed session may wait for its first round.
    #[arg(long)]
    pub unstarted_timeout_secs: Option<u64>,
    /// Seconds a started session outlives its client's last stream (a dead client's sessions are
    /// freed after it).
    #[arg(long)]
    pub detached_timeout_secs: Option<u64>,
    /// Concurrent HTTP/2 streams per connection.
    #[arg(long)]
    pub max_concurrent_streams: Option<u32>,
    /// Group requests the whole server computes at once (default: cores).
    #[arg(long)]
    pub max_concurrent_computations: Option<usize>,
    /// Delta evaluations (positions × groups) per token and adapter per extraction window.
    #[arg(long)]
    pub extraction_budget: Option<u64>,
    /// Seconds of the extraction budget's sliding window.
    #[arg(long)]
    pub extraction_window_secs: Option<u64>,
    /// Milliseconds in-flight streams get to finish at shutdown.
    #[arg(long)]
    pub shutdown_grace_ms: Option<u64>,
}

impl LimitArgs {
    /// `self`'s values where set, else `under`'s.
    #[must_use]
    pub fn over(self, under: LimitArgs) -> LimitArgs {
        macro_rules! pick {
            ($($f:ident),*) => { LimitArgs { $($f: self.$f.or(under.$f),)* } };
        }
        pick!(
            max_message_bytes,
            max_sessions,
            max_sessions_per_token,
            max_offers_per_token,
            max_key_bytes_per_token,
            max_key_bytes_per_session,
            max_ciphertexts_per_request,
            max_ciphertext_bytes,
            max_in_flight_per_stream,
            max_requests_per_session,
            idle_timeout_secs,
            offer_timeout_secs,
            unstarted_timeout_secs,
            detached_timeout_secs,
            max_concurrent_streams,
            max_concurrent_computations,
            extraction_budget,
            extraction_window_secs,
            shutdown_grace_ms
        )
    }

    /// The default [`Limits`] with every set field replaced.
    #[must_use]
    pub fn apply(&self, mut l: Limits) -> Limits {
        let secs = Duration::from_secs;
        macro_rules! set {
            ($($f:ident => $g:ident $(via $conv:expr)?),* $(,)?) => {
                $(if let Some(v) = self.$f { l.$g = set!(@conv v $(, $conv)?); })*
            };
            (@conv $v:ident) => { $v };
            (@conv $v:ident, $conv:expr) => { $conv($v) };
        }
        set!(
            max_message_bytes => max_message_bytes,
            max_sessions => max_sessions,
            max_sessions_per_token => max_sessions_per_token,
            max_offers_per_token => max_offers_per_token,
            max_key_bytes_per_token => max_key_bytes_per_token,
            max_key_bytes_per_session => max_key_bytes_per_session,
            max_ciphertexts_per_request => max_ciphertexts_per_request,
            max_ciphertext_bytes => max_ciphertext_bytes,
            max_in_flight_per_stream => max_in_flight_per_stream,
            max_requests_per_session => max_requests_per_session,
            idle_timeout_secs => idle_timeout via secs,
            offer_timeout_secs => offer_timeout via secs,
            unstarted_timeout_secs => unstarted_timeout via secs,
            detached_timeout_secs => detached_timeout via secs,
            max_concurrent_streams => max_concurrent_streams,
            max_concurrent_computations => max_concurrent_computations,
            extraction_budget => extraction_budget,
            extraction_window_secs => extraction_window via secs,
            shutdown_grace_ms => shutdown_grace via Duration::from_millis,
        );
        l
    }
}

/// The `--config` file of `serve`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServeFile {
    /// `[limits]`: any [`LimitArgs`] field.
    pub limits: LimitArgs,
    /// MiB of pre-encoded adapter diagonals (as `--max-session-memory-mib`).
    pub max_session_memory_mib: Option<u64>,
}

impl ServeFile {
    /// Reads and parses `path`. Errors: an unreadable file, malformed TOML or an unknown key.
    pub fn read(path: &Path) -> anyhow::Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))
    }

    /// The file at `path` (defaults when `None`) and the limits a server runs with: `flags` over
    /// the file's `[limits]` over [`Limits::default`]. Errors: as [`ServeFile::read`].
    pub fn with_limits(path: Option<&Path>, flags: &LimitArgs) -> anyhow::Result<(Self, Limits)> {
        let file = match path {
            Some(p) => ServeFile::read(p)?,
            None => ServeFile::default(),
        };
        let limits = flags
            .clone()
            .over(file.limits.clone())
            .apply(Limits::default());
        Ok((file, limits))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_limit_is_settable_from_toml_and_flags_win() {
        let file: ServeFile = toml::from_str(
            "max_session_memory_mib = 512\n[limits]\nmax_sessions = 7\nidle_timeout_secs = 9\n\
             extraction_budget = 11\nshutdown_grace_ms = 250\nmax_concurrent_streams = 5\n",
        )
        .unwrap();
        assert_eq!(file.max_session_memory_mib, Some(512));
        let flags = LimitArgs {
            max_sessions: Some(3),
            offer_timeout_secs: Some(2),
            ..LimitArgs::default()
        };
        let l = flags.over(file.limits).apply(Limits::default());
        assert_eq!(l.max_sessions, 3, "the flag wins");
        assert_eq!(l.idle_timeout, Duration::from_secs(9));
        assert_eq!(l.offer_timeout, Duration::from_secs(2));
        assert_eq!(l.extraction_budget, 11);
        assert_eq!(l.shutdown_grace, Duration::from_millis(250));
        assert_eq!(l.max_concurrent_streams, 5);
        assert_eq!(
            l.max_sessions_per_token,
            Limits::default().max_sessions_per_token
        );
        assert!(toml::from_str::<ServeFile>("[limits]\nmax_sesions = 1\n").is_err());
        // Every Limits field has its setting: a Limits whose every field differs from the default
        // is reachable.
        let all = LimitArgs {
            max_message_bytes: Some(1),
            max_sessions: Some(1),
            max_sessions_per_token: Some(1),
            max_offers_per_token: Some(1),
            max_key_bytes_per_token: Some(1),
            max_key_bytes_per_session: Some(1),
            max_ciphertexts_per_request: Some(1),
            max_ciphertext_bytes: Some(1),
            max_in_flight_per_stream: Some(1),
            max_requests_per_session: Some(1),
            idle_timeout_secs: Some(1),
            offer_timeout_secs: Some(1),
            unstarted_timeout_secs: Some(1),
            detached_timeout_secs: Some(1),
            max_concurrent_streams: Some(1),
            max_concurrent_computations: Some(usize::MAX),
            extraction_budget: Some(1),
            extraction_window_secs: Some(1),
            shutdown_grace_ms: Some(1),
        }
        .apply(Limits::default());
        let Limits {
            max_message_bytes,
            max_sessions,
            max_sessions_per_token,
            max_offers_per_token,
            max_key_bytes_per_token,
            max_key_bytes_per_session,
            max_ciphertexts_per_request,
            max_ciphertext_bytes,
            max_in_flight_per_stream,
            max_requests_per_session,
            idle_timeout,
            offer_timeout,
            unstarted_timeout,
            detached_timeout,
            max_concurrent_streams,
            max_concurrent_computations,
            extraction_budget,
            extraction_window,
            shutdown_grace,
        } = all;
        let d = Limits::default();
        assert!(max_message_bytes != d.max_message_bytes && max_sessions != d.max_sessions);
        assert!(max_sessions_per_token != d.max_sessions_per_token);
        assert!(max_offers_per_token != d.max_offers_per_token);
        assert!(max_key_bytes_per_token != d.max_key_bytes_per_token);
        assert!(max_key_bytes_per_session != d.max_key_bytes_per_session);
        assert!(max_ciphertexts_per_request != d.max_ciphertexts_per_request);
        assert!(max_ciphertext_bytes != d.max_ciphertext_bytes);
        assert!(max_in_flight_per_stream != d.max_in_flight_per_stream);
        assert!(max_requests_per_session != d.max_requests_per_session);
        assert!(idle_timeout != d.idle_timeout && offer_timeout != d.offer_timeout);
        assert!(unstarted_timeout != d.unstarted_timeout);
        assert!(detached_timeout != d.detached_timeout);
        assert!(max_concurrent_streams != d.max_concurrent_streams);
        assert!(max_concurrent_computations != d.max_concurrent_computations);
        assert!(extraction_budget != d.extraction_budget);
        assert!(extraction_window != d.extraction_window && shutdown_grace != d.shutdown_grace);
    }
}

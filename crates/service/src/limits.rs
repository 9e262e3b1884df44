//! The server's explicit resource limits.

use std::time::Duration;

/// Limits enforced before any HE work: `RESOURCE_EXHAUSTED` (`limit_exceeded`), or `OUT_OF_RANGE`
/// for the message size.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Largest gRPC message in either direction, bytes (must hold the largest key upload).
    pub max_message_bytes: usize,
    /// Open sessions at once, over all adapters and clients.
    pub max_sessions: usize,
    /// Open sessions per bearer token (without authentication, all callers share one).
    pub max_sessions_per_token: usize,
    /// Offer-only sessions (opened without keys, to learn the plan) at once per bearer token.
    pub max_offers_per_token: usize,
    /// Key bytes one token's open sessions may hold together (split: KV caches, separately).
    pub max_key_bytes_per_token: usize,
    /// Public key plus Galois keys bytes per session (split-inference sessions: KV cache bytes).
    pub max_key_bytes_per_session: usize,
    /// Ciphertexts in one layer-group request.
    pub max_ciphertexts_per_request: usize,
    /// Bytes of one serialised ciphertext.
    pub max_ciphertext_bytes: usize,
    /// Requests of one stream computed at once (pipelining depth).
    pub max_in_flight_per_stream: usize,
    /// Layer-group requests one session may make, replays included (against delta collection).
    pub max_requests_per_session: u64,
    /// A session without a request for this long is dropped with its keys.
    pub idle_timeout: Duration,
    /// An offer-only session is dropped this long after opening.
    pub offer_timeout: Duration,
    /// A keyed session that has not started a round is dropped after this long.
    pub unstarted_timeout: Duration,
    /// A started session whose last `Rounds` stream ended (the client closed it, its connection
    /// dropped or its process died) is dropped after this long unless a new stream resumes it.
    pub detached_timeout: Duration,
    /// Concurrent HTTP/2 streams per connection.
    pub max_concurrent_streams: u32,
    /// Group requests computed at once by the whole server (default: available cores).
    pub max_concurrent_computations: usize,
    /// Delta evaluations (positions × groups, replays included) one token may have computed on one
    /// adapter within `extraction_window`.
    pub extraction_budget: u64,
    /// The sliding window of `extraction_budget`.
    pub extraction_window: Duration,
    /// Time in-flight streams get to finish after shutdown was asked for.
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    /// 128 MiB messages, 32 sessions (16 per token, as many offer-only), one computation per core, key
    /// bytes 128 MiB per session and 1 GiB per token, 64 ciphertexts of ≤ 8 MiB per request, 4 in
    /// flight per stream, 64 streams per connection, 10⁷ requests per session, 10 min idle (20 s
    /// unstarted, 30 s offer-only, 15 s without a stream), 2·10⁷ evaluations per token and
    /// adapter per hour, 10 s grace.
    fn default() -> Self {
        Self {
            max_message_bytes: 128 << 20,
            max_sessions: 32,
            max_sessions_per_token: 16,
            // Offer-only sessions live until the client opens its keyed session: a
            // token may have as many as it may have sessions.
            max_offers_per_token: 16,
            max_key_bytes_per_token: 1 << 30,
            max_key_bytes_per_session: 128 << 20,
            max_ciphertexts_per_request: 64,
            max_ciphertext_bytes: 8 << 20,
            max_in_flight_per_stream: 4,
            max_requests_per_session: 10_000_000,
            idle_timeout: Duration::from_secs(600),
            offer_timeout: Duration::from_secs(30),
            // A sibling's rounds keep it alive (`SessionTable::touch`); a dead client's
            // unused session goes within 20 s.
            unstarted_timeout: Duration::from_secs(20),
            detached_timeout: Duration::from_secs(15),
            max_concurrent_streams: 64,
            max_concurrent_computations: std::thread::available_parallelism()
                .map_or(1, std::num::NonZeroUsize::get),
            extraction_budget: 20_000_000,
            extraction_window: Duration::from_secs(3600),
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

impl Limits {
    /// The envelope limits of one request.
    pub fn request_limits(&self) -> cipherlora_proto::RequestLimits {
        cipherlora_proto::RequestLimits {
            max_ciphertexts: self.max_ciphertexts_per_request,
            max_ciphertext_bytes: self.max_ciphertext_bytes,
            max_masked_rows: cipherlora_proto::RequestLimits::default().max_masked_rows,
        }
    }
}

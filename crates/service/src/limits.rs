//! The server's explicit resource limits.

use std::time::Duration;

/// Limits the server enforces before any HE work. Every limit answers
/// `RESOURCE_EXHAUSTED` (reason `limit_exceeded`) when hit, except the message
/// size, which tonic enforces while decoding: `OUT_OF_RANGE` (with reason
/// `limit_exceeded` on `Rounds` streams; without a reason on unary calls,
/// which tonic refuses before the handler runs). A client whose own
/// `max_message_bytes` is smaller gets `OUT_OF_RANGE` locally.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Largest gRPC message in either direction, bytes: tonic's
    /// `max_decoding_message_size` and `max_encoding_message_size`. Must hold
    /// the largest key upload.
    pub max_message_bytes: usize,
    /// Open sessions at once, over all adapters and clients.
    pub max_sessions: usize,
    /// Open sessions at once per bearer token (all callers of a server
    /// without authentication share one token's limits).
    pub max_sessions_per_token: usize,
    /// Offer-only sessions (opened without keys, to learn the plan) at once
    /// per bearer token.
    pub max_offers_per_token: usize,
    /// Key bytes (public plus Galois keys) the open sessions of one bearer
    /// token may hold together: a session's own memory is its keys and
    /// buffers (the adapter's encoded diagonals are shared). Split-inference
    /// sessions count their KV cache's bytes here instead (in a table of
    /// their own: adapter and split sessions are limited separately).
    pub max_key_bytes_per_token: usize,
    /// Public key plus Galois keys bytes per session (split-inference
    /// sessions: KV cache bytes).
    pub max_key_bytes_per_session: usize,
    /// Ciphertexts in one layer-group request.
    pub max_ciphertexts_per_request: usize,
    /// Bytes of one serialised ciphertext.
    pub max_ciphertext_bytes: usize,
    /// Requests of one stream computed at once (pipelining depth).
    pub max_in_flight_per_stream: usize,
    /// Layer-group requests one session may make in its lifetime (a rate
    /// limit against a client that collects deltas to solve for B·A; see the
    /// threat model's known limits). Replays count.
    pub max_requests_per_session: u64,
    /// A session without a request for this long is dropped with its keys.
    pub idle_timeout: Duration,
    /// An offer-only session is dropped this long after it was opened (a
    /// round on it never refreshes its timer: it computes nothing).
    pub offer_timeout: Duration,
    /// A keyed session that has not yet started a round is dropped after
    /// this long (a killed client's half-opened sessions go fast).
    pub unstarted_timeout: Duration,
    /// Concurrent HTTP/2 streams per connection (one `Rounds` stream per
    /// session, plus unary calls).
    pub max_concurrent_streams: u32,
    /// Group requests computed at once by the whole server, over all
    /// connections and sessions (the compute pool; requests beyond it wait
    /// their turn without holding a thread). Default: the cores this
    /// process may run on.
    pub max_concurrent_computations: usize,
    /// Delta evaluations (positions × layer groups, replays included) one
    /// bearer token may have computed on one adapter within
    /// `extraction_window`; beyond it group requests are refused with
    /// `RESOURCE_EXHAUSTED` (`limit_exceeded`) until old evaluations leave
    /// the window. See README's security section for what it buys.
    pub extraction_budget: u64,
    /// The sliding window of `extraction_budget`.
    pub extraction_window: Duration,
    /// Time in-flight streams get to finish after shutdown was asked for.
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    /// 128 MiB messages, 32 sessions (16 per token, at most 4 of them offer-only),
    /// as many group computations at once as the process has cores,
    /// 96 MiB of keys per session and 1 GiB per token, 64 ciphertexts of
    /// at most 8 MiB per request, 4 requests in flight per stream, 64
    /// HTTP/2 streams per connection, 10 million requests per session, 10
    /// min idle timeout (60 s before the first round, 30 s for offer-only
    /// sessions), 20 million delta evaluations per token and adapter per
    /// hour, 10 s shutdown grace.
    fn default() -> Self {
        Self {
            max_message_bytes: 128 << 20,
            max_sessions: 32,
            max_sessions_per_token: 16,
            max_offers_per_token: 4,
            max_key_bytes_per_token: 1 << 30,
            max_key_bytes_per_session: 96 << 20,
            max_ciphertexts_per_request: 64,
            max_ciphertext_bytes: 8 << 20,
            max_in_flight_per_stream: 4,
            max_requests_per_session: 10_000_000,
            idle_timeout: Duration::from_secs(600),
            offer_timeout: Duration::from_secs(30),
            unstarted_timeout: Duration::from_secs(60),
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
        }
    }
}

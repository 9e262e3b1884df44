//! The blocking client of `cipherlora.split.v1.SplitInference`, one unary call per forward pass,
//! with [`ClientConfig`]'s transport settings; no replay (`cipherlora_split`'s `ReplayingClient`).

use std::time::Duration;

use cipherlora_proto::split::v1::split_inference_client::SplitInferenceClient;
use cipherlora_proto::split::v1::{self as sv1, ActivationEncoding};
use cipherlora_proto::{SessionId, activations, tree};
use prost::Message;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::auth::BearerToken;
use crate::client::{ClientConfig, connect_channel};
use crate::error::{Result, ServerFault, ServiceError};
use crate::link::LinkDirection;
use crate::split_backend::SplitModelInfo;

type Rpc = SplitInferenceClient<InterceptedService<Channel, BearerToken>>;

/// The server's answer to `OpenSplitSession`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitSessionInfo {
    /// The server's first layer (= the client's head layers a).
    pub first_layer: u32,
    /// One past the server's last layer (= L − b).
    pub end_layer: u32,
    /// Residual stream width d.
    pub hidden_size: u32,
    /// Idle time after which the server drops the session.
    pub idle_timeout: Duration,
    /// Largest message the server accepts, bytes.
    pub max_message_bytes: u64,
    /// Whether the server honours tree masks and compaction ([`SplitClient::forward_tree`]).
    pub tree_passes: bool,
}

/// What the client sent and received (protobuf message sizes, the link simulator's unit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SplitClientStats {
    /// Calls made (every RPC is one round trip).
    pub round_trips: u64,
    /// `Forward` calls among them.
    pub forwards: u64,
    /// Bytes of request messages sent.
    pub bytes_up: u64,
    /// Bytes of response messages received.
    pub bytes_down: u64,
    /// Server compute time the `Forward` responses reported, microseconds.
    pub server_micros: u64,
}

/// Bound on closing the session when the client is dropped.
const CLOSE_ON_DROP_TIMEOUT: Duration = Duration::from_secs(2);

/// A connection to a split-inference server with at most one open session.
pub struct SplitClient {
    rt: tokio::runtime::Runtime,
    rpc: Rpc,
    up: LinkDirection,
    down: LinkDirection,
    timeout: Duration,
    session: Option<(SessionId, SplitSessionInfo)>,
    stats: SplitClientStats,
}

impl SplitClient {
    /// Starts a one-worker runtime and connects. Errors: [`ServiceError::Config`], `Transport`,
    /// `Io`.
    pub fn connect(config: &ClientConfig) -> Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("cipherlora-split-client")
            .enable_all()
            .build()
            .map_err(|e| ServiceError::io("starting the client runtime", e))?;
        let bearer = BearerToken::new(config.token.as_deref())?;
        let channel = rt.block_on(connect_channel(config))?;
        let rpc = SplitInferenceClient::with_interceptor(channel, bearer)
            .max_decoding_message_size(config.max_message_bytes)
            .max_encoding_message_size(config.max_message_bytes);
        Ok(Self {
            rt,
            rpc,
            up: LinkDirection::new(config.link.upload()),
            down: LinkDirection::new(config.link.download()),
            timeout: config.round_timeout,
            session: None,
            stats: SplitClientStats::default(),
        })
    }

    /// One unary call with link shaping, the timeout and the byte counts.
    fn call<Q, R, F, Fut>(&mut self, req: Q, f: F) -> Result<R>
    where
        Q: Message,
        R: Message,
        F: FnOnce(Rpc, Q) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<tonic::Response<R>, tonic::Status>>,
    {
        let up = req.encoded_len();
        let rpc = self.rpc.clone();
        let (upl, downl, timeout) = (&self.up, &self.down, self.timeout);
        let resp = self.rt.block_on(async move {
            upl.transit(up).await;
            let r = tokio::time::timeout(timeout, f(rpc, req))
                .await
                .map_err(|_| ServiceError::Timeout { after: timeout })??
                .into_inner();
            downl.transit(r.encoded_len()).await;
            Ok::<R, ServiceError>(r)
        })?;
        self.stats.round_trips += 1;
        self.stats.bytes_up += up as u64;
        self.stats.bytes_down += resp.encoded_len() as u64;
        Ok(resp)
    }

    /// The served model's shape. Errors: [`ServiceError::Rpc`]; transport errors.
    pub fn describe(&mut self) -> Result<SplitModelInfo> {
        let r = self.call(sv1::DescribeRequest {}, |mut c, q| async move {
            c.describe(q).await
        })?;
        Ok(SplitModelInfo {
            model: r.model,
            num_layers: r.num_layers,
            hidden_size: r.hidden_size,
            max_capacity: r.max_capacity,
        })
    }

    /// Opens a session running layers `[a, L − b)` with a `capacity`-position cache. Errors:
    /// [`ServiceError::Rpc`]; [`ServiceError::Protocol`] for another split.
    pub fn open(&mut self, a: u32, b: u32, capacity: u32) -> Result<SplitSessionInfo> {
        if self.session.is_some() {
            self.close()?;
        }
        let req = sv1::OpenSplitSessionRequest {
            client_head_layers: a,
            client_tail_layers: b,
            capacity,
        };
        let r = self.call(req, |mut c, q| async move { c.open_split_session(q).await })?;
        let id = SessionId::from_slice(&r.session_id)
            .map_err(ServerFault::malformed("open-split-session answer"))?;
        if r.first_layer != a {
            return Err(ServiceError::Protocol {
                fault: ServerFault::FirstLayer {
                    asked: a,
                    got: r.first_layer,
                },
            });
        }
        let info = SplitSessionInfo {
            first_layer: r.first_layer,
            end_layer: r.end_layer,
            hidden_size: r.hidden_size,
            idle_timeout: Duration::from_millis(r.idle_timeout_ms),
            max_message_bytes: r.max_message_bytes,
            tree_passes: r.tree_passes,
        };
        self.session = Some((id, info.clone()));
        Ok(info)
    }

    /// The open session's id and description.
    pub fn session(&self) -> Option<&(SessionId, SplitSessionInfo)> {
        self.session.as_ref()
    }

    /// Runs the server's layers on `hidden` (row-major `positions` × d f32) at `start..`, dropping
    /// cached positions from `start` first. Errors: [`ServiceError::NoSession`], `Rpc`, `Protocol`.
    pub fn forward(&mut self, start: usize, positions: usize, hidden: &[f32]) -> Result<Vec<f32>> {
        self.forward_tree(start, &[], &[], positions, hidden)
    }

    /// A lookahead pass (Fu et al. 2024, §3) in one round trip: compaction by `keep`, then `hidden`
    /// under tree mask `parents` (empty: causal). Errors: as [`SplitClient::forward`].
    pub fn forward_tree(
        &mut self,
        start: usize,
        keep: &[usize],
        parents: &[Option<usize>],
        positions: usize,
        hidden: &[f32],
    ) -> Result<Vec<f32>> {
        let (id, info) = self.session.clone().ok_or(ServiceError::NoSession)?;
        let tree = !keep.is_empty() || !parents.is_empty();
        if tree && !info.tree_passes {
            return Err(ServiceError::Protocol {
                fault: ServerFault::NoTreePasses,
            });
        }
        let keep_wire = keep
            .iter()
            .map(|&k| u32::try_from(k))
            .collect::<std::result::Result<Vec<u32>, _>>()
            .map_err(|_| ServiceError::Config {
                reason: "a keep index beyond u32".into(),
            })?;
        let req = sv1::ForwardRequest {
            session_id: id.to_bytes(),
            start: start as u64,
            positions: u32::try_from(positions).map_err(|_| ServiceError::Config {
                reason: format!("{positions} positions in one call"),
            })?,
            encoding: ActivationEncoding::F32Le as i32,
            hidden: activations::encode_f32(hidden),
            tree_parents: tree::encode_parents(parents),
            keep: keep_wire,
        };
        let r = self.forward_raw(req)?;
        let end = start + keep.len() + positions;
        if r.length != end as u64 {
            return Err(ServiceError::Protocol {
                fault: ServerFault::CacheLength {
                    expected: end as u64,
                    got: r.length,
                },
            });
        }
        activations::decode(r.encoding, &r.hidden, positions, info.hidden_size as usize)
            .map_err(ServerFault::malformed("forward response"))
    }

    /// Sends `req` as is (tests send malformed ones). Errors as `forward`, unchecked.
    pub fn forward_raw(&mut self, req: sv1::ForwardRequest) -> Result<sv1::ForwardResponse> {
        let r = self.call(req, |mut c, q| async move { c.forward(q).await })?;
        self.stats.forwards += 1;
        self.stats.server_micros += r.server_micros;
        Ok(r)
    }

    /// Drops cached positions from `length` on; returns the cached length. Errors: the server's.
    pub fn truncate(&mut self, length: usize) -> Result<usize> {
        let (id, _) = self.session.clone().ok_or(ServiceError::NoSession)?;
        let req = sv1::TruncateRequest {
            session_id: id.to_bytes(),
            length: length as u64,
        };
        let r = self.call(req, |mut c, q| async move { c.truncate(q).await })?;
        Ok(usize::try_from(r.length).unwrap_or(usize::MAX))
    }

    /// Closes the open session, if any. Errors: the server's status (`NOT_FOUND` if evicted).
    pub fn close(&mut self) -> Result<()> {
        let Some((id, _)) = self.session.take() else {
            return Ok(());
        };
        let req = sv1::CloseSplitSessionRequest {
            session_id: id.to_bytes(),
        };
        self.call(
            req,
            |mut c, q| async move { c.close_split_session(q).await },
        )?;
        Ok(())
    }

    /// Bytes and calls so far.
    pub fn stats(&self) -> SplitClientStats {
        self.stats
    }
}

impl Drop for SplitClient {
    fn drop(&mut self) {
        if self.session.is_some() {
            self.timeout = self.timeout.min(CLOSE_ON_DROP_TIMEOUT);
            let _ = self.close();
        }
    }
}

//! The adapter server: `cipherlora serve` is [`serve`] with the HE backend. Requests are fully
//! checked before any arithmetic; statuses never echo client strings, logs never hold keys.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cipherlora_proto::v1::adapter_service_server::{AdapterService, AdapterServiceServer};
use cipherlora_proto::v1::{self, GroupRequest, GroupResponse};
use cipherlora_proto::{ErrorReason, SessionId, offer_id, validate_group_request};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Identity, ServerTlsConfig};
use tonic::{Code, Request, Response, Status, Streaming};

use crate::auth::{AuthInterceptor, Principal, RejectionLog, TokenSet};
use crate::backend::{AdapterBackend, BackendError, OpenSessionPayload};
use crate::budget::ExtractionBudget;
use crate::error::{Result, ServiceError};
use crate::limits::Limits;
use crate::metrics::{Metrics, serve_metrics};
use crate::sessions::{NewSession, Session, SessionTable, insert_error};
use crate::split_backend::SplitBackend;
use crate::split_server::{SplitState, SplitSvc};
use crate::status::{from_backend, from_proto, internal, status, unknown_session};
use crate::tls::TlsConfig;
use cipherlora_proto::split::v1::split_inference_server::SplitInferenceServer;

/// HTTP/2 flow-control windows, large enough for ciphertext batches on slow links.
pub(crate) const STREAM_WINDOW: u32 = 16 << 20;
pub(crate) const CONNECTION_WINDOW: u32 = 64 << 20;

/// Everything `cipherlora serve` configures.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Address to listen on (`--listen`); port 0 picks a free port.
    pub listen: SocketAddr,
    /// Server identity; `None` serves plaintext HTTP/2 (warned).
    pub tls: Option<TlsConfig>,
    /// Accepted bearer tokens; `None` disables authentication (warned).
    pub tokens: Option<TokenSet>,
    /// Resource limits.
    pub limits: Limits,
    /// Where to serve `GET /metrics` (plain HTTP), if anywhere.
    pub metrics_listen: Option<SocketAddr>,
}

impl ServeConfig {
    /// Defaults: no TLS, no auth, default limits, no metrics endpoint.
    pub fn new(listen: SocketAddr) -> Self {
        Self {
            listen,
            tls: None,
            tokens: None,
            limits: Limits::default(),
            metrics_listen: None,
        }
    }
}

pub(crate) struct State {
    adapters: BTreeMap<String, Arc<dyn AdapterBackend>>,
    /// The `ListAdapters` answer, built and size-checked at bind.
    list: v1::ListAdaptersResponse,
    sessions: SessionTable,
    budget: ExtractionBudget,
    pub(crate) limits: Limits,
    pub(crate) metrics: Arc<Metrics>,
    shutdown: watch::Receiver<bool>,
    /// The server-wide compute pool ([`Limits::max_concurrent_computations`]).
    pub(crate) compute: Arc<Semaphore>,
    /// The split-inference model and its sessions, if served.
    pub(crate) split: Option<Arc<SplitState>>,
}

/// A bound, not yet running server.
pub struct AdapterServer {
    state: Arc<State>,
    config: ServeConfig,
    listener: tokio::net::TcpListener,
    local_addr: SocketAddr,
    metrics_listener: Option<tokio::net::TcpListener>,
    shutdown_tx: watch::Sender<bool>,
}

impl AdapterServer {
    /// Binds the listen (and metrics) address and checks the configuration. Errors:
    /// [`ServiceError::Config`]; [`ServiceError::Io`] when binding fails.
    pub async fn bind(config: ServeConfig, backends: Vec<Arc<dyn AdapterBackend>>) -> Result<Self> {
        Self::bind_with_split(config, backends, None).await
    }

    /// [`AdapterServer::bind`], also serving `split` when given. Errors: as `bind`.
    pub async fn bind_with_split(
        config: ServeConfig,
        backends: Vec<Arc<dyn AdapterBackend>>,
        split: Option<Arc<dyn SplitBackend>>,
    ) -> Result<Self> {
        let l = &config.limits;
        if l.max_sessions == 0
            || l.max_sessions_per_token == 0
            || l.max_message_bytes == 0
            || l.max_ciphertexts_per_request == 0
            || l.max_in_flight_per_stream == 0
            || l.max_concurrent_computations == 0
            || l.max_concurrent_streams == 0
            || l.idle_timeout.is_zero()
            || l.offer_timeout.is_zero()
            || l.unstarted_timeout.is_zero()
            || l.extraction_window.is_zero()
        {
            return Err(ServiceError::Config {
                reason: "limits must be positive".into(),
            });
        }
        if backends.is_empty() && split.is_none() {
            return Err(ServiceError::Config {
                reason: "no adapter and no split model to serve".into(),
            });
        }
        let mut adapters = BTreeMap::new();
        let mut infos = Vec::new();
        for b in backends {
            let info = b.info();
            if adapters.insert(info.adapter_id.clone(), b).is_some() {
                return Err(ServiceError::Config {
                    reason: format!("adapter id {:?} served twice", info.adapter_id),
                });
            }
            infos.push(info);
        }
        let list = v1::ListAdaptersResponse {
            adapters: infos.iter().map(Into::into).collect(),
        };
        if prost::Message::encoded_len(&list) > l.max_message_bytes {
            return Err(ServiceError::Config {
                reason: "the adapter descriptions exceed max_message_bytes".into(),
            });
        }
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|e| ServiceError::io(format!("binding {}", config.listen), e))?;
        let local_addr = listener
            .local_addr()
            .map_err(|e| ServiceError::io("reading the bound address", e))?;
        let metrics_listener = match config.metrics_listen {
            Some(a) => Some(
                tokio::net::TcpListener::bind(a)
                    .await
                    .map_err(|e| ServiceError::io(format!("binding metrics {a}"), e))?,
            ),
            None => None,
        };
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let state = Arc::new(State {
            adapters,
            list,
            sessions: SessionTable::new(config.limits.clone()),
            budget: ExtractionBudget::new(
                config.limits.extraction_budget,
                config.limits.extraction_window,
            ),
            limits: config.limits.clone(),
            metrics: Arc::new(Metrics::default()),
            shutdown: shutdown_rx,
            compute: Arc::new(Semaphore::new(config.limits.max_concurrent_computations)),
            split: split.map(|backend| {
                Arc::new(SplitState {
                    info: backend.info(),
                    backend,
                    sessions: SessionTable::new(config.limits.clone()),
                })
            }),
        });
        Ok(Self {
            state,
            config,
            listener,
            local_addr,
            metrics_listener,
            shutdown_tx,
        })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The metrics endpoint's bound address, if one was asked for.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_listener
            .as_ref()
            .and_then(|l| l.local_addr().ok())
    }

    /// The live metrics registry.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.state.metrics.clone()
    }

    /// Serves until `shutdown`, then shuts down gracefully. Errors: [`ServiceError::Transport`].
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<()> {
        let Self {
            state,
            config,
            listener,
            local_addr,
            metrics_listener,
            shutdown_tx,
        } = self;
        let limits = &config.limits;
        let mut builder = tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .initial_stream_window_size(Some(STREAM_WINDOW))
            .initial_connection_window_size(Some(CONNECTION_WINDOW))
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .http2_keepalive_timeout(Some(Duration::from_secs(20)))
            .max_concurrent_streams(Some(limits.max_concurrent_streams));
        match &config.tls {
            Some(tls) => {
                builder = builder.tls_config(
                    ServerTlsConfig::new()
                        .identity(Identity::from_pem(&tls.cert_pem, &tls.key_pem)),
                )?;
            }
            None => tracing::warn!("serving WITHOUT TLS: tokens and ciphertexts travel in clear"),
        }
        if config.tokens.is_none() {
            tracing::warn!("serving WITHOUT authentication");
        }
        let svc = AdapterServiceServer::new(Svc {
            state: state.clone(),
        })
        .max_decoding_message_size(limits.max_message_bytes)
        .max_encoding_message_size(limits.max_message_bytes);
        let auth = AuthInterceptor {
            tokens: config.tokens.clone().map(Arc::new),
            metrics: state.metrics.clone(),
            rejections: Arc::new(RejectionLog::default()),
        };
        let split_svc = state.split.as_ref().map(|split| {
            let s = SplitInferenceServer::new(SplitSvc {
                split: split.clone(),
                limits: state.limits.clone(),
                metrics: state.metrics.clone(),
                compute: state.compute.clone(),
            })
            .max_decoding_message_size(limits.max_message_bytes)
            .max_encoding_message_size(limits.max_message_bytes);
            InterceptedService::new(s, auth.clone())
        });
        let svc = InterceptedService::new(svc, auth);

        let metrics_task = metrics_listener.map(|l| {
            tokio::spawn(serve_metrics(
                l,
                state.metrics.clone(),
                state.shutdown.clone(),
            ))
        });
        let evict_task = tokio::spawn(evict_loop(state.clone()));

        let mut sd = state.shutdown.clone();
        let signal = async move {
            let _ = sd.wait_for(|v| *v).await;
        };
        tracing::info!(
            addr = %local_addr,
            tls = config.tls.is_some(),
            auth = config.tokens.is_some(),
            adapters = ?state.adapters.keys().collect::<Vec<_>>(),
            split = ?state.split.as_ref().map(|s| &s.info.model),
            "adapter server listening"
        );
        let server = builder
            .add_service(svc)
            .add_optional_service(split_svc)
            .serve_with_incoming_shutdown(
                // TCP options must be set here (Nagle + delayed ACK would add latency).
                TcpIncoming::from(listener)
                    .with_nodelay(Some(true))
                    .with_keepalive(Some(Duration::from_secs(60))),
                signal,
            );
        let grace = limits.shutdown_grace;
        let trigger = async move {
            shutdown.await;
            tracing::info!("shutdown requested: finishing in-flight requests");
            let _ = shutdown_tx.send(true);
            tokio::time::sleep(grace).await;
            shutdown_tx
        };
        let result = tokio::select! {
            r = server => r.map_err(ServiceError::from),
            _tx = trigger => {
                tracing::warn!(?grace, "shutdown grace elapsed: dropping remaining connections");
                Ok(())
            }
        };
        evict_task.abort();
        if let Some(t) = metrics_task {
            t.abort();
        }
        tracing::info!(sessions = state.sessions.len(), "adapter server stopped");
        result
    }
}

/// Binds `config.listen` and serves `backends` until `shutdown`. Errors: `bind`'s and `run`'s.
pub async fn serve(
    config: ServeConfig,
    backends: Vec<Arc<dyn AdapterBackend>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    AdapterServer::bind(config, backends)
        .await?
        .run(shutdown)
        .await
}

async fn evict_loop(state: Arc<State>) {
    let period = (state.sessions.shortest_timeout() / 4)
        .clamp(Duration::from_millis(10), Duration::from_secs(5));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        for s in state.sessions.evict_idle() {
            state.metrics.session("evicted");
            tracing::info!(session = %s.id.tag(), adapter = %s.adapter_id, "evicted idle session");
        }
        for s in state.split.iter().flat_map(|sp| sp.sessions.evict_idle()) {
            state.metrics.session("evicted");
            tracing::info!(session = %s.id.tag(), "evicted idle split session");
        }
    }
}

struct Svc {
    state: Arc<State>,
}

type RoundsStream =
    Pin<Box<dyn tokio_stream::Stream<Item = std::result::Result<GroupResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AdapterService for Svc {
    async fn list_adapters(
        &self,
        req: Request<v1::ListAdaptersRequest>,
    ) -> std::result::Result<Response<v1::ListAdaptersResponse>, Status> {
        self.state.metrics.request("list_adapters", Code::Ok);
        let wanted = req.into_inner().adapter_id;
        let mut list = self.state.list.clone();
        if !wanted.is_empty() {
            list.adapters.retain(|a| a.adapter_id == wanted);
        }
        Ok(Response::new(list))
    }

    async fn open_session(
        &self,
        req: Request<v1::OpenSessionRequest>,
    ) -> std::result::Result<Response<v1::OpenSessionResponse>, Status> {
        let who = Principal::of(&req);
        let r = self.state.open_session(who, req.into_inner()).await;
        self.state.metrics.outcome("open_session", &r);
        r.map(Response::new)
    }

    type RoundsStream = RoundsStream;

    async fn rounds(
        &self,
        req: Request<Streaming<GroupRequest>>,
    ) -> std::result::Result<Response<RoundsStream>, Status> {
        let who = Principal::of(&req);
        let inbound = req.into_inner();
        let (tx, rx) = mpsc::channel(self.state.limits.max_in_flight_per_stream * 2);
        tokio::spawn(run_stream(self.state.clone(), who, inbound, tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn close_session(
        &self,
        req: Request<v1::CloseSessionRequest>,
    ) -> std::result::Result<Response<v1::CloseSessionResponse>, Status> {
        let who = Principal::of(&req);
        let r = SessionId::from_slice(&req.get_ref().session_id)
            .map_err(|e| from_proto(&e))
            .and_then(|id| {
                let mine = self.state.sessions.get(&id).is_some_and(|s| s.owner == who);
                if mine && self.state.sessions.remove(&id) {
                    self.state.metrics.session("closed");
                    tracing::info!(session = %id.tag(), "closed session");
                    Ok(v1::CloseSessionResponse {})
                } else {
                    Err(unknown_session())
                }
            });
        self.state.metrics.outcome("close_session", &r);
        r.map(Response::new)
    }
}

impl State {
    async fn open_session(
        &self,
        who: Principal,
        req: v1::OpenSessionRequest,
    ) -> std::result::Result<v1::OpenSessionResponse, Status> {
        let backend = self.adapters.get(&req.adapter_id).cloned().ok_or_else(|| {
            status(
                Code::NotFound,
                ErrorReason::UnknownAdapter,
                "no such adapter (ListAdapters names the served ones)",
            )
        })?;
        let key_bytes = req.public_key.len() + req.galois_keys.len();
        self.metrics.received(
            "open_session",
            (key_bytes
                + req
                    .plan_request
                    .as_ref()
                    .map_or(0, prost::Message::encoded_len)) as u64,
        );
        if key_bytes > self.limits.max_key_bytes_per_session {
            return Err(status(
                Code::ResourceExhausted,
                ErrorReason::LimitExceeded,
                format!(
                    "{key_bytes} key bytes, limit is {}",
                    self.limits.max_key_bytes_per_session
                ),
            ));
        }
        self.sessions
            .check_room(who, key_bytes, None)
            .map_err(insert_error)?;
        let payload = OpenSessionPayload {
            ckks_preset: req.ckks_preset,
            public_key: req.public_key,
            galois_keys: req.galois_keys,
            plan_request: req.plan_request.unwrap_or_default(),
        };
        tracing::debug!(adapter = %req.adapter_id, ?payload, "open session");
        // Meanwhile the token's other unstarted sessions wait for this one.
        let _opening = self.sessions.opening(who);
        // Key parsing and weight encoding can take a while: off the reactor.
        let opened = tokio::task::spawn_blocking(move || backend.open_session(payload))
            .await
            .map_err(|e| internal(&e))?
            .map_err(|e| {
                let s = from_backend(&e);
                tracing::info!(adapter = %req.adapter_id, code = ?s.code(), "open session refused: {}", s.message());
                s
            })?;
        let id = self
            .sessions
            .insert(NewSession {
                adapter_id: req.adapter_id.clone(),
                owner: who,
                offer_only: opened.compute.offer_only(),
                compute: opened.compute,
                plan_id: offer_id(&opened.offer),
                key_bytes,
            })
            .map_err(insert_error)?;
        self.metrics.session("opened");
        tracing::info!(
            session = %id.tag(),
            adapter = %req.adapter_id,
            key_bytes,
            "opened session"
        );
        Ok(v1::OpenSessionResponse {
            session_id: id.to_bytes(),
            offer: Some(opened.offer),
            idle_timeout_ms: u64::try_from(self.limits.idle_timeout.as_millis())
                .unwrap_or(u64::MAX),
            max_ciphertexts_per_request: u32::try_from(self.limits.max_ciphertexts_per_request)
                .unwrap_or(u32::MAX),
            max_message_bytes: self.limits.max_message_bytes as u64,
        })
    }

    /// Every check of a layer-group request that needs no arithmetic.
    fn admit(
        &self,
        who: Principal,
        req: &GroupRequest,
        bound: &mut Option<SessionId>,
    ) -> std::result::Result<Arc<Session>, Status> {
        let id = validate_group_request(req, &self.limits.request_limits())
            .map_err(|e| from_proto(&e))?;
        match bound {
            Some(b) if *b != id => {
                return Err(status(
                    Code::InvalidArgument,
                    ErrorReason::ProtocolViolation,
                    "one stream carries one session",
                ));
            }
            _ => *bound = Some(id),
        }
        let session = self
            .sessions
            .get(&id)
            .filter(|s| s.owner == who)
            .ok_or_else(unknown_session)?;
        if req.plan_id != session.plan_id {
            return Err(status(
                Code::FailedPrecondition,
                ErrorReason::PlanMismatch,
                "the request's plan id is not the session's plan: reopen the session",
            ));
        }
        let n = session.count_request();
        if n > self.limits.max_requests_per_session {
            return Err(status(
                Code::ResourceExhausted,
                ErrorReason::LimitExceeded,
                format!(
                    "session made {} requests, the server's limit",
                    self.limits.max_requests_per_session
                ),
            ));
        }
        let shape = session
            .compute
            .group_shape(req.layer, req.group)
            .map_err(|e| from_backend(&e))?;
        if req.masked.is_some() && !shape.masked {
            return Err(status(
                Code::InvalidArgument,
                ErrorReason::ProtocolViolation,
                "masked rows sent to a CKKS session",
            ));
        }
        let evaluations = match &req.masked {
            Some(rows) => rows.batches.len() as u64,
            None if shape.input_ciphertexts != req.ciphertexts.len() => {
                return Err(from_backend(&BackendError::CiphertextCount {
                    expected: shape.input_ciphertexts,
                    got: req.ciphertexts.len(),
                }));
            }
            None => u64::from(shape.positions),
        };
        self.budget
            .charge(who, &session.adapter_id, evaluations)
            .map_err(|e| {
                status(
                    Code::ResourceExhausted,
                    ErrorReason::LimitExceeded,
                    format!(
                        "extraction budget: {} delta evaluations in the window, limit {}",
                        e.would_be, e.limit
                    ),
                )
            })?;
        self.metrics.evaluations(&session.adapter_id, evaluations);
        self.sessions.touch(&session);
        Ok(session)
    }
}

type Tx = mpsc::Sender<std::result::Result<GroupResponse, Status>>;

/// Reads one `Rounds` stream, computing several requests at once; a refusal ends the stream.
async fn run_stream(
    state: Arc<State>,
    who: Principal,
    mut inbound: Streaming<GroupRequest>,
    tx: Tx,
) {
    let depth = state.limits.max_in_flight_per_stream;
    let permits = Arc::new(Semaphore::new(depth));
    let mut bound: Option<SessionId> = None;
    // The session this stream carries, attached until the stream ends.
    let mut attached: Option<Arc<Session>> = None;
    let mut shutdown = state.shutdown.clone();
    loop {
        let msg = tokio::select! {
            m = inbound.message() => Some(m),
            _ = tx.closed() => break,
            _ = async { let _ = shutdown.wait_for(|v| *v).await; } => None,
        };
        let Some(msg) = msg else {
            // Shutting down: let in-flight requests finish, then say why the stream ends.
            let _ = permits
                .acquire_many(u32::try_from(depth).unwrap_or(u32::MAX))
                .await;
            let _ = tx
                .send(Err(status(
                    Code::Unavailable,
                    ErrorReason::ShuttingDown,
                    "server shutting down",
                )))
                .await;
            break;
        };
        let req = match msg {
            Ok(Some(req)) => req,
            Ok(None) => break,
            Err(s) => {
                // Decoding failed or the client went away: forward the status.
                tracing::debug!(code = ?s.code(), "rounds stream ended by transport: {}", s.message());
                state.metrics.request("rounds", s.code());
                let s = if s.code() == Code::OutOfRange {
                    // tonic's decoder refused a message over the size limit.
                    status(Code::OutOfRange, ErrorReason::LimitExceeded, s.message())
                } else {
                    s
                };
                let _ = tx.send(Err(s)).await;
                break;
            }
        };
        let session = match state.admit(who, &req, &mut bound) {
            Ok(s) => s,
            Err(s) => {
                tracing::info!(
                    session = ?bound.map(|b| b.tag()),
                    layer = req.layer,
                    group = req.group,
                    round = req.round,
                    code = ?s.code(),
                    "refused group request: {}",
                    s.message()
                );
                state.metrics.refused("rounds", &s);
                let _ = tx.send(Err(s)).await;
                break;
            }
        };
        if attached.is_none() {
            state.sessions.attach(&session);
            state.metrics.streaming(true);
            attached = Some(session.clone());
        }
        let Ok(permit) = permits.clone().acquire_owned().await else {
            break;
        };
        let state = state.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let resp = compute_group(&state, session, req).await;
            state.metrics.outcome("rounds", &resp);
            let _ = tx.send(resp).await;
            drop(permit);
        });
    }
    if let Some(s) = attached {
        state.sessions.detach(&s);
        state.metrics.streaming(false);
    }
}

async fn compute_group(
    state: &State,
    session: Arc<Session>,
    req: GroupRequest,
) -> std::result::Result<GroupResponse, Status> {
    let in_bytes = req.ciphertexts.iter().map(Bytes::len).sum::<usize>()
        + req.masked.as_ref().map_or(0, |m| m.values.len());
    let masked = req.masked.is_some();
    state.metrics.received("rounds", in_bytes as u64);
    let (layer, group, round) = (req.layer, req.group, req.round);
    let tag = session.id.tag();
    // A turn in the server-wide compute pool before a blocking thread.
    let queued = Instant::now();
    let turn = state
        .compute
        .clone()
        .acquire_owned()
        .await
        .map_err(|e| internal(&e))?;
    state.metrics.queue_wait(queued.elapsed());
    let (out, took) = tokio::task::spawn_blocking(move || {
        let _turn = turn;
        let t0 = Instant::now();
        let out = session.compute.compute(&req);
        (out, t0.elapsed())
    })
    .await
    .map_err(|e| internal(&e))?;
    let out = out.map_err(|e| {
        tracing::info!(session = %tag, layer, group, round, error = %e, "group request refused by backend");
        from_backend(&e)
    })?;
    state.metrics.compute_time(group, took);
    let out_bytes: usize = out.iter().map(Bytes::len).sum();
    state.metrics.sent("rounds", out_bytes as u64);
    tracing::debug!(
        session = %tag, layer, group, round, in_bytes, out_bytes,
        server_us = took.as_micros() as u64,
        "computed group"
    );
    let (ciphertexts, masked_values) = if masked {
        (Vec::new(), out.into_iter().next().unwrap_or_default())
    } else {
        (out, Bytes::new())
    };
    Ok(GroupResponse {
        masked_values,
        round,
        layer,
        group,
        ciphertexts,
        server_micros: u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
    })
}

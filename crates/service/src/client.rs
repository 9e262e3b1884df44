//! Adapter-service client: sessions, layer-group requests and their delta ciphertexts, blocking
//! ([`AdapterClient`]) or async ([`AsyncAdapterClient`]); transient failures replay the round.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cipherlora_proto::v1::adapter_service_client::AdapterServiceClient;
use cipherlora_proto::v1::{self, GroupRequest, GroupResponse};
use cipherlora_proto::{ErrorReason, SessionId, offer_id};
use prost::Message;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::auth::BearerToken;
use crate::backend::AdapterInfo;
use crate::error::{Result, ServerFault, ServiceError};
use crate::in_flight::InFlight;
use crate::link::{LinkDirection, LinkProfile};
use crate::server::{CONNECTION_WINDOW, STREAM_WINDOW};
use crate::tls::ClientTls;

/// How to reach an adapter server.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// `https://host:port` with TLS, `http://host:port` without.
    pub endpoint: String,
    /// CA and server name to check; `None` for plaintext.
    pub tls: Option<ClientTls>,
    /// Bearer token, if the server requires one.
    pub token: Option<String>,
    /// Simulated link (delays added inside this client).
    pub link: LinkProfile,
    /// Largest message sent or accepted, bytes.
    pub max_message_bytes: usize,
    /// TCP + TLS + HTTP/2 connect timeout.
    pub connect_timeout: Duration,
    /// Longest wait for the next answer while one is awaited.
    pub round_timeout: Duration,
    /// Replays of a round after transient failures, at least (until `retry_for` has passed).
    pub max_retries: u32,
    /// How long a round keeps being retried after its first transient failure.
    pub retry_for: Duration,
    /// Wait before retry `i` is `retry_backoff · 2^(i−1)`, at most [`MAX_BACKOFF`].
    pub retry_backoff: Duration,
    /// How long opening a session keeps retrying a refusal that clears by itself
    /// ([`ServiceError::is_capacity`]), with jittered exponential backoff up to
    /// [`MAX_OPEN_BACKOFF`]; after it, the refusal is returned.
    pub open_wait: Duration,
}

/// Longest wait between two attempts to open a session at a server at capacity.
pub const MAX_OPEN_BACKOFF: Duration = Duration::from_secs(4);

/// Longest wait between two retries of a round.
pub const MAX_BACKOFF: Duration = Duration::from_secs(2);

impl ClientConfig {
    /// Defaults: no TLS or token, loopback link, 128 MiB messages, timeouts 10 s / 120 s, 30 s
    /// retries, 60 s of retried openings at capacity.
    pub fn new(endpoint: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            tls: None,
            token: None,
            link: LinkProfile::LOOPBACK,
            max_message_bytes: 128 << 20,
            connect_timeout: Duration::from_secs(10),
            round_timeout: Duration::from_secs(120),
            max_retries: 3,
            retry_for: Duration::from_secs(30),
            retry_backoff: Duration::from_millis(100),
            open_wait: Duration::from_secs(60),
        }
    }
}

/// What the client uploads to open (and, after a loss, reopen) a session.
#[derive(Clone, PartialEq)]
pub struct SessionParams {
    /// Adapter to use.
    pub adapter_id: String,
    /// CKKS preset of the keys.
    pub ckks_preset: String,
    /// Serialised (seeded) public key.
    pub public_key: Bytes,
    /// Serialised (seeded) Galois keys the plan needs.
    pub galois_keys: Bytes,
    /// The plan request.
    pub plan_request: v1::PlanRequest,
}

impl std::fmt::Debug for SessionParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionParams")
            .field("adapter_id", &self.adapter_id)
            .field("ckks_preset", &self.ckks_preset)
            .field("public_key_bytes", &self.public_key.len())
            .field("galois_keys_bytes", &self.galois_keys.len())
            .field("plan_request", &self.plan_request)
            .finish()
    }
}

/// The server's answer to an open-session call.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionInfo {
    /// The plans the server runs.
    pub offer: v1::SessionOffer,
    /// [`offer_id`] of `offer`, carried by every group request.
    pub plan_id: u64,
    /// Idle time after which the server drops the session.
    pub idle_timeout: Duration,
    /// Most ciphertexts per request.
    pub max_ciphertexts_per_request: u32,
    /// Largest message the server accepts, bytes.
    pub max_message_bytes: u64,
}

/// Counters of the client's recovery work.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Connections made (the first included).
    pub connects: u64,
    /// Sessions opened (reopens included).
    pub sessions_opened: u64,
    /// Rounds replayed after a transient failure.
    pub replays: u64,
    /// Session openings retried after a refusal at capacity.
    pub open_retries: u64,
    /// Server compute time reported in the received responses, µs.
    pub server_micros: u64,
}

type Rpc = AdapterServiceClient<InterceptedService<Channel, BearerToken>>;

/// A live `Rounds` stream with its link-shaping tasks.
struct RoundStream {
    tx: mpsc::Sender<GroupRequest>,
    rx: mpsc::Receiver<std::result::Result<GroupResponse, Status>>,
    tasks: [JoinHandle<()>; 4],
}

impl Drop for RoundStream {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Session state: `Closed` → `Open` → `Lost` → `Open` (same keys and plan); any → `Closed`.
enum Session {
    /// No session.
    Closed,
    /// Opened with `params`, running `offer`, but gone from the server.
    Lost {
        params: SessionParams,
        offer: v1::SessionOffer,
    },
    /// Open on the server (its plans are `info.offer`), with its `Rounds` stream once one runs.
    Open {
        params: SessionParams,
        id: SessionId,
        info: SessionInfo,
        stream: Option<RoundStream>,
    },
}

impl Session {
    /// Drops the `Rounds` stream (it failed or the connection is suspect).
    fn drop_stream(&mut self) {
        if let Session::Open { stream, .. } = self {
            *stream = None;
        }
    }

    /// The server lost an open session: keep what reopening it needs.
    fn lose(&mut self) {
        if let Session::Open { .. } = self
            && let Session::Open { params, info, .. } = std::mem::replace(self, Session::Closed)
        {
            *self = Session::Lost {
                params,
                offer: info.offer,
            };
        }
    }
}

/// The async client. Not `Clone`: one session, one stream.
pub struct AsyncAdapterClient {
    config: ClientConfig,
    bearer: BearerToken,
    up: Arc<LinkDirection>,
    down: Arc<LinkDirection>,
    rpc: Option<Rpc>,
    session: Session,
    /// Group requests sent and not yet answered, answers not yet taken.
    in_flight: InFlight,
    stats: ClientStats,
}

impl AsyncAdapterClient {
    /// Checks the configuration and connects. Errors: [`ServiceError::Config`],
    /// [`ServiceError::Transport`].
    pub async fn connect(config: ClientConfig) -> Result<Self> {
        let bearer = BearerToken::new(config.token.as_deref())?;
        let mut c = Self {
            up: Arc::new(LinkDirection::new(config.link.upload())),
            down: Arc::new(LinkDirection::new(config.link.download())),
            config,
            bearer,
            rpc: None,
            session: Session::Closed,
            in_flight: InFlight::default(),
            stats: ClientStats::default(),
        };
        c.rpc().await?;
        Ok(c)
    }

    async fn rpc(&mut self) -> Result<Rpc> {
        if let Some(r) = &self.rpc {
            return Ok(r.clone());
        }
        let cfg = &self.config;
        let channel = connect_channel(cfg).await?;
        self.stats.connects += 1;
        let rpc = AdapterServiceClient::with_interceptor(channel, self.bearer.clone())
            .max_decoding_message_size(cfg.max_message_bytes)
            .max_encoding_message_size(cfg.max_message_bytes);
        self.rpc = Some(rpc.clone());
        Ok(rpc)
    }

    /// Counters of reconnects, reopens and replays.
    pub fn stats(&self) -> ClientStats {
        self.stats
    }

    /// The open session's id, if any.
    pub fn session_id(&self) -> Option<SessionId> {
        match &self.session {
            Session::Open { id, .. } => Some(*id),
            _ => None,
        }
    }

    /// The open session's plan and limits, if any.
    pub fn session_info(&self) -> Option<&SessionInfo> {
        match &self.session {
            Session::Open { info, .. } => Some(info),
            _ => None,
        }
    }

    /// Every adapter the server serves. Errors: [`ServiceError::Rpc`], [`ServiceError::Transport`].
    pub async fn list_adapters(&mut self) -> Result<Vec<AdapterInfo>> {
        self.list(String::new()).await
    }

    /// The description of `adapter_id` alone (`None`: the server does not serve it); a server
    /// that lists every adapter whatever it is asked is filtered here. Errors: as
    /// [`Self::list_adapters`].
    pub async fn describe_adapter(&mut self, adapter_id: &str) -> Result<Option<AdapterInfo>> {
        let listed = self.list(adapter_id.to_string()).await?;
        Ok(listed.into_iter().find(|a| a.adapter_id == adapter_id))
    }

    async fn list(&mut self, adapter_id: String) -> Result<Vec<AdapterInfo>> {
        let mut rpc = self.rpc().await?;
        let req = v1::ListAdaptersRequest { adapter_id };
        self.up.transit(req.encoded_len()).await;
        let resp = rpc.list_adapters(req).await?.into_inner();
        self.down.transit(resp.encoded_len()).await;
        Ok(resp.adapters.into_iter().map(Into::into).collect())
    }

    /// Opens a session (uploading the keys; closing a previous one), kept to reopen after a loss.
    /// Errors: [`ServiceError::Rpc`], [`ServiceError::Transport`], [`ServiceError::Protocol`].
    pub async fn open_session(&mut self, params: SessionParams) -> Result<SessionInfo> {
        if matches!(self.session, Session::Open { .. }) {
            let _ = self.close().await;
        }
        self.session = Session::Closed;
        self.in_flight.clear();
        // A refused opening leaves no session to replay into.
        let (id, info) = self.send_open(&params).await?;
        self.session = Session::Open {
            params,
            id,
            info: info.clone(),
            stream: None,
        };
        Ok(info)
    }

    /// Reopens a lost session with the same keys ([`ServiceError::PlanChanged`] for another plan).
    async fn reopen(&mut self) -> Result<()> {
        let Session::Lost { params, offer } = &self.session else {
            return Err(ServiceError::NoSession);
        };
        let (params, offer) = (params.clone(), offer.clone());
        let (id, info) = self.send_open(&params).await?;
        if info.offer != offer {
            // Leave the new session to the server's timeout.
            if let Ok(mut rpc) = self.rpc().await {
                let _ = rpc
                    .close_session(v1::CloseSessionRequest {
                        session_id: id.to_bytes(),
                    })
                    .await;
            }
            return Err(ServiceError::PlanChanged);
        }
        self.session = Session::Open {
            params,
            id,
            info,
            stream: None,
        };
        Ok(())
    }

    /// Sends `OpenSession` with `params`; a refusal at capacity is retried for
    /// [`ClientConfig::open_wait`] with jittered exponential backoff ("equal jitter": AWS
    /// Architecture Blog, "Exponential Backoff and Jitter", 2015), so a burst of clients does not
    /// retry in step.
    async fn send_open(&mut self, p: &SessionParams) -> Result<(SessionId, SessionInfo)> {
        let started = std::time::Instant::now();
        let mut attempt = 0u32;
        loop {
            let e = match self.send_open_once(p).await {
                Err(e) if e.is_capacity() => e,
                done => return done,
            };
            let left = self.config.open_wait.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Err(e);
            }
            attempt += 1;
            self.stats.open_retries += 1;
            if e.reason() == Some(ErrorReason::ShuttingDown) {
                // Behind a balancer a fresh connection may reach another replica.
                self.rpc = None;
            }
            let cap = self
                .config
                .retry_backoff
                .saturating_mul(1u32 << attempt.min(16))
                .min(MAX_OPEN_BACKOFF);
            let wait = jitter(cap).min(left);
            tracing::info!(attempt, ?wait, error = %e, "session refused at capacity, retrying");
            tokio::time::sleep(wait).await;
        }
    }

    /// One `OpenSession` call with `params`.
    async fn send_open_once(&mut self, p: &SessionParams) -> Result<(SessionId, SessionInfo)> {
        let mut rpc = self.rpc().await?;
        let req = v1::OpenSessionRequest {
            adapter_id: p.adapter_id.clone(),
            ckks_preset: p.ckks_preset.clone(),
            public_key: p.public_key.clone(),
            galois_keys: p.galois_keys.clone(),
            plan_request: Some(p.plan_request),
        };
        self.up.transit(req.encoded_len()).await;
        let resp = rpc.open_session(req).await?.into_inner();
        self.down.transit(resp.encoded_len()).await;
        let id = SessionId::from_slice(&resp.session_id)
            .map_err(ServerFault::malformed("open-session answer"))?;
        let offer = resp.offer.unwrap_or_default();
        let info = SessionInfo {
            plan_id: offer_id(&offer),
            offer,
            idle_timeout: Duration::from_millis(resp.idle_timeout_ms),
            max_ciphertexts_per_request: resp.max_ciphertexts_per_request,
            max_message_bytes: resp.max_message_bytes,
        };
        self.stats.sessions_opened += 1;
        tracing::debug!(session = %id.tag(), "session opened");
        Ok((id, info))
    }

    /// Closes the session (idempotent). Errors: [`ServiceError::Rpc`], [`ServiceError::Transport`].
    pub async fn close(&mut self) -> Result<()> {
        self.in_flight.clear();
        let Session::Open { id, .. } = std::mem::replace(&mut self.session, Session::Closed) else {
            return Ok(());
        };
        let mut rpc = self.rpc().await?;
        let req = v1::CloseSessionRequest {
            session_id: id.to_bytes(),
        };
        self.up.transit(req.encoded_len()).await;
        rpc.close_session(req).await?;
        self.down.transit(0).await;
        Ok(())
    }

    /// One layer group's round trip for round `round` at the default response precision: the delta
    /// ciphertexts. Errors as [`AsyncAdapterClient::round_pipelined`].
    pub async fn round(
        &mut self,
        layer: u32,
        group: u32,
        round: u64,
        ciphertexts: Vec<Bytes>,
    ) -> Result<Vec<Bytes>> {
        let request = GroupRequest::for_group(layer, group, ciphertexts, 0);
        let mut out = self.round_pipelined(round, &[request]).await?;
        Ok(out.pop().unwrap_or_default())
    }

    /// Sends several groups' requests of one round pipelined; returns their deltas in `calls`
    /// order. Errors: [`ServiceError::NoSession`]; [`ServiceError::Config`] for a repeated (layer,
    /// group); [`ServiceError::Rpc`]; transient errors once `max_retries` replays failed.
    pub async fn round_pipelined(
        &mut self,
        round: u64,
        calls: &[GroupRequest],
    ) -> Result<Vec<Vec<Bytes>>> {
        let mut seen = HashSet::new();
        if let Some(c) = calls.iter().find(|c| !seen.insert((c.layer, c.group))) {
            return Err(ServiceError::Config {
                reason: format!("(layer {}, group {}) twice in one round", c.layer, c.group),
            });
        }
        for c in calls {
            self.send_call(round, c.clone()).await?;
        }
        let mut out = Vec::with_capacity(calls.len());
        for c in calls {
            out.push(
                self.receive_call(round, c.layer, c.group)
                    .await?
                    .ciphertexts,
            );
        }
        Ok(out)
    }

    /// Sends one group request of `round` without waiting ([`AsyncAdapterClient::receive_call`]);
    /// the client fills its session id, round and plan id. Errors: [`ServiceError::NoSession`];
    /// [`ServiceError::Config`] when already in flight.
    pub async fn send_call(&mut self, round: u64, call: GroupRequest) -> Result<()> {
        if matches!(self.session, Session::Closed) {
            return Err(ServiceError::NoSession);
        }
        self.in_flight.send(round, call.clone())?;
        match &mut self.session {
            Session::Open {
                id,
                info,
                stream: Some(stream),
                ..
            } => {
                let req = group_request(*id, info.plan_id, round, &call);
                if stream.tx.send(req).await.is_err() {
                    // The stream died: the next receive replays every unanswered call on a fresh
                    // stream.
                    self.stats.replays += 1;
                    self.session.drop_stream();
                }
            }
            _ => {
                // Opening the stream resends every unanswered call; failures are left to the next
                // receive.
                if let Err(e) = self.ensure_stream().await {
                    tracing::debug!(error = %e, "stream not restored at send");
                    self.session.drop_stream();
                }
            }
        }
        Ok(())
    }

    /// Waits for (round, layer, group)'s response (delta ciphertexts, server time), replaying on
    /// transient failures. Errors: [`ServiceError::Config`] for a call never sent;
    /// [`ServiceError::Rpc`]; [`ServiceError::Timeout`]; transient errors once retries ran out.
    pub async fn receive_call(
        &mut self,
        round: u64,
        layer: u32,
        group: u32,
    ) -> Result<GroupResponse> {
        let key = (round, layer, group);
        let mut attempt = 0;
        let mut first_failure: Option<std::time::Instant> = None;
        loop {
            if let Some(answer) = self.in_flight.take(key) {
                return Ok(answer);
            }
            if !self.in_flight.is_unanswered(key) {
                return Err(ServiceError::Config {
                    reason: format!("round {round} layer {layer} group {group} was never sent"),
                });
            }
            let after = self.config.round_timeout;
            let e = match tokio::time::timeout(after, self.next_answer()).await {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => e,
                Err(_) => ServiceError::Timeout { after },
            };
            self.session.drop_stream();
            let since = *first_failure.get_or_insert_with(std::time::Instant::now);
            let out_of_time = since.elapsed() >= self.config.retry_for;
            if !e.is_transient() || (attempt >= self.config.max_retries && out_of_time) {
                // A refusal ends the stream for all its requests: none is answered or replayed.
                self.in_flight.clear();
                return Err(e);
            }
            attempt += 1;
            self.stats.replays += 1;
            if e.reason() == Some(ErrorReason::UnknownSession) {
                // The server lost the session (evicted, restarted): reopen.
                self.session.lose();
            } else {
                // The connection is suspect: make a fresh one.
                self.rpc = None;
            }
            tracing::warn!(round, attempt, error = %e, "round failed, replaying");
            let backoff = self
                .config
                .retry_backoff
                .saturating_mul(1u32 << (attempt - 1).min(16))
                .min(MAX_BACKOFF);
            tokio::time::sleep(backoff).await;
        }
    }

    /// Restores the stream if needed and files the next answer it brings.
    async fn next_answer(&mut self) -> Result<()> {
        self.ensure_stream().await?;
        let Session::Open {
            stream: Some(stream),
            ..
        } = &mut self.session
        else {
            return Err(ServiceError::NoSession);
        };
        match stream.rx.recv().await {
            Some(Ok(resp)) => {
                self.stats.server_micros =
                    self.stats.server_micros.saturating_add(resp.server_micros);
                self.in_flight.answer(resp)
            }
            Some(Err(status)) => Err(status.into()),
            None => Err(ServiceError::StreamClosed {
                pending: self.in_flight.pending(),
            }),
        }
    }

    /// Reopens a lost session and stream if needed, then resends every unanswered call in order.
    async fn ensure_stream(&mut self) -> Result<()> {
        if matches!(self.session, Session::Lost { .. }) {
            self.reopen().await?;
        }
        if !matches!(self.session, Session::Open { stream: None, .. }) {
            return Ok(());
        }
        let fresh = self.open_stream().await?;
        let Session::Open {
            id, info, stream, ..
        } = &mut self.session
        else {
            return Err(ServiceError::NoSession);
        };
        for (round, call) in self.in_flight.unanswered() {
            if fresh
                .tx
                .send(group_request(*id, info.plan_id, round, call))
                .await
                .is_err()
            {
                break; // the stream died; its status is read by the receive
            }
        }
        *stream = Some(fresh);
        Ok(())
    }

    /// Opens the `Rounds` stream with link shaping ([`crate::link::deliver_in_order`]).
    async fn open_stream(&mut self) -> Result<RoundStream> {
        let mut rpc = self.rpc().await?;
        let (tx, mut user_rx) = mpsc::channel::<GroupRequest>(256);
        let (booked_tx, booked_rx) = mpsc::channel(256);
        let (wire_tx, wire_rx) = mpsc::channel::<GroupRequest>(256);
        let up = self.up.clone();
        let up_book = tokio::spawn(async move {
            while let Some(r) = user_rx.recv().await {
                let at = (!up.is_loopback()).then(|| up.deliver_at(r.encoded_len()));
                if booked_tx.send((at, r)).await.is_err() {
                    break;
                }
            }
        });
        let up_deliver = tokio::spawn(crate::link::deliver_in_order(booked_rx, wire_tx));
        let mut inbound = match rpc.rounds(ReceiverStream::new(wire_rx)).await {
            Ok(r) => r.into_inner(),
            Err(s) => {
                up_book.abort();
                up_deliver.abort();
                return Err(s.into());
            }
        };
        let (out_tx, rx) = mpsc::channel(256);
        let (down_booked_tx, down_booked_rx) = mpsc::channel(256);
        let down = self.down.clone();
        let down_book = tokio::spawn(async move {
            loop {
                let item = match inbound.message().await {
                    Ok(Some(m)) => {
                        let at = (!down.is_loopback()).then(|| down.deliver_at(m.encoded_len()));
                        (at, Ok(m))
                    }
                    Ok(None) => break,
                    Err(s) => (None, Err(s)),
                };
                let last = item.1.is_err();
                if down_booked_tx.send(item).await.is_err() || last {
                    break;
                }
            }
        });
        let down_deliver = tokio::spawn(crate::link::deliver_in_order(down_booked_rx, out_tx));
        Ok(RoundStream {
            tx,
            rx,
            tasks: [up_book, up_deliver, down_book, down_deliver],
        })
    }
}

/// Blocking client for the model hook on its own one-thread runtime (not from inside a runtime);
/// dropping it closes its session.
pub struct AdapterClient {
    rt: tokio::runtime::Runtime,
    inner: AsyncAdapterClient,
}

/// Longest wait for the session close sent when an [`AdapterClient`] drops.
pub const CLOSE_ON_DROP_TIMEOUT: Duration = Duration::from_secs(2);

impl Drop for AdapterClient {
    fn drop(&mut self) {
        if self.inner.session_id().is_some() {
            let inner = &mut self.inner;
            let _ = self.rt.block_on(async move {
                tokio::time::timeout(CLOSE_ON_DROP_TIMEOUT, inner.close()).await
            });
        }
    }
}

impl AdapterClient {
    /// Builds the runtime and connects. Errors: [`ServiceError::Io`]; as
    /// [`AsyncAdapterClient::connect`].
    pub fn connect(config: ClientConfig) -> Result<Self> {
        // One worker thread keeps the HTTP/2 connection polled while the model runs.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("cipherlora-client")
            .enable_all()
            .build()
            .map_err(|e| ServiceError::io("starting the client runtime", e))?;
        let inner = rt.block_on(AsyncAdapterClient::connect(config))?;
        Ok(Self { rt, inner })
    }

    /// See [`AsyncAdapterClient::list_adapters`]. Errors: as there.
    pub fn list_adapters(&mut self) -> Result<Vec<AdapterInfo>> {
        self.rt.block_on(self.inner.list_adapters())
    }

    /// See [`AsyncAdapterClient::describe_adapter`]. Errors: as there.
    pub fn describe_adapter(&mut self, adapter_id: &str) -> Result<Option<AdapterInfo>> {
        self.rt.block_on(self.inner.describe_adapter(adapter_id))
    }

    /// See [`AsyncAdapterClient::open_session`]. Errors: as there.
    pub fn open_session(&mut self, params: SessionParams) -> Result<SessionInfo> {
        self.rt.block_on(self.inner.open_session(params))
    }

    /// See [`AsyncAdapterClient::round`]. Errors: as there.
    pub fn round(
        &mut self,
        layer: u32,
        group: u32,
        round: u64,
        ciphertexts: Vec<Bytes>,
    ) -> Result<Vec<Bytes>> {
        self.rt
            .block_on(self.inner.round(layer, group, round, ciphertexts))
    }

    /// See [`AsyncAdapterClient::round_pipelined`]. Errors: as there.
    pub fn round_pipelined(
        &mut self,
        round: u64,
        calls: &[GroupRequest],
    ) -> Result<Vec<Vec<Bytes>>> {
        self.rt.block_on(self.inner.round_pipelined(round, calls))
    }

    /// See [`AsyncAdapterClient::send_call`]. Errors: as there.
    pub fn send_call(&mut self, round: u64, call: GroupRequest) -> Result<()> {
        self.rt.block_on(self.inner.send_call(round, call))
    }

    /// See [`AsyncAdapterClient::receive_call`]. Errors: as there.
    pub fn receive_call(&mut self, round: u64, layer: u32, group: u32) -> Result<GroupResponse> {
        self.rt
            .block_on(self.inner.receive_call(round, layer, group))
    }

    /// See [`AsyncAdapterClient::close`]. Errors: as there.
    pub fn close(&mut self) -> Result<()> {
        self.rt.block_on(self.inner.close())
    }

    /// See [`AsyncAdapterClient::stats`].
    pub fn stats(&self) -> ClientStats {
        self.inner.stats()
    }

    /// See [`AsyncAdapterClient::session_id`].
    pub fn session_id(&self) -> Option<SessionId> {
        self.inner.session_id()
    }

    /// The open session's plan and limits, if any.
    pub fn session_info(&self) -> Option<&SessionInfo> {
        self.inner.session_info()
    }
}

/// `call` stamped for `round` of session `id` running plan `plan_id` (the ciphertexts are shared,
/// not copied).
fn group_request(id: SessionId, plan_id: u64, round: u64, call: &GroupRequest) -> GroupRequest {
    GroupRequest {
        session_id: id.to_bytes(),
        round,
        plan_id,
        ..call.clone()
    }
}

/// A channel to `cfg.endpoint` with the service's transport settings and optional TLS.
pub(crate) async fn connect_channel(cfg: &ClientConfig) -> Result<Channel> {
    let mut ep = Endpoint::from_shared(cfg.endpoint.clone())
        .map_err(|e| ServiceError::Config {
            reason: format!("endpoint {:?}: {e}", cfg.endpoint),
        })?
        .connect_timeout(cfg.connect_timeout)
        .tcp_nodelay(true)
        .initial_stream_window_size(Some(STREAM_WINDOW))
        .initial_connection_window_size(Some(CONNECTION_WINDOW))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(20));
    if let Some(tls) = &cfg.tls {
        ep = ep.tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(&tls.ca_pem))
                .domain_name(tls.domain.clone()),
        )?;
    }
    Ok(ep.connect().await?)
}

/// A uniformly random wait in `[cap / 2, cap]` (OS generator; `cap` if it fails).
fn jitter(cap: Duration) -> Duration {
    let mut raw = [0u8; 4];
    match getrandom::fill(&mut raw) {
        Ok(()) => cap.mul_f64(0.5 + 0.5 * f64::from(u32::from_le_bytes(raw)) / f64::from(u32::MAX)),
        Err(_) => cap,
    }
}

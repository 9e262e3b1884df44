//! The `SplitInference` gRPC service (`cipherlora.split.v1`): runs a split client's middle layers
//! on its hidden states, served next to the adapter service with the same TLS, tokens, limits,
//! sessions and shutdown. Every request is checked (token, size, session, budget, activations,
//! tree, `keep`, capacity) before the cache is touched, so a refused call leaves the session as it
//! was.

use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cipherlora_proto::split::v1::split_inference_server::SplitInference;
use cipherlora_proto::split::v1::{self as sv1, ActivationEncoding};
use cipherlora_proto::{ErrorReason, SessionId, activations, tree};
use tokio::sync::Semaphore;
use tonic::{Code, Request, Response, Status};

use crate::auth::Principal;
use crate::limits::Limits;
use crate::metrics::Metrics;
use crate::sessions::{NewSession, Session, SessionTable, insert_error};
use crate::split_backend::{SplitBackend, SplitCompute, SplitModelInfo};
use crate::status::{from_backend, from_proto, internal, status, unknown_session};

/// What a split session holds in the session table.
pub(crate) type SplitHeld = Mutex<Box<dyn SplitCompute>>;

/// The split half of the server's state.
pub(crate) struct SplitState {
    pub(crate) backend: Arc<dyn SplitBackend>,
    pub(crate) info: SplitModelInfo,
    pub(crate) sessions: SessionTable<SplitHeld>,
}

/// The session-table label of split sessions (where adapter sessions keep their adapter id).
const SPLIT_LABEL: &str = "split";

/// The tonic service, served only beside a split model: the server's limits, metrics and compute
/// pool, and the split half of its state.
pub(crate) struct SplitSvc {
    pub(crate) split: Arc<SplitState>,
    pub(crate) limits: Limits,
    pub(crate) metrics: Arc<Metrics>,
    /// The server-wide compute pool.
    pub(crate) compute: Arc<Semaphore>,
}

impl SplitSvc {
    fn session(&self, who: Principal, raw: &[u8]) -> Result<Arc<Session<SplitHeld>>, Status> {
        let id = SessionId::from_slice(raw).map_err(|e| from_proto(&e))?;
        self.split
            .sessions
            .get(&id)
            .filter(|s| s.owner == who)
            .ok_or_else(unknown_session)
    }

    /// Counts a request on `s` against the session budget and refreshes it.
    fn admit(&self, s: &Session<SplitHeld>) -> Result<(), Status> {
        let limit = self.limits.max_requests_per_session;
        if s.count_request() > limit {
            return Err(status(
                Code::ResourceExhausted,
                ErrorReason::LimitExceeded,
                format!("session made {limit} requests, the server's limit"),
            ));
        }
        self.split.sessions.touch(s);
        Ok(())
    }

    fn record<T>(&self, rpc: &'static str, r: &Result<T, Status>) {
        self.metrics
            .request(rpc, r.as_ref().map_or_else(Status::code, |_| Code::Ok));
    }
}

/// The server's layers for a client running `a` layers before and `b` after them, if the split is
/// valid for `num_layers` layers.
fn server_layers(a: u32, b: u32, num_layers: u32) -> Result<Range<u32>, Status> {
    match a.checked_add(b) {
        Some(ab) if a >= 1 && b >= 1 && ab < num_layers => Ok(a..num_layers - b),
        _ => Err(status(
            Code::InvalidArgument,
            ErrorReason::InvalidPlan,
            format!(
                "invalid split: the client runs a ≥ 1 and b ≥ 1 layers with a + b < {num_layers}"
            ),
        )),
    }
}

fn invalid_activations(message: String) -> Status {
    status(
        Code::InvalidArgument,
        ErrorReason::InvalidActivations,
        message,
    )
}

#[tonic::async_trait]
impl SplitInference for SplitSvc {
    async fn describe(
        &self,
        _req: Request<sv1::DescribeRequest>,
    ) -> Result<Response<sv1::DescribeResponse>, Status> {
        let info = &self.split.info;
        let r = Ok(sv1::DescribeResponse {
            model: info.model.clone(),
            num_layers: info.num_layers,
            hidden_size: info.hidden_size,
            max_capacity: info.max_capacity,
        });
        self.record("split_describe", &r);
        r.map(Response::new)
    }

    async fn open_split_session(
        &self,
        req: Request<sv1::OpenSplitSessionRequest>,
    ) -> Result<Response<sv1::OpenSplitSessionResponse>, Status> {
        let who = Principal::of(&req);
        let r = self.open(who, req.into_inner()).await;
        self.record("split_open", &r);
        r.map(Response::new)
    }

    async fn forward(
        &self,
        req: Request<sv1::ForwardRequest>,
    ) -> Result<Response<sv1::ForwardResponse>, Status> {
        let who = Principal::of(&req);
        let r = self.forward(who, req.into_inner()).await;
        self.record("split_forward", &r);
        r.map(Response::new)
    }

    async fn truncate(
        &self,
        req: Request<sv1::TruncateRequest>,
    ) -> Result<Response<sv1::TruncateResponse>, Status> {
        let who = Principal::of(&req);
        let r = self.truncate(who, req.into_inner()).await;
        self.record("split_truncate", &r);
        r.map(Response::new)
    }

    async fn close_split_session(
        &self,
        req: Request<sv1::CloseSplitSessionRequest>,
    ) -> Result<Response<sv1::CloseSplitSessionResponse>, Status> {
        let who = Principal::of(&req);
        let r = self.session(who, &req.get_ref().session_id).and_then(|s| {
            if self.split.sessions.remove(&s.id) {
                self.metrics.session("closed");
                tracing::info!(session = %s.id.tag(), "closed split session");
                Ok(sv1::CloseSplitSessionResponse {})
            } else {
                Err(unknown_session())
            }
        });
        self.record("split_close", &r);
        r.map(Response::new)
    }
}

impl SplitSvc {
    async fn open(
        &self,
        who: Principal,
        req: sv1::OpenSplitSessionRequest,
    ) -> Result<sv1::OpenSplitSessionResponse, Status> {
        let split = &self.split;
        let layers = server_layers(
            req.client_head_layers,
            req.client_tail_layers,
            split.info.num_layers,
        )?;
        if req.capacity == 0 {
            return Err(status(
                Code::InvalidArgument,
                ErrorReason::InvalidPlan,
                "capacity must be at least one position",
            ));
        }
        if req.capacity > split.info.max_capacity {
            return Err(status(
                Code::ResourceExhausted,
                ErrorReason::LimitExceeded,
                format!(
                    "capacity {} positions, limit is {}",
                    req.capacity, split.info.max_capacity
                ),
            ));
        }
        let bytes = split.backend.session_bytes(layers.clone(), req.capacity);
        let limits = &self.limits;
        if bytes > limits.max_key_bytes_per_session {
            return Err(status(
                Code::ResourceExhausted,
                ErrorReason::LimitExceeded,
                format!(
                    "{bytes} bytes of KV cache, limit is {}",
                    limits.max_key_bytes_per_session
                ),
            ));
        }
        split
            .sessions
            .check_room(who, bytes, Some(false))
            .map_err(insert_error)?;
        let backend = split.backend.clone();
        let (lo, hi, capacity) = (layers.start, layers.end, req.capacity);
        let compute = tokio::task::spawn_blocking(move || backend.open(lo..hi, capacity))
            .await
            .map_err(|e| internal(&e))?
            .map_err(|e| from_backend(&e))?;
        let id = split
            .sessions
            .insert(NewSession {
                adapter_id: SPLIT_LABEL.into(),
                owner: who,
                compute: Box::new(Mutex::new(compute)),
                plan_id: 0,
                key_bytes: bytes,
                offer_only: false,
            })
            .map_err(insert_error)?;
        self.metrics.session("opened");
        tracing::info!(session = %id.tag(), lo, hi, capacity, bytes, "opened split session");
        Ok(sv1::OpenSplitSessionResponse {
            session_id: id.to_bytes(),
            first_layer: lo,
            end_layer: hi,
            hidden_size: split.info.hidden_size,
            idle_timeout_ms: u64::try_from(limits.idle_timeout.as_millis()).unwrap_or(u64::MAX),
            max_message_bytes: limits.max_message_bytes as u64,
            tree_passes: true,
        })
    }

    async fn truncate(
        &self,
        who: Principal,
        req: sv1::TruncateRequest,
    ) -> Result<sv1::TruncateResponse, Status> {
        let session = self.session(who, &req.session_id)?;
        self.admit(&session)?;
        let length = usize::try_from(req.length).unwrap_or(usize::MAX);
        // The lock waits for a Forward in flight: off the reactor.
        let len = tokio::task::spawn_blocking(move || {
            let mut c = session.compute.lock().unwrap_or_else(|p| p.into_inner());
            c.truncate(length);
            c.len()
        })
        .await
        .map_err(|e| internal(&e))?;
        Ok(sv1::TruncateResponse { length: len as u64 })
    }

    async fn forward(
        &self,
        who: Principal,
        req: sv1::ForwardRequest,
    ) -> Result<sv1::ForwardResponse, Status> {
        let session = self.session(who, &req.session_id)?;
        self.admit(&session)?;
        let width = self.split.info.hidden_size as usize;
        let positions = req.positions as usize;
        self.metrics
            .received("split_forward", req.hidden.len() as u64);
        let hidden = activations::decode(req.encoding, &req.hidden, positions, width)
            .map_err(|e| from_proto(&e))?;
        let parents = tree::decode_parents(&req.tree_parents, positions)
            .map_err(|e| from_proto(&e))?
            .unwrap_or_default();
        let parents_empty = parents.is_empty();
        let start = usize::try_from(req.start).unwrap_or(usize::MAX);
        let keep_raw = req.keep;
        let turn = self
            .compute
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| internal(&e))?;
        let tag = session.id.tag();
        let (out, took, length) = tokio::task::spawn_blocking(move || {
            let _turn = turn;
            let mut c = session.compute.lock().unwrap_or_else(|p| p.into_inner());
            if start > c.len() {
                return Err(invalid_activations(format!(
                    "start position {start} beyond the {} cached positions",
                    c.len()
                )));
            }
            let keep = tree::check_keep(&keep_raw, c.len() - start).map_err(|e| from_proto(&e))?;
            let base = start + keep.len();
            if base.saturating_add(positions) > c.capacity() {
                return Err(status(
                    Code::ResourceExhausted,
                    ErrorReason::LimitExceeded,
                    format!(
                        "{base} + {positions} positions exceed the session's capacity {}",
                        c.capacity()
                    ),
                ));
            }
            c.compact(start, &keep).map_err(|e| from_backend(&e))?;
            let t0 = Instant::now();
            let out = c
                .forward(hidden, positions, &parents)
                .map_err(|e| from_backend(&e))?;
            Ok((out, t0.elapsed(), c.len()))
        })
        .await
        .map_err(|e| internal(&e))??;
        let hidden = activations::encode_f32(&out);
        self.metrics.sent("split_forward", hidden.len() as u64);
        tracing::debug!(session = %tag, start, positions, tree = !parents_empty, server_us = took.as_micros() as u64, "split forward");
        Ok(sv1::ForwardResponse {
            length: length as u64,
            encoding: ActivationEncoding::F32Le as i32,
            hidden,
            server_micros: u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
        })
    }
}

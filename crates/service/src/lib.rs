//! The cipherlora adapter service: a two-party gRPC protocol between a client
//! that holds the CKKS secret key and an untrusted server that holds a LoRA
//! adapter and computes deltas on ciphertexts only (see
//! `shared/threat-model.md`).
//!
//! - [`server`]: `cipherlora serve` as a library ([`server::serve`]): TLS
//!   (rustls/ring), bearer tokens ([`auth`]), explicit [`limits`], sessions
//!   with idle eviction, per-request validation before any arithmetic, typed
//!   statuses ([`status`]), tracing logs without key or ciphertext bytes,
//!   Prometheus [`metrics`], graceful shutdown.
//! - [`client`]: the transport under the model hook, with idempotent round
//!   replay after a dropped connection and a [`link`] simulator.
//! - [`backend`]: the trait the HE code implements; [`testing`] holds a
//!   plaintext stand-in with exact answers.
//! - [`split_server`], [`split_backend`], [`split_client`]: split inference
//!   (issue 17) over the same stack: the server runs the middle decoder
//!   layers on a client's plaintext hidden states.
//! - [`tls`]: certificate loading and a development PKI ([`tls::dev_cert`]).
//!
//! Wire protocol: `cipherlora-proto` (`cipherlora.adapter.v1`).

pub mod auth;
pub mod backend;
mod budget;
pub mod client;
mod convert;
pub mod error;
mod group_call;
mod in_flight;
pub mod limits;
pub mod link;
pub mod metrics;
pub mod server;
pub mod server_thread;
mod sessions;
pub mod split_backend;
pub mod split_client;
pub mod split_server;
pub mod status;
pub mod testing;
pub mod tls;

pub use backend::{
    AdapterBackend, AdapterInfo, BackendError, CiphertextFault, GroupRequestShape,
    OpenSessionPayload, OpenedSession, SessionCompute,
};
pub use cipherlora_proto::plan_id;
pub use client::{
    AdapterClient, AsyncAdapterClient, ClientConfig, GroupCall, SessionInfo, SessionParams,
};
pub use error::{Result, ServiceError};
pub use limits::Limits;
pub use link::LinkProfile;
pub use server::{AdapterServer, ServeConfig, serve};
pub use server_thread::{Placement, ServerThread, ThreadHook};
pub use split_backend::{SplitBackend, SplitCompute, SplitModelInfo};
pub use split_client::{SplitClient, SplitClientStats, SplitSessionInfo};
pub use tls::{ClientTls, DevCert, TlsConfig, dev_cert, write_dev_cert};

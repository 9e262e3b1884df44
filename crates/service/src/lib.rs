//! The cipherlora gRPC services: the adapter service (a client holding the CKKS secret key, an
//! untrusted server computing LoRA deltas on ciphertexts) and split inference, with TLS, bearer
//! tokens, limits, sessions, metrics and the link simulator. Start at [`server::serve`] and
//! [`client::AdapterClient`]; the HE side plugs in through [`backend::AdapterBackend`]. Wire
//! protocol: `cipherlora-proto`; security model: docs/security.md.

pub mod auth;
pub mod backend;
mod budget;
pub mod client;
mod convert;
pub mod error;
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
    OpenSessionPayload, OpenedSession, ParameterFault, SessionCompute,
};
pub use cipherlora_proto::plan_id;
pub use client::{AdapterClient, AsyncAdapterClient, ClientConfig, SessionInfo, SessionParams};
pub use error::{Result, ServerFault, ServiceError, TransportError};
pub use limits::Limits;
pub use link::LinkProfile;
pub use server::{AdapterServer, ServeConfig, serve};
pub use server_thread::{Placement, ServerThread, ThreadHook};
pub use split_backend::{SplitBackend, SplitCompute, SplitModelInfo};
pub use split_client::{SplitClient, SplitClientStats, SplitSessionInfo};
pub use tls::{ClientTls, DevCert, TlsConfig, dev_cert, write_dev_cert};

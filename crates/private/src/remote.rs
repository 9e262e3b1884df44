//! Private generation over the network: [`HeBackend`] serves an [`HeAdapter`](crate::HeAdapter)
//! through the gRPC adapter service, within a [`SessionMemory`] budget; [`EmbeddedServer`] runs one
//! on loopback in-process; [`connect_remote`] gives the client a ready [`HeHook`](crate::HeHook)
//! over a [`GrpcTransport`]. Sessions open in two steps (an offer-only `OpenSession`, then one with
//! the Galois keys for exactly the offer's steps); FFA lora_A travels once in `AdapterInfo`
//! ([`crate::protocol::attach_public_a`]). See docs/design/code-notes.md, "private: remote".

mod connect;
mod grpc_transport;
mod he_backend;
mod loopback;
mod masked_compute;
mod masked_connect;

pub use crate::server::SessionMemory;
pub use connect::{GrpcOpener, connect};
pub use grpc_transport::{GrpcTransport, RemoteOffer, connect_remote, connect_widths, fetch_offer};
pub use he_backend::{COST_REPS, HeBackend};
pub use loopback::EmbeddedServer;
pub use masked_connect::open_masked;

//! Private generation over the network: the HE adapter server behind the
//! gRPC adapter service (`cipherlora-service`), and the client's transport
//! to it.
//!
//! - [`HeBackend`] (server): an [`HeAdapter`](crate::HeAdapter) as a
//!   [`cipherlora_service::AdapterBackend`]. Its `AdapterInfo` carries the
//!   PEFT description, the CKKS preset name and, for FFA adapters, the public
//!   lora_A ([`encode_public_a`]).
//! - [`SessionMemory`] (re-exported): the bytes of pre-encoded diagonals the server may
//!   hold (once per offer, shared by its sessions); a session whose offer
//!   is not encoded yet and would exceed it is refused
//!   (`RESOURCE_EXHAUSTED`) before anything is encoded.
//! - [`EmbeddedServer`]: an [`HeBackend`] served on loopback with TLS and a
//!   token, in the client's own process (demo, benchmarks).
//! - [`connect_remote`] (client): a ready [`HeHook`](crate::HeHook) over a
//!   [`GrpcTransport`].
//!
//! Opening a session takes two `OpenSession` calls, because the service
//! wants the Galois keys in the same call that returns the plan, while the
//! client can only make the keys once it knows the plans' rotation steps:
//! 1. offer only ([`PlanRequest::offer_only`]): no keys; the server answers
//!    the [`SessionOffer`](crate::SessionOffer) for T ([`encode_offer`]);
//! 2. with the Galois keys for exactly those steps: the server answers the
//!    same offer (it is deterministic in T) and keeps the keys; the client
//!    checks the two offers are byte-identical.
//!
//! An FFA adapter's public lora_A is in `AdapterInfo.ffa_lora_a` only, not
//! in the offers: the client attaches it to each decoded offer
//! ([`attach_public_a`]), so it crosses the link once per `ListAdapters`
//! instead of once per offer as well.
//!
//! The offer-only session computes nothing and is closed by step 2. No new
//! RPC is needed, and nothing the client decrypts is ever sent (threat
//! model, guarantee 2).

mod grpc_transport;
mod he_backend;
mod loopback;
mod wire;

pub use crate::server::SessionMemory;
pub use grpc_transport::{
    GrpcTransport, RemoteOffer, connect_chosen_width, connect_remote, connect_widths, fetch_offer,
};
pub use he_backend::HeBackend;
pub use loopback::EmbeddedServer;
pub use wire::{
    MAX_GROUPS, MAX_T, PlanRequest, PublicA, attach_public_a, decode_offer, decode_public_a,
    encode_offer, encode_public_a, preset_from_name, preset_name,
};

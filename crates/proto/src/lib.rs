//! The cipherlora wire protocols: protobuf messages, tonic stubs and the checks both sides share.
//! `adapter.proto` (`cipherlora.adapter.v1`) carries opaque HE payloads, checked here only as
//! envelopes ([`validate`]); masked ring values travel bit-packed ([`ring_values`]);
//! `split.proto` ([`split::v1`]) carries plaintext hidden states ([`activations`]) and lookahead
//! trees ([`tree`]). Compiled at build time with protox; `bytes`
//! fields are [`bytes::Bytes`].

pub mod activations;
pub mod codec;
pub mod error;
mod group;
pub mod plan_id;
pub mod reason;
pub mod ring_values;
pub mod session_id;
pub mod tree;
pub mod validate;

pub use error::ProtoError;
pub use plan_id::{offer_id, plan_id};
pub use reason::{ERROR_REASON_KEY, ErrorReason};
pub use session_id::SessionId;
pub use validate::{RequestLimits, decode_group_request, validate_group_request};

/// Generated protobuf messages and gRPC stubs of `cipherlora.adapter.v1`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("cipherlora.adapter.v1");
}

/// Generated protobuf messages and gRPC stubs of `cipherlora.split.v1`.
pub mod split {
    /// Version 1 of the split inference protocol.
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod v1 {
        tonic::include_proto!("cipherlora.split.v1");
    }
}

/// gRPC metadata key of the bearer token: `authorization: Bearer <token>`.
pub const AUTHORIZATION_KEY: &str = "authorization";

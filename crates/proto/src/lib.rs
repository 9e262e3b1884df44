//! The cipherlora adapter protocol: protobuf messages, tonic client/server
//! stubs and the wire-level checks both sides share.
//!
//! `proto/cipherlora/adapter/v1/adapter.proto` is compiled at build time by
//! [`protox`](https://docs.rs/protox) (pure Rust, no `protoc`) and
//! `tonic-prost-build`; every `bytes` field is a [`bytes::Bytes`], so
//! ciphertexts are sliced out of the received frame without copying.
//!
//! HE payloads (keys, ciphertexts, plans) are opaque here: their format and
//! validation belong to the HE crates. This crate checks only the envelope:
//! session-id length, ciphertext counts and sizes ([`validate`]).
//!
//! `proto/cipherlora/split/v1/split.proto` ([`split::v1`]) is the split
//! inference protocol (issue 17): plaintext hidden states of the middle
//! layers, checked by [`activations`], with the tree attention mask and
//! the compaction list of lookahead passes checked by [`tree`].

pub mod activations;
pub mod codec;
pub mod error;
pub mod plan_id;
pub mod reason;
pub mod session_id;
pub mod tree;
pub mod validate;

pub use error::ProtoError;
pub use plan_id::plan_id;
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

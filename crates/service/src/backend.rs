//! The seam between the transport and the HE code.
//!
//! The service never looks inside keys, ciphertexts or plans: an
//! [`AdapterBackend`] (one per served adapter) parses and validates them and
//! does the arithmetic. The real backend wraps `cipherlora-helora`'s server
//! half; [`crate::testing::TestBackend`] is a plaintext stand-in with the same
//! error behaviour.
//!
//! Contract for implementations:
//! - `open_session` and `compute` validate every byte they are given (headers,
//!   lengths, parameters, coefficients below their moduli) *before* any
//!   arithmetic, and report bad input as a [`BackendError`], never a panic.
//! - `compute` is deterministic in its inputs or, with circuit-privacy
//!   rerandomisation, decrypts to the same deltas: a replayed round must give
//!   the client the same result.
//! - Neither keys nor ciphertext bytes go into errors or logs.

use bytes::Bytes;
use std::collections::BTreeMap;
use thiserror::Error;

/// Public description of one adapter (mirrors `AdapterInfo` in the protocol).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AdapterInfo {
    /// Name clients use to pick the adapter.
    pub adapter_id: String,
    /// Base model the adapter was trained for: name.
    pub base_model: String,
    /// Base model: pinned revision.
    pub base_model_revision: String,
    /// Base model: SHA-256 of the weights file (32 bytes).
    pub base_model_sha256: [u8; 32],
    /// PEFT target_modules.
    pub target_modules: Vec<String>,
    /// PEFT default rank r.
    pub rank: u32,
    /// PEFT rank_pattern (per-module rank overrides).
    pub rank_pattern: BTreeMap<String, u32>,
    /// PEFT lora_alpha.
    pub lora_alpha: f64,
    /// Transformer layers carrying the adapter.
    pub num_layers: u32,
    /// Layer groups per layer: the target modules fused in each group.
    pub groups: Vec<Vec<String>>,
    /// Serialised public lora_A when the adapter is FFA-LoRA.
    pub ffa_lora_a: Option<Bytes>,
    /// CKKS presets the backend accepts.
    pub ckks_presets: Vec<String>,
}

/// What the client uploads to open a session.
///
/// `Debug` prints sizes only: key bytes never reach logs.
#[derive(Clone, PartialEq)]
pub struct OpenSessionPayload {
    /// CKKS preset the keys were made under.
    pub ckks_preset: String,
    /// Serialised (seeded) public key.
    pub public_key: Bytes,
    /// Serialised (seeded) Galois keys, only the rotations the plan needs.
    pub galois_keys: Bytes,
    /// Serialised plan request (positions per round, options).
    pub plan_request: Bytes,
}

impl std::fmt::Debug for OpenSessionPayload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenSessionPayload")
            .field("ckks_preset", &self.ckks_preset)
            .field("public_key_bytes", &self.public_key.len())
            .field("galois_keys_bytes", &self.galois_keys.len())
            .field("plan_request_bytes", &self.plan_request.len())
            .finish()
    }
}

/// A session the backend accepted.
pub struct OpenedSession {
    /// Serialised plan sent back to the client.
    pub plan: Bytes,
    /// The per-session compute state (keys, plan, encoded weights).
    pub compute: Box<dyn SessionCompute>,
}

/// What one layer group of a session expects per request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupRequestShape {
    /// Ciphertexts in each request for this group.
    pub input_ciphertexts: usize,
    /// Delta evaluations one request of this group makes — positions
    /// (token rows) times the inputs it answers for (one per shared input;
    /// a request grouping a layer's inputs counts each): what the
    /// extraction budget counts.
    pub positions: u32,
}

/// One served adapter.
pub trait AdapterBackend: Send + Sync + 'static {
    /// The adapter's public description.
    fn info(&self) -> AdapterInfo;

    /// Validates the client's keys and plan request and prepares a session.
    ///
    /// # Errors
    /// [`BackendError::UnknownPreset`], [`BackendError::InvalidKey`],
    /// [`BackendError::InvalidPlan`], [`BackendError::LimitExceeded`].
    fn open_session(&self, payload: OpenSessionPayload) -> Result<OpenedSession, BackendError>;
}

/// The per-session half: computes LoRA deltas on ciphertexts.
pub trait SessionCompute: Send + Sync {
    /// True for a session that computes nothing (opened only to learn the
    /// plan): it expires after `Limits::offer_timeout` and counts against
    /// `Limits::max_offers_per_token`.
    fn offer_only(&self) -> bool {
        false
    }

    /// The request shape of `(layer, group)`.
    ///
    /// # Errors
    /// [`BackendError::UnknownLayer`] when the layer or group does not exist.
    fn group_shape(&self, layer: u32, group: u32) -> Result<GroupRequestShape, BackendError>;

    /// Ciphertexts of the deltas of `(layer, group)` for one verify round.
    ///
    /// `ciphertexts` has exactly `group_shape(layer, group).input_ciphertexts`
    /// entries (the service checks this first). `response_bits` is the
    /// precision the client asks for in the returned ciphertexts (bits
    /// relative to their output bound; 0: the backend's default, which a
    /// backend never exceeds). Runs on a blocking thread.
    ///
    /// # Errors
    /// [`BackendError::InvalidCiphertext`], [`BackendError::ParameterMismatch`],
    /// [`BackendError::UnknownLayer`], [`BackendError::Internal`].
    fn compute(
        &self,
        layer: u32,
        group: u32,
        round: u64,
        response_bits: u32,
        ciphertexts: &[Bytes],
    ) -> Result<Vec<Bytes>, BackendError>;
}

/// What is wrong inside one serialised ciphertext (mirrors the
/// deserialisation errors of `cipherlora-ckks`).
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CiphertextFault {
    /// Fewer bytes than the header announces.
    Truncated {
        /// Bytes needed.
        expected: usize,
        /// Bytes given.
        got: usize,
    },
    /// More bytes than the header announces.
    TrailingBytes {
        /// Bytes expected.
        expected: usize,
        /// Bytes given.
        got: usize,
    },
    /// Not a ciphertext (wrong magic or object kind).
    BadMagic,
    /// Unknown format version.
    UnsupportedVersion {
        /// Version found.
        version: u8,
    },
    /// A coefficient is not below its modulus.
    CoefficientOutOfRange {
        /// Limb (prime index).
        limb: usize,
        /// Coefficient index in the limb.
        index: usize,
    },
    /// A structural field is invalid.
    Malformed {
        /// Which field.
        what: &'static str,
    },
}

impl std::fmt::Display for CiphertextFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Truncated { expected, got } => {
                write!(f, "truncated: need {expected} bytes, got {got}")
            }
            Self::TrailingBytes { expected, got } => {
                write!(f, "trailing bytes: expected {expected} bytes, got {got}")
            }
            Self::BadMagic => write!(f, "bad magic (not a ciphertext)"),
            Self::UnsupportedVersion { version } => {
                write!(f, "unsupported format version {version}")
            }
            Self::CoefficientOutOfRange { limb, index } => {
                write!(
                    f,
                    "coefficient {index} of limb {limb} not below its modulus"
                )
            }
            Self::Malformed { what } => write!(f, "malformed field: {what}"),
        }
    }
}

/// Everything a backend can refuse. Each variant maps to one gRPC status code
/// and [`cipherlora_proto::ErrorReason`] (see [`crate::status`]).
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Error)]
pub enum BackendError {
    /// A ciphertext failed validation. → `INVALID_ARGUMENT`, `invalid_ciphertext`.
    #[error("ciphertext {index}: {fault}")]
    InvalidCiphertext {
        /// Index of the ciphertext in the request.
        index: usize,
        /// What is wrong with it.
        fault: CiphertextFault,
    },
    /// A ciphertext was made under other parameters (ring degree N, level,
    /// scale, moduli). → `INVALID_ARGUMENT`, `parameter_mismatch`.
    #[error("ciphertext {index}: parameter mismatch: {what}")]
    ParameterMismatch {
        /// Index of the ciphertext in the request.
        index: usize,
        /// Which parameter and how it differs, in words (no payload bytes).
        what: String,
    },
    /// The request carries the wrong number of ciphertexts for its group.
    /// → `INVALID_ARGUMENT`, `malformed_request`.
    #[error("group needs {expected} ciphertexts, got {got}")]
    CiphertextCount {
        /// Count the plan needs.
        expected: usize,
        /// Count given.
        got: usize,
    },
    /// A public or Galois key failed validation. → `INVALID_ARGUMENT`, `invalid_key`.
    #[error("invalid key: {what}")]
    InvalidKey {
        /// What is wrong, in words.
        what: String,
    },
    /// The CKKS preset is not served. → `INVALID_ARGUMENT`, `parameter_mismatch`.
    /// The message does not echo the (client-supplied) name.
    #[error("CKKS preset not served (ListAdapters names the served ones)")]
    UnknownPreset {
        /// The preset asked for.
        preset: String,
    },
    /// The plan request cannot be served. → `INVALID_ARGUMENT`, `invalid_plan`.
    #[error("invalid plan request: {reason}")]
    InvalidPlan {
        /// Why, in words.
        reason: String,
    },
    /// The layer or group does not exist. → `NOT_FOUND`, `unknown_layer`.
    #[error("no layer group ({layer}, {group}) in this adapter")]
    UnknownLayer {
        /// Layer index asked for.
        layer: u32,
        /// Group index asked for.
        group: u32,
    },
    /// A backend limit was hit. → `RESOURCE_EXHAUSTED`, `limit_exceeded`.
    #[error("limit exceeded: {what} = {got} > {limit}")]
    LimitExceeded {
        /// Which limit.
        what: &'static str,
        /// The limit.
        limit: u64,
        /// Value asked for.
        got: u64,
    },
    /// A bug or resource failure in the backend. → `INTERNAL`, `internal`.
    #[error("internal backend error: {reason}")]
    Internal {
        /// What failed, in words.
        reason: String,
    },
}

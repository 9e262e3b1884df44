//! The seam between transport and HE code: an [`AdapterBackend`] per adapter parses, validates
//! (before any arithmetic, never panicking) and computes deterministically; keys and ciphertexts
//! never reach errors or logs.

use bytes::Bytes;
use cipherlora_proto::v1::{GroupRequest, PlanRequest, PublicLoraA, SessionOffer};
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
    /// The public lora_A when the adapter is FFA-LoRA.
    pub ffa_lora_a: Option<PublicLoraA>,
    /// CKKS presets the backend accepts.
    pub ckks_presets: Vec<String>,
}

/// What the client uploads to open a session (`Debug` prints sizes only).
#[derive(Clone, PartialEq)]
pub struct OpenSessionPayload {
    /// CKKS preset the keys were made under.
    pub ckks_preset: String,
    /// Serialised (seeded) public key.
    pub public_key: Bytes,
    /// Serialised (seeded) Galois keys, only the rotations the plan needs.
    pub galois_keys: Bytes,
    /// The plan request (positions per round, options).
    pub plan_request: PlanRequest,
}

impl std::fmt::Debug for OpenSessionPayload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenSessionPayload")
            .field("ckks_preset", &self.ckks_preset)
            .field("public_key_bytes", &self.public_key.len())
            .field("galois_keys_bytes", &self.galois_keys.len())
            .field("plan_request", &self.plan_request)
            .finish()
    }
}

/// A session the backend accepted.
pub struct OpenedSession {
    /// The plans sent back to the client.
    pub offer: SessionOffer,
    /// The per-session compute state (keys, plan, encoded weights).
    pub compute: Box<dyn SessionCompute>,
}

/// What one layer group of a session expects per request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupRequestShape {
    /// Ciphertexts in each request for this group.
    pub input_ciphertexts: usize,
    /// Delta evaluations one request makes: what the extraction budget counts (a masked
    /// session's online requests count their rows instead).
    pub positions: u32,
    /// Whether the session is a masked one: its online requests carry masked rows, its offline
    /// requests `input_ciphertexts` encrypted masks.
    pub masked: bool,
}

/// One served adapter.
pub trait AdapterBackend: Send + Sync + 'static {
    /// The adapter's public description.
    fn info(&self) -> AdapterInfo;

    /// Validates the client's keys and plan request and prepares a session. Errors:
    /// [`BackendError::UnknownPreset`], `InvalidKey`, `InvalidPlan`, `LimitExceeded`.
    fn open_session(&self, payload: OpenSessionPayload) -> Result<OpenedSession, BackendError>;
}

/// The per-session half: computes LoRA deltas on ciphertexts.
pub trait SessionCompute: Send + Sync {
    /// True for an offer-only session (short timeout, own per-token limit).
    fn offer_only(&self) -> bool {
        false
    }

    /// The request shape of `(layer, group)`. Errors: [`BackendError::UnknownLayer`].
    fn group_shape(&self, layer: u32, group: u32) -> Result<GroupRequestShape, BackendError>;

    /// Delta ciphertexts of `request`'s (layer, group), at its `response_bits` of precision (0:
    /// default); for a masked online request, one byte string of packed response values. The service checked its envelope, session, plan id and ciphertext count. Runs on
    /// a blocking thread. Errors: [`BackendError::InvalidCiphertext`], `ParameterMismatch`,
    /// `UnknownLayer`, `Internal`.
    fn compute(&self, request: &GroupRequest) -> Result<Vec<Bytes>, BackendError>;
}

/// What is wrong inside one serialised ciphertext.
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

/// Everything a backend can refuse; each maps to one gRPC code and reason ([`crate::status`]).
#[non_exhaustive]
#[derive(Debug, Error)]
pub enum BackendError {
    /// A ciphertext failed validation. → `INVALID_ARGUMENT`, `invalid_ciphertext`.
    #[error("ciphertext {index}: {fault}")]
    InvalidCiphertext {
        /// Index of the ciphertext in the request.
        index: usize,
        /// What is wrong with it.
        fault: CiphertextFault,
    },
    /// A ciphertext was made under other parameters. → `INVALID_ARGUMENT`, `parameter_mismatch`.
    #[error("ciphertext {index}: parameter mismatch: {fault}")]
    ParameterMismatch {
        /// Index of the ciphertext in the request.
        index: usize,
        /// Which parameter and how it differs.
        fault: ParameterFault,
    },
    /// Wrong number of ciphertexts for the group. → `INVALID_ARGUMENT`, `malformed_request`.
    #[error("group needs {expected} ciphertexts, got {got}")]
    CiphertextCount {
        /// Count the plan needs.
        expected: usize,
        /// Count given.
        got: usize,
    },
    /// A public or Galois key failed validation. → `INVALID_ARGUMENT`, `invalid_key`.
    #[error("invalid key: {source}")]
    InvalidKey {
        /// The backend's own error.
        #[source]
        source: BackendSource,
    },
    /// The CKKS preset is not served (not echoed). → `INVALID_ARGUMENT`, `parameter_mismatch`.
    #[error("CKKS preset not served (ListAdapters names the served ones)")]
    UnknownPreset {
        /// The preset asked for.
        preset: String,
    },
    /// The plan request cannot be served. → `INVALID_ARGUMENT`, `invalid_plan`.
    #[error("invalid plan request: {source}")]
    InvalidPlan {
        /// The backend's own error.
        #[source]
        source: BackendSource,
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
    /// A limit shared with other sessions was hit; it clears as they close. →
    /// `RESOURCE_EXHAUSTED`, `at_capacity`.
    #[error("at capacity: {what} would be {got} > {limit}")]
    AtCapacity {
        /// Which limit.
        what: &'static str,
        /// The limit.
        limit: u64,
        /// Value it would come to.
        got: u64,
    },
    /// A masked session refused a one-time mask (reused, unknown or stale). →
    /// `FAILED_PRECONDITION`, `mask_refused`.
    #[error("mask refused: {source}")]
    MaskRefused {
        /// The backend's own error.
        #[source]
        source: BackendSource,
    },
    /// A bug or resource failure in the backend. → `INTERNAL`, `internal`.
    #[error("internal backend error: {source}")]
    Internal {
        /// The backend's own error.
        #[source]
        source: BackendSource,
    },
}

/// A backend's own typed error behind [`BackendError::InvalidKey`], `InvalidPlan` or
/// `Internal`: the service sends its message and never interprets it; a backend's tests can
/// downcast it.
pub type BackendSource = Box<dyn std::error::Error + Send + Sync + 'static>;

impl BackendError {
    /// [`BackendError::InvalidKey`] with `source`.
    pub fn invalid_key(source: impl Into<BackendSource>) -> Self {
        Self::InvalidKey {
            source: source.into(),
        }
    }

    /// [`BackendError::InvalidPlan`] with `source`.
    pub fn invalid_plan(source: impl Into<BackendSource>) -> Self {
        Self::InvalidPlan {
            source: source.into(),
        }
    }

    /// [`BackendError::Internal`] with `source`.
    pub fn internal(source: impl Into<BackendSource>) -> Self {
        Self::Internal {
            source: source.into(),
        }
    }
}

/// How a ciphertext's parameters differ from the session's ([`BackendError::ParameterMismatch`]).
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ParameterFault {
    /// A parameter of the encoding (ring degree, moduli, ...) differs from the preset's.
    #[error("{what} differs from the session's parameters")]
    Parameters {
        /// Which parameter.
        what: &'static str,
    },
    /// The ring degree N differs from the preset's.
    #[error("ring degree N = {got}, the preset has {expected}")]
    RingDegree {
        /// The preset's N.
        expected: u64,
        /// The ciphertext's N.
        got: u64,
    },
    /// The ciphertext is at another level than the plan encrypts at.
    #[error("level {got}, the plan needs {expected}")]
    Level {
        /// The plan's input level.
        expected: usize,
        /// The ciphertext's level.
        got: usize,
    },
    /// The ciphertext's level is above the parameters' top level.
    #[error("level {got} above the parameters' maximum {max}")]
    LevelAboveTop {
        /// The ciphertext's level.
        got: usize,
        /// The parameters' top level.
        max: usize,
    },
    /// The ciphertext's scale is not the parameters' scale.
    #[error("scale differs from the parameters' scale")]
    Scale,
    /// A field of the request differs from the session's plan.
    #[error("{field} is {got}, the plan needs {expected}")]
    Plan {
        /// The field.
        field: &'static str,
        /// The plan's value.
        expected: u64,
        /// The request's value.
        got: u64,
    },
}

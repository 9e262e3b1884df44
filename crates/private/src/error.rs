//! The crate's error type.

use cipherlora_model::ModelError;

/// Errors of private generation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PrivateError {
    /// Packing, planning or HE evaluation failed (malformed ciphertexts, plan mismatches, wrong
    /// shapes).
    #[error("HE-LoRA: {0}")]
    Helora(#[from] cipherlora_helora::HeloraError),
    /// The CKKS engine refused parameters, keys or bytes.
    #[error("CKKS: {0}")]
    Ckks(#[from] cipherlora_ckks::CkksError),
    /// Loading the adapter or the model failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// A request named a layer or group the adapter does not have.
    #[error("no adapted group {group} in layer {layer}")]
    UnknownGroup {
        /// Decoder layer index.
        layer: u32,
        /// Group index ([`crate::AdapterGroups::group_index`]).
        group: u32,
    },
    /// A session grouped by layers was asked for one group's deltas or an incomplete fused group.
    #[error(
        "the session groups layer {layer} with others into one request: it needs all of their inputs at once (use the fixed-point schedule)"
    )]
    GroupedByLayer {
        /// Decoder layer index (the first of the fused group).
        layer: u32,
    },
    /// [`crate::Grouping::ByLayers`] asked for no layers per group, or for more than
    /// [`crate::Grouping::MAX_LAYERS`].
    #[error("{got} layers per group: expected 1 to {max}")]
    LayersPerGroup {
        /// Layers per group asked for.
        got: usize,
        /// The most allowed.
        max: usize,
    },
    /// The adapter's sidecar file (cipherlora.json) is malformed.
    #[error("{path}: {reason}")]
    Sidecar {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// An adapter folder has no UTF-8 name to serve the adapter under ([`crate::adapter_id`]).
    #[error("adapter folder {path} has no usable name")]
    AdapterId {
        /// The folder.
        path: std::path::PathBuf,
    },
    /// The Galois keys of a session are not exactly those its plans rotate by (an empty set, keys
    /// made for another width).
    #[error(
        "Galois keys do not match the plan: {missing} rotation keys missing, {extra} not needed"
    )]
    GaloisKeysMismatch {
        /// Keys the plans need and the set lacks.
        missing: usize,
        /// Keys in the set the plans never use.
        extra: usize,
    },
    /// The offer's plans rerandomise their outputs (circuit privacy) and the client sent no public
    /// key, or one that does not parse.
    #[error("circuit privacy is on: the session needs the client's public key")]
    PublicKeyRequired,
    /// Encoding the adapter for another offer would exceed the session memory budget
    /// ([`crate::SessionMemory`]).
    #[error("session plaintext memory: {got} bytes would be held, the limit is {limit}")]
    MemoryBudget {
        /// Bytes that would be held with this offer's diagonals.
        got: u64,
        /// The budget, bytes.
        limit: u64,
    },
    /// The verify-width model was asked for no candidate, or given client timings for fewer widths
    /// than it models ([`crate::width_plan::choose_width`]).
    #[error(
        "verify-width model: K up to {k_max} needs passes of 1..={needed} positions timed, got {timed}"
    )]
    WidthModel {
        /// The largest K asked for.
        k_max: usize,
        /// Pass widths needed (k_max + 1).
        needed: usize,
        /// Pass widths timed.
        timed: usize,
    },
    /// The transport failed in a way the service does not describe (an unexpected answer, an
    /// unknown adapter).
    #[error("transport: {0}")]
    Transport(String),
    /// The adapter service refused or failed (with gRPC code and `ErrorReason` when sent).
    #[error("adapter service: {0}")]
    Service(#[from] cipherlora_service::ServiceError),
}

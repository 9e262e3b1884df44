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
        /// Group index ([`crate::protocol::group_index`]).
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
        /// This offer's diagonals alone, bytes (above `limit`: never served).
        need: u64,
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
    /// The adapter server serves no adapter of this id.
    #[error("the adapter server has no adapter {adapter_id:?}")]
    UnknownAdapter {
        /// The id asked for (cut to 64 characters).
        adapter_id: String,
    },
    /// The adapter server's answer contradicts the protocol: a missing field, or a plan other
    /// than the one offered.
    #[error("the adapter server broke the protocol: {what}")]
    Protocol {
        /// What was wrong with its answer.
        what: ProtocolFault,
    },
    /// A message's envelope is malformed (packed values, row lists, session id).
    #[error("message: {0}")]
    Message(#[from] cipherlora_proto::ProtoError),
    /// A group message did not decode as protobuf (the in-process transport's round trip).
    #[error("group message: {0}")]
    Decode(prost::DecodeError),
    /// The server offered plans for another number of positions than the client asked for.
    #[error("asked for T = {asked} positions, the server offered T = {offered}")]
    WidthMismatch {
        /// T asked for.
        asked: usize,
        /// T offered.
        offered: usize,
    },
    /// A reply was awaited for a request that is not in flight (a caller's error).
    #[error("no request of round {round}, layer {layer}, group {group} in flight")]
    NotInFlight {
        /// The round (trip) id.
        round: u64,
        /// The layer.
        layer: u32,
        /// The group.
        group: u32,
    },
    /// The transport returned another number of replies than requests were sent.
    #[error("{replies} replies to {requests} group requests")]
    ReplyCount {
        /// Replies received.
        replies: usize,
        /// Requests sent.
        requests: usize,
    },
    /// No open session has this verify or prefill width.
    #[error("no session of width {width}")]
    NoSessionOfWidth {
        /// The width asked for.
        width: usize,
    },
    /// The adapter service refused or failed (with gRPC code and `ErrorReason` when sent).
    #[error("adapter service: {0}")]
    Service(#[from] cipherlora_service::ServiceError),
}

impl PrivateError {
    /// Whether the adapter server refused for want of room it may get back (its session memory or
    /// session limits): [`PrivateError::MemoryBudget`] within the budget in process, `AT_CAPACITY`
    /// (or `SHUTTING_DOWN`) over gRPC.
    #[must_use]
    pub fn is_at_capacity(&self) -> bool {
        match self {
            Self::MemoryBudget { need, limit, .. } => need <= limit,
            Self::Service(e) => e.is_capacity(),
            _ => false,
        }
    }

    /// Whether the adapter server refused because one session would exceed a limit of its own
    /// (its plaintext diagonals above the whole memory budget, its key bytes): asking the same
    /// way is refused again, a narrower session may fit. [`PrivateError::MemoryBudget`] above the
    /// budget in process, `LIMIT_EXCEEDED` over gRPC.
    #[must_use]
    pub fn is_over_limit(&self) -> bool {
        match self {
            Self::MemoryBudget { need, limit, .. } => need > limit,
            Self::Service(e) => e.reason() == Some(cipherlora_proto::ErrorReason::LimitExceeded),
            _ => false,
        }
    }
}

/// How an adapter server's answer broke the protocol ([`PrivateError::Protocol`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolFault {
    /// Its adapter list names no CKKS preset for the adapter.
    #[error("the adapter names no CKKS preset")]
    NoPreset,
    /// An FFA adapter's info carries no public lora_A.
    #[error("the FFA adapter's info carries no lora_A")]
    NoPublicA,
    /// The opened session runs other plans than the offer.
    #[error("the session runs other plans than the server offered")]
    PlanChanged,
    /// A response names another layer, group, batch or round than its request.
    #[error("a response answers another request")]
    ResponseMismatch,
}

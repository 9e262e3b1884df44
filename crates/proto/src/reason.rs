//! Machine-readable error reasons: every error status carries [`ERROR_REASON_KEY`] with one of
//! these, since a gRPC code alone is too coarse to act on.

/// gRPC metadata key of the error reason.
pub const ERROR_REASON_KEY: &str = "cipherlora-error";

macro_rules! reasons {
    ($($(#[$doc:meta])* $variant:ident => $s:literal,)*) => {
        /// Why the server refused a call.
        #[non_exhaustive]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ErrorReason {
            $($(#[$doc])* $variant,)*
        }

        impl ErrorReason {
            /// The wire form.
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $s,)* }
            }

            /// Parses the wire form; `None` for reasons this version does not know.
            pub fn parse(s: &str) -> Option<Self> {
                match s { $($s => Some(Self::$variant),)* _ => None }
            }
        }
    };
}

reasons! {
    /// Missing or wrong bearer token.
    Unauthenticated => "unauthenticated",
    /// No session with this id (never opened, closed or evicted).
    UnknownSession => "unknown_session",
    /// No adapter with this id.
    UnknownAdapter => "unknown_adapter",
    /// The layer or group index does not exist in the adapter.
    UnknownLayer => "unknown_layer",
    /// The message envelope is malformed (session id, counts, sizes).
    MalformedRequest => "malformed_request",
    /// A ciphertext failed validation (truncated, bad header, coefficient not below its modulus,
    /// ...).
    InvalidCiphertext => "invalid_ciphertext",
    /// A ciphertext or key was made under other parameters (N, level, scale, preset).
    ParameterMismatch => "parameter_mismatch",
    /// A public or Galois key failed validation.
    InvalidKey => "invalid_key",
    /// The plan request cannot be served.
    InvalidPlan => "invalid_plan",
    /// A limit of one message or session was hit (key bytes of a session, ciphertexts, message
    /// size, requests per session): asking again the same way is refused again.
    LimitExceeded => "limit_exceeded",
    /// The server or this token holds all it may (sessions, offers, key bytes, session memory):
    /// the refusal clears as other sessions close, so the client may retry later.
    AtCapacity => "at_capacity",
    /// The stream mixes sessions or goes back in rounds.
    ProtocolViolation => "protocol_violation",
    /// A group request names another plan than its session's (the client laid its ciphertexts out
    /// for a plan the server does not run).
    PlanMismatch => "plan_mismatch",
    /// Hidden states of a split-inference call are malformed: wrong byte length or width, a NaN or
    /// infinity, a position that does not follow the session's cache.
    InvalidActivations => "invalid_activations",
    /// A split call's tree mask or compaction list is malformed.
    InvalidTree => "invalid_tree",
    /// A masked session refused a one-time mask: used before, in a closed or unknown batch, or
    /// a batch number not above the group's last; the client runs the pass another way.
    MaskRefused => "mask_refused",
    /// The server is shutting down.
    ShuttingDown => "shutting_down",
    /// A bug or resource failure on the server.
    Internal => "internal",
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_round_trip_through_their_wire_form() {
        for r in [
            ErrorReason::Unauthenticated,
            ErrorReason::UnknownSession,
            ErrorReason::UnknownLayer,
            ErrorReason::InvalidCiphertext,
            ErrorReason::InvalidActivations,
            ErrorReason::InvalidTree,
            ErrorReason::MaskRefused,
            ErrorReason::Internal,
        ] {
            assert_eq!(ErrorReason::parse(r.as_str()), Some(r));
        }
        assert_eq!(ErrorReason::parse("nonsense"), None);
    }
}

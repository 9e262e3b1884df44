//! Typed gRPC statuses: every refusal carries a code and an [`ErrorReason`] in the
//! `cipherlora-error` metadata entry.

use cipherlora_proto::{ERROR_REASON_KEY, ErrorReason, ProtoError};
use tonic::{Code, Status};

use crate::backend::BackendError;

/// Longest status message the server sends, bytes; longer ones are cut at a character boundary and
/// end with `…`.
pub const MAX_STATUS_MESSAGE: usize = 256;

/// A status with `code`, `message` (cut to [`MAX_STATUS_MESSAGE`] bytes) and the machine-readable
/// `reason`.
pub fn status(code: Code, reason: ErrorReason, message: impl Into<String>) -> Status {
    let mut s = Status::new(code, bounded(message.into()));
    s.metadata_mut().insert(
        ERROR_REASON_KEY,
        tonic::metadata::MetadataValue::from_static(reason.as_str()),
    );
    s
}

/// `m` cut to at most [`MAX_STATUS_MESSAGE`] bytes.
fn bounded(mut m: String) -> String {
    if m.len() > MAX_STATUS_MESSAGE {
        let mut end = MAX_STATUS_MESSAGE - '…'.len_utf8();
        while !m.is_char_boundary(end) {
            end -= 1;
        }
        m.truncate(end);
        m.push('…');
    }
    m
}

/// The reason attached to a status, if the server attached a known one.
pub fn reason_of(s: &Status) -> Option<ErrorReason> {
    s.metadata()
        .get(ERROR_REASON_KEY)
        .and_then(|v| v.to_str().ok())
        .and_then(ErrorReason::parse)
}

/// gRPC status of a backend refusal.
pub fn from_backend(e: &BackendError) -> Status {
    let (code, reason) = match e {
        BackendError::InvalidCiphertext { .. } => {
            (Code::InvalidArgument, ErrorReason::InvalidCiphertext)
        }
        BackendError::ParameterMismatch { .. } | BackendError::UnknownPreset { .. } => {
            (Code::InvalidArgument, ErrorReason::ParameterMismatch)
        }
        BackendError::CiphertextCount { .. } => {
            (Code::InvalidArgument, ErrorReason::MalformedRequest)
        }
        BackendError::InvalidKey { .. } => (Code::InvalidArgument, ErrorReason::InvalidKey),
        BackendError::InvalidPlan { .. } => (Code::InvalidArgument, ErrorReason::InvalidPlan),
        BackendError::UnknownLayer { .. } => (Code::NotFound, ErrorReason::UnknownLayer),
        BackendError::LimitExceeded { .. } => (Code::ResourceExhausted, ErrorReason::LimitExceeded),
        BackendError::AtCapacity { .. } => (Code::ResourceExhausted, ErrorReason::AtCapacity),
        BackendError::MaskRefused { .. } => (Code::FailedPrecondition, ErrorReason::MaskRefused),
        // `Internal` and variants added later.
        _ => (Code::Internal, ErrorReason::Internal),
    };
    status(code, reason, e.to_string())
}

/// gRPC status of an envelope error.
pub fn from_proto(e: &ProtoError) -> Status {
    let code = match e {
        ProtoError::TooManyCiphertexts { .. } | ProtoError::CiphertextTooLarge { .. } => {
            Code::ResourceExhausted
        }
        _ => Code::InvalidArgument,
    };
    let reason = match e {
        _ if code == Code::ResourceExhausted => ErrorReason::LimitExceeded,
        ProtoError::NoPositions
        | ProtoError::ActivationLength { .. }
        | ProtoError::NonFiniteActivation { .. } => ErrorReason::InvalidActivations,
        ProtoError::TreeLength { .. }
        | ProtoError::TreeParent { .. }
        | ProtoError::KeepOrder { .. }
        | ProtoError::KeepRange { .. } => ErrorReason::InvalidTree,
        _ => ErrorReason::MalformedRequest,
    };
    status(code, reason, e.to_string())
}

/// `NOT_FOUND` / `unknown_session`: the id names no session of the caller's (never opened, closed,
/// evicted, or another token's).
pub(crate) fn unknown_session() -> Status {
    status(
        Code::NotFound,
        ErrorReason::UnknownSession,
        "no such session (never opened, closed or evicted)",
    )
}

/// `INTERNAL` with a fixed message; the cause goes to the log only (never echoed to the caller).
pub(crate) fn internal(e: &dyn std::fmt::Display) -> Status {
    tracing::error!(error = %e, "internal error");
    status(
        Code::Internal,
        ErrorReason::Internal,
        "internal server error",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::CiphertextFault;

    #[test]
    fn backend_errors_map_to_typed_statuses() {
        let cases = [
            (
                BackendError::InvalidCiphertext {
                    index: 0,
                    fault: CiphertextFault::BadMagic,
                },
                Code::InvalidArgument,
                ErrorReason::InvalidCiphertext,
            ),
            (
                BackendError::ParameterMismatch {
                    index: 1,
                    fault: crate::backend::ParameterFault::Scale,
                },
                Code::InvalidArgument,
                ErrorReason::ParameterMismatch,
            ),
            (
                BackendError::UnknownLayer { layer: 9, group: 0 },
                Code::NotFound,
                ErrorReason::UnknownLayer,
            ),
            (
                BackendError::LimitExceeded {
                    what: "x",
                    limit: 1,
                    got: 2,
                },
                Code::ResourceExhausted,
                ErrorReason::LimitExceeded,
            ),
            (
                BackendError::internal("x"),
                Code::Internal,
                ErrorReason::Internal,
            ),
        ];
        for (e, code, reason) in cases {
            let s = from_backend(&e);
            assert_eq!(s.code(), code, "{e}");
            assert_eq!(reason_of(&s), Some(reason), "{e}");
        }
    }

    #[test]
    fn status_messages_are_bounded_and_never_echo_a_preset_name() {
        let long = "é".repeat(10_000);
        let s = status(Code::InvalidArgument, ErrorReason::InvalidPlan, long);
        assert!(
            s.message().len() <= MAX_STATUS_MESSAGE,
            "{}",
            s.message().len()
        );
        assert!(s.message().ends_with('…'));
        let preset = "x".repeat(1 << 20);
        let s = from_backend(&BackendError::UnknownPreset {
            preset: preset.clone(),
        });
        assert!(!s.message().contains("xxxx"), "{}", s.message());
        assert_eq!(s.code(), Code::InvalidArgument);
    }
}

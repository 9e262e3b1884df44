//! Each user-facing failure of the adapter server reaches an HTTP client as
//! its typed variant, with OpenAI's status and error code: an adapter the
//! server does not serve (404 `model_not_found`), a server at a limit (503
//! `adapter_server_busy`), a broken protocol or a failed pass (502
//! `adapter_server_error`). The gRPC side is the status a server sends
//! (`cipherlora_service::status::status`), decoded as the client decodes it.

use axum::http::StatusCode;
use cipherlora_api::{ApiError, UpstreamError};
use cipherlora_model::ModelError;
use cipherlora_private::{PrivateError, ProtocolFault};
use cipherlora_proto::ErrorReason;
use cipherlora_service::ServiceError;
use tonic::Code;

/// What a client makes of a refusal the server sends as `code` + `reason`.
fn refusal(code: Code, reason: ErrorReason) -> ServiceError {
    ServiceError::from(cipherlora_service::status::status(code, reason, "refused"))
}

fn mapped(e: ApiError) -> (StatusCode, Option<String>, String) {
    let body = e.body();
    (e.status(), body.error.code, body.error.kind)
}

#[test]
fn an_unknown_adapter_is_a_404_model_not_found_from_either_side() {
    let from_offer = ApiError::upstream(PrivateError::UnknownAdapter {
        adapter_id: "nope".into(),
    });
    assert!(matches!(
        &from_offer,
        ApiError::Upstream(UpstreamError::Sessions(PrivateError::UnknownAdapter { adapter_id }))
            if adapter_id == "nope"
    ));
    let from_grpc = ApiError::upstream(refusal(Code::NotFound, ErrorReason::UnknownAdapter));
    for e in [from_offer, from_grpc] {
        let (status, code, kind) = mapped(e);
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(code.as_deref(), Some("model_not_found"));
        assert_eq!(kind, "invalid_request_error");
    }
}

#[test]
fn a_server_at_capacity_is_a_503_to_retry_and_shutting_down_too() {
    let over = refusal(Code::ResourceExhausted, ErrorReason::AtCapacity);
    assert_eq!(over.code(), Some(Code::ResourceExhausted));
    assert!(over.is_capacity());
    // A limit asking again cannot pass is not a capacity refusal.
    assert!(!refusal(Code::ResourceExhausted, ErrorReason::LimitExceeded).is_capacity());
    for e in [
        ApiError::upstream(over),
        ApiError::upstream(PrivateError::Service(refusal(
            Code::Unavailable,
            ErrorReason::ShuttingDown,
        ))),
    ] {
        let (status, code, _) = mapped(e);
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(code.as_deref(), Some("adapter_server_busy"));
    }
}

#[test]
fn a_plan_mismatch_or_a_failed_pass_is_a_502() {
    let plan = refusal(Code::FailedPrecondition, ErrorReason::PlanMismatch);
    assert_eq!(plan.reason(), Some(ErrorReason::PlanMismatch));
    for e in [
        ApiError::upstream(plan),
        ApiError::upstream(PrivateError::Protocol {
            what: ProtocolFault::PlanChanged,
        }),
        ApiError::upstream(ModelError::Input("a pass failed".into())),
    ] {
        let (status, code, _) = mapped(e);
        assert_eq!(status, StatusCode::BAD_GATEWAY);
        assert_eq!(code.as_deref(), Some("adapter_server_error"));
    }
}

#[test]
fn a_failure_of_the_endpoint_itself_is_a_500_with_its_typed_cause() {
    let e = ApiError::from(cipherlora_api::InternalError::SessionsNotOpen);
    assert!(matches!(
        &e,
        ApiError::Internal(cipherlora_api::InternalError::SessionsNotOpen)
    ));
    let (status, code, kind) = mapped(e);
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!((code, kind.as_str()), (None, "api_error"));
}

//! The session table, the plan binding, the extraction budget and the wire under abuse: each test
//! pins one abuse case.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use cipherlora_proto::ErrorReason;
use cipherlora_proto::v1::{GroupRequest, PlanRequest};
use cipherlora_service::testing::{TestBackend, encode_ct};
use cipherlora_service::{
    AdapterClient, ClientConfig, Limits, ServiceError, SessionParams, dev_cert,
};
use common::*;
use tonic::Code;

fn rpc_err(e: ServiceError) -> (Code, Option<ErrorReason>) {
    match e {
        ServiceError::Rpc { code, reason, .. } => (code, reason),
        other => panic!("expected an RPC status, got {other}"),
    }
}

/// An offer-only opening of the test backend (plan request T = 0).
fn offer_params(client: u8) -> SessionParams {
    let mut p = params(client);
    p.plan_request = PlanRequest::default();
    p
}

fn config_with_token(fx: &Fixture, token: &str) -> ClientConfig {
    let mut c = fx.client_config();
    c.token = Some(token.into());
    c
}

/// Waits up to 5 s for `m.sessions_active()` to reach `n`.
fn wait_sessions(fx: &Fixture, n: i64) -> bool {
    let m = fx.server.metrics();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        if m.sessions_active() == n {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// Finding: 32 offer-only opens from one token filled the global session table and locked every
/// other client out.
#[test]
fn one_token_cannot_fill_the_session_table_with_offer_only_sessions() {
    let fx = start(Limits {
        max_sessions: 6,
        max_sessions_per_token: 3,
        max_offers_per_token: 2,
        ..Limits::default()
    });
    let mut offers: Vec<AdapterClient> = Vec::new();
    for i in 0..2 {
        let mut c = AdapterClient::connect(fx.client_config()).unwrap();
        c.open_session(offer_params(i)).unwrap();
        offers.push(c);
    }
    let mut third = AdapterClient::connect(fx.client_config()).unwrap();
    assert_eq!(
        rpc_err(third.open_session(offer_params(3)).unwrap_err()),
        (Code::ResourceExhausted, Some(ErrorReason::AtCapacity)),
        "a third offer-only session of the same token"
    );
    // The token still has room for one keyed session, then none.
    third.open_session(params(3)).unwrap();
    let mut fourth = AdapterClient::connect(fx.client_config()).unwrap();
    assert_eq!(
        rpc_err(fourth.open_session(params(4)).unwrap_err()),
        (Code::ResourceExhausted, Some(ErrorReason::AtCapacity)),
        "a fourth session of the same token"
    );
    // Another token is not locked out.
    let mut other = AdapterClient::connect(config_with_token(&fx, TOKEN2)).unwrap();
    other.open_session(params(5)).unwrap();
    check(5, 0, 0, &other.round_pipelined(0, &calls(5, 0, 0)).unwrap());
}

/// Findings: offer-only sessions stayed for the full idle timeout, and a round on one refreshed its
/// idle timer.
#[test]
fn offer_only_session_expires_fast_and_rounds_on_it_do_not_refresh_its_timer() {
    let fx = start(Limits {
        offer_timeout: Duration::from_millis(300),
        ..Limits::default()
    });
    let mut c = AdapterClient::connect(fx.client_config()).unwrap();
    c.open_session(offer_params(1)).unwrap();
    let sid = c.session_id().unwrap().0;
    let plan = c.session_info().unwrap().plan_id;
    assert_eq!(fx.server.metrics().sessions_active(), 1);
    // Keep poking it with rounds (each refused) for longer than its timeout.
    let t0 = Instant::now();
    let req = GroupRequest {
        batch: 0,
        masked: None,
        session_id: Bytes::copy_from_slice(&sid),
        round: 0,
        layer: 0,
        group: 0,
        ciphertexts: vec![encode_ct(12, 2, &inputs(1, 0, 0, 0))],
        plan_id: plan,
        response_bits: 0,
    };
    let mut codes = Vec::new();
    while t0.elapsed() < Duration::from_millis(900) {
        let s = raw_rounds(fx.server.addr(), &fx.cert, vec![req.clone()]).unwrap_err();
        codes.push(s.code());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(codes[0], Code::NotFound, "a round on an offer-only session");
    assert!(
        wait_sessions(&fx, 0),
        "the offer-only session outlived its timeout while being poked"
    );
    assert_eq!(*codes.last().unwrap(), Code::NotFound);
}

/// Finding: a killed client's sessions stayed for the full 600 s idle timeout. A keyed session that
/// never starts a round now goes after `unstarted_timeout`; a started one stays until
/// `idle_timeout`.
#[test]
fn session_that_never_started_a_round_expires_after_the_short_timeout() {
    let fx = start(Limits {
        unstarted_timeout: Duration::from_millis(300),
        ..Limits::default()
    });
    let mut started = AdapterClient::connect(fx.client_config()).unwrap();
    started.open_session(params(1)).unwrap();
    check(
        1,
        0,
        0,
        &started.round_pipelined(0, &calls(1, 0, 0)).unwrap(),
    );
    let mut idle = AdapterClient::connect(fx.client_config()).unwrap();
    idle.open_session(params(2)).unwrap();
    assert_eq!(fx.server.metrics().sessions_active(), 2);
    assert!(
        wait_sessions(&fx, 1),
        "the unstarted session was not evicted"
    );
    // The started session is still there: no reopen needed.
    check(
        1,
        1,
        1,
        &started.round_pipelined(1, &calls(1, 1, 1)).unwrap(),
    );
    assert_eq!(started.stats().sessions_opened, 1);
}

/// Bug: a client's verify session, opened before a prefill that took more than `unstarted_timeout`
/// on a WAN (standard LoRA, 80 ms), was evicted while the client was busy on its prefill session,
/// and the first verify round failed with NOT_FOUND and a reopen. Rounds on one session of a token
/// now keep the token's unstarted sessions; another token's still go.
#[test]
fn unstarted_session_survives_a_long_prefill_on_its_sibling() {
    let fx = start(Limits {
        unstarted_timeout: Duration::from_millis(300),
        ..Limits::default()
    });
    let mut prefill = AdapterClient::connect(fx.client_config()).unwrap();
    prefill.open_session(params(1)).unwrap();
    let mut verify = AdapterClient::connect(fx.client_config()).unwrap();
    verify.open_session(params(2)).unwrap();
    let mut stranger = AdapterClient::connect(config_with_token(&fx, TOKEN2)).unwrap();
    stranger.open_session(params(3)).unwrap();
    assert_eq!(fx.server.metrics().sessions_active(), 3);
    // A "prefill" of 1 s: rounds on the sibling every 50 ms.
    let t0 = Instant::now();
    let mut round = 0;
    while t0.elapsed() < Duration::from_millis(1000) {
        check(
            1,
            round,
            0,
            &prefill.round_pipelined(round, &calls(1, round, 0)).unwrap(),
        );
        round += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        fx.server.metrics().sessions_active(),
        2,
        "the other token's unstarted session should be gone, the sibling kept"
    );
    check(
        2,
        0,
        0,
        &verify.round_pipelined(0, &calls(2, 0, 0)).unwrap(),
    );
    assert_eq!(
        verify.stats().sessions_opened,
        1,
        "the verify session was reopened"
    );
}

/// Bug: a client opening its prefill and verify sessions against a large adapter (standard LoRA
/// on q,k,v,o at the 8B shape) saw the session it opened first evicted unstarted while the server
/// encoded the other's diagonals for longer than `unstarted_timeout`; its first round failed with
/// NOT_FOUND and a reopen. A token's unstarted sessions now wait while another of its sessions
/// opens; another token's still go.
#[test]
fn unstarted_session_survives_a_slow_open_of_its_sibling() {
    let cert = dev_cert(&["localhost"]).unwrap();
    let limits = Limits {
        unstarted_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let backend = TestBackend::new(ADAPTER, LAYERS).with_open_delay(Duration::from_millis(1000));
    let server = start_on(&cert, "127.0.0.1:0".parse().unwrap(), limits, backend);
    let fx = Fixture { server, cert };
    // Every opening takes 1 s, over three unstarted timeouts: the stranger's session goes while
    // the first opens, the first waits while its sibling opens.
    let mut stranger = AdapterClient::connect(config_with_token(&fx, TOKEN2)).unwrap();
    stranger.open_session(params(3)).unwrap();
    let mut first = AdapterClient::connect(fx.client_config()).unwrap();
    first.open_session(params(1)).unwrap();
    let mut second = AdapterClient::connect(fx.client_config()).unwrap();
    second.open_session(params(2)).unwrap();
    assert_eq!(
        fx.server.metrics().sessions_active(),
        2,
        "the other token's unstarted session should be gone, the waiting sibling kept"
    );
    check(1, 0, 0, &first.round_pipelined(0, &calls(1, 0, 0)).unwrap());
    assert_eq!(
        first.stats().sessions_opened,
        1,
        "the first session was reopened"
    );
}

/// Finding: group requests carried no plan id, so a request laid out for one plan could be computed
/// against another.
#[test]
fn group_request_with_another_plan_id_is_refused_with_failed_precondition() {
    let fx = start(Limits::default());
    let mut c = AdapterClient::connect(fx.client_config()).unwrap();
    c.open_session(params(1)).unwrap();
    let sid = c.session_id().unwrap().0;
    let plan = c.session_info().unwrap().plan_id;
    let req = |plan_id| GroupRequest {
        batch: 0,
        masked: None,
        session_id: Bytes::copy_from_slice(&sid),
        round: 0,
        layer: 0,
        group: 0,
        ciphertexts: vec![encode_ct(12, 2, &inputs(1, 0, 0, 0))],
        plan_id,
        response_bits: 0,
    };
    let s = raw_rounds(fx.server.addr(), &fx.cert, vec![req(plan ^ 1)]).unwrap_err();
    assert_eq!(s.code(), Code::FailedPrecondition);
    assert_eq!(
        cipherlora_service::status::reason_of(&s),
        Some(ErrorReason::PlanMismatch)
    );
    let ok = raw_rounds(fx.server.addr(), &fx.cert, vec![req(plan)]).unwrap();
    assert_eq!(ok.len(), 1);
    // The client library sends the right id.
    check(1, 0, 0, &c.round_pipelined(0, &calls(1, 0, 0)).unwrap());
}

/// Finding: the only limit on collecting deltas was 10 million requests per session, reset by
/// opening a new session.
#[test]
fn extraction_budget_refuses_past_its_limit_and_resets_after_its_window() {
    // T = 8 positions × 2 groups per layer call: 16 evaluations each.
    let fx = start(Limits {
        extraction_budget: 32,
        extraction_window: Duration::from_millis(640),
        ..Limits::default()
    });
    let mut c = AdapterClient::connect(fx.client_config()).unwrap();
    c.open_session(params(1)).unwrap();
    check(1, 0, 0, &c.round_pipelined(0, &calls(1, 0, 0)).unwrap());
    check(1, 0, 1, &c.round_pipelined(0, &calls(1, 0, 1)).unwrap());
    let refused =
        |c: &mut AdapterClient| rpc_err(c.round_pipelined(0, &calls(1, 0, 2)).unwrap_err());
    let t_full = Instant::now();
    assert_eq!(
        refused(&mut c),
        (Code::ResourceExhausted, Some(ErrorReason::LimitExceeded))
    );
    // A new session of the same token does not reset it.
    let mut again = AdapterClient::connect(fx.client_config()).unwrap();
    again.open_session(params(1)).unwrap();
    if t_full.elapsed() < Duration::from_millis(500) {
        assert_eq!(
            refused(&mut again),
            (Code::ResourceExhausted, Some(ErrorReason::LimitExceeded)),
            "a new session reset the budget"
        );
    }
    // Another token has its own budget.
    let mut other = AdapterClient::connect(config_with_token(&fx, TOKEN2)).unwrap();
    other.open_session(params(2)).unwrap();
    check(2, 0, 0, &other.round_pipelined(0, &calls(2, 0, 0)).unwrap());
    // After the window the first token may go on.
    std::thread::sleep(Duration::from_millis(800));
    check(1, 0, 2, &c.round_pipelined(0, &calls(1, 0, 2)).unwrap());
}

/// Finding: user-supplied strings (a 64 MiB adapter id) were echoed into status messages.
#[test]
fn status_messages_are_bounded_and_never_echo_the_adapter_id_or_preset() {
    let fx = start(Limits::default());
    let mut c = AdapterClient::connect(fx.client_config()).unwrap();
    let mut p = params(1);
    p.adapter_id = "A".repeat(1 << 20);
    match c.open_session(p).unwrap_err() {
        ServiceError::Rpc {
            code,
            reason,
            message,
        } => {
            assert_eq!(
                (code, reason),
                (Code::NotFound, Some(ErrorReason::UnknownAdapter))
            );
            assert!(message.len() <= 256, "{} bytes", message.len());
            assert!(!message.contains("AAAA"), "{message}");
        }
        e => panic!("{e}"),
    }
    let mut p = params(1);
    p.ckks_preset = "P".repeat(1 << 20);
    match c.open_session(p).unwrap_err() {
        ServiceError::Rpc { code, message, .. } => {
            assert_eq!(code, Code::InvalidArgument);
            assert!(!message.contains("PPPP"), "{message}");
        }
        e => panic!("{e}"),
    }
}

/// Finding: undecodable protobuf was answered INTERNAL.
#[test]
fn undecodable_protobuf_is_invalid_argument_not_internal() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let fx = start(Limits::default());
    let addr = fx.server.addr();
    let ca = fx.cert.ca_pem.clone();
    let status = rt.block_on(async move {
        let ch =
            tonic::transport::Endpoint::from_shared(format!("https://127.0.0.1:{}", addr.port()))
                .unwrap()
                .tls_config(
                    tonic::transport::ClientTlsConfig::new()
                        .ca_certificate(tonic::transport::Certificate::from_pem(&ca))
                        .domain_name("localhost"),
                )
                .unwrap()
                .connect()
                .await
                .unwrap();
        let mut grpc = tonic::client::Grpc::new(ch);
        grpc.ready().await.unwrap();
        let mut req = tonic::Request::new(Bytes::from_static(&[0xff, 0xff, 0xff, 0xff, 0x0f]));
        req.metadata_mut()
            .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(
            "/cipherlora.adapter.v1.AdapterService/OpenSession",
        );
        grpc.unary::<Bytes, Bytes, _>(req, path, RawCodec)
            .await
            .unwrap_err()
    });
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(
        cipherlora_service::status::reason_of(&status),
        Some(ErrorReason::MalformedRequest)
    );
}

/// Masked rows belong to masked sessions only: sent to a CKKS session they are refused with
/// `protocol_violation` before any computation, and so is a masked request that also carries
/// ciphertexts (`malformed_request`).
#[test]
fn masked_rows_on_a_ckks_session_are_refused_before_any_computation() {
    let fx = start(Limits::default());
    let mut c = AdapterClient::connect(fx.client_config()).unwrap();
    c.open_session(params(1)).unwrap();
    let sid = c.session_id().unwrap().0;
    let plan = c.session_info().unwrap().plan_id;
    let req = |ciphertexts| GroupRequest {
        batch: 0,
        masked: Some(cipherlora_proto::v1::MaskedRows {
            batches: vec![0],
            positions: vec![0],
            values: Bytes::from_static(&[1; 8]),
        }),
        session_id: Bytes::copy_from_slice(&sid),
        round: 0,
        layer: 0,
        group: 0,
        ciphertexts,
        plan_id: plan,
        response_bits: 0,
    };
    let s = raw_rounds(fx.server.addr(), &fx.cert, vec![req(vec![])]).unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument);
    assert_eq!(
        cipherlora_service::status::reason_of(&s),
        Some(ErrorReason::ProtocolViolation)
    );
    let both = vec![encode_ct(12, 2, &inputs(1, 0, 0, 0))];
    let s = raw_rounds(fx.server.addr(), &fx.cert, vec![req(both)]).unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument);
    assert_eq!(
        cipherlora_service::status::reason_of(&s),
        Some(ErrorReason::MalformedRequest)
    );
    // The session still answers its CKKS rounds.
    check(1, 0, 0, &c.round_pipelined(0, &calls(1, 0, 0)).unwrap());
}

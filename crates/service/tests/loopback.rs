//! Client and server in one process on 127.0.0.1 with TLS and token auth, using the plaintext test
//! backend (exact expected deltas).

mod common;

use std::time::Duration;

use bytes::Bytes;
use cipherlora_proto::ErrorReason;
use cipherlora_proto::v1::GroupRequest;
use cipherlora_service::testing::{MODULUS, encode_ct, test_galois_keys, test_public_key};
use cipherlora_service::{AdapterClient, Limits, ServiceError};
use common::*;
use tonic::Code;

fn rpc_err(e: ServiceError) -> (Code, Option<ErrorReason>) {
    match e {
        ServiceError::Rpc { code, reason, .. } => (code, reason),
        other => panic!("expected an RPC status, got {other}"),
    }
}

#[test]
fn loopback_tls_auth_round_trip_gives_exact_deltas() {
    let fx = start(Limits::default());
    let mut c = AdapterClient::connect(fx.client_config()).unwrap();

    let infos = c.list_adapters().unwrap();
    assert_eq!(infos.len(), 1);
    assert_eq!(infos[0].adapter_id, ADAPTER);
    assert_eq!(infos[0].num_layers, LAYERS);
    assert_eq!(infos[0].groups.len(), 2);
    assert_eq!(infos[0].base_model_sha256, [0x5a; 32]);
    assert!(infos[0].ckks_presets.contains(&"test-n4096".to_string()));
    // One adapter asked for by id, as a client opening a session does.
    let one = c.describe_adapter(ADAPTER).unwrap().expect("listed");
    assert_eq!((one.adapter_id.as_str(), one.num_layers), (ADAPTER, LAYERS));
    assert!(c.describe_adapter("not-served").unwrap().is_none());

    let info = c.open_session(params(1)).unwrap();
    assert_eq!(info.offer.positions, 8);
    assert_eq!(info.plan_id, cipherlora_proto::offer_id(&info.offer));

    for round in 0..3 {
        for layer in 0..LAYERS {
            let out = c.round_pipelined(round, &calls(1, round, layer)).unwrap();
            check(1, round, layer, &out);
        }
    }
    // The single-group call returns the same as the pipelined one.
    let one = c
        .round(2, 0, 5, calls(1, 5, 2).swap_remove(0).ciphertexts)
        .unwrap();
    let both = c.round_pipelined(5, &calls(1, 5, 2)).unwrap();
    assert_eq!(one, both[0]);
    c.close().unwrap();

    let m = fx.server.metrics();
    assert_eq!(
        m.requests("rounds", Code::Ok),
        3 * u64::from(LAYERS) * 2 + 3
    );
    assert_eq!(m.sessions_active(), 0);
    let text = scrape(fx.server.metrics_addr().unwrap());
    assert!(text.starts_with("HTTP/1.1 200 OK"));
    assert!(text.contains("cipherlora_requests_total{rpc=\"rounds\",code=\"OK\"} 27"));
    assert!(text.contains("cipherlora_group_compute_seconds_count{group=\"1\"}"));
    assert!(text.contains("cipherlora_sessions_total{event=\"closed\"} 1"));
    assert_eq!(c.stats().replays, 0);
    assert!(
        c.stats().server_micros > 0,
        "server compute time is reported"
    );
}

#[test]
fn bad_inputs_get_typed_statuses_while_an_honest_session_completes() {
    let limits = Limits {
        max_message_bytes: 1 << 20,
        max_ciphertexts_per_request: 4,
        max_key_bytes_per_session: 4096,
        ..Limits::default()
    };
    let fx = start(limits);

    // An honest client works through 30 rounds while the attacks go on.
    let honest_cfg = fx.client_config();
    let honest = std::thread::spawn(move || {
        let mut c = AdapterClient::connect(honest_cfg).unwrap();
        c.open_session(params(7)).unwrap();
        for round in 0..30 {
            let layer = (round % u64::from(LAYERS)) as u32;
            let out = c.round_pipelined(round, &calls(7, round, layer)).unwrap();
            check(7, round, layer, &out);
        }
        c.stats()
    });

    // Wrong token, then no token: UNAUTHENTICATED.
    for token in [Some("wrong-token-0123456789abcdef".to_string()), None] {
        let mut cfg = fx.client_config();
        cfg.token = token;
        let mut c = AdapterClient::connect(cfg).unwrap();
        let e = c.list_adapters().unwrap_err();
        assert_eq!(
            rpc_err(e),
            (Code::Unauthenticated, Some(ErrorReason::Unauthenticated))
        );
        let e = c.open_session(params(2)).unwrap_err();
        assert_eq!(rpc_err(e).0, Code::Unauthenticated);
    }

    // No TLS: a plaintext HTTP/2 client cannot talk to the TLS server.
    let mut cfg = fx.client_config();
    cfg.tls = None;
    cfg.endpoint = format!("http://127.0.0.1:{}", fx.server.addr().port());
    cfg.max_retries = 0;
    cfg.connect_timeout = Duration::from_secs(5);
    let plain = AdapterClient::connect(cfg).and_then(|mut c| c.list_adapters());
    let e = plain.expect_err("plaintext client must be refused");
    assert!(
        e.is_transient() || matches!(e, ServiceError::Transport(_)),
        "{e}"
    );

    // A client with a valid session sends bad requests; each is refused with a typed status and the
    // session stays usable.
    let mut bad = AdapterClient::connect(fx.client_config()).unwrap();
    bad.open_session(params(3)).unwrap();
    let good_ct = encode_ct(12, 2, &inputs(3, 0, 0, 0));
    let mut big = inputs(3, 0, 0, 0);
    big[17] = MODULUS * 1.5;
    let cases: Vec<(&str, u32, Vec<Bytes>, Code, ErrorReason)> = vec![
        (
            "truncated ciphertext",
            0,
            vec![good_ct.slice(..good_ct.len() - 9)],
            Code::InvalidArgument,
            ErrorReason::InvalidCiphertext,
        ),
        (
            "coefficient >= modulus",
            0,
            vec![encode_ct(12, 2, &big)],
            Code::InvalidArgument,
            ErrorReason::InvalidCiphertext,
        ),
        (
            "wrong N",
            0,
            vec![encode_ct(13, 2, &vec![0.5; 4096])],
            Code::InvalidArgument,
            ErrorReason::ParameterMismatch,
        ),
        (
            "wrong level",
            0,
            vec![encode_ct(12, 3, &inputs(3, 0, 0, 0))],
            Code::InvalidArgument,
            ErrorReason::ParameterMismatch,
        ),
        (
            "not a ciphertext",
            0,
            vec![Bytes::from_static(b"garbage bytes here")],
            Code::InvalidArgument,
            ErrorReason::InvalidCiphertext,
        ),
        (
            "layer that does not exist",
            LAYERS + 5,
            vec![good_ct.clone()],
            Code::NotFound,
            ErrorReason::UnknownLayer,
        ),
        (
            "wrong ciphertext count",
            0,
            vec![good_ct.clone(), good_ct.clone()],
            Code::InvalidArgument,
            ErrorReason::MalformedRequest,
        ),
        (
            "too many ciphertexts",
            0,
            vec![good_ct.clone(); 5],
            Code::ResourceExhausted,
            ErrorReason::LimitExceeded,
        ),
        (
            "empty ciphertext",
            0,
            vec![Bytes::new()],
            Code::InvalidArgument,
            ErrorReason::MalformedRequest,
        ),
    ];
    for (what, layer, cts, code, reason) in cases {
        let e = bad.round(layer, 0, 0, cts).unwrap_err();
        assert_eq!(rpc_err(e), (code, Some(reason)), "{what}");
        // The same session still computes correctly.
        let out = bad.round_pipelined(1, &calls(3, 1, 1)).unwrap();
        check(3, 1, 1, &out);
    }
    assert_eq!(bad.stats().replays, 0, "refusals must not be retried");

    // Oversized message: over the server's 1 MiB decode limit.
    let huge = vec![
        Bytes::from(vec![1u8; 600 << 10]),
        Bytes::from(vec![2u8; 600 << 10]),
    ];
    let e = bad.round(0, 0, 0, huge).unwrap_err();
    assert_eq!(
        rpc_err(e),
        (Code::OutOfRange, Some(ErrorReason::LimitExceeded)),
        "oversized message"
    );
    let out = bad.round_pipelined(2, &calls(3, 2, 0)).unwrap();
    check(3, 2, 0, &out);

    // Unknown session and a stream mixing sessions (forged with a raw client).
    let plan = bad.session_info().unwrap().plan_id;
    let forged = |sid: [u8; 16]| GroupRequest {
        batch: 0,
        masked: None,
        session_id: Bytes::copy_from_slice(&sid),
        round: 0,
        layer: 0,
        group: 0,
        ciphertexts: vec![encode_ct(12, 2, &inputs(3, 0, 0, 0))],
        plan_id: plan,
        response_bits: 0,
    };
    let s = raw_rounds(fx.server.addr(), &fx.cert, vec![forged([0xEE; 16])]).unwrap_err();
    assert_eq!(s.code(), Code::NotFound);
    assert_eq!(
        cipherlora_service::status::reason_of(&s),
        Some(ErrorReason::UnknownSession)
    );
    let real = bad.session_id().unwrap().0;
    let s = raw_rounds(
        fx.server.addr(),
        &fx.cert,
        vec![forged(real), forged([0xEE; 16])],
    )
    .unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument);
    assert_eq!(
        cipherlora_service::status::reason_of(&s),
        Some(ErrorReason::ProtocolViolation)
    );
    let mut short = forged(real);
    short.session_id = Bytes::from_static(&[1, 2, 3]);
    let s = raw_rounds(fx.server.addr(), &fx.cert, vec![short]).unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument);

    // Bad session openings.
    let mut opener = AdapterClient::connect(fx.client_config()).unwrap();
    let mut p = params(4);
    p.public_key = test_public_key(13, key_seed(4)); // N of another preset
    assert_eq!(
        rpc_err(opener.open_session(p).unwrap_err()),
        (Code::InvalidArgument, Some(ErrorReason::InvalidKey))
    );
    let mut p = params(4);
    p.galois_keys = test_galois_keys(&[1; 600]); // 4808 bytes > 4096 limit
    assert_eq!(
        rpc_err(opener.open_session(p).unwrap_err()),
        (Code::ResourceExhausted, Some(ErrorReason::LimitExceeded))
    );
    let mut p = params(4);
    p.adapter_id = "nope".into();
    assert_eq!(
        rpc_err(opener.open_session(p).unwrap_err()),
        (Code::NotFound, Some(ErrorReason::UnknownAdapter))
    );
    let mut p = params(4);
    p.ckks_preset = "n65536".into();
    assert_eq!(
        rpc_err(opener.open_session(p).unwrap_err()),
        (Code::InvalidArgument, Some(ErrorReason::ParameterMismatch))
    );
    let mut p = params(4);
    p.plan_request.positions = 65; // > 64
    assert_eq!(
        rpc_err(opener.open_session(p).unwrap_err()),
        (Code::InvalidArgument, Some(ErrorReason::InvalidPlan))
    );
    // A round before any session is a local error.
    assert!(matches!(
        opener.round(0, 0, 0, vec![good_ct]),
        Err(ServiceError::NoSession)
    ));

    let stats = honest.join().expect("honest client completed");
    assert_eq!(stats.replays, 0);
    let m = fx.server.metrics();
    assert!(m.requests("rounds", Code::InvalidArgument) >= 6);
    assert!(m.render().contains("cipherlora_auth_failures_total 4"));
}

#[test]
fn eight_concurrent_sessions_with_different_keys_get_their_own_deltas() {
    let fx = start(Limits::default());
    let threads: Vec<_> = (0..8u8)
        .map(|client| {
            let cfg = fx.client_config();
            std::thread::spawn(move || {
                let mut c = AdapterClient::connect(cfg).unwrap();
                c.open_session(params(10 + client)).unwrap();
                for round in 0..4 {
                    for layer in 0..LAYERS {
                        let out = c
                            .round_pipelined(round, &calls(10 + client, round, layer))
                            .unwrap();
                        check(10 + client, round, layer, &out);
                    }
                }
                c.close().unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().expect("client thread");
    }
    let m = fx.server.metrics();
    assert_eq!(
        m.requests("rounds", Code::Ok),
        8 * 4 * u64::from(LAYERS) * 2
    );
    assert_eq!(m.sessions_active(), 0);
}

#[test]
fn max_sessions_limit_refuses_the_extra_session_only() {
    let fx = start(Limits {
        max_sessions: 2,
        ..Limits::default()
    });
    let mut a = AdapterClient::connect(fx.client_config()).unwrap();
    let mut b = AdapterClient::connect(fx.client_config()).unwrap();
    let mut c = AdapterClient::connect(fx.client_config()).unwrap();
    a.open_session(params(1)).unwrap();
    b.open_session(params(2)).unwrap();
    assert_eq!(
        rpc_err(c.open_session(params(3)).unwrap_err()),
        (Code::ResourceExhausted, Some(ErrorReason::AtCapacity))
    );
    check(1, 0, 0, &a.round_pipelined(0, &calls(1, 0, 0)).unwrap());
    a.close().unwrap();
    c.open_session(params(3)).unwrap();
    check(3, 0, 0, &c.round_pipelined(0, &calls(3, 0, 0)).unwrap());
    check(2, 0, 1, &b.round_pipelined(0, &calls(2, 0, 1)).unwrap());
}

#[test]
fn an_opening_refused_at_capacity_waits_for_room_and_a_lasting_refusal_does_not() {
    let fx = start(Limits {
        max_sessions: 1,
        max_key_bytes_per_session: 4096,
        ..Limits::default()
    });
    let mut patient = fx.client_config();
    patient.open_wait = Duration::from_secs(20);
    let mut a = AdapterClient::connect(fx.client_config()).unwrap();
    a.open_session(params(1)).unwrap();
    let waiter = std::thread::spawn(move || {
        let mut c = AdapterClient::connect(patient).unwrap();
        let t0 = std::time::Instant::now();
        c.open_session(params(3)).unwrap();
        check(3, 0, 0, &c.round_pipelined(0, &calls(3, 0, 0)).unwrap());
        (t0.elapsed(), c.stats().open_retries)
    });
    std::thread::sleep(Duration::from_millis(800));
    a.close().unwrap();
    let (waited, retries) = waiter.join().unwrap();
    assert!(retries >= 1, "the refusal at capacity was retried");
    assert!(waited >= Duration::from_millis(700), "{waited:?}");
    // Too many key bytes for any session: refused at once, however patient.
    let mut patient = fx.client_config();
    patient.open_wait = Duration::from_secs(20);
    let mut d = AdapterClient::connect(patient).unwrap();
    let mut p = params(4);
    p.galois_keys = test_galois_keys(&[1; 600]);
    let t0 = std::time::Instant::now();
    assert_eq!(
        rpc_err(d.open_session(p).unwrap_err()),
        (Code::ResourceExhausted, Some(ErrorReason::LimitExceeded))
    );
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert_eq!(d.stats().open_retries, 0);
}

#[test]
fn duplicate_groups_in_one_round_are_refused_locally() {
    let fx = start(Limits::default());
    let mut c = AdapterClient::connect(fx.client_config()).unwrap();
    c.open_session(params(1)).unwrap();
    let mut cs = calls(1, 0, 0);
    cs.push(cs[0].clone());
    assert!(matches!(
        c.round_pipelined(0, &cs),
        Err(ServiceError::Config { .. })
    ));
}

#[test]
fn server_started_from_cert_and_token_files_like_the_cli() {
    use cipherlora_service::auth::TokenSet;
    use cipherlora_service::testing::TestBackend;
    use cipherlora_service::{
        AdapterBackend, ClientTls, ServeConfig, ServerThread, TlsConfig, write_dev_cert,
    };
    use std::sync::Arc;

    let mut raw = [0u8; 8];
    getrandom::fill(&mut raw).unwrap();
    let dir = std::env::temp_dir().join(format!(
        "cipherlora-service-test-{}-{}",
        std::process::id(),
        u64::from_le_bytes(raw)
    ));
    let paths = write_dev_cert(&dir, &["localhost", "127.0.0.1"]).unwrap();
    let token_file = dir.join("tokens");
    std::fs::write(&token_file, format!("# clients\n\n{TOKEN}\n")).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&paths.key).unwrap().permissions().mode();
        assert_eq!(
            mode & 0o777,
            0o600,
            "private key must not be world-readable"
        );
    }

    let mut cfg = ServeConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.tls = Some(TlsConfig::from_files(&paths.cert, &paths.key).unwrap());
    cfg.tokens = Some(TokenSet::from_file(&token_file).unwrap());
    let backends: Vec<Arc<dyn AdapterBackend>> = vec![Arc::new(TestBackend::new(ADAPTER, LAYERS))];
    let server = ServerThread::start(cfg, backends, 1).unwrap();

    let mut ccfg = cipherlora_service::ClientConfig::new(format!(
        "https://127.0.0.1:{}",
        server.addr().port()
    ));
    ccfg.tls = Some(ClientTls::from_file(&paths.ca, "localhost").unwrap());
    ccfg.token = Some(TOKEN.into());
    let mut c = AdapterClient::connect(ccfg).unwrap();
    c.open_session(params(9)).unwrap();
    check(9, 0, 3, &c.round_pipelined(0, &calls(9, 0, 3)).unwrap());
    c.close().unwrap();
    server.stop().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn session_request_budget_is_enforced() {
    let fx = start(Limits {
        max_requests_per_session: 3,
        ..Limits::default()
    });
    let mut c = AdapterClient::connect(fx.client_config()).unwrap();
    c.open_session(params(1)).unwrap();
    check(1, 0, 0, &c.round_pipelined(0, &calls(1, 0, 0)).unwrap());
    let one = calls(1, 1, 0).swap_remove(0);
    c.round(0, 0, 1, one.ciphertexts.clone()).unwrap();
    assert_eq!(
        rpc_err(c.round(0, 0, 2, one.ciphertexts).unwrap_err()),
        (Code::ResourceExhausted, Some(ErrorReason::LimitExceeded))
    );
    // A fresh session has its own budget.
    let mut d = AdapterClient::connect(fx.client_config()).unwrap();
    d.open_session(params(2)).unwrap();
    check(2, 0, 1, &d.round_pipelined(0, &calls(2, 0, 1)).unwrap());
}

/// Regression: `bench e2e` opened two sessions per configuration and never closed them; the server
/// kept every session's keys (and, with the HE backend, its pre-encoded diagonals) until idle
/// eviction and was killed for running out of memory. Dropping a client now closes its session.
#[test]
fn dropping_a_client_closes_its_session_on_the_server() {
    let fx = start(Limits::default());
    let m = fx.server.metrics();
    for id in 1..=3 {
        let mut c = AdapterClient::connect(fx.client_config()).unwrap();
        c.open_session(params(id)).unwrap();
        let out = c.round_pipelined(0, &calls(id, 0, 0)).unwrap();
        check(id, 0, 0, &out);
        assert_eq!(m.sessions_active(), 1);
        drop(c);
        assert_eq!(m.sessions_active(), 0, "session {id} outlived its client");
    }
    let text = scrape(fx.server.metrics_addr().unwrap());
    assert!(
        text.contains("cipherlora_sessions_total{event=\"closed\"} 3"),
        "{text}"
    );
}

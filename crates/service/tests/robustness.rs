//! Dropped connections, evicted sessions and shutdown: rounds are replayed and
//! give exactly the result of an uninterrupted run.

mod common;

use std::time::Duration;

use bytes::Bytes;
use cipherlora_service::{AdapterClient, Limits};
use common::*;
use tonic::Code;

/// Runs rounds 0..4 over layers 0..LAYERS and returns every answer's bytes.
fn run(c: &mut AdapterClient, before_round: impl Fn(u64)) -> Vec<Vec<Vec<Bytes>>> {
    let mut all = Vec::new();
    for round in 0..4 {
        before_round(round);
        for layer in 0..LAYERS {
            let out = c.round_pipelined(round, &calls(5, round, layer)).unwrap();
            check(5, round, layer, &out);
            all.push(out);
        }
    }
    all
}

#[test]
fn round_replayed_after_dropped_connection_gives_identical_responses() {
    let fx = start(Limits::default());

    // Reference: uninterrupted, direct.
    let mut direct = AdapterClient::connect(fx.client_config()).unwrap();
    direct.open_session(params(5)).unwrap();
    let reference = run(&mut direct, |_| {});
    assert_eq!(direct.stats().replays, 0);

    // Through a proxy that cuts the TCP connection in the middle of the
    // upload of round 2 (about 20 KB into a ~33 KB pipelined request pair).
    let proxy = Proxy::start(fx.server.addr());
    let mut cfg = fx.client_config();
    cfg.endpoint = format!("https://127.0.0.1:{}", proxy.addr.port());
    let mut c = AdapterClient::connect(cfg).unwrap();
    c.open_session(params(5)).unwrap();
    let cut = run(&mut c, |round| {
        if round == 2 {
            proxy.cut_after(20_000);
        }
    });
    assert!(proxy.has_cut(), "the proxy must have cut the connection");
    let s = c.stats();
    assert!(s.replays >= 1, "round must have been replayed: {s:?}");
    assert!(s.connects >= 2, "client must have reconnected: {s:?}");
    // The server kept the session: no reopen was needed.
    assert_eq!(s.sessions_opened, 1);
    assert_eq!(
        cut, reference,
        "replayed rounds differ from the uninterrupted run"
    );
}

#[test]
fn evicted_session_is_reopened_and_the_round_replayed() {
    let fx = start(Limits {
        idle_timeout: Duration::from_millis(100),
        ..Limits::default()
    });
    let mut c = AdapterClient::connect(fx.client_config()).unwrap();
    c.open_session(params(5)).unwrap();
    let first = c.session_id().unwrap();
    check(5, 0, 0, &c.round_pipelined(0, &calls(5, 0, 0)).unwrap());
    // Idle long enough to be evicted (eviction runs every 25 ms).
    let m = fx.server.metrics();
    for _ in 0..200 {
        if m.render()
            .contains("cipherlora_sessions_total{event=\"evicted\"} 1")
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(m.sessions_active(), 0, "session must have been evicted");
    let out = c.round_pipelined(1, &calls(5, 1, 2)).unwrap();
    check(5, 1, 2, &out);
    let s = c.stats();
    assert_eq!(s.sessions_opened, 2, "{s:?}");
    assert!(s.replays >= 1);
    assert_ne!(c.session_id().unwrap(), first);
}

#[test]
fn graceful_shutdown_stops_the_server_and_clients_see_a_transient_error() {
    let fx = start(Limits {
        shutdown_grace: Duration::from_secs(1),
        ..Limits::default()
    });
    let mut cfg = fx.client_config();
    cfg.max_retries = 1;
    let mut c = AdapterClient::connect(cfg).unwrap();
    c.open_session(params(5)).unwrap();
    check(5, 0, 0, &c.round_pipelined(0, &calls(5, 0, 0)).unwrap());
    let Fixture { server, .. } = fx;
    server.stop().expect("clean shutdown");
    let e = c.round_pipelined(1, &calls(5, 1, 0)).unwrap_err();
    assert!(e.is_transient(), "{e}");
    assert_ne!(e.code(), Some(Code::InvalidArgument));
}

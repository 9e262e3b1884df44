//! Logs (every target, TRACE level: ours, tonic, h2, hyper, rustls) never
//! contain key bytes, ciphertext bytes or the bearer token, on good and bad
//! requests alike. Own test binary: it installs the global subscriber.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use cipherlora_proto::v1::{GroupRequest, PlanRequest};
use cipherlora_service::testing::{encode_ct, test_galois_keys, test_public_key};
use cipherlora_service::{AdapterClient, Limits, SessionParams};
use common::*;

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn logs_never_contain_keys_ciphertexts_or_tokens() {
    let cap = Capture::default();
    let writer = cap.clone();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();

    let fx = start(Limits::default());
    let mut c = AdapterClient::connect(fx.client_config()).unwrap();
    let key_marker = *b"KEYMATERIALMARKERKEYMATERIALMARK";
    let params = SessionParams {
        adapter_id: ADAPTER.into(),
        ckks_preset: "test-n4096".into(),
        public_key: test_public_key(12, key_marker),
        galois_keys: test_galois_keys(&[0x4b45_594d_4152_4b52]), // "KEYMARKR"
        plan_request: PlanRequest {
            positions: 8,
            ..PlanRequest::default()
        },
    };
    c.open_session(params).unwrap();
    // Good rounds, then a malformed ciphertext full of marker bytes.
    let x: Vec<f64> = vec![1.0; SLOTS];
    let good = encode_ct(12, 2, &x);
    c.round(0, 0, 0, vec![good.clone()]).unwrap();
    let bad = Bytes::from(b"CTMARKERCTMARKERCTMARKERCTMARKER".repeat(8));
    assert!(c.round(0, 0, 1, vec![bad]).is_err());
    let mut wrong = fx.client_config();
    wrong.token = Some("WRONGTOKENMARKER0123456789".into());
    let mut w = AdapterClient::connect(wrong).unwrap();
    assert!(w.list_adapters().is_err());
    let _ = c.round_pipelined(
        2,
        &[GroupRequest {
            layer: 1,
            group: 1,
            ciphertexts: vec![good],
            ..GroupRequest::default()
        }],
    );
    c.close().unwrap();
    drop(fx);

    let text = String::from_utf8_lossy(&cap.0.lock().unwrap()).to_string();
    assert!(text.contains("opened session"), "our logs were captured");
    assert!(text.contains("h2::"), "transport TRACE logs were captured");
    assert!(text.contains("refused group request") || text.contains("refused by backend"));
    for marker in [
        "KEYMATERIAL",
        "KEYMARKR",
        "RKRAMYEK",
        "CTMARKER",
        "WRONGTOKEN",
        TOKEN,
    ] {
        assert!(!text.contains(marker), "log contains {marker:?}");
    }
    // No Debug dump of key material bytes either (75 = 'K' of the marker).
    assert!(!text.contains("75, 69, 89, 77"), "log contains key bytes");
}

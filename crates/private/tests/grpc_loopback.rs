//! End to end over the network: the HE backend behind the gRPC service (TLS with a development
//! certificate, a bearer token) on loopback, the client's HE hook over it, speculative decoding on
//! the real default model. The private greedy output must equal the plaintext adapted output; a
//! malformed request from another session is refused with a typed status and does not disturb the
//! honest session.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use cipherlora_helora::{CkksClient, HeClient};
use cipherlora_model::{LoraAdapter, Model, Tokenizer, fetch};
use cipherlora_private::Grouping;
use cipherlora_private::remote::{
    GrpcTransport, HeBackend, connect_remote, connect_widths, fetch_offer,
};
use cipherlora_proto::ErrorReason;
use cipherlora_service::auth::TokenSet;
use cipherlora_service::{
    AdapterBackend, AdapterClient, ClientConfig, DevCert, ServeConfig, ServerThread, dev_cert,
};
use cipherlora_speculative::decode::{self, SpecConfig};
use tonic::Code;

const ADAPTER: &str = "code-ffa-r16";
const TOKEN: &str = "loopback-test-token-0123456789abcdef";
const K: usize = 4;
const TOKENS: usize = 16;
const PREFILL: usize = 8;
/// Two of the held-out prompts.
const PROMPTS: [&str; 2] = [common::PROMPTS[0], common::PROMPTS[3]];

fn adapter_dir() -> std::path::PathBuf {
    common::adapter_dir(ADAPTER)
}

fn start(model: &Model) -> (ServerThread, DevCert) {
    let backend = HeBackend::load(ADAPTER, &adapter_dir(), model.config()).unwrap();
    let info = backend.info();
    assert_eq!(info.adapter_id, ADAPTER);
    assert_eq!(info.rank, 16);
    assert_eq!(info.lora_alpha, 32.0);
    assert_eq!(
        info.target_modules,
        ["k_proj", "o_proj", "q_proj", "v_proj"]
    );
    assert_eq!(info.num_layers as usize, model.config().num_layers);
    assert_eq!(
        info.groups,
        [vec!["q_proj", "k_proj", "v_proj"], vec!["o_proj"]]
    );
    assert_eq!(info.base_model_sha256[0], 0xb1);
    assert!(info.ffa_lora_a.is_some());
    let cert = dev_cert(&["localhost", "127.0.0.1"]).unwrap();
    let mut config = ServeConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)));
    config.tls = Some(cert.server_tls());
    config.tokens = Some(TokenSet::new(&[TOKEN]).unwrap());
    let server = ServerThread::start(config, vec![Arc::new(backend)], 2).unwrap();
    (server, cert)
}

fn client_config(server: &ServerThread, cert: &DevCert) -> ClientConfig {
    let mut c = ClientConfig::new(format!("https://localhost:{}", server.addr().port()));
    c.tls = Some(cert.client_tls("localhost"));
    c.token = Some(TOKEN.into());
    c
}

#[test]
fn grpc_private_generation_equals_plaintext_and_survives_a_malformed_session() {
    let path = fetch::ensure_default_model().expect("default model");
    let model = Model::load(&path).unwrap();
    let tok = Tokenizer::for_model(&path).unwrap();
    let (server, cert) = start(&model);
    let config = client_config(&server, &cert);

    // Verify passes of K+1 positions, prefill passes of PREFILL through a second session: both must
    // give the plaintext result.
    let mut hook = connect_widths(
        config.clone(),
        ADAPTER,
        (K + 1, Grouping::ByInput),
        PREFILL,
        model.config(),
    )
    .unwrap();

    // A wrong token is refused with its gRPC status, kept in the typed error.
    let mut wrong = config.clone();
    wrong.token = Some("not-the-token-0123456789abcdef-xyz".into());
    match connect_remote(wrong, ADAPTER, K + 1, Grouping::ByInput, model.config()) {
        Err(cipherlora_private::PrivateError::Service(e)) => {
            assert_eq!(e.code(), Some(Code::Unauthenticated), "{e}")
        }
        other => panic!("a wrong token must be refused, got {other:?}"),
    }

    // A second session sends bad requests; each is refused before any arithmetic with its typed
    // status.
    let mut raw = AdapterClient::connect(config.clone()).unwrap();
    let offer = fetch_offer(&mut raw, ADAPTER, K + 1, Grouping::ByInput).unwrap();
    let public_a =
        cipherlora_private::protocol::decode_public_a(offer.info.ffa_lora_a.as_ref().unwrap())
            .unwrap();
    assert_eq!(public_a.len(), 4 * model.config().num_layers);
    let first = &offer.offer.groups[0];
    assert_eq!(public_a[0].a, first.public_a.as_ref().unwrap()[0]);
    let ctx = cipherlora_ckks::Context::new(
        cipherlora_ckks::CkksParameters::preset(offer.offer.preset).unwrap(),
    )
    .unwrap();
    let he = CkksClient::new(&ctx).unwrap();
    let steps: Vec<i64> = offer
        .offer
        .groups
        .iter()
        .flat_map(|g| g.plan.galois_steps().unwrap())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let keys = he.galois_keys(&steps).to_bytes();
    let mut bad = GrpcTransport::open(raw, &offer, &keys, None).unwrap();
    let n_in = first.plan.input_cts().unwrap();
    let layer = first.layer as u32;
    let refused = |e: cipherlora_service::ServiceError, code: Code, reason: ErrorReason| {
        assert_eq!((e.code(), e.reason()), (Some(code), Some(reason)), "{e}");
    };
    let garbage = vec![Bytes::from_static(b"not a ciphertext"); n_in];
    let e = bad.client_mut().round(layer, 0, 1, garbage).unwrap_err();
    refused(e, Code::InvalidArgument, ErrorReason::InvalidCiphertext);
    let low = Bytes::from(he.encrypt_to_bytes(&[0.5; 8], &[], 0).unwrap());
    let e = bad
        .client_mut()
        .round(layer, 0, 2, vec![low; n_in])
        .unwrap_err();
    refused(e, Code::InvalidArgument, ErrorReason::ParameterMismatch);
    let e = bad
        .client_mut()
        .round(layer, 0, 3, vec![Bytes::from_static(b"x"); n_in + 1])
        .unwrap_err();
    refused(e, Code::InvalidArgument, ErrorReason::MalformedRequest);
    let e = bad
        .client_mut()
        .round(999, 0, 4, vec![Bytes::from_static(b"x"); n_in])
        .unwrap_err();
    refused(e, Code::NotFound, ErrorReason::UnknownLayer);

    let plain = LoraAdapter::load(&adapter_dir(), model.config()).unwrap();
    for text in PROMPTS {
        let prompt = tok.encode(text).unwrap();
        let want = common::plaintext_reference(&model, &tok, &plain, &prompt, TOKENS);
        let cfg = SpecConfig {
            prefill_width: Some(PREFILL),
            optimistic: true,
            first_token_from_prefill: true,
            prefill_span: cipherlora_speculative::decode::PrefillSpan::default(),
            ..common::greedy_spec(K, TOKENS, &tok)
        };
        let got = decode::generate(&model, &prompt, &cfg, &mut hook, &mut |_| Ok(())).unwrap();
        common::assert_matches(&got, &want, &tok, &format!("over gRPC on {text:?}"));
    }
    let t = hook.timings();
    eprintln!("{ADAPTER} over gRPC: {t:?}");
    assert!(t.rounds > 0 && t.bytes_up > 0 && t.bytes_down > 0 && t.server_ms > 0.0);
    for width in [K + 1, PREFILL] {
        let s = hook.session(width).unwrap().timings();
        assert!(s.rounds > 0, "the width-{width} session was never used");
    }
    drop(hook);
    drop(bad);
    server.stop().unwrap();
}

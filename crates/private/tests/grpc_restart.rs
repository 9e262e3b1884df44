//! A server restart during a private generation: the HE backend behind gRPC + TLS on loopback is
//! stopped after a few rounds and started again on the same address two seconds later. The client
//! retries with backoff, reopens its session (the restarted server plans from the same cached op
//! costs, so the plan is the same) and the output equals the plaintext reference.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cipherlora_model::{LoraAdapter, Model, Tokenizer, fetch};
use cipherlora_private::Grouping;
use cipherlora_private::remote::{HeBackend, connect_remote};
use cipherlora_service::auth::TokenSet;
use cipherlora_service::{ClientConfig, DevCert, ServeConfig, ServerThread, dev_cert};
use cipherlora_speculative::decode::{self};
use tonic::Code;

const ADAPTER: &str = "code-ffa-r16";
const TOKEN: &str = "restart-test-token-0123456789abcdef";
const K: usize = 4;
const TOKENS: usize = 24;

fn start(model: &Model, cert: &DevCert, listen: SocketAddr) -> ServerThread {
    let backend = HeBackend::load(ADAPTER, &common::adapter_dir(ADAPTER), model.config()).unwrap();
    let mut config = ServeConfig::new(listen);
    config.tls = Some(cert.server_tls());
    config.tokens = Some(TokenSet::new(&[TOKEN]).unwrap());
    ServerThread::start(config, vec![Arc::new(backend)], 2).unwrap()
}

#[test]
fn server_restart_during_generation_resumes_with_the_plaintext_output() {
    let path = fetch::ensure_default_model().expect("default model");
    let model = Model::load(&path).unwrap();
    let tok = Tokenizer::for_model(&path).unwrap();
    let cert = dev_cert(&["localhost"]).unwrap();
    let server = start(&model, &cert, SocketAddr::from(([127, 0, 0, 1], 0)));
    let addr = server.addr();
    let metrics = server.metrics();
    let mut config = ClientConfig::new(format!("https://localhost:{}", addr.port()));
    config.tls = Some(cert.client_tls("localhost"));
    config.token = Some(TOKEN.into());
    let mut hook =
        connect_remote(config, ADAPTER, K + 1, Grouping::ByInput, model.config()).unwrap();

    let plain = LoraAdapter::load(&common::adapter_dir(ADAPTER), model.config()).unwrap();
    let prompt = tok.encode(common::PROMPTS[1]).unwrap();
    let want = common::plaintext_reference(&model, &tok, &plain, &prompt, TOKENS);

    // Kill the server once it has answered a few verify rounds' groups; restart it 2 s later on the
    // same address.
    let model = Arc::new(model);
    let restarter = {
        let (model, cert) = (model.clone(), cert.clone());
        std::thread::spawn(move || {
            let t0 = Instant::now();
            while metrics.requests("rounds", Code::Ok) < 150 {
                assert!(t0.elapsed() < Duration::from_secs(600), "no rounds");
                std::thread::sleep(Duration::from_millis(5));
            }
            server.stop().unwrap();
            std::thread::sleep(Duration::from_secs(2));
            start(&model, &cert, addr)
        })
    };
    let spec = common::greedy_spec(K, TOKENS, &tok);
    let got = decode::generate(&model, &prompt, &spec, &mut hook, &mut |_| Ok(())).unwrap();
    let restarted = restarter.join().unwrap();
    common::assert_matches(&got, &want, &tok, "across a server restart");
    let stats = hook.transport().client().stats();
    assert!(stats.sessions_opened >= 2, "{stats:?}");
    assert!(stats.replays >= 1, "{stats:?}");
    drop(hook);
    restarted.stop().unwrap();
}

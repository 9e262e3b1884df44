//! Fuzz run against the real HE backend (ignored: minutes): malformed group requests made from real
//! CKKS ciphertexts — truncated, extended, doubled, bytes flipped (header and body), replaced by
//! noise, at the wrong level, too few or too many, unknown layers and groups — sent on a keyed FFA
//! session over gRPC + TLS, while an honest client generates privately.
//!
//! ```sh
//! CIPHERLORA_FUZZ_N=100000 cargo test -p cipherlora-private --test fuzz_he -- --ignored --nocapture
//! ```
//!
//! Passes when every refusal is a typed status (`INTERNAL`, `UNKNOWN` and transport failures fail
//! it), no request panics the server, the honest output equals the plaintext reference, and the
//! process RSS grows by less than 256 MiB from a tenth of the run to its end. Prints the count per
//! outcome and the RSS at both points.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use cipherlora_helora::{CkksClient, HeClient};
use cipherlora_model::{LoraAdapter, Model, Tokenizer, fetch};
use cipherlora_private::Grouping;
use cipherlora_private::remote::{GrpcTransport, HeBackend, connect_widths, fetch_offer};
use cipherlora_service::auth::TokenSet;
use cipherlora_service::{AdapterClient, ClientConfig, ServeConfig, ServerThread, dev_cert};
use cipherlora_speculative::decode::{self, SpecConfig};
use tonic::Code;

const ADAPTER: &str = "code-ffa-r16";
const TOKEN: &str = "fuzz-he-test-token-0123456789abcdef";
const K: usize = 4;

/// xorshift64*: deterministic and seedable.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn rss_mib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb / 1024)
}

/// One malformed request from valid ciphertexts `seed` of (`layer`, group 0).
fn mutate(
    rng: &mut Rng,
    seed: &[Bytes],
    low: &Bytes,
    layers: u32,
) -> (&'static str, u32, u32, Vec<Bytes>) {
    let mut cts: Vec<Bytes> = seed.to_vec();
    let i = rng.below(cts.len());
    let ct = cts[i].to_vec();
    let (layer, group) = (rng.below(layers as usize) as u32, 0);
    let kind = match rng.below(10) {
        0 => {
            cts[i] = Bytes::from(ct[..rng.below(ct.len())].to_vec());
            "truncated"
        }
        1 => {
            let mut v = ct;
            let at = rng.below(64.min(v.len()));
            v[at] ^= 1 << rng.below(8);
            cts[i] = Bytes::from(v);
            "header bit flipped"
        }
        2 => {
            let mut v = ct;
            for _ in 0..1 + rng.below(8) {
                let at = rng.below(v.len());
                v[at] = rng.next() as u8;
            }
            cts[i] = Bytes::from(v);
            "body bytes replaced"
        }
        3 => {
            let mut v = ct;
            v.extend((0..1 + rng.below(4096)).map(|_| rng.next() as u8));
            cts[i] = Bytes::from(v);
            "extended"
        }
        4 => {
            let mut v = ct.clone();
            v.extend_from_slice(&ct);
            cts[i] = Bytes::from(v);
            "doubled"
        }
        5 => {
            cts[i] = Bytes::from((0..ct.len()).map(|_| rng.next() as u8).collect::<Vec<u8>>());
            "noise of the same length"
        }
        6 => {
            cts[i] = low.clone();
            "wrong level"
        }
        7 => {
            if rng.below(2) == 0 {
                cts.pop();
            } else {
                cts.push(cts[0].clone());
            }
            "wrong count"
        }
        8 => return ("unknown layer", layers + rng.below(1000) as u32, 0, cts),
        _ => return ("unknown group", layer, 2 + rng.below(100) as u32, cts),
    };
    (kind, layer, group, cts)
}

#[test]
#[ignore = "minutes; run by hand before resolving (see the module docs)"]
fn fuzz_the_he_backend_while_an_honest_client_generates() {
    let n: usize = std::env::var("CIPHERLORA_FUZZ_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let path = fetch::ensure_default_model().expect("default model");
    let model = Model::load(&path).unwrap();
    let dir = common::adapter_dir(ADAPTER);
    let backend = HeBackend::load(ADAPTER, &dir, model.config()).unwrap();
    let cert = dev_cert(&["localhost", "127.0.0.1"]).unwrap();
    let mut serve = ServeConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)));
    serve.tls = Some(cert.server_tls());
    serve.tokens = Some(TokenSet::new(&[TOKEN]).unwrap());
    let server = ServerThread::start(serve, vec![Arc::new(backend)], 2).unwrap();
    let mut config = ClientConfig::new(format!("https://localhost:{}", server.addr().port()));
    config.tls = Some(cert.client_tls("localhost"));
    config.token = Some(TOKEN.into());

    // The attacker: a keyed session of its own, and valid ciphertexts of the right level (found by
    // trying each level) to mutate.
    let mut raw_config = config.clone();
    raw_config.max_retries = 0;
    let mut raw = AdapterClient::connect(raw_config).unwrap();
    let offer = fetch_offer(&mut raw, ADAPTER, K + 1, Grouping::ByInput).unwrap();
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
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let keys = he.galois_keys(&steps).to_bytes();
    let mut bad = GrpcTransport::open(raw, &offer, &keys, None).unwrap();
    let first = &offer.offer.groups[0];
    let n_in = first.plan.input_cts().unwrap();
    let layers = model.config().num_layers as u32;
    let mut round = 0u64;
    let mut by_level = Vec::new();
    for level in 0..3 {
        let ct = Bytes::from(he.encrypt_to_bytes(&[0.25; 64], &[], level).unwrap());
        round += 1;
        let ok = bad
            .client_mut()
            .round(first.layer as u32, 0, round, vec![ct.clone(); n_in])
            .is_ok();
        by_level.push((ok, ct));
    }
    let seed: Vec<Bytes> = vec![
        by_level
            .iter()
            .find(|(ok, _)| *ok)
            .expect("one level is the plan's")
            .1
            .clone();
        n_in
    ];
    let low = by_level
        .iter()
        .find(|(ok, _)| !*ok)
        .expect("another level")
        .1
        .clone();

    // The honest client, in parallel.
    let honest = {
        let config = config.clone();
        let model_path = path.clone();
        std::thread::spawn(move || {
            let model = Model::load(&model_path).unwrap();
            let tok = Tokenizer::for_model(&model_path).unwrap();
            let plain = LoraAdapter::load(&common::adapter_dir(ADAPTER), model.config()).unwrap();
            let mut hook = connect_widths(
                config,
                ADAPTER,
                (K + 1, Grouping::ByInput),
                8,
                model.config(),
            )
            .unwrap();
            for text in [common::PROMPTS[1], common::PROMPTS[4]] {
                let prompt = tok.encode(text).unwrap();
                let want = common::plaintext_reference(&model, &tok, &plain, &prompt, 16);
                let cfg = SpecConfig {
                    prefill_width: Some(8),
                    first_token_from_prefill: true,
                    prefill_span: cipherlora_speculative::decode::PrefillSpan::default(),
                    ..common::greedy_spec(K, 16, &tok)
                };
                let got =
                    decode::generate(&model, &prompt, &cfg, &mut hook, &mut |_| Ok(())).unwrap();
                common::assert_matches(&got, &want, &tok, "honest client during the fuzz run");
            }
        })
    };

    // RSS is compared from a tenth of the run on: by then the honest client has loaded its model
    // and opened its sessions.
    let mut rss_before = 0;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut outcomes: BTreeMap<(&str, String), usize> = BTreeMap::new();
    let t0 = std::time::Instant::now();
    for i in 0..n {
        if i == n / 10 {
            rss_before = rss_mib();
        }
        let (kind, layer, group, cts) = mutate(&mut rng, &seed, &low, layers);
        round += 1;
        let outcome = match bad.client_mut().round(layer, group, round, cts) {
            Ok(_) => "answered".to_string(),
            Err(e) => {
                let code = e.code();
                assert!(
                    matches!(code, Some(c) if c != Code::Internal && c != Code::Unknown && c != Code::Unavailable),
                    "{kind}: untyped or transport failure: {e}"
                );
                format!("{:?}", code.unwrap())
            }
        };
        *outcomes.entry((kind, outcome)).or_default() += 1;
    }
    let secs = t0.elapsed().as_secs_f64();
    let rss_after = rss_mib();
    honest.join().expect("the honest client");
    for ((kind, outcome), count) in &outcomes {
        eprintln!("{kind:>26}  {outcome:<18} {count}");
    }
    eprintln!(
        "{n} malformed requests in {secs:.1} s; process RSS after a tenth of them {rss_before} MiB, at the end {rss_after} MiB"
    );
    assert!(
        rss_after < rss_before + 256,
        "RSS grew from {rss_before} to {rss_after} MiB"
    );
    // The server still serves a well-formed request.
    round += 1;
    bad.client_mut()
        .round(first.layer as u32, 0, round, seed.clone())
        .expect("the server still answers");
    drop(bad);
    server.stop().unwrap();
}

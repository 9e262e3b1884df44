//! Load test (ignored: minutes on two cores): 16 concurrent private generations over gRPC + TLS on
//! loopback, 8 on the FFA adapter and 8 on the standard one, each its own session of T = 9
//! positions (K = 8) and its own bearer token, against one server holding both adapters. Every
//! output must equal its plaintext reference; the server's diagonal memory must be one copy per
//! adapter, not one per session.
//!
//! ```sh
//! cargo test --release -p cipherlora-private --test load_16_sessions -- --ignored --nocapture
//! ```
//!
//! Prints the diagonal bytes reserved (peak) next to what per-session copies would have reserved,
//! and the process RSS (server and the 16 clients share the process) before, at peak and after.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use cipherlora_model::{LoraAdapter, Model, Tokenizer, fetch};
use cipherlora_private::remote::{HeBackend, connect_remote};
use cipherlora_private::{Grouping, SessionMemory};
use cipherlora_service::auth::TokenSet;
use cipherlora_service::{AdapterBackend, ClientConfig, ServeConfig, ServerThread, dev_cert};
use cipherlora_speculative::decode::{self};

const ADAPTERS: [&str; 2] = ["code-ffa-r16", "code-lora-r16"];
const PER_ADAPTER: usize = 8;
const K: usize = 8;
const TOKENS: usize = 8;

/// `VmRSS` and `VmHWM` of this process, bytes.
fn rss() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn gib(b: u64) -> f64 {
    b as f64 / f64::from(1u32 << 30)
}

#[test]
#[ignore = "load test: minutes; run with --ignored --nocapture"]
fn sixteen_concurrent_sessions_share_the_diagonals_and_match_plaintext() {
    let path = fetch::ensure_default_model().expect("default model");
    let model = Model::load(&path).unwrap();
    let tok = Tokenizer::for_model(&path).unwrap();
    let memory = SessionMemory::default();
    let mut backends: Vec<Arc<dyn AdapterBackend>> = Vec::new();
    let mut per_session = Vec::new();
    for a in ADAPTERS {
        let b = HeBackend::load(a, &common::adapter_dir(a), model.config())
            .unwrap()
            .with_session_memory(memory.clone());
        per_session.push(b.server().offer(K + 1).unwrap().diagonal_bytes().unwrap());
        backends.push(Arc::new(b));
    }
    let tokens: Vec<String> = (0..ADAPTERS.len() * PER_ADAPTER)
        .map(|i| format!("load-test-token-{i:02}-0123456789abcdef"))
        .collect();
    let cert = dev_cert(&["localhost"]).unwrap();
    let mut config = ServeConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)));
    config.tls = Some(cert.server_tls());
    config.tokens = Some(TokenSet::new(&tokens).unwrap());
    let server = ServerThread::start(config, backends, 2).unwrap();

    // References first (plaintext, merged adapter).
    let mut jobs = Vec::new();
    for (ai, a) in ADAPTERS.iter().enumerate() {
        let plain = LoraAdapter::load(&common::adapter_dir(a), model.config()).unwrap();
        for i in 0..PER_ADAPTER {
            let text = common::PROMPTS[i % common::PROMPTS.len()];
            let prompt = tok.encode(text).unwrap();
            let want = common::plaintext_reference(&model, &tok, &plain, &prompt, TOKENS);
            jobs.push((ai, i, *a, prompt, want));
        }
    }

    let (rss_before, _) = rss();
    let reserved_before = memory.reserved();
    let peak_reserved = Arc::new(AtomicU64::new(0));
    let peak_rss = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let monitor = {
        let (memory, peak_reserved, peak_rss, done) = (
            memory.clone(),
            peak_reserved.clone(),
            peak_rss.clone(),
            done.clone(),
        );
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak_reserved.fetch_max(memory.reserved(), Ordering::Relaxed);
                peak_rss.fetch_max(rss().0, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let t0 = Instant::now();
    let all_open = Arc::new(Barrier::new(jobs.len()));
    let model = Arc::new(model);
    let tok = Arc::new(tok);
    let handles: Vec<_> = jobs
        .into_iter()
        .enumerate()
        .map(|(n, (ai, i, adapter, prompt, want))| {
            let mut cfg = ClientConfig::new(format!("https://localhost:{}", server.addr().port()));
            cfg.tls = Some(cert.client_tls("localhost"));
            cfg.token = Some(tokens[n].clone());
            let (model, tok, all_open) = (model.clone(), tok.clone(), all_open.clone());
            std::thread::spawn(move || {
                let mut hook =
                    connect_remote(cfg, adapter, K + 1, Grouping::ByInput, model.config()).unwrap();
                // Every session is open before any generates: 16 at once.
                all_open.wait();
                let spec = common::greedy_spec(K, TOKENS, &tok);
                let got =
                    decode::generate(&model, &prompt, &spec, &mut hook, &mut |_| Ok(())).unwrap();
                common::assert_matches(&got, &want, &tok, &format!("{adapter} client {i}"));
                let _ = ai;
            })
        })
        .collect();
    for h in handles {
        h.join().expect("a client failed");
    }
    let took = t0.elapsed();
    done.store(true, Ordering::Relaxed);
    monitor.join().unwrap();
    let (rss_after, hwm) = rss();
    let old_code = PER_ADAPTER as u64 * per_session.iter().sum::<u64>();
    let peak = peak_reserved.load(Ordering::Relaxed);
    eprintln!(
        "16 sessions (8 FFA, 8 standard, T = {}): all outputs equal to plaintext in {:.1} s",
        K + 1,
        took.as_secs_f64()
    );
    eprintln!(
        "diagonals per session: FFA {:.3} GiB, standard {:.3} GiB; budget {:.2} GiB",
        gib(per_session[0]),
        gib(per_session[1]),
        gib(memory.limit())
    );
    eprintln!(
        "diagonals reserved: before {:.3} GiB, peak {:.3} GiB (shared); per-session copies would reserve {:.3} GiB ({})",
        gib(reserved_before),
        gib(peak),
        gib(old_code),
        if old_code > memory.limit() {
            "over the budget: the old code refuses sessions"
        } else {
            "within the budget"
        }
    );
    eprintln!(
        "process RSS (server + 16 clients): before {:.2} GiB, peak {:.2} GiB (sampled), high-water {:.2} GiB, after {:.2} GiB",
        gib(rss_before),
        gib(peak_rss.load(Ordering::Relaxed)),
        gib(hwm),
        gib(rss_after)
    );
    assert_eq!(
        peak,
        per_session.iter().sum::<u64>(),
        "one copy of the diagonals per adapter"
    );
    drop(server);
}

//! Load test on the code before shared diagonals (commit deb9299, the parent
//! of 9c19fe8), ported from main's `crates/private/tests/load_16_sessions.rs`
//! with as few changes as the old API allows: 16 concurrent private
//! generations over gRPC + TLS on loopback, 8 on the FFA adapter and 8 on
//! the standard one, each its own session of T = 9 positions (K = 8) and
//! its own bearer token, against one server holding both adapters and the
//! default `SessionMemory` budget.
//!
//! Kept on main as `scripts/load-before-shared-diagonals/load_16_sessions_old.rs`;
//! `scripts/load-before-shared-diagonals.sh` checks out deb9299 in a
//! temporary worktree, puts it in place of
//! `crates/private/tests/load_16_sessions.rs` (deb9299's `tests/common` is
//! used as it is) and runs it.
//!
//! Here every session encodes its own copy of the diagonals, so the budget
//! may refuse some: the test records, per session, whether it
//! opened and then matched its plaintext reference, or was refused (and
//! with which status); it asserts only that every session that opened
//! matched and that the budget held. Stops the process if its RSS passes
//! `RSS_STOP` or the machine's `MemAvailable` falls below `AVAILABLE_STOP`.
//!
//! ```sh
//! cargo test --release -p cipherlora-private --test load_16_sessions -- --ignored --nocapture
//! ```
//!
//! The old `HeBackend::load` measures the planner's op costs at every start,
//! so the plans, and the diagonal bytes a session holds, follow what the
//! machine measured then. With `CIPHERLORA_LOAD_OPCOSTS=FILE` (an op-cost
//! JSON in the format of main's machine cache,
//! `~/.cache/cipherlora/opcosts-v1-N8192Depth2Fast-<machine>.json`) the
//! backends plan with those costs instead: the plans main's server offers
//! on the machine that wrote the file.
//!
//! Changes from main's test: `connect_remote` takes no `Grouping`; the
//! `SpecConfig` literal is the old one (no `tree`, no
//! `first_token_from_prefill`), as main's test had it at 41e1bc1; a client
//! whose session is refused still meets the others at the barrier and
//! reports instead of panicking; the main thread joins the barrier to read
//! the reservation with every session open; the memory guard;
//! `CIPHERLORA_LOAD_OPCOSTS`.

// `common::assert_matches` panics; this test records outcomes instead.
#[allow(dead_code)]
mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use cipherlora_helora::{Link, OpCosts};
use cipherlora_model::{LoraAdapter, Model, SamplingParams, Tokenizer, fetch};
use cipherlora_private::remote::{HeBackend, connect_remote};
use cipherlora_private::{AdapterServer, PrivateError, SessionMemory};
use cipherlora_service::auth::TokenSet;
use cipherlora_service::{AdapterBackend, ClientConfig, ServeConfig, ServerThread, dev_cert};
use cipherlora_spec::decode::{self, DrafterKind, SpecConfig};

const ADAPTERS: [&str; 2] = ["code-ffa-r16", "code-lora-r16"];
const PER_ADAPTER: usize = 8;
const K: usize = 8;
const TOKENS: usize = 8;
/// The run stops (exit 2) past this process RSS, bytes (the machine has
/// 23 GiB, shared).
const RSS_STOP: u64 = 18_000_000_000;
/// The run stops (exit 2) when the machine has less than this available.
const AVAILABLE_STOP: u64 = 1 << 30;

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

/// `MemAvailable` of the machine, bytes (`u64::MAX` if unreadable).
fn available() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(u64::MAX, |kib| kib * 1024)
}

/// Op costs from a JSON file of main's machine cache (the same field names
/// as this `OpCosts`; main made it serde-serialisable).
fn costs_from(path: &Path) -> OpCosts {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let one = |k: &str| {
        v[k].as_f64()
            .unwrap_or_else(|| panic!("{k} in {}", path.display()))
    };
    fn levels<const L: usize>(v: &serde_json::Value, k: &str) -> [f64; L] {
        let a: Vec<f64> = v[k]
            .as_array()
            .map(|a| a.iter().filter_map(serde_json::Value::as_f64).collect())
            .unwrap_or_default();
        a.try_into()
            .unwrap_or_else(|a: Vec<f64>| panic!("{k}: {} values, want {L}", a.len()))
    }
    OpCosts {
        ct_pt_ms: levels(&v, "ct_pt_ms"),
        ct_pt_cached_ms: levels(&v, "ct_pt_cached_ms"),
        rotate_ms: levels(&v, "rotate_ms"),
        hoist_ms: levels(&v, "hoist_ms"),
        hoisted_rotate_ms: levels(&v, "hoisted_rotate_ms"),
        ext_ct_pt_ms: levels(&v, "ext_ct_pt_ms"),
        ext_hoisted_rotate_ms: levels(&v, "ext_hoisted_rotate_ms"),
        extend_ms: levels(&v, "extend_ms"),
        mod_down_rescale_ms: levels(&v, "mod_down_rescale_ms"),
        add_ms: levels(&v, "add_ms"),
        rescale_ms: levels(&v, "rescale_ms"),
        encrypt_ms: levels(&v, "encrypt_ms"),
        decrypt_ms: one("decrypt_ms"),
        rerandomize_ms: one("rerandomize_ms"),
        parse_input_ms: levels(&v, "parse_input_ms"),
        serialize_output_ms: one("serialize_output_ms"),
        upload_ct_bytes: levels(&v, "upload_ct_bytes"),
        download_ct_bytes: one("download_ct_bytes"),
        galois_key_bytes: one("galois_key_bytes"),
    }
}

fn gib(b: u64) -> f64 {
    b as f64 / f64::from(1u32 << 30)
}

/// What became of one session.
enum Outcome {
    /// Opened, and its output equals the plaintext reference.
    Matched,
    /// Opened, but generated other tokens.
    Differed(String),
    /// Opened, but generation failed.
    Failed(String),
    /// `OpenSession` refused (or any other error while opening).
    Refused(String),
}

/// gRPC code and reason of a refusal, then the message.
fn describe(e: &PrivateError) -> String {
    match e {
        PrivateError::Service(s) => format!("{:?}/{:?}: {s}", s.code(), s.reason()),
        other => other.to_string(),
    }
}

#[test]
#[ignore = "load test: minutes; run with --ignored --nocapture"]
fn sixteen_concurrent_sessions_on_per_session_diagonals() {
    let path = fetch::ensure_default_model().expect("default model");
    let model = Model::load(&path).unwrap();
    let tok = Tokenizer::for_model(&path).unwrap();
    let memory = SessionMemory::default();
    let costs = std::env::var_os("CIPHERLORA_LOAD_OPCOSTS").map(|f| {
        eprintln!("planner op costs from {}", Path::new(&f).display());
        costs_from(Path::new(&f))
    });
    if costs.is_none() {
        eprintln!("planner op costs measured at load (the old HeBackend::load)");
    }
    let mut backends: Vec<Arc<dyn AdapterBackend>> = Vec::new();
    let mut per_session = Vec::new();
    for a in ADAPTERS {
        let dir = common::adapter_dir(a);
        let b = HeBackend::load(a, &dir, model.config()).unwrap();
        let b = match &costs {
            None => b,
            Some(c) => {
                let mut server = AdapterServer::load(&dir, model.config()).unwrap();
                server.set_costs(c.clone(), Link::default());
                HeBackend::new(server, b.info()).unwrap()
            }
        }
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
    let t0 = Instant::now();
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
                let (now, hwm) = rss();
                peak_rss.fetch_max(now, Ordering::Relaxed);
                let avail = available();
                if now > RSS_STOP || avail < AVAILABLE_STOP {
                    eprintln!(
                        "STOPPED at {:.1} s: RSS {:.2} GiB (high-water {:.2}), MemAvailable {:.2} GiB, diagonals reserved {:.3} GiB (peak {:.3})",
                        t0.elapsed().as_secs_f64(),
                        gib(now),
                        gib(hwm),
                        gib(avail),
                        gib(memory.reserved()),
                        gib(peak_reserved.load(Ordering::Relaxed))
                    );
                    std::process::exit(2);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    // The clients and this thread: every session is open (or refused)
    // before any generates.
    let all_open = Arc::new(Barrier::new(jobs.len() + 1));
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
                let opened = connect_remote(cfg, adapter, K + 1, model.config());
                let open_s = t0.elapsed().as_secs_f64();
                all_open.wait();
                let mut hook = match opened {
                    Ok(hook) => hook,
                    Err(e) => return (ai, i, open_s, Outcome::Refused(describe(&e))),
                };
                let spec = SpecConfig {
                    drafter: DrafterKind::Base,
                    k: K,
                    adaptive: false,
                    pad_to_k: true,
                    prefill_width: None,
                    optimistic: false,
                    draft_stop_below: 0.0,
                    max_tokens: TOKENS,
                    sampling: SamplingParams::greedy(),
                    eos: tok.eos_tokens().to_vec(),
                    schedule: Default::default(),
                };
                let outcome =
                    match decode::generate(&model, &prompt, &spec, &mut hook, &mut |_| Ok(())) {
                        Ok(got) if got.tokens == want => Outcome::Matched,
                        Ok(got) => Outcome::Differed(format!(
                            "private {:?}, plain {:?}",
                            tok.decode(&got.tokens).unwrap(),
                            tok.decode(&want).unwrap()
                        )),
                        Err(e) => Outcome::Failed(e.to_string()),
                    };
                (ai, i, open_s, outcome)
            })
        })
        .collect();
    all_open.wait();
    let opened_s = t0.elapsed().as_secs_f64();
    let reserved_open = memory.reserved();
    let (rss_open, _) = rss();
    let outcomes: Vec<_> = handles
        .into_iter()
        .map(|h| h.join().expect("a client panicked"))
        .collect();
    let took = t0.elapsed();
    done.store(true, Ordering::Relaxed);
    monitor.join().unwrap();
    let (rss_after, hwm) = rss();
    let peak = peak_reserved.load(Ordering::Relaxed);

    let mut opened = [0usize; 2];
    let mut matched = [0usize; 2];
    let mut refused = [0usize; 2];
    for (ai, i, open_s, outcome) in &outcomes {
        let what = match outcome {
            Outcome::Matched => {
                opened[*ai] += 1;
                matched[*ai] += 1;
                "opened, output equal to plaintext".to_string()
            }
            Outcome::Differed(d) => {
                opened[*ai] += 1;
                format!("opened, output DIFFERS: {d}")
            }
            Outcome::Failed(e) => {
                opened[*ai] += 1;
                format!("opened, generation FAILED: {e}")
            }
            Outcome::Refused(e) => {
                refused[*ai] += 1;
                format!("refused: {e}")
            }
        };
        eprintln!(
            "{} client {i}: {what} (open answered at {open_s:.1} s)",
            ADAPTERS[*ai]
        );
    }
    eprintln!(
        "16 sessions (8 FFA, 8 standard, T = {}) on per-session diagonals: opened FFA {} standard {}, refused FFA {} standard {}, equal to plaintext FFA {} standard {}; all answered OpenSession by {:.1} s, done in {:.1} s",
        K + 1,
        opened[0],
        opened[1],
        refused[0],
        refused[1],
        matched[0],
        matched[1],
        opened_s,
        took.as_secs_f64()
    );
    eprintln!(
        "diagonals per session: FFA {:.3} GiB, standard {:.3} GiB; budget {:.2} GiB; all 16 would reserve {:.3} GiB",
        gib(per_session[0]),
        gib(per_session[1]),
        gib(memory.limit()),
        gib(PER_ADAPTER as u64 * per_session.iter().sum::<u64>())
    );
    eprintln!(
        "diagonals reserved: before {:.3} GiB, with every session open {:.3} GiB, peak {:.3} GiB (sampled), after {:.3} GiB",
        gib(reserved_before),
        gib(reserved_open),
        gib(peak),
        gib(memory.reserved())
    );
    eprintln!(
        "process RSS (server + 16 clients): before {:.2} GiB, every session open {:.2} GiB, peak {:.2} GiB (sampled), high-water {:.2} GiB, after {:.2} GiB",
        gib(rss_before),
        gib(rss_open),
        gib(peak_rss.load(Ordering::Relaxed)),
        gib(hwm),
        gib(rss_after)
    );
    let opened_total: usize = opened.iter().sum();
    assert_eq!(
        matched.iter().sum::<usize>(),
        opened_total,
        "every session that opened matches its plaintext reference"
    );
    assert!(peak <= memory.limit(), "the budget held");
    drop(server);
}

//! Fuzz run (ignored: about a minute): malformed requests across every RPC — undecodable protobuf,
//! wrong and missing tokens, bad presets, keys and plan requests, oversized ids, unknown sessions,
//! wrong plan ids, empty, truncated, oversized and surplus ciphertexts, unknown layers — while an
//! honest session keeps computing rounds whose every delta is checked.
//!
//! ```sh
//! CIPHERLORA_FUZZ_N=100000 cargo test -p cipherlora-service --test fuzz -- --ignored --nocapture
//! ```
//!
//! Passes when no request gets a status outside the typed refusals (`INTERNAL`, `UNKNOWN`,
//! `UNAVAILABLE` fail it), every honest round is exact, and the server is still serving at the end.
//! Prints the request count per RPC and status code, and the process RSS before and after.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use bytes::Bytes;
use cipherlora_proto::v1::{
    CloseSessionRequest, GroupRequest, ListAdaptersRequest, OpenSessionRequest, PlanRequest,
};
use cipherlora_service::testing::encode_ct;
use cipherlora_service::{AdapterClient, Limits};
use common::*;
use prost::Message;
use tonic::Code;

const SERVICE: &str = "/cipherlora.adapter.v1.AdapterService/";

/// xorshift64*: deterministic, seedable, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
    fn bytes_upto(&mut self, max: u64) -> Vec<u8> {
        let n = self.below(max) as usize;
        self.bytes(n)
    }
    fn bytes_upto_nonempty(&mut self, max: u64) -> Vec<u8> {
        let n = 1 + self.below(max) as usize;
        self.bytes(n)
    }
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// One fuzz request: which RPC, its path, the encoded message(s) and the token to send.
struct Case {
    rpc: &'static str,
    streaming: bool,
    body: Bytes,
    token: Option<&'static str>,
}

/// A malformed request of kind `k`. `sid`/`plan` are those of a real session of the fuzzer (opened
/// with TOKEN2).
fn case(rng: &mut Rng, sid: [u8; 16], plan: u64) -> Case {
    let good_ct = || encode_ct(12, 2, &vec![0.5; SLOTS]);
    let group = |rng: &mut Rng, session_id: Bytes, plan_id: u64, cts: Vec<Bytes>| {
        let layer = if rng.below(8) == 0 {
            rng.next() as u32
        } else {
            rng.below(u64::from(LAYERS)) as u32
        };
        GroupRequest {
            batch: 0,
            masked: None,
            session_id,
            round: rng.next(),
            layer,
            group: rng.below(3) as u32,
            ciphertexts: cts,
            plan_id,
            response_bits: 0,
        }
        .encode_to_vec()
    };
    let (rpc, streaming, body): (&'static str, bool, Vec<u8>) = match rng.below(14) {
        0 => ("ListAdapters", false, rng.bytes_upto(64)),
        1 => ("OpenSession", false, rng.bytes_upto(512)),
        2 => ("Rounds", true, rng.bytes_upto(512)),
        3 => ("CloseSession", false, rng.bytes_upto(64)),
        4 => {
            // Structurally valid opening with one bad field.
            let mut p = OpenSessionRequest {
                adapter_id: ADAPTER.into(),
                ckks_preset: "test-n4096".into(),
                public_key: cipherlora_service::testing::test_public_key(12, [7; 32]),
                galois_keys: cipherlora_service::testing::test_galois_keys(&[1, 2]),
                plan_request: Some(PlanRequest {
                    positions: 8,
                    ..PlanRequest::default()
                }),
            };
            match rng.below(6) {
                0 => p.adapter_id = "A".repeat(1 + rng.below(1 << 16) as usize),
                1 => p.ckks_preset = String::from_utf8_lossy(&rng.bytes(16)).into_owned(),
                2 => p.public_key = Bytes::from(rng.bytes_upto(64)),
                3 => p.galois_keys = Bytes::from(rng.bytes_upto(64)),
                4 => p.plan_request = None,
                _ => {
                    p.plan_request = Some(PlanRequest {
                        masked: false,
                        positions: 65 + rng.below(1000) as u32,
                        offer_only: rng.below(2) == 1,
                        layers_per_group: rng.below(8) as u32,
                    })
                }
            }
            ("OpenSession", false, p.encode_to_vec())
        }
        5 => {
            let mut id = [0u8; 16];
            id.copy_from_slice(&rng.bytes(16));
            let len = if rng.below(4) == 0 {
                rng.below(40) as usize
            } else {
                16
            };
            let id = Bytes::from(if len == 16 {
                id.to_vec()
            } else {
                rng.bytes(len)
            });
            (
                "CloseSession",
                false,
                CloseSessionRequest { session_id: id }.encode_to_vec(),
            )
        }
        6 => {
            // Unknown session.
            let id = Bytes::from(rng.bytes(16));
            ("Rounds", true, group(rng, id, plan, vec![good_ct()]))
        }
        7 => {
            // Wrong plan id on a real session.
            let wrong = plan ^ (1 + rng.below(u64::MAX - 1));
            (
                "Rounds",
                true,
                group(rng, Bytes::copy_from_slice(&sid), wrong, vec![good_ct()]),
            )
        }
        8 => {
            // Truncated or bit-flipped ciphertext.
            let mut ct = good_ct().to_vec();
            if rng.below(2) == 0 {
                ct.truncate(rng.below(ct.len() as u64) as usize);
            } else {
                let i = rng.below(ct.len() as u64) as usize;
                ct[i] ^= 1 << rng.below(8);
            }
            let sidb = Bytes::copy_from_slice(&sid);
            (
                "Rounds",
                true,
                group(rng, sidb, plan, vec![Bytes::from(ct)]),
            )
        }
        9 => {
            // Trailing bytes, a ciphertext over the server's size limit (32 KiB in this run), or
            // surplus ciphertexts.
            let sidb = Bytes::copy_from_slice(&sid);
            let cts = match rng.below(3) {
                0 => {
                    let mut ct = good_ct().to_vec();
                    ct.extend(rng.bytes_upto_nonempty(64));
                    vec![Bytes::from(ct)]
                }
                1 => vec![Bytes::from(vec![
                    0x5a;
                    (32 << 10)
                        + 1
                        + rng.below(8 << 10) as usize
                ])],
                _ => vec![good_ct(); 2 + rng.below(70) as usize],
            };
            ("Rounds", true, group(rng, sidb, plan, cts))
        }
        10 => {
            // No or empty ciphertexts.
            let sidb = Bytes::copy_from_slice(&sid);
            let cts = if rng.below(2) == 0 {
                vec![]
            } else {
                vec![Bytes::new()]
            };
            ("Rounds", true, group(rng, sidb, plan, cts))
        }
        11 => {
            // Session id of the wrong length.
            let id = Bytes::from(rng.bytes_upto(40));
            ("Rounds", true, group(rng, id, plan, vec![good_ct()]))
        }
        12 => (
            "ListAdapters",
            false,
            ListAdaptersRequest::default().encode_to_vec(),
        ),
        _ => ("OpenSession", false, rng.bytes_upto(32)),
    };
    let token = match rng.below(16) {
        0 => None,
        1 => Some("wrong-token-0123456789abcdef"),
        _ => Some(TOKEN2),
    };
    Case {
        rpc,
        streaming,
        body: Bytes::from(body),
        token,
    }
}

#[test]
#[ignore = "fuzz run: about a minute; run with --ignored --nocapture"]
fn fuzz_every_rpc_while_an_honest_session_completes() {
    let n: u64 = std::env::var("CIPHERLORA_FUZZ_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let fx = start(Limits {
        max_ciphertext_bytes: 32 << 10,
        ..Limits::default()
    });
    let rss_before = rss_kib();

    // The honest client: rounds over every layer until the fuzzer is done.
    let stop = Arc::new(AtomicBool::new(false));
    let honest = {
        let cfg = fx.client_config();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut c = AdapterClient::connect(cfg).unwrap();
            c.open_session(params(9)).unwrap();
            let mut rounds = 0u64;
            while !stop.load(Ordering::Relaxed) || rounds == 0 {
                for layer in 0..LAYERS {
                    let out = c.round_pipelined(rounds, &calls(9, rounds, layer)).unwrap();
                    check(9, rounds, layer, &out);
                }
                rounds += 1;
            }
            (rounds, c.stats())
        })
    };

    // The fuzzer's own real session (another token).
    let mut cfg2 = fx.client_config();
    cfg2.token = Some(TOKEN2.into());
    let mut mine = AdapterClient::connect(cfg2).unwrap();
    mine.open_session(params(3)).unwrap();
    let sid = mine.session_id().unwrap().0;
    let plan = mine.session_info().unwrap().plan_id;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let addr = fx.server.addr();
    let ca = fx.cert.ca_pem.clone();
    let t0 = Instant::now();
    let counts = rt.block_on(async move {
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
        let workers = 8u64;
        let mut tasks = Vec::new();
        for w in 0..workers {
            let ch = ch.clone();
            tasks.push(tokio::spawn(async move {
                let mut rng =
                    Rng(0x9e37_79b9_7f4a_7c15 ^ (w + 1).wrapping_mul(0x1234_5678_9abc_def1));
                let mut grpc = tonic::client::Grpc::new(ch);
                let mut counts: BTreeMap<(&'static str, String), u64> = BTreeMap::new();
                for _ in 0..n / workers {
                    let c = case(&mut rng, sid, plan);
                    grpc.ready().await.unwrap();
                    let path = tonic::codegen::http::uri::PathAndQuery::try_from(format!(
                        "{SERVICE}{}",
                        c.rpc
                    ))
                    .unwrap();
                    let code = if c.streaming {
                        let mut req = tonic::Request::new(tokio_stream::iter(vec![c.body]));
                        if let Some(t) = c.token {
                            req.metadata_mut()
                                .insert("authorization", format!("Bearer {t}").parse().unwrap());
                        }
                        match grpc
                            .streaming::<_, Bytes, Bytes, _>(req, path, RawCodec)
                            .await
                        {
                            Err(s) => s.code(),
                            Ok(resp) => {
                                let mut inbound = resp.into_inner();
                                let mut code = Code::Ok;
                                loop {
                                    match inbound.message().await {
                                        Ok(Some(_)) => {}
                                        Ok(None) => break,
                                        Err(s) => {
                                            code = s.code();
                                            break;
                                        }
                                    }
                                }
                                code
                            }
                        }
                    } else {
                        let mut req = tonic::Request::new(c.body);
                        if let Some(t) = c.token {
                            req.metadata_mut()
                                .insert("authorization", format!("Bearer {t}").parse().unwrap());
                        }
                        match grpc.unary::<Bytes, Bytes, _>(req, path, RawCodec).await {
                            Ok(_) => Code::Ok,
                            Err(s) => s.code(),
                        }
                    };
                    *counts.entry((c.rpc, format!("{code:?}"))).or_default() += 1;
                }
                counts
            }));
        }
        let mut all: BTreeMap<(&'static str, String), u64> = BTreeMap::new();
        for t in tasks {
            for (k, v) in t.await.unwrap() {
                *all.entry(k).or_default() += v;
            }
        }
        all
    });
    let took = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    let (rounds, stats) = honest.join().expect("the honest session failed");
    // Still serving, and the fuzzer's real session still computes.
    let out = mine.round_pipelined(0, &calls(3, 0, 1)).unwrap();
    check(3, 0, 1, &out);
    let rss_after = rss_kib();

    let total: u64 = counts.values().sum();
    eprintln!(
        "fuzz: {total} malformed requests in {:.1} s; honest session: {rounds} rounds × {LAYERS} layers exact, {} replays",
        took.as_secs_f64(),
        stats.replays
    );
    for ((rpc, code), k) in &counts {
        eprintln!("  {rpc:<13} {code:<18} {k}");
    }
    eprintln!(
        "process RSS (server + clients): before {} MiB, after {} MiB",
        rss_before >> 10,
        rss_after >> 10
    );
    let bad: Vec<_> = counts
        .iter()
        .filter(|((_, code), _)| {
            [
                "Internal",
                "Unknown",
                "Unavailable",
                "Cancelled",
                "DataLoss",
            ]
            .contains(&code.as_str())
        })
        .collect();
    assert!(bad.is_empty(), "untyped statuses: {bad:?}");
    assert!(total >= n - n % 8);
}

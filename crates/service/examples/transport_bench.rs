//! Round-trip cost of the adapter transport versus the compute it carries.
//!
//! ```text
//! CARGO_TARGET_DIR=/work/target-service cargo run -p cipherlora-service \
//!     --example transport_bench -- [--iters N] [--link loopback|lan|wan80|rtt=MS,mbps=N]...
//! ```
//!
//! One process: a TLS + token server on 127.0.0.1 with the plaintext test
//! backend, one blocking client. For a 100 KB request (6 ciphertexts of
//! 16 KiB) and a 1 MB request (64 ciphertexts), it reports the median and
//! p90 of
//! - `compute`: the backend's own work on the same bytes, called directly
//!   (parse + validate + arithmetic + serialise; no transport), and
//! - `round trip`: `AdapterClient::round` over gRPC/TLS, request and response
//!   of equal size, including the simulated link when one is given,
//!
//! and `overhead = round trip − compute`. Prints a Markdown table.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cipherlora_proto::v1::{GroupRequest, PlanRequest};
use cipherlora_service::auth::TokenSet;
use cipherlora_service::testing::{TestBackend, encode_ct, test_galois_keys, test_public_key};
use cipherlora_service::{
    AdapterBackend, AdapterClient, ClientConfig, LinkProfile, OpenSessionPayload, ServeConfig,
    ServerThread, SessionParams, dev_cert,
};

const TOKEN: &str = "bench-token-0123456789abcdef";

fn stats(mut v: Vec<Duration>) -> (f64, f64) {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    (
        ms(v[v.len() / 2]),
        ms(v[(v.len() * 9 / 10).min(v.len() - 1)]),
    )
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut iters = 50usize;
    let mut links: Vec<(String, LinkProfile)> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--iters" => iters = args.next().ok_or("--iters N")?.parse()?,
            "--link" => {
                let s = args.next().ok_or("--link NAME")?;
                let p: LinkProfile = s.parse()?;
                links.push((s, p));
            }
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    if links.is_empty() {
        links.push(("loopback".into(), LinkProfile::LOOPBACK));
    }

    // Group 0: 6 ciphertexts (~100 KB); group 1: 64 ciphertexts (~1 MB).
    let backend = TestBackend::with_groups("bench", 1, &[6, 64]);
    let sizes = [("100 KB", 0u32, 6usize), ("1 MB", 1, 64)];
    let params = SessionParams {
        adapter_id: "bench".into(),
        ckks_preset: "test-n4096".into(),
        public_key: test_public_key(12, [9; 32]),
        galois_keys: test_galois_keys(&[1, 2, 4]),
        plan_request: PlanRequest {
            positions: 8,
            ..PlanRequest::default()
        },
    };
    let x: Vec<f64> = (0..2048).map(|i| f64::from(i) * 0.125 - 100.0).collect();
    let ct = encode_ct(12, 2, &x);

    let direct = backend.open_session(OpenSessionPayload {
        ckks_preset: params.ckks_preset.clone(),
        public_key: params.public_key.clone(),
        galois_keys: params.galois_keys.clone(),
        plan_request: params.plan_request,
    })?;

    let cert = dev_cert(&["localhost"])?;
    let mut cfg = ServeConfig::new("127.0.0.1:0".parse()?);
    cfg.tls = Some(cert.server_tls());
    cfg.tokens = Some(TokenSet::new(&[TOKEN])?);
    let backends: Vec<Arc<dyn AdapterBackend>> = vec![Arc::new(backend)];
    let server = ServerThread::start(cfg, backends, 2)?;

    println!(
        "| link | payload (request = response) | compute median / p90 (ms) | round trip median / p90 (ms) | overhead median (ms) |"
    );
    println!("| --- | --- | --- | --- | --- |");
    for (name, link) in &links {
        let mut ccfg = ClientConfig::new(format!("https://127.0.0.1:{}", server.addr().port()));
        ccfg.tls = Some(cert.client_tls("localhost"));
        ccfg.token = Some(TOKEN.into());
        ccfg.link = *link;
        let mut client = AdapterClient::connect(ccfg)?;
        client.open_session(params.clone())?;
        for (label, group, n) in sizes {
            let cts = vec![ct.clone(); n];
            let bytes: usize = cts.iter().map(Bytes::len).sum();
            let mut compute = Vec::with_capacity(iters);
            let mut rtt = Vec::with_capacity(iters);
            for i in 0..iters + 3 {
                let t = Instant::now();
                let out =
                    direct
                        .compute
                        .compute(&GroupRequest::for_group(0, group, cts.clone(), 0))?;
                let c = t.elapsed();
                assert_eq!(out.len(), n);
                let t = Instant::now();
                let out = client.round(0, group, i as u64, cts.clone())?;
                let r = t.elapsed();
                assert_eq!(out.len(), n);
                if i >= 3 {
                    compute.push(c);
                    rtt.push(r);
                }
            }
            let (cm, cp) = stats(compute);
            let (rm, rp) = stats(rtt);
            println!(
                "| {name} | {label} ({bytes} B) | {cm:.3} / {cp:.3} | {rm:.3} / {rp:.3} | {:.3} |",
                rm - cm
            );
        }
        client.close()?;
    }
    server.stop()?;
    Ok(())
}

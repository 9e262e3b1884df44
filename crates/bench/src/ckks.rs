//! `cipherlora bench ckks`: per-operation medians of the CKKS engine (N =
//! 8192, 16384; one thread; chain 50,40,40 + 50, or 60,… with
//! `CIPHERLORA_CKKS_CHAIN=60`) and seeded ciphertext and Galois key sizes.
//! JSON: `{"N": {"8192": {"ops_ms": {...}, "bytes": {"ct_seeded": .., "galois_key": ..}}, "16384": {...}}}`.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::PathBuf;
use std::time::Instant;

use cipherlora_ckks::{
    CkksParameters, Context, Decryptor, Encoder, Encryptor, Evaluator, GaloisKeys, PublicKey,
    SecretKey, os_rng,
};
use serde_json::{Value, json};

/// Options of `cipherlora bench ckks`.
#[derive(Debug, Clone)]
pub struct CkksBenchOptions {
    /// Where the JSON report goes.
    pub json: PathBuf,
    /// Where the Markdown table goes (default: the JSON path with `.md`).
    pub markdown: Option<PathBuf>,
    /// Timed repetitions per operation (the median is reported).
    pub reps: usize,
}

/// Operation names, in report order.
pub const OPS: [&str; 9] = [
    "encode",
    "encrypt_sk",
    "encrypt_pk",
    "decrypt_decode",
    "add",
    "ct_pt_mul",
    "rescale",
    "rotate",
    "rotate_hoisted_extra",
];

/// The bit sizes of the chain and special prime used by the benchmark.
pub fn chain() -> (Vec<u32>, u32) {
    match std::env::var("CIPHERLORA_CKKS_CHAIN").as_deref() {
        Ok("60") => (vec![60, 40, 40], 60),
        _ => (vec![50, 40, 40], 50),
    }
}

/// Median in milliseconds of `reps` timed calls (after a short warm-up).
fn median_ms(reps: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..reps.clamp(1, 5) {
        f();
    }
    let mut t: Vec<f64> = (0..reps.max(1))
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

/// Measures one degree; returns `{"ops_ms": .., "bytes": ..}`.
pub fn measure(degree: usize, reps: usize) -> anyhow::Result<Value> {
    let (bits, special) = chain();
    let params = CkksParameters::builder()
        .degree(degree)
        .moduli_bits(&bits)
        .special_moduli_bits(&[special])
        .scale_bits(40)
        .build()?;
    let ctx = Context::new(params)?;
    let mut rng = os_rng()?;
    let sk = SecretKey::generate(&ctx, &mut rng);
    let pk = PublicKey::generate(&sk, &mut rng);
    let gks = GaloisKeys::generate(&sk, &[1, 2], &mut rng);
    let enc = Encoder::new(&ctx);
    let encryptor = Encryptor::new(&ctx);
    let dec = Decryptor::new(&sk);
    let ev = Evaluator::new(&ctx);
    let level = ctx.max_level();
    let scale = ctx.params().scale();
    let values: Vec<f64> = (0..ctx.slots())
        .map(|i| ((i % 97) as f64 - 48.0) / 50.0)
        .collect();
    let pt = enc.encode(&values, level, scale)?;
    let seeded = encryptor.encrypt_sk(&pt, &sk, &mut rng)?;
    let ct = seeded.expand();
    let ct2 = encryptor.encrypt_pk(&pt, &pk, &mut rng)?;
    let mut ops = BTreeMap::new();
    ops.insert(
        "encode",
        median_ms(reps, || {
            black_box(enc.encode(black_box(&values), level, scale).ok());
        }),
    );
    ops.insert(
        "encrypt_sk",
        median_ms(reps, || {
            black_box(encryptor.encrypt_sk(&pt, &sk, &mut rng).ok());
        }),
    );
    let mut rng2 = os_rng()?;
    ops.insert(
        "encrypt_pk",
        median_ms(reps, || {
            black_box(encryptor.encrypt_pk(&pt, &pk, &mut rng2).ok());
        }),
    );
    ops.insert(
        "decrypt_decode",
        median_ms(reps, || {
            black_box(dec.decrypt(black_box(&ct)).map(|p| enc.decode(&p)).ok());
        }),
    );
    let mut acc = ct.clone();
    ops.insert(
        "add",
        median_ms(reps, || {
            ev.add_assign(&mut acc, black_box(&ct2)).ok();
        }),
    );
    let mut prod = ct.clone();
    ops.insert(
        "ct_pt_mul",
        median_ms(reps, || {
            ev.mul_plain_assign(&mut prod, black_box(&pt)).ok();
        }),
    );
    let big = ev.mul_plain(&ct, &pt)?;
    ops.insert(
        "rescale",
        median_ms(reps, || {
            black_box(ev.rescale(black_box(&big)).ok());
        }),
    );
    ops.insert(
        "rotate",
        median_ms(reps, || {
            black_box(ev.rotate(black_box(&ct), 1, &gks).ok());
        }),
    );
    let hoisted = ev.hoist(&ct);
    ops.insert(
        "rotate_hoisted_extra",
        median_ms(reps, || {
            black_box(ev.rotate_hoisted(black_box(&hoisted), 2, &gks).ok());
        }),
    );
    let one_key = GaloisKeys::generate(&sk, &[1], &mut rng).to_bytes().len();
    let ops_json: serde_json::Map<String, Value> = OPS
        .iter()
        .map(|&k| (k.to_string(), json!(ops[k])))
        .collect();
    Ok(json!({
        "ops_ms": ops_json,
        "bytes": {"ct_seeded": seeded.to_bytes().len(), "galois_key": one_key},
    }))
}

/// The Markdown table of a report.
pub fn markdown(report: &Value) -> String {
    let (bits, special) = chain();
    let mut s = format!(
        "CKKS engine, one thread, scale 2^40, chain {:?} + special {special} (medians, ms)\n\n| op | N=8192 | N=16384 |\n| --- | ---: | ---: |\n",
        bits
    );
    let get = |n: &str, sec: &str, k: &str| report["N"][n][sec][k].as_f64().unwrap_or(f64::NAN);
    for k in OPS {
        s += &format!(
            "| {k} | {:.4} | {:.4} |\n",
            get("8192", "ops_ms", k),
            get("16384", "ops_ms", k)
        );
    }
    for k in ["ct_seeded", "galois_key"] {
        s += &format!(
            "| bytes: {k} | {} | {} |\n",
            get("8192", "bytes", k),
            get("16384", "bytes", k)
        );
    }
    s
}

/// Runs the benchmark. Errors: unwritable report files.
pub fn run(opts: &CkksBenchOptions) -> anyhow::Result<()> {
    let mut per_n = serde_json::Map::new();
    for n in [8192usize, 16384] {
        per_n.insert(n.to_string(), measure(n, opts.reps)?);
    }
    let report = json!({ "N": per_n });
    let md = markdown(&report);
    crate::write_report(&opts.json, opts.markdown.as_deref(), &report, &md)?;
    println!("{md}");
    Ok(())
}

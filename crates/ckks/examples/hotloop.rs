//! Loops one CKKS operation for profiling (`perf record`): encrypt (of an encoded plaintext),
//! encryptv (fused encode + encrypt of values), decrypt, encode, rescale, rotations (plain,
//! hoisted, extended), ModDown, fused ModDown + rescale. N = 8192, preset N8192Depth2Fast.

use cipherlora_ckks::*;
use std::time::Instant;

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let op = std::env::args().nth(1).unwrap_or_else(|| "encrypt".into());
    let iters: usize = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    let ctx = Context::new(CkksParameters::preset(Preset::N8192Depth2Fast)?)?;
    let mut rng = os_rng()?;
    let sk = SecretKey::generate(&ctx, &mut rng);
    let enc = Encoder::new(&ctx);
    let encryptor = Encryptor::new(&ctx);
    let dec = Decryptor::new(&sk);
    let ev = Evaluator::new(&ctx);
    let gks = GaloisKeys::generate(&sk, &[9, 18], &mut rng);
    let values: Vec<f64> = (0..ctx.slots()).map(|i| (i % 17) as f64 / 16.0).collect();
    let scale = ctx.params().scale();
    let pt1 = enc.encode(&values, 1, scale)?;
    let ct1 = encryptor.encrypt_sk(&pt1, &sk, &mut rng).unwrap().expand();
    let w1 = enc.encode(&values, 1, ctx.params().moduli()[1] as f64)?;
    let prod = ev.mul_plain(&ct1, &w1)?;
    let ct0 = ev.rescale(&prod)?;
    let bytes0 = ct0.to_bytes();
    let h1 = ev.hoist(&ct1);
    let ext1 = ev.rotate_hoisted_extended(&h1, 9, &gks)?;
    let t0 = Instant::now();
    for _ in 0..iters {
        match op.as_str() {
            "encode" => drop(enc.encode(&values, 1, scale)?),
            "encrypt" => drop(
                encryptor
                    .encrypt_sk(&pt1, &sk, &mut rng)
                    .unwrap()
                    .to_bytes(),
            ),
            "encryptv" => drop(
                encryptor
                    .encrypt_values_sk(&enc, &values, &[], 1, scale, &sk, &mut rng)?
                    .to_bytes(),
            ),
            "decrypt" => drop(
                enc.decode(
                    &dec.decrypt(&Ciphertext::from_bytes(&ctx, &bytes0)?)
                        .unwrap(),
                ),
            ),
            "decode" => drop(enc.decode(&pt1)),
            "rescale" => drop(ev.rescale(&prod)?),
            "rotate0" => drop(ev.rotate(&ct0, 9, &gks)?),
            "hoisted1" => drop(ev.rotate_hoisted(&h1, 9, &gks)?),
            "hoist1" => drop(ev.hoist(&ct1)),
            "ext1" => drop(ev.rotate_hoisted_extended(&h1, 9, &gks)?),
            "mdr1" => drop(ev.mod_down_rescale(&ext1)?),
            "moddown1" => drop(ev.mod_down(&ext1)?),
            _ => return Err("unknown op".into()),
        }
    }
    println!(
        "{op}: {:.4} ms",
        t0.elapsed().as_secs_f64() * 1e3 / iters as f64
    );
    Ok(())
}

//! Measures the per-operation costs the planner prices plans with, on the
//! real CKKS engine (single thread, medians of thread CPU time).

use std::sync::Arc;

use cipherlora_ckks::{
    Context, Decryptor, Encoder, Encryptor, Evaluator, GaloisKeys, PublicKey, SecretKey, os_rng,
};

use crate::counts::LEVELS;
use crate::error::{HeloraError, Result};
use crate::planner::OpCosts;

fn he(e: cipherlora_ckks::CkksError) -> HeloraError {
    HeloraError::Backend(e.to_string())
}

/// CPU time consumed by the calling thread, in ms
/// (`clock_gettime(CLOCK_THREAD_CPUTIME_ID)`): unlike wall time it does not
/// count the time other processes hold the (shared, 2-core) machine.
pub fn thread_cpu_ms() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as f64 * 1e3 + t.tv_nsec as f64 * 1e-6
}

/// Median thread CPU time of `f` over `reps` runs, in ms.
fn median_ms(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut v = Vec::with_capacity(reps.max(1));
    for _ in 0..reps.max(1) {
        let t0 = thread_cpu_ms();
        f()?;
        v.push(thread_cpu_ms() - t0);
    }
    v.sort_by(f64::total_cmp);
    Ok(v[v.len() / 2])
}

/// Byte sizes of the engine's wire formats, from its serializer: `(upload
/// of a seeded ciphertext at each level, download of a level-0 ciphertext,
/// one Galois key)`.
///
/// # Errors
/// Engine errors.
pub fn wire_sizes(ctx: &Arc<Context>) -> Result<([f64; LEVELS], f64, f64)> {
    let mut rng = os_rng().map_err(he)?;
    let sk = SecretKey::generate(ctx, &mut rng);
    let enc = Encoder::new(ctx);
    let mut up = [0.0; LEVELS];
    let mut down = 0.0;
    for (level, slot) in up.iter_mut().enumerate().take(ctx.max_level() + 1) {
        let pt = enc
            .encode(&[0.5], level, ctx.params().scale())
            .map_err(he)?;
        let ct = Encryptor::new(ctx)
            .encrypt_sk(&pt, &sk, &mut rng)
            .map_err(he)?;
        *slot = ct.to_bytes().len() as f64;
        if level == 0 {
            down = ct.expand().to_bytes().len() as f64;
        }
    }
    let key = GaloisKeys::serialized_key_size(ctx) as f64;
    Ok((up, down, key))
}

/// Bytes of plaintexts a streamed ct×pt measurement cycles through: twice
/// a large last-level cache, so each product fetches its plaintext from
/// memory as in a round.
const STREAMED_BYTES: usize = 64 << 20;

/// How many plaintexts of `limbs` limbs make [`STREAMED_BYTES`].
fn streamed_count(ctx: &Context, limbs: usize) -> usize {
    STREAMED_BYTES.div_ceil(limbs * ctx.degree() * 8)
}

/// Measures every cost of [`OpCosts`] on `ctx` (levels `0..=max_level`),
/// `reps` timed runs each.
///
/// # Errors
/// Engine errors (should not happen for valid contexts).
pub fn measure_op_costs(ctx: &Arc<Context>, reps: usize) -> Result<OpCosts> {
    let mut rng = os_rng().map_err(he)?;
    let sk = SecretKey::generate(ctx, &mut rng);
    let pk = PublicKey::generate(&sk, &mut rng);
    let enc = Encoder::new(ctx);
    let encryptor = Encryptor::new(ctx);
    let dec = Decryptor::new(&sk);
    let ev = Evaluator::new(ctx);
    // Distinct Galois keys in rotation, as a plan's baby and giant steps use
    // them: a key at level 1 is ~0.75 MiB, so a batch of rotations streams
    // its keys from memory; a single hot key would flatter key switching.
    let steps: Vec<i64> = (1..=KEYS as i64).map(|k| 9 * k).collect();
    let gks = GaloisKeys::generate(&sk, &steps, &mut rng);
    let step = |i: usize| steps[i % KEYS];
    let values: Vec<f64> = (0..ctx.slots())
        .map(|i| ((i % 17) as f64 - 8.0) / 16.0)
        .collect();
    let mut c = OpCosts::default();
    let (up, down, key) = wire_sizes(ctx)?;
    c.upload_ct_bytes = up;
    c.download_ct_bytes = down;
    c.galois_key_bytes = key;
    let scale = ctx.params().scale();
    // Working sets like a real evaluation's: distinct ciphertexts and
    // plaintexts in rotation, so caches are as cold as in the pipeline.
    const DISTINCT: usize = 8;
    const KEYS: usize = 16;
    for level in 0..=ctx.max_level().min(LEVELS - 1) {
        let cts: Vec<_> = (0..DISTINCT)
            .map(|i| {
                let v: Vec<f64> = values.iter().map(|x| x + i as f64 * 1e-3).collect();
                let pt = enc.encode(&v, level, scale).map_err(he)?;
                Ok(encryptor
                    .encrypt_sk(&pt, &sk, &mut rng)
                    .map_err(he)?
                    .expand())
            })
            .collect::<Result<_>>()?;
        let mut i = 0usize;
        let mut next = || {
            i += 1;
            &cts[i % DISTINCT]
        };
        // What the client does per upload (CkksClient::encrypt_to_bytes):
        // fused encode + encrypt, serialise.
        c.encrypt_ms[level] = median_ms(reps, || {
            let _ = encryptor
                .encrypt_values_sk(&enc, &values, &[], level, scale, &sk, &mut rng)
                .map_err(he)?
                .to_bytes();
            Ok(())
        })?;
        let upload = encryptor
            .encrypt_sk(
                &enc.encode(&values, level, scale).map_err(he)?,
                &sk,
                &mut rng,
            )
            .map_err(he)?
            .to_bytes();
        c.parse_input_ms[level] = median_ms(reps, || {
            let _ = cipherlora_ckks::SeededCiphertext::from_bytes(ctx, &upload)
                .map_err(he)?
                .expand();
            Ok(())
        })?;
        c.add_ms[level] = median_ms(reps, || {
            let mut a = next().clone();
            ev.add_assign(&mut a, next()).map_err(he)
        })?;
        c.rotate_ms[level] = {
            let mut r = 0usize;
            median_ms(reps, || {
                r += 1;
                ev.rotate(next(), step(r), &gks).map(|_| ()).map_err(he)
            })?
        };
        c.hoist_ms[level] = median_ms(reps, || {
            let _ = ev.hoist(next());
            Ok(())
        })?;
        let hs: Vec<_> = cts.iter().map(|ct| ev.hoist(ct)).collect();
        let mut j = 0usize;
        c.hoisted_rotate_ms[level] = median_ms(reps, || {
            j += 1;
            ev.rotate_hoisted(&hs[j % DISTINCT], step(j), &gks)
                .map(|_| ())
                .map_err(he)
        })?;
        c.ext_hoisted_rotate_ms[level] = median_ms(reps, || {
            j += 1;
            ev.rotate_hoisted_extended(&hs[j % DISTINCT], step(j), &gks)
                .map(|_| ())
                .map_err(he)
        })?;
        c.extend_ms[level] = median_ms(reps, || {
            let _ = ev.extend(next());
            Ok(())
        })?;
        if level == 0 {
            c.decrypt_ms = median_ms(reps, || {
                let bytes = next().to_bytes();
                let ct = cipherlora_ckks::Ciphertext::from_bytes(ctx, &bytes).map_err(he)?;
                let _ = enc.decode_complex(&dec.decrypt(&ct).map_err(he)?);
                Ok(())
            })?;
            c.serialize_output_ms = median_ms(reps, || {
                let _ = next().to_bytes();
                Ok(())
            })?;
            // The client's to_bytes above is not the client's cost: the
            // server serialises, the client parses; keep only the parse.
            c.decrypt_ms = (c.decrypt_ms - c.serialize_output_ms).max(0.0);
            c.rerandomize_ms = median_ms(reps, || {
                let noise: Vec<f64> = values.iter().map(|v| v * 1e-6).collect();
                let ct = next();
                let pt = enc.encode(&noise, 0, ct.scale()).map_err(he)?;
                let z = encryptor.encrypt_pk(&pt, &pk, &mut rng).map_err(he)?;
                let mut a = ct.clone();
                ev.add_assign(&mut a, &z).map_err(he)
            })?;
            continue;
        }
        // ct×pt inside a lazy accumulation of 8 terms (a typical g), each
        // with its own plaintext, as plans use it: once over a working set
        // larger than the last-level cache (a round streams every diagonal
        // once; a session holds 10⁸–10⁹ bytes of them), once over a
        // cache-resident one.
        let terms = 8;
        let encode_q = |i: usize| {
            let v: Vec<f64> = values.iter().map(|x| x * (1.0 + i as f64 * 1e-3)).collect();
            enc.encode(&v, level, ctx.params().moduli()[level] as f64)
                .map_err(he)
        };
        let ws: Vec<_> = (0..streamed_count(ctx, level + 1))
            .map(encode_q)
            .collect::<Result<_>>()?;
        let mut k = 0usize;
        let mut ct_pt = |n: usize| {
            median_ms(reps, || {
                let mut acc = ev.mul_accumulator(level).map_err(he)?;
                for _ in 0..terms {
                    k += 1;
                    acc.add_product(&cts[k % DISTINCT], &ws[k % n])
                        .map_err(he)?;
                }
                let _ = acc.finish();
                Ok(())
            })
            .map(|ms| ms / terms as f64)
        };
        c.ct_pt_ms[level] = ct_pt(ws.len())?;
        c.ct_pt_cached_ms[level] = ct_pt(4 * DISTINCT)?;
        let prods: Vec<_> = cts
            .iter()
            .zip(&ws)
            .map(|(ct, w)| ev.mul_plain(ct, w).map_err(he))
            .collect::<Result<_>>()?;
        let mut m = 0usize;
        c.rescale_ms[level] = median_ms(reps, || {
            m += 1;
            ev.rescale(&prods[m % DISTINCT]).map(|_| ()).map_err(he)
        })?;
        // The same over Q·P (double hoisting): extended rotations times
        // extended diagonals, then the fused ModDown + rescale.
        let ews: Vec<_> = (0..streamed_count(ctx, level + 2))
            .map(|i| {
                let v: Vec<f64> = values.iter().map(|x| x * (1.0 + i as f64 * 1e-3)).collect();
                enc.encode_extended(&v, level, ctx.params().moduli()[level] as f64)
                    .map_err(he)
            })
            .collect::<Result<_>>()?;
        let exts: Vec<_> = hs
            .iter()
            .enumerate()
            .map(|(i, h)| ev.rotate_hoisted_extended(h, step(i), &gks).map_err(he))
            .collect::<Result<_>>()?;
        c.ext_ct_pt_ms[level] = median_ms(reps, || {
            let mut acc = ev.mul_accumulator_extended(level).map_err(he)?;
            for _ in 0..terms {
                k += 1;
                acc.add_product(&exts[k % DISTINCT], &ews[k % ews.len()])
                    .map_err(he)?;
            }
            let _ = acc.finish();
            Ok(())
        })? / terms as f64;
        c.mod_down_rescale_ms[level] = median_ms(reps, || {
            m += 1;
            ev.mod_down_rescale(&exts[m % DISTINCT])
                .map(|_| ())
                .map_err(he)
        })?;
    }
    Ok(c)
}

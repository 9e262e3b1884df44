//! Measures the per-operation costs the planner prices plans with (medians of thread CPU time).

use std::sync::Arc;

use cipherlora_ckks::{
    Ciphertext, CompressedCiphertext, CompressionParams, Context, Decryptor, Encoder, Encryptor,
    Evaluator, GaloisKeys, PublicKey, SecretKey, os_rng,
};

use crate::ckks_backend::ResponseCompression;
use crate::counts::LEVELS;
use crate::error::{HeloraError, Result};
use crate::planner::OpCosts;

fn he(e: cipherlora_ckks::CkksError) -> HeloraError {
    HeloraError::Ckks(e)
}

/// CPU time of the calling thread, ms (unaffected by other processes).
pub fn thread_cpu_ms() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as f64 * 1e3 + t.tv_nsec as f64 * 1e-6
}

/// Median thread CPU time of `f` over `reps` runs, ms, after one untimed warm-up.
fn median_ms(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let mut v = Vec::with_capacity(reps.max(1));
    for _ in 0..reps.max(1) {
        let t0 = thread_cpu_ms();
        f()?;
        v.push(thread_cpu_ms() - t0);
    }
    v.sort_by(f64::total_cmp);
    Ok(v[v.len() / 2])
}

/// The output bound (per slot part) the cost model assumes for returned ciphertexts.
pub const MODEL_OUTPUT_BOUND: f64 = 16.0;

/// The compression a default [`crate::CkksServer`] applies at [`MODEL_OUTPUT_BOUND`].
pub fn model_compression(ctx: &Context) -> Option<CompressionParams> {
    CompressionParams::choose(
        ctx.degree(),
        ctx.params().moduli()[0],
        ctx.params().scale(),
        MODEL_OUTPUT_BOUND,
        ResponseCompression::DEFAULT_BITS,
    )
    .ok()
}

/// Download bytes of a ciphertext compressed to `bits` (`None`: not compressed).
pub fn compressed_download_bytes(ctx: &Context, bits: u32) -> Option<f64> {
    let p = CompressionParams::choose(
        ctx.degree(),
        ctx.params().moduli()[0],
        ctx.params().scale(),
        MODEL_OUTPUT_BOUND,
        bits,
    )
    .ok()?;
    Some((28 + p.poly_bytes(ctx.degree())) as f64)
}

/// The download bytes of a level-0 ciphertext under `p` (full size when `None`).
fn download_bytes(ct: &Ciphertext, p: Option<CompressionParams>) -> Result<Vec<u8>> {
    Ok(match p {
        Some(p) => ct.compress(&p).map_err(he)?.to_bytes(),
        None => ct.to_bytes(),
    })
}

/// Serialized sizes: (seeded upload per level, level-0 download, one Galois key). Errors: engine.
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
            down = download_bytes(&ct.expand(), model_compression(ctx))?.len() as f64;
        }
    }
    let key = GaloisKeys::serialized_key_size(ctx) as f64;
    Ok((up, down, key))
}

/// Plaintext bytes a streamed ct×pt measurement cycles through (beyond the LLC).
const STREAMED_BYTES: usize = 64 << 20;

/// How many plaintexts of `limbs` limbs make [`STREAMED_BYTES`].
fn streamed_count(ctx: &Context, limbs: usize) -> usize {
    STREAMED_BYTES.div_ceil(limbs * ctx.degree() * 8)
}

/// Passes of [`measure_op_costs`], each over every operation.
const PASSES: usize = 8;

/// Every measured figure of `c` in a fixed order (a new field fails to compile until listed).
fn fields(c: &mut OpCosts) -> Vec<&mut f64> {
    let OpCosts {
        ct_pt_ms,
        ct_pt_cached_ms,
        rotate_ms,
        hoist_ms,
        hoisted_rotate_ms,
        ext_ct_pt_ms,
        ext_hoisted_rotate_ms,
        extend_ms,
        mod_down_rescale_ms,
        add_ms,
        rescale_ms,
        encrypt_ms,
        decrypt_ms,
        rerandomize_ms,
        parse_input_ms,
        serialize_output_ms,
        upload_ct_bytes,
        download_ct_bytes,
        galois_key_bytes,
    } = c;
    let mut v: Vec<&mut f64> = Vec::new();
    for a in [
        ct_pt_ms,
        ct_pt_cached_ms,
        rotate_ms,
        hoist_ms,
        hoisted_rotate_ms,
        ext_ct_pt_ms,
        ext_hoisted_rotate_ms,
        extend_ms,
        mod_down_rescale_ms,
        add_ms,
        rescale_ms,
        encrypt_ms,
        parse_input_ms,
        upload_ct_bytes,
    ] {
        v.extend(a.iter_mut());
    }
    v.extend([
        decrypt_ms,
        rerandomize_ms,
        serialize_output_ms,
        download_ct_bytes,
        galois_key_bytes,
    ]);
    v
}

/// Measures every cost of [`OpCosts`] on `ctx` in interleaved passes (medians of per-pass medians),
/// so load bursts hit every operation alike. Errors: engine errors.
pub fn measure_op_costs(ctx: &Arc<Context>, reps: usize) -> Result<OpCosts> {
    let fixture = Fixture::new(ctx)?;
    let per_pass = reps.div_ceil(PASSES).max(2);
    let mut passes = (0..PASSES)
        .map(|_| fixture.pass(per_pass))
        .collect::<Result<Vec<_>>>()?;
    let mut out = passes[0].clone();
    let mut columns: Vec<Vec<f64>> = Vec::new();
    for p in &mut passes {
        for (i, f) in fields(p).into_iter().enumerate() {
            if columns.len() <= i {
                columns.push(Vec::with_capacity(PASSES));
            }
            columns[i].push(*f);
        }
    }
    for (f, mut col) in fields(&mut out).into_iter().zip(columns) {
        col.sort_by(f64::total_cmp);
        *f = col[col.len() / 2];
    }
    Ok(out)
}

/// Distinct ciphertexts in rotation per level.
const DISTINCT: usize = 8;
/// Distinct Galois keys in rotation, as plans use them (one hot key would flatter key switching).
const KEYS: usize = 16;
/// Products per lazy accumulation (a typical g).
const TERMS: usize = 8;

/// The working sets of one level.
struct LevelSet {
    cts: Vec<cipherlora_ckks::Ciphertext>,
    hs: Vec<cipherlora_ckks::HoistedCiphertext>,
    /// Plaintexts at the level's rescale scale: 64 MiB (streamed).
    ws: Vec<cipherlora_ckks::Plaintext>,
    /// Products `cts[i]·ws[i]` to rescale.
    prods: Vec<cipherlora_ckks::Ciphertext>,
    /// Extended plaintexts, 64 MiB (streamed).
    ews: Vec<cipherlora_ckks::ExtendedPlaintext>,
    /// Extended rotations.
    exts: Vec<cipherlora_ckks::ExtendedCiphertext>,
    /// A seeded upload at this level.
    upload: Vec<u8>,
}

/// Keys, engine objects and per-level working sets, built once.
struct Fixture {
    ctx: Arc<Context>,
    sk: SecretKey,
    pk: PublicKey,
    enc: Encoder,
    encryptor: Encryptor,
    dec: Decryptor,
    ev: Evaluator,
    gks: GaloisKeys,
    steps: Vec<i64>,
    values: Vec<f64>,
    levels: Vec<LevelSet>,
    sizes: ([f64; LEVELS], f64, f64),
    rng: std::cell::RefCell<rand_chacha::ChaCha20Rng>,
}

impl Fixture {
    fn new(ctx: &Arc<Context>) -> Result<Self> {
        let mut rng = os_rng().map_err(he)?;
        let sk = SecretKey::generate(ctx, &mut rng);
        let pk = PublicKey::generate(&sk, &mut rng);
        let enc = Encoder::new(ctx);
        let encryptor = Encryptor::new(ctx);
        let ev = Evaluator::new(ctx);
        let steps: Vec<i64> = (1..=KEYS as i64).map(|k| 9 * k).collect();
        let gks = GaloisKeys::generate(&sk, &steps, &mut rng);
        let values: Vec<f64> = (0..ctx.slots())
            .map(|i| ((i % 17) as f64 - 8.0) / 16.0)
            .collect();
        let scale = ctx.params().scale();
        let perturbed =
            |i: usize| -> Vec<f64> { values.iter().map(|x| x * (1.0 + i as f64 * 1e-3)).collect() };
        let mut levels = Vec::new();
        for level in 0..=ctx.max_level().min(LEVELS - 1) {
            let cts: Vec<_> = (0..DISTINCT)
                .map(|i| {
                    let pt = enc.encode(&perturbed(i), level, scale).map_err(he)?;
                    Ok(encryptor
                        .encrypt_sk(&pt, &sk, &mut rng)
                        .map_err(he)?
                        .expand())
                })
                .collect::<Result<_>>()?;
            let hs: Vec<_> = cts.iter().map(|ct| ev.hoist(ct)).collect();
            let upload = encryptor
                .encrypt_sk(
                    &enc.encode(&values, level, scale).map_err(he)?,
                    &sk,
                    &mut rng,
                )
                .map_err(he)?
                .to_bytes();
            let (mut ws, mut prods, mut ews, mut exts) = (vec![], vec![], vec![], vec![]);
            if level > 0 {
                let q = ctx.params().moduli()[level] as f64;
                ws = (0..streamed_count(ctx, level + 1))
                    .map(|i| enc.encode(&perturbed(i), level, q).map_err(he))
                    .collect::<Result<_>>()?;
                prods = cts
                    .iter()
                    .zip(&ws)
                    .map(|(ct, w)| ev.mul_plain(ct, w).map_err(he))
                    .collect::<Result<_>>()?;
                ews = (0..streamed_count(ctx, level + 2))
                    .map(|i| enc.encode_extended(&perturbed(i), level, q).map_err(he))
                    .collect::<Result<_>>()?;
                exts = hs
                    .iter()
                    .enumerate()
                    .map(|(i, h)| {
                        ev.rotate_hoisted_extended(h, steps[i % KEYS], &gks)
                            .map_err(he)
                    })
                    .collect::<Result<_>>()?;
            }
            levels.push(LevelSet {
                cts,
                hs,
                ws,
                prods,
                ews,
                exts,
                upload,
            });
        }
        Ok(Fixture {
            ctx: ctx.clone(),
            dec: Decryptor::new(&sk),
            sk,
            pk,
            enc,
            encryptor,
            ev,
            gks,
            steps,
            values,
            levels,
            sizes: wire_sizes(ctx)?,
            rng: std::cell::RefCell::new(rng),
        })
    }

    /// One pass: every cost, `reps` timed runs each.
    fn pass(&self, reps: usize) -> Result<OpCosts> {
        let (ctx, ev, enc, gks) = (&self.ctx, &self.ev, &self.enc, &self.gks);
        let mut rng = self.rng.borrow_mut();
        let step = |i: usize| self.steps[i % KEYS];
        let scale = ctx.params().scale();
        let mut c = OpCosts::default();
        (c.upload_ct_bytes, c.download_ct_bytes, c.galois_key_bytes) = self.sizes;
        for (level, set) in self.levels.iter().enumerate() {
            let cts = &set.cts;
            let mut i = 0usize;
            let mut next = || {
                i += 1;
                &cts[i % DISTINCT]
            };
            // The client's upload: fused encode + encrypt, serialise.
            c.encrypt_ms[level] = median_ms(reps, || {
                let _ = self
                    .encryptor
                    .encrypt_values_sk(enc, &self.values, &[], level, scale, &self.sk, &mut *rng)
                    .map_err(he)?
                    .to_bytes();
                Ok(())
            })?;
            c.parse_input_ms[level] = median_ms(reps, || {
                let _ = cipherlora_ckks::SeededCiphertext::from_upload_bytes(ctx, &set.upload)
                    .map_err(he)?
                    .expand();
                Ok(())
            })?;
            c.add_ms[level] = median_ms(reps, || {
                let mut a = next().clone();
                ev.add_assign(&mut a, next()).map_err(he)
            })?;
            let mut r = 0usize;
            c.rotate_ms[level] = median_ms(reps, || {
                r += 1;
                ev.rotate(next(), step(r), gks).map(|_| ()).map_err(he)
            })?;
            c.hoist_ms[level] = median_ms(reps, || {
                let _ = ev.hoist(next());
                Ok(())
            })?;
            let mut j = 0usize;
            c.hoisted_rotate_ms[level] = median_ms(reps, || {
                j += 1;
                ev.rotate_hoisted(&set.hs[j % DISTINCT], step(j), gks)
                    .map(|_| ())
                    .map_err(he)
            })?;
            c.ext_hoisted_rotate_ms[level] = median_ms(reps, || {
                j += 1;
                ev.rotate_hoisted_extended(&set.hs[j % DISTINCT], step(j), gks)
                    .map(|_| ())
                    .map_err(he)
            })?;
            c.extend_ms[level] = median_ms(reps, || {
                let _ = ev.extend(next());
                Ok(())
            })?;
            if level == 0 {
                // Responses as a default server sends them (compressed).
                let cp = model_compression(ctx);
                c.decrypt_ms = median_ms(reps, || {
                    let bytes = download_bytes(next(), cp)?;
                    let pt = if cp.is_some() {
                        let ct = CompressedCiphertext::from_bytes(ctx, &bytes).map_err(he)?;
                        self.dec.decrypt_compressed(&ct).map_err(he)?
                    } else {
                        let ct = Ciphertext::from_bytes(ctx, &bytes).map_err(he)?;
                        self.dec.decrypt(&ct).map_err(he)?
                    };
                    let _ = enc.decode_complex(&pt);
                    Ok(())
                })?;
                c.serialize_output_ms = median_ms(reps, || {
                    let _ = download_bytes(next(), cp)?;
                    Ok(())
                })?;
                // Keep only the client's parse (the server serialises).
                c.decrypt_ms = (c.decrypt_ms - c.serialize_output_ms).max(0.0);
                c.rerandomize_ms = median_ms(reps, || {
                    let noise: Vec<f64> = self.values.iter().map(|v| v * 1e-6).collect();
                    let ct = next();
                    let pt = enc.encode(&noise, 0, ct.scale()).map_err(he)?;
                    let z = self
                        .encryptor
                        .encrypt_pk(&pt, &self.pk, &mut *rng)
                        .map_err(he)?;
                    let mut a = ct.clone();
                    ev.add_assign(&mut a, &z).map_err(he)
                })?;
                continue;
            }
            // ct×pt inside one lazy sum, streamed from beyond the LLC and cache-resident.
            let mut k = 0usize;
            let mut ct_pt = |n: usize| {
                median_ms(reps, || {
                    let mut acc = ev.mul_accumulator(level).map_err(he)?;
                    let (cs, ps): (Vec<_>, Vec<_>) = (0..TERMS)
                        .map(|_| {
                            k += 1;
                            (&cts[k % DISTINCT], &set.ws[k % n])
                        })
                        .unzip();
                    acc.add_products(&cs, &ps).map_err(he)?;
                    let _ = acc.finish();
                    Ok(())
                })
                .map(|ms| ms / TERMS as f64)
            };
            c.ct_pt_ms[level] = ct_pt(set.ws.len())?;
            c.ct_pt_cached_ms[level] = ct_pt(4 * DISTINCT)?;
            let mut m = 0usize;
            c.rescale_ms[level] = median_ms(reps, || {
                m += 1;
                ev.rescale(&set.prods[m % DISTINCT]).map(|_| ()).map_err(he)
            })?;
            // The same over Q·P: extended rotations × extended diagonals, fused ModDown + rescale.
            c.ext_ct_pt_ms[level] = median_ms(reps, || {
                let mut acc = ev.mul_accumulator_extended(level).map_err(he)?;
                let (cs, ps): (Vec<_>, Vec<_>) = (0..TERMS)
                    .map(|_| {
                        k += 1;
                        (&set.exts[k % DISTINCT], &set.ews[k % set.ews.len()])
                    })
                    .unzip();
                acc.add_products(&cs, &ps).map_err(he)?;
                let _ = acc.finish();
                Ok(())
            })? / TERMS as f64;
            c.mod_down_rescale_ms[level] = median_ms(reps, || {
                m += 1;
                ev.mod_down_rescale(&set.exts[m % DISTINCT])
                    .map(|_| ())
                    .map_err(he)
            })?;
        }
        Ok(c)
    }
}

//! Lossy, controlled compression of level-0 ciphertexts for the download: modulus switching to
//! `2^(b+k)` (Brakerski–Vaikuntanathan, FOCS 2011; BGV, ITCS 2012) and dropping `d` low bits of
//! `c0` (Kyber's `Compress_q`, Bos et al., EuroS&P 2018). Noise analysis:
//! docs/design/code-notes.md, "ckks: compress".

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::ciphertext::Ciphertext;
use crate::context::Context;
use crate::decrypt::Decryptor;
use crate::error::{CkksError, Result};
use crate::plaintext::Plaintext;

/// Failure probability (log2) of the high-probability bound on the slot error, per ciphertext.
const FAILURE_LOG2: f64 = 40.0;

/// Largest `b + k` handled (the switched numerator `c·2^(b+k)`, `|c| < 2^61`, must fit an `i128`).
const MAX_SWITCH_BITS: u32 = 64;

/// The parameters of a compressed ciphertext (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompressionParams {
    /// `b`: bits per coefficient of `c1'` (modulus `2^b`); `2 ≤ b < bits(q_0)`.
    pub bits: u32,
    /// `k`: headroom bits dropped from the top (switch to `2^(b+k)`, reduce mod `2^b`); `b + k ≤
    /// 64`.
    pub headroom: u32,
    /// `d`: low bits dropped from `c0'` (`c0'` has `b − d` bits); `d < b`.
    pub dropped: u32,
}

fn bits_of(q: u64) -> u32 {
    64 - q.leading_zeros()
}

/// `E_W[exp(−t²/(2(α + β·W)))]`, `W` ~ Exp(1), by Simpson's rule on `[0, 160]`.
fn product_tail(t: f64, alpha: f64, beta: f64) -> f64 {
    const W_MAX: f64 = 160.0;
    const STEPS: usize = 1600;
    let h = W_MAX / STEPS as f64;
    let f = |w: f64| (-w - t * t / (2.0 * (alpha + beta * w))).exp();
    let mut acc = f(0.0) + f(W_MAX);
    for i in 1..STEPS {
        acc += f(i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 };
    }
    acc * h / 3.0
}

/// `t_d` (coefficient units), exceeded by some slot part w.p. ≤ 2^-40; memoized per `(N, d)`.
fn tail_threshold(degree: usize, dropped: u32) -> f64 {
    static TAILS: OnceLock<Mutex<HashMap<(usize, u32), f64>>> = OnceLock::new();
    let tails = TAILS.get_or_init(|| Mutex::new(HashMap::new()));
    let cached = tails
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .get(&(degree, dropped))
        .copied();
    if let Some(t) = cached {
        return t;
    }
    // Computed outside the lock: a race computes the same value twice.
    let t = tail_threshold_uncached(degree, dropped);
    tails
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .insert((degree, dropped), t);
    t
}

fn tail_threshold_uncached(degree: usize, dropped: u32) -> f64 {
    let n = degree as f64;
    let alpha = n * 4f64.powi(dropped as i32) / 24.0;
    let beta = n * n / 36.0;
    let target = 2f64.powf(-FAILURE_LOG2) / n;
    let sigma = (alpha + beta).sqrt();
    let (mut lo, mut hi) = (0.0, 64.0 * sigma);
    while product_tail(hi, alpha, beta) > target {
        hi *= 2.0;
    }
    for _ in 0..48 {
        let mid = 0.5 * (lo + hi);
        if product_tail(mid, alpha, beta) > target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi
}

impl CompressionParams {
    /// Checks `2 ≤ b < bits(q_0)`, `d < b`, `b + k ≤ 64`. Errors:
    /// [`CkksError::InvalidCompression`].
    pub fn validate(&self, q0: u64) -> Result<()> {
        let reason = if self.bits < 2 || self.bits >= bits_of(q0) {
            "bits must be in 2..bits(q0)"
        } else if self.dropped >= self.bits {
            "dropped bits must be fewer than bits"
        } else if self.bits + self.headroom > MAX_SWITCH_BITS {
            "bits + headroom above 64"
        } else {
            return Ok(());
        };
        Err(CkksError::InvalidCompression { reason })
    }

    /// The scale `Δ' = Δ·2^(b+k)/q_0` the decompressed plaintext is decoded at.
    pub fn compressed_scale(&self, scale: f64, q0: u64) -> f64 {
        scale * 2f64.powi((self.bits + self.headroom) as i32) / q0 as f64
    }

    /// Serialized body size in bytes of both polynomials at degree N: `N·(2b − d)/8`.
    pub fn poly_bytes(&self, degree: usize) -> usize {
        degree * (2 * self.bits - self.dropped) as usize / 8
    }

    /// Bound (failure 2^-40 per ciphertext) on any slot part's added error, slot units: `t_d/Δ'`.
    pub fn predicted_error(&self, degree: usize, q0: u64, scale: f64) -> f64 {
        tail_threshold(degree, self.dropped) / self.compressed_scale(scale, q0)
    }

    /// Standard deviation of a slot part's error, slot units: `sqrt(N·(4^d/12 + N/18)/2)/Δ'`.
    pub fn error_std(&self, degree: usize, q0: u64, scale: f64) -> f64 {
        let n = degree as f64;
        let v = 4f64.powi(self.dropped as i32) / 12.0 + n / 18.0;
        (n * v / 2.0).sqrt() / self.compressed_scale(scale, q0)
    }

    /// Whether no coefficient can wrap modulo `2^b` for slot parts ≤ `value_bound`.
    pub fn fits(&self, degree: usize, q0: u64, scale: f64, value_bound: f64) -> bool {
        let coeff = std::f64::consts::SQRT_2 * value_bound * self.compressed_scale(scale, q0);
        let noise = 2f64.powi(self.dropped as i32 - 1) + degree as f64 / 2.0;
        // One unit of slack for the f64 evaluation of the left-hand side.
        coeff + noise + 1.0 < 2f64.powi(self.bits as i32 - 1)
    }

    /// The smallest `(b, k, d)` keeping slot errors ≤ `value_bound·2^-precision_bits` w.h.p. (costs
    /// milliseconds: keep it). Errors: [`CkksError::InvalidCompression`], `InvalidScale`,
    /// `CompressionBoundTooLarge` (values would wrap), `CompressionInfeasible`.
    pub fn choose(
        degree: usize,
        q0: u64,
        scale: f64,
        value_bound: f64,
        precision_bits: u32,
    ) -> Result<Self> {
        if !(value_bound.is_finite() && value_bound > 0.0) {
            return Err(CkksError::InvalidCompression {
                reason: "value bound must be finite and positive",
            });
        }
        if !(scale.is_finite() && scale >= 1.0) {
            return Err(CkksError::InvalidScale { scale });
        }
        if degree < 8 || !degree.is_power_of_two() {
            return Err(CkksError::InvalidCompression {
                reason: "degree must be a power of two ≥ 8",
            });
        }
        if precision_bits == 0 || precision_bits > 60 {
            return Err(CkksError::InvalidCompression {
                reason: "precision bits must be in 1..=60",
            });
        }
        let target = value_bound * 2f64.powi(-(precision_bits as i32));
        let max_bits = bits_of(q0).saturating_sub(1);
        let mut best: Option<CompressionParams> = None;
        let mut any_fit = false;
        let max_dropped = degree.max(1).ilog2();
        for bits in 2..=max_bits {
            for dropped in 0..bits.min(max_dropped + 1) {
                // The largest headroom that still fits (fits is monotone in k).
                let mut chosen = None;
                for headroom in 0..=MAX_SWITCH_BITS - bits {
                    let p = CompressionParams {
                        bits,
                        headroom,
                        dropped,
                    };
                    if p.fits(degree, q0, scale, value_bound) {
                        chosen = Some(p);
                    } else {
                        break;
                    }
                }
                let Some(p) = chosen else { continue };
                any_fit = true;
                let t = tail_threshold(degree, dropped);
                if t / p.compressed_scale(scale, q0) > target {
                    continue;
                }
                let cost = 2 * bits - dropped;
                if best.is_none_or(|b| cost < 2 * b.bits - b.dropped) {
                    best = Some(p);
                }
            }
        }
        match best {
            Some(p) => Ok(p),
            None if !any_fit => Err(CkksError::CompressionBoundTooLarge {
                bound: value_bound,
                scale,
            }),
            None => Err(CkksError::CompressionInfeasible {
                precision_bits,
                max_bits,
            }),
        }
    }
}

/// A compressed level-0 ciphertext: `c0'` mod `2^(b−d)`, `c1'` mod `2^b`, and the scale `Δ`.
/// Decrypt with [`Decryptor::decrypt_compressed`].
#[derive(Clone)]
pub struct CompressedCiphertext {
    pub(crate) ctx: Arc<Context>,
    /// `N` coefficients in `[0, 2^(b−d))`.
    pub(crate) c0: Vec<u64>,
    /// `N` coefficients in `[0, 2^b)`.
    pub(crate) c1: Vec<u64>,
    pub(crate) params: CompressionParams,
    pub(crate) scale: f64,
}

impl std::fmt::Debug for CompressedCiphertext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompressedCiphertext")
            .field("degree", &self.ctx.degree())
            .field("params", &self.params)
            .field("scale", &self.scale)
            .finish_non_exhaustive()
    }
}

impl PartialEq for CompressedCiphertext {
    fn eq(&self, o: &Self) -> bool {
        self.ctx.digest() == o.ctx.digest()
            && self.params == o.params
            && self.scale == o.scale
            && self.c0 == o.c0
            && self.c1 == o.c1
    }
}

impl CompressedCiphertext {
    /// The compression parameters.
    pub fn params(&self) -> CompressionParams {
        self.params
    }
    /// Scale Δ of the ciphertext it was compressed from.
    pub fn scale(&self) -> f64 {
        self.scale
    }
    /// The context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

/// `round(c·2^shift / q)` mod `2^bits` for the centered lift `c` of `x`, exactly.
fn switch(x: u64, q: u64, shift: u32, bits: u32) -> u64 {
    let negative = x > q / 2;
    let magnitude = if negative { q - x } else { x };
    let num = (u128::from(magnitude) << shift << 1) + u128::from(q);
    let r = (num / (2 * u128::from(q))) as u64;
    let r = if negative { r.wrapping_neg() } else { r };
    r & (u64::MAX >> (64 - bits))
}

impl Ciphertext {
    /// Compresses a level-0 ciphertext (values beyond `params`' bound wrap). Errors:
    /// [`CkksError::InvalidCompression`] off level 0 or for invalid `params`.
    pub fn compress(&self, params: &CompressionParams) -> Result<CompressedCiphertext> {
        if self.level != 0 {
            return Err(CkksError::InvalidCompression {
                reason: "only level-0 ciphertexts are compressed",
            });
        }
        let ctx = &self.ctx;
        let q0 = ctx.prime(0);
        params.validate(q0)?;
        let n = ctx.degree();
        let (b, k, d) = (params.bits, params.headroom, params.dropped);
        let mut c0 = self.c0[..n].to_vec();
        let mut c1 = self.c1[..n].to_vec();
        ctx.inv(0, &mut c0);
        ctx.inv(0, &mut c1);
        for x in &mut c0 {
            *x = switch(*x, q0, b + k - d, b - d);
        }
        for x in &mut c1 {
            *x = switch(*x, q0, b + k, b);
        }
        Ok(CompressedCiphertext {
            ctx: ctx.clone(),
            c0,
            c1,
            params: *params,
            scale: self.scale,
        })
    }
}

impl Decryptor {
    /// Decrypts to a level-0 plaintext at scale `Δ·2^(b+k)/q_0`. Errors:
    /// [`CkksError::ParameterMismatch`], [`CkksError::InvalidCompression`].
    pub fn decrypt_compressed(&self, ct: &CompressedCiphertext) -> Result<Plaintext> {
        let ctx = &self.sk.ctx;
        ctx.check(ct.ctx.digest())?;
        let q0 = ctx.prime(0);
        ct.params.validate(q0)?;
        let n = ctx.degree();
        let (b, d) = (ct.params.bits, ct.params.dropped);
        let half = 1u64 << (b - 1);
        // Centered c1' in [−2^(b−1), 2^(b−1)).
        let c1: Vec<i64> = ct
            .c1
            .iter()
            .map(|&v| v as i64 - (((v >= half) as i64) << b))
            .collect();
        // c1'·s modulo q_0 and modulo P (coefficients).
        let primes = [0, ctx.sp()];
        let mut prod = [vec![0u64; n], vec![0u64; n]];
        for (limb, &i) in prod.iter_mut().zip(&primes) {
            let m = ctx.moduli[i];
            for (o, &c) in limb.iter_mut().zip(&c1) {
                *o = m.from_i64(c);
            }
            ctx.fwd(i, limb);
            ctx.mul_scaled(i, limb, self.sk.scaled_limb(i));
            ctx.inv(i, limb);
        }
        // CRT: x = a0 + q0·((a1 − a0)·q0^{-1} mod p), centered modulo q0·p.
        let (m0, mp) = (ctx.moduli[0], ctx.moduli[ctx.sp()]);
        let q0_inv = mp.inv(mp.reduce(q0));
        let qp = q0 as i128 * mp.q as i128;
        let mask = (1u128 << b) - 1;
        let mut data = vec![0u64; n];
        for (k, o) in data.iter_mut().enumerate() {
            let (a0, a1) = (prod[0][k], prod[1][k]);
            let t = mp.mul(mp.sub(a1, mp.reduce(a0)), q0_inv);
            let mut x = a0 as i128 + q0 as i128 * t as i128;
            x -= qp * (x > qp / 2) as i128;
            let m = ((((ct.c0[k] as i128) << d) + x) as u128 & mask) as u64;
            // Centered in [−2^(b−1), 2^(b−1)), |m| < q0/2.
            let m = m as i64 - (((m >= half) as i64) << b);
            *o = m0.from_i64(m);
        }
        ctx.fwd(0, &mut data);
        Ok(Plaintext {
            data,
            level: 0,
            scale: ct.params.compressed_scale(ct.scale, q0),
            n_scaled: false,
            digest: ctx.digest(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encoder::Encoder;
    use crate::encrypt::Encryptor;
    use crate::evaluator::Evaluator;
    use crate::keys::SecretKey;
    use crate::params::{CkksParameters, Preset};
    use crate::sampling::os_rng;
    use rand::Rng;

    /// The process-wide tail memo gives exactly the fresh values, whichever thread filled it.
    #[test]
    fn cached_tail_thresholds_equal_fresh_ones() {
        let pairs = [(8192usize, 0u32), (8192, 7), (4096, 3), (16384, 13)];
        let handles: Vec<_> = (0..4)
            .map(|_| std::thread::spawn(move || pairs.map(|(n, d)| tail_threshold(n, d))))
            .collect();
        for h in handles {
            let cached = h.join().unwrap();
            for ((n, d), t) in pairs.iter().zip(cached) {
                assert_eq!(t.to_bits(), tail_threshold_uncached(*n, *d).to_bits());
            }
        }
        // More dropped bits, more rounding noise: a larger threshold.
        assert!(tail_threshold(8192, 8) > tail_threshold(8192, 4));
    }

    /// The signed `div_euclid` reference for `switch`.
    fn switch_reference(x: u64, q: u64, shift: u32, bits: u32) -> u64 {
        let c = if x > q / 2 {
            x as i128 - q as i128
        } else {
            x as i128
        };
        let q = q as i128;
        let r = (2 * (c << shift) + q).div_euclid(2 * q);
        (r as u64) & (u64::MAX >> (64 - bits))
    }

    proptest::proptest! {
        #[test]
        fn switch_matches_the_signed_reference(
            x in proptest::prelude::any::<u64>(),
            qi in 0usize..3,
            shift in 0u32..=64,
            bits in 2u32..=60,
        ) {
            // The chain's q0 and two other NTT primes of 50, 40 and 60 bits.
            let q = [1125899906826241u64, 1099510890497, 1152921504606830593][qi];
            let x = x % q;
            proptest::prop_assert_eq!(switch(x, q, shift, bits), switch_reference(x, q, shift, bits));
        }
    }

    #[test]
    fn switch_handles_the_extremes() {
        let q = 1125899906826241u64;
        for x in [0, 1, q / 2, q / 2 + 1, q - 1] {
            for (shift, bits) in [(0, 2), (14, 42), (56, 50), (63, 60), (64, 64)] {
                assert_eq!(
                    switch(x, q, shift, bits),
                    switch_reference(x, q, shift, bits),
                    "x {x} shift {shift}"
                );
            }
        }
    }

    fn ctx() -> Arc<Context> {
        Context::new(CkksParameters::preset(Preset::N8192Depth2Fast).unwrap()).unwrap()
    }

    /// Uniform in `[-bound, bound]`.
    fn uniform(rng: &mut impl Rng, n: usize, bound: f64) -> Vec<f64> {
        (0..n)
            .map(|_| ((rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * bound)
            .collect()
    }

    /// A level-0 ciphertext of `re + i·im` after ct×pt and rescale, its decryption, and the key.
    fn level0(ctx: &Arc<Context>, re: &[f64], im: &[f64]) -> (Ciphertext, SecretKey) {
        let mut rng = os_rng().unwrap();
        let sk = SecretKey::generate(ctx, &mut rng);
        let enc = Encoder::new(ctx);
        let ev = Evaluator::new(ctx);
        let scale = ctx.params().scale();
        let ct = Encryptor::new(ctx)
            .encrypt_values_sk(&enc, re, im, 1, scale, &sk, &mut rng)
            .unwrap()
            .expand();
        let q1 = ctx.params().moduli()[1] as f64;
        let one = enc.encode(&vec![1.0; ctx.slots()], 1, q1).unwrap();
        let mut out = ev.rescale(&ev.mul_plain(&ct, &one).unwrap()).unwrap();
        out.set_scale(scale);
        assert_eq!(out.level(), 0);
        (out, sk)
    }

    fn max_diff(a: &[crate::Complex64], b: &[crate::Complex64]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x.re - y.re).abs().max((x.im - y.im).abs()))
            .fold(0.0, f64::max)
    }

    #[test]
    fn compressed_decryption_matches_uncompressed_to_the_predicted_precision() {
        let ctx = ctx();
        let (n, q0, scale) = (ctx.degree(), ctx.prime(0), ctx.params().scale());
        let mut rng = os_rng().unwrap();
        for (bound, precision) in [(4.0, 24), (1.0, 20), (100.0, 28), (0.01, 16)] {
            let re = uniform(&mut rng, ctx.slots(), bound);
            let im = uniform(&mut rng, ctx.slots(), bound);
            let (ct, sk) = level0(&ctx, &re, &im);
            let dec = Decryptor::new(&sk);
            let enc = Encoder::new(&ctx);
            let plain = enc.decode_complex(&dec.decrypt(&ct).unwrap());
            let p = CompressionParams::choose(n, q0, scale, bound, precision).unwrap();
            let predicted = p.predicted_error(n, q0, scale);
            assert!(predicted <= bound * 2f64.powi(-(precision as i32)));
            let cc = ct.compress(&p).unwrap();
            let got = enc.decode_complex(&dec.decrypt_compressed(&cc).unwrap());
            let err = max_diff(&got, &plain);
            let rms = (got
                .iter()
                .zip(&plain)
                .map(|(x, y)| (x - y).norm_sqr())
                .sum::<f64>()
                / (2 * got.len()) as f64)
                .sqrt();
            let sigma = p.error_std(n, q0, scale);
            eprintln!(
                "rms {rms:.3e} vs model σ {sigma:.3e}; max {:.1} σ, bound {:.1} σ",
                err / sigma,
                predicted / sigma
            );
            // The averaged model is accurate (this can fail: ±10 %).
            assert!((rms / sigma - 1.0).abs() < 0.1, "rms {rms:e} vs {sigma:e}");
            eprintln!(
                "M = {bound}, P = {precision}: {p:?}, {} of {} bytes, err {err:.3e} ≤ {predicted:.3e}",
                p.poly_bytes(n),
                2 * n * 50 / 8
            );
            assert!(err <= predicted, "{err:e} > {predicted:e}");
            // The bound is not loose by more than 3 bits (it can fail).
            assert!(err >= predicted / 8.0, "{err:e} ≪ {predicted:e}");
            // Against the plaintext reference as well.
            let want: Vec<_> = re
                .iter()
                .zip(&im)
                .map(|(&a, &b)| crate::Complex64::new(a, b))
                .collect();
            assert!(max_diff(&got, &want) <= predicted + 1e-6 * bound.max(1.0));
        }
    }

    #[test]
    fn values_at_the_bound_do_not_wrap() {
        let ctx = ctx();
        let (n, q0, scale) = (ctx.degree(), ctx.prime(0), ctx.params().scale());
        let bound = 3.0;
        let p = CompressionParams::choose(n, q0, scale, bound, 24).unwrap();
        let slots = ctx.slots();
        // Constant, alternating and random signs at the bound: the extreme cases.
        let mut rng = os_rng().unwrap();
        let signs: Vec<f64> = (0..slots)
            .map(|_| if rng.next_u32() & 1 == 0 { 1.0 } else { -1.0 })
            .collect();
        let cases: Vec<(Vec<f64>, Vec<f64>)> = vec![
            (vec![bound; slots], vec![bound; slots]),
            (vec![-bound; slots], vec![bound; slots]),
            (
                (0..slots)
                    .map(|i| if i % 2 == 0 { bound } else { -bound })
                    .collect(),
                vec![-bound; slots],
            ),
            (
                signs.iter().map(|s| s * bound).collect(),
                signs.iter().map(|s| -s * bound).collect(),
            ),
        ];
        for (re, im) in cases {
            // Just below the bound, so that the level-0 noise keeps |z| ≤ M.
            let re: Vec<f64> = re.iter().map(|v| v * (1.0 - 1e-6)).collect();
            let im: Vec<f64> = im.iter().map(|v| v * (1.0 - 1e-6)).collect();
            let (ct, sk) = level0(&ctx, &re, &im);
            let dec = Decryptor::new(&sk);
            let enc = Encoder::new(&ctx);
            let plain = enc.decode_complex(&dec.decrypt(&ct).unwrap());
            let got =
                enc.decode_complex(&dec.decrypt_compressed(&ct.compress(&p).unwrap()).unwrap());
            let err = max_diff(&got, &plain);
            assert!(err <= p.predicted_error(n, q0, scale), "wrapped: {err:e}");
        }
        // Two more headroom bits wrap the constant vector (the check is tight within 4×).
        let wider = CompressionParams {
            headroom: p.headroom + 2,
            ..p
        };
        assert!(!wider.fits(n, q0, scale, bound));
        let (ct, sk) = level0(&ctx, &vec![bound; slots], &vec![bound; slots]);
        let dec = Decryptor::new(&sk);
        let enc = Encoder::new(&ctx);
        let got = enc.decode_complex(
            &dec.decrypt_compressed(&ct.compress(&wider).unwrap())
                .unwrap(),
        );
        // Decoded at the wider scale, the wrapped coefficient is far off.
        assert!((got[0].re - bound).abs() > 0.1 * bound);
    }

    #[test]
    fn the_chooser_refuses_what_it_cannot_deliver() {
        let ctx = ctx();
        let (n, q0, scale) = (ctx.degree(), ctx.prime(0), ctx.params().scale());
        // q0 ≈ 2^50, Δ = 2^40: √2·M·Δ·2 ≥ q0 from M ≈ 2^8.5.
        assert!(matches!(
            CompressionParams::choose(n, q0, scale, 400.0, 10),
            Err(CkksError::CompressionBoundTooLarge { .. })
        ));
        // 45 bits of precision need b > 49.
        assert!(matches!(
            CompressionParams::choose(n, q0, scale, 1.0, 45),
            Err(CkksError::CompressionInfeasible { .. })
        ));
        for (m, p) in [(f64::NAN, 20), (0.0, 20), (-1.0, 20), (1.0, 0), (1.0, 61)] {
            assert!(matches!(
                CompressionParams::choose(n, q0, scale, m, p),
                Err(CkksError::InvalidCompression { .. })
            ));
        }
        for degree in [0, 3, 6000] {
            assert!(matches!(
                CompressionParams::choose(degree, q0, scale, 1.0, 20),
                Err(CkksError::InvalidCompression { .. })
            ));
        }
        // Structural checks.
        for bad in [
            CompressionParams {
                bits: 50,
                headroom: 0,
                dropped: 0,
            },
            CompressionParams {
                bits: 30,
                headroom: 0,
                dropped: 30,
            },
            CompressionParams {
                bits: 40,
                headroom: 25,
                dropped: 0,
            },
        ] {
            assert!(bad.validate(q0).is_err(), "{bad:?}");
        }
        // A higher precision costs more bits; the choice always fits.
        let mut last = 0;
        for p in 10..=30 {
            let c = CompressionParams::choose(n, q0, scale, 2.0, p).unwrap();
            assert!(c.fits(n, q0, scale, 2.0));
            let bytes = c.poly_bytes(n);
            assert!(bytes >= last);
            last = bytes;
        }
    }

    #[test]
    fn only_level_zero_compresses() {
        let ctx = ctx();
        let mut rng = os_rng().unwrap();
        let sk = SecretKey::generate(&ctx, &mut rng);
        let enc = Encoder::new(&ctx);
        let pt = enc.encode(&[1.0], 1, ctx.params().scale()).unwrap();
        let ct = Encryptor::new(&ctx)
            .encrypt_sk(&pt, &sk, &mut rng)
            .unwrap()
            .expand();
        let p =
            CompressionParams::choose(ctx.degree(), ctx.prime(0), ctx.params().scale(), 1.0, 20)
                .unwrap();
        assert!(matches!(
            ct.compress(&p),
            Err(CkksError::InvalidCompression { .. })
        ));
    }
}

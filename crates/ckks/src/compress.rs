//! Lossy, controlled compression of level-0 ciphertexts for the download:
//! modulus switching to a power of two, dropping the headroom bits of both
//! polynomials and the low bits of `c0`.
//!
//! # The transformation
//! A level-0 ciphertext `(c0, c1)` modulo `q_0` at scale `Δ` decrypts to
//! `m = c0 + c1·s (mod q_0)` with `σ(m)/Δ = z`, the slot values. With
//! `B = b + k`, each coefficient (centered lift of `c mod q_0`) is switched
//! to the modulus `2^B` and reduced modulo `2^b`:
//!
//! * `c1' = round(c1 · 2^B / q_0) mod 2^b`,
//! * `c0' = round(c0 · 2^(B−d) / q_0) mod 2^(b−d)`,
//!
//! computed exactly (128-bit integers). The receiver computes
//! `m' = c0'·2^d + c1'·s (mod 2^b)`, `c1'·s` being formed exactly over the
//! integers (negacyclic product by the ternary `s`, `|coefficient| ≤ N·2^(b−1)`,
//! by NTT modulo `q_0` and the special prime and CRT), takes the centered
//! representative and decodes it at the scale `Δ' = Δ·2^B/q_0`. Since
//! `c0 + c1·s = m + q_0·I` for an integer polynomial `I`,
//! `m' = m·2^B/q_0 + 2^B·I + E ≡ m·2^B/q_0 + E (mod 2^b)` (k ≥ 0), with the
//! rounding error `E = e0·2^d + e1·s`, `|e0|, |e1| ≤ 1/2` coefficient-wise.
//!
//! This is modulus switching (Brakerski–Vaikuntanathan, "Efficient fully
//! homomorphic encryption from (standard) LWE", FOCS 2011, dimension-modulus
//! reduction; Brakerski–Gentry–Vaikuntanathan, ITCS 2012, modulus
//! switching; CKKS rescaling, Cheon–Kim–Kim–Song, Asiacrypt 2017, is the
//! same operation between primes) to a power-of-two modulus, followed by
//! dropping low-order bits of the part that is not multiplied by the secret
//! — the ciphertext compression of Kyber (Bos et al., "CRYSTALS-Kyber",
//! EuroS&P 2018, `Compress_q`, where `v` keeps fewer bits than `u` for the
//! same reason). Implemented here from those descriptions; no code is
//! copied.
//!
//! # Noise analysis ([`CompressionParams::choose`])
//! *Wrap-around.* If every slot value has `|Re z|, |Im z| ≤ M`, then
//! `|z| ≤ √2·M` and every coefficient of `m = σ^{-1}(Δ·z)` (an average of N
//! evaluations times roots of unity) satisfies `|m_i| ≤ √2·M·Δ`. The rounding
//! error is at most `2^(d−1) + N/2` per coefficient (`s` ternary). The
//! receiver's centered representative is right iff
//! `√2·M·Δ·2^B/q_0 + 2^(d−1) + N/2 < 2^(b−1)`: this worst-case condition is
//! checked exactly, so values up to the bound never wrap. The headroom `k`
//! is the largest that satisfies it (k = 0 is plain modulus switching;
//! raising k by one multiplies `Δ'` by 2 at the same b).
//!
//! *Precision.* A slot is `Σ_i E_i·ζ^i / Δ'` and the canonical embedding
//! is a ring homomorphism, so the slot error is
//! `(2^d·ê0_j + ê1_j·ŝ_j)/Δ'` with `x̂_j = x(ζ_j)`. Heuristically (as in
//! every CKKS noise analysis) the rounding errors are independent and
//! uniform (variance 1/12 per coefficient) and the evaluations are complex
//! Gaussians (central limit over N coefficients): `E|ê0_j|² = E|ê1_j|² = N/12`
//! and, for a uniform ternary secret (`E[s_i²] = 2/3`), `E|ŝ_j|² = 2N/3`.
//! Averaged over slots, the real and imaginary parts each have variance
//! `N·v/2`, `v = 4^d/12 + N/18` (the coefficient variance; the standard
//! deviation grows by √N from coefficients to slots), which the tests
//! match to 1 %. But `ê1_j·ŝ_j` is a *product* of Gaussians, whose tail is
//! exponential, not Gaussian: given `ŝ_j`, a part is Gaussian with variance
//! `σ²(W) = (N/24)·(4^d + (2N/3)·W)`, `W = |ŝ_j|²/(2N/3)` ~ Exp(1), so
//! `P(|part|·Δ' > t) ≤ E_W[exp(−t²/(2σ²(W)))]` (Chernoff). The bound
//! `t_d` solves `N·E_W[…] = 2^-40` (N parts per ciphertext; probability over
//! the key and the ciphertext; numerical integration and bisection): 10 to
//! 17 average standard deviations depending on d, where a Gaussian model
//! would say 8.6 — and measured maxima reach 6.6 of them (d = 7), which
//! the Gaussian bound's usual slack would not cover.
//! [`CompressionParams::predicted_error`] is `t_d/Δ'`; the chooser
//! requires it to be at most `M·2^-P` and, over every `d < b` with
//! `d ≤ log2 N` (beyond, the rounding of `c0` dominates the variance by a
//! factor N/1.5 and every further dropped bit costs a bit of b), picks the
//! smallest serialized size `N·(2b − d)` bits (ties: the smaller b).
//!
//! At N = 8192, `q_0 ≈ 2^50`, `Δ = 2^40`, M = 4 and P = 24 this gives
//! b = 42, k = 6, d = 8: 76 bits per coefficient pair instead of 100
//! (77 824 instead of 102 400 bytes; the `compress` tests print the
//! choices).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::ciphertext::Ciphertext;
use crate::context::Context;
use crate::decrypt::Decryptor;
use crate::error::{CkksError, Result};
use crate::plaintext::Plaintext;

/// Failure probability (log2) of the high-probability bound on the slot
/// error, per ciphertext.
const FAILURE_LOG2: f64 = 40.0;

/// Largest `b + k` handled (the switched numerator `c·2^(b+k)`,
/// `|c| < 2^61`, must fit an `i128`).
const MAX_SWITCH_BITS: u32 = 64;

/// The parameters of a compressed ciphertext (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompressionParams {
    /// `b`: bits per coefficient of `c1'` (the modulus `2^b` of the
    /// compressed ciphertext); `2 ≤ b < bits(q_0)`.
    pub bits: u32,
    /// `k`: headroom bits dropped from the top (the switch is to `2^(b+k)`,
    /// then reduced modulo `2^b`); `b + k ≤ 64`.
    pub headroom: u32,
    /// `d`: low bits dropped from `c0'` (`c0'` has `b − d` bits); `d < b`.
    pub dropped: u32,
}

fn bits_of(q: u64) -> u32 {
    64 - q.leading_zeros()
}

/// `E_W[exp(−t²/(2(α + β·W)))]`, `W` ~ Exp(1): Simpson's rule on
/// `[0, 160]` (the weight `e^{−w}` below 2^-230 beyond), 1600 intervals.
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

/// `t_d` of the module docs, in coefficient units (divide by `Δ'` for slot
/// units): the bound exceeded by some real or imaginary part of the N/2
/// slots of a compressed ciphertext with probability at most 2^-40.
///
/// Depends on `(N, d)` only and costs ≈ 0.4 ms (bisection over a numerical
/// integral), so it is computed once per process and pair: a server chooses
/// parameters for every output bound of every session, and recomputing the
/// tails there cost ≈ 6 ms per choice (≈ 1–3 s of server time in the first
/// round of each session; `cached_tail_thresholds_equal_fresh_ones`).
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
    // Computed outside the lock: two threads may both compute the same
    // (deterministic) value; either insert is right.
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
    /// Checks the structural constraints against `q_0`:
    /// `2 ≤ b < bits(q_0)`, `d < b`, `b + k ≤ 64`.
    ///
    /// # Errors
    /// [`CkksError::InvalidCompression`] naming the violated constraint.
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

    /// Serialized body size in bytes of both polynomials at degree N:
    /// `N·(2b − d)/8`.
    pub fn poly_bytes(&self, degree: usize) -> usize {
        degree * (2 * self.bits - self.dropped) as usize / 8
    }

    /// The high-probability bound (failure probability 2^-40 per
    /// ciphertext over the key and the rounding, module docs) on the
    /// absolute error the compression adds to the real or imaginary part of
    /// any slot, in slot units: `t_d/Δ'`.
    pub fn predicted_error(&self, degree: usize, q0: u64, scale: f64) -> f64 {
        tail_threshold(degree, self.dropped) / self.compressed_scale(scale, q0)
    }

    /// The standard deviation of the compression error of a real or
    /// imaginary slot part, averaged over the slots (module docs), in slot
    /// units: `sqrt(N·(4^d/12 + N/18)/2)/Δ'`.
    pub fn error_std(&self, degree: usize, q0: u64, scale: f64) -> f64 {
        let n = degree as f64;
        let v = 4f64.powi(self.dropped as i32) / 12.0 + n / 18.0;
        (n * v / 2.0).sqrt() / self.compressed_scale(scale, q0)
    }

    /// Whether no coefficient can wrap around modulo `2^b` when every slot
    /// part is at most `value_bound` in absolute value (module docs:
    /// `√2·M·Δ·2^(b+k)/q_0 + 2^(d−1) + N/2 < 2^(b−1)`).
    pub fn fits(&self, degree: usize, q0: u64, scale: f64, value_bound: f64) -> bool {
        let coeff = std::f64::consts::SQRT_2 * value_bound * self.compressed_scale(scale, q0);
        let noise = 2f64.powi(self.dropped as i32 - 1) + degree as f64 / 2.0;
        // One unit of slack for the f64 evaluation of the left-hand side.
        coeff + noise + 1.0 < 2f64.powi(self.bits as i32 - 1)
    }

    /// Chooses `(b, k, d)` for ciphertexts of degree `degree` modulo `q0`
    /// at scale `scale` whose slot values have real and imaginary parts at
    /// most `value_bound` in absolute value, such that the compression
    /// error of every slot part is at most `value_bound·2^-precision_bits`
    /// with high probability (module docs), with the fewest bytes. Costs a
    /// few milliseconds (numerical tail bounds): callers that compress many
    /// ciphertexts with the same bound should keep the result.
    ///
    /// # Errors
    /// [`CkksError::InvalidCompression`] for a non-finite or non-positive
    /// bound, a degree that is not a power of two ≥ 8, or `precision_bits`
    /// 0 or above 60; [`CkksError::InvalidScale`] for a scale below 1 or
    /// non-finite;
    /// [`CkksError::CompressionBoundTooLarge`] when values up to the bound
    /// would wrap even without compression (`2√2·M·Δ ≳ q_0`);
    /// [`CkksError::CompressionInfeasible`] when no `b < bits(q_0)` reaches
    /// the precision (too small a modulus for the request).
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

/// A compressed level-0 ciphertext: `c0'` modulo `2^(b−d)` and `c1'`
/// modulo `2^b` in coefficient form (module docs), and the scale `Δ` of the
/// ciphertext it came from. Decrypt with [`Decryptor::decrypt_compressed`];
/// it cannot be evaluated on.
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

/// `round(c·2^shift / q)` modulo `2^bits` for the centered lift `c` of
/// `x mod q`, exactly.
///
/// Computed on the magnitude `|c| < q/2` as `⌊(2|c|·2^shift + q) / 2q⌋`
/// and negated for negative `c`: the quotient is below `2^(shift − 1)`,
/// so with `shift ≤ 64` (`b + k ≤ 64`) and `q < 2^62` it is a
/// 128-by-64-bit division with a 64-bit quotient, one hardware divide,
/// where the signed 128-bit `div_euclid` it replaces took the generic
/// 128-bit path (the server spent ≈ 6 % of a standard LoRA round here).
/// Rounding is the same: `c·2^shift/q` is never a half-integer for an odd
/// prime `q` and `c ≠ 0` (`switch_matches_the_signed_reference`).
fn switch(x: u64, q: u64, shift: u32, bits: u32) -> u64 {
    let negative = x > q / 2;
    let magnitude = if negative { q - x } else { x };
    let num = (u128::from(magnitude) << shift << 1) + u128::from(q);
    let r = (num / (2 * u128::from(q))) as u64;
    let r = if negative { r.wrapping_neg() } else { r };
    r & (u64::MAX >> (64 - bits))
}

impl Ciphertext {
    /// Compresses a level-0 ciphertext with `params` (module docs): one
    /// inverse NTT per polynomial and an exact rounding per coefficient.
    /// The caller is responsible for the value bound `params` was chosen
    /// for ([`CompressionParams::choose`]); values beyond it wrap.
    ///
    /// # Errors
    /// [`CkksError::InvalidCompression`] when the ciphertext is not at
    /// level 0 or `params` fail [`CompressionParams::validate`].
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
    /// Decrypts a compressed ciphertext: `m' = c0'·2^d + c1'·s mod 2^b`,
    /// `c1'·s` computed exactly (NTT modulo `q_0` and the special prime,
    /// CRT), centered, returned as a level-0 plaintext at the scale
    /// `Δ' = Δ·2^(b+k)/q_0` for [`crate::Encoder::decode_complex`] (the
    /// same slot values as the uncompressed decryption, up to
    /// [`CompressionParams::predicted_error`]). Never sent back (as
    /// [`Decryptor::decrypt`]).
    ///
    /// # Errors
    /// [`CkksError::ParameterMismatch`] if the ciphertext belongs to another
    /// context than the key; [`CkksError::InvalidCompression`] for
    /// parameters that fail [`CompressionParams::validate`].
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

    /// Regression: every session's server recomputed the tails (≈ 6 ms
    /// per compression choice); the process-wide memo must give exactly
    /// the fresh values, whichever thread filled it.
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

    /// The exact signed rounding `switch` replaced (`div_euclid` on the
    /// centered lift), kept as the reference.
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

    /// A level-0 ciphertext of `re + i·im` reached by a ct×pt product and a
    /// rescale from level 1 (the noise of a real response), its
    /// uncompressed decryption, and the secret key.
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
        // Constant vectors put the whole mass into one coefficient
        // (|m_0| = √2·M·Δ for z = M(1 + i)); alternating signs and random
        // signs at the bound cover other extremes.
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
        // Two more headroom bits wrap the constant vector: the worst-case
        // check is tight to within a factor 4 (√2 of it is the worst-case
        // embedding, which a constant vector does not reach).
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

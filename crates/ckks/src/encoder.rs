//! Canonical-embedding encoder: N/2 real or complex slots ↔ integer polynomials in N-scaled NTT
//! form (Cheon–Kim–Kim–Song, Asiacrypt 2017, §3.2); slot `k` at `ζ^{5^k}`, so `5^r` rotates left by
//! `r`. Derivation: docs/design/code-notes.md, "ckks: encoder".

use std::f64::consts::PI;
use std::sync::Arc;

use rustfft::num_complex::Complex;
use rustfft::{Fft, FftPlanner};

use crate::context::Context;
use crate::error::{CkksError, Result};
use crate::modular::ShoupConst;
use crate::plaintext::{ExtendedPlaintext, Plaintext};

/// Encodes and decodes real vectors (see the module docs for the embedding).
#[derive(Clone)]
pub struct Encoder {
    ctx: Arc<Context>,
    /// Size-N/2 DFT with exponent sign `+` (evaluation at the slot points).
    eval_fft: Arc<dyn Fft<f64>>,
    /// Size-N/2 DFT with exponent sign `−` (rustfft's forward direction): interpolation (encode).
    interp_fft: Arc<dyn Fft<f64>>,
    /// Scratch lengths of the two plans' out-of-place calls.
    eval_scratch: usize,
    interp_scratch: usize,
    /// `twist[i] = ζ^i`, `i < N/2`.
    twist: Vec<Complex<f64>>,
    /// `untwist[i] = ζ^{-i} / (N/2)` (exact).
    untwist: Vec<Complex<f64>>,
    /// `slot_index[j] = (5^j mod 2N − 1)/4`: slot `j`'s index in the DFT.
    slot_index: Vec<u32>,
    /// `garner[i][j] = q_j^{-1} mod q_i` for `j < i`.
    garner: Vec<Vec<ShoupConst>>,
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder")
            .field("degree", &self.ctx.degree())
            .field("slots", &self.slot_index.len())
            .finish_non_exhaustive()
    }
}

/// Largest `|value·scale|` accepted (coefficients must fit an i64 with room).
const MAX_COEFF: f64 = 4.611_686_018_427_388e18; // 2^62

impl Encoder {
    /// Precomputes the FFT plans, twist factors and slot permutation for the context's degree.
    pub fn new(ctx: &Arc<Context>) -> Self {
        let n = ctx.degree();
        let slots = n / 2;
        let m = 2 * n;
        let mut slot_index = Vec::with_capacity(slots);
        let mut g = 1usize;
        for _ in 0..slots {
            debug_assert_eq!(g % 4, 1);
            slot_index.push(((g - 1) / 4) as u32);
            g = g * 5 % m;
        }
        // ζ^k = e^{iπk/N}; k < N/2, so the angle stays in [0, π/2).
        let zeta = |k: usize| {
            let a = PI * k as f64 / n as f64;
            Complex::new(a.cos(), a.sin())
        };
        let twist: Vec<Complex<f64>> = (0..slots).map(zeta).collect();
        let inv_slots = 1.0 / slots as f64;
        let untwist = twist.iter().map(|t| t.conj() * inv_slots).collect();
        let mut planner = FftPlanner::new();
        let eval_fft = planner.plan_fft_inverse(slots);
        let interp_fft = planner.plan_fft_forward(slots);
        let levels = ctx.max_level() + 1;
        let garner = (0..levels)
            .map(|i| {
                let mi = ctx.moduli[i];
                (0..i)
                    .map(|j| mi.shoup(mi.inv(mi.reduce(ctx.prime(j)))))
                    .collect()
            })
            .collect();
        Self {
            ctx: ctx.clone(),
            eval_scratch: eval_fft.get_outofplace_scratch_len(),
            interp_scratch: interp_fft.get_outofplace_scratch_len(),
            eval_fft,
            interp_fft,
            twist,
            untwist,
            slot_index,
            garner,
        }
    }

    /// The context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Evaluates at the slot points (`twisted`, clobbered) → the N/2 complex slot values.
    fn evaluate(&self, twisted: &mut [Complex<f64>]) -> Vec<Complex<f64>> {
        let slots = twisted.len();
        let mut out = vec![Complex::new(0.0, 0.0); slots];
        let mut scratch = vec![Complex::new(0.0, 0.0); self.eval_scratch];
        self.eval_fft
            .process_outofplace_with_scratch(twisted, &mut out, &mut scratch);
        self.slot_index.iter().map(|&l| out[l as usize]).collect()
    }

    /// The integer coefficients `round(Δ·m)` of the polynomial with slots `values` (+ i·`im`).
    pub(crate) fn coefficients(
        &self,
        values: &[f64],
        im: Option<&[f64]>,
        scale: f64,
    ) -> Result<Vec<i64>> {
        let slots = self.ctx.slots();
        let longest = values.len().max(im.map_or(0, <[f64]>::len));
        if longest > slots {
            return Err(CkksError::TooManyValues {
                got: longest,
                slots,
            });
        }
        if !(scale.is_finite() && scale >= 1.0) {
            return Err(CkksError::InvalidScale { scale });
        }
        // Slot j goes to DFT input l_j; unused slots are zero.
        let mut spectrum = vec![Complex::new(0.0, 0.0); slots];
        for (i, (&x, &l)) in values.iter().zip(&self.slot_index).enumerate() {
            if !x.is_finite() || (x * scale).abs() >= MAX_COEFF {
                return Err(CkksError::ValueOutOfRange { index: i });
            }
            spectrum[l as usize].re = x;
        }
        for (i, (&y, &l)) in im.unwrap_or(&[]).iter().zip(&self.slot_index).enumerate() {
            if !y.is_finite() || (y * scale).abs() >= MAX_COEFF {
                return Err(CkksError::ValueOutOfRange { index: i });
            }
            spectrum[l as usize].im = y;
        }
        let mut z = vec![Complex::new(0.0, 0.0); slots];
        let mut scratch = vec![Complex::new(0.0, 0.0); self.interp_scratch];
        self.interp_fft
            .process_outofplace_with_scratch(&mut spectrum, &mut z, &mut scratch);
        let mut coeffs = vec![0i64; 2 * slots];
        let (lo, hi) = coeffs.split_at_mut(slots);
        // |coefficient| ≤ max |value| (checked above), so these fit i64.
        crate::modular::vectorized(|| {
            for (((a, b), &c), &u) in lo.iter_mut().zip(hi.iter_mut()).zip(&z).zip(&self.untwist) {
                let c = c * u;
                *a = (c.re * scale).round_ties_even() as i64;
                *b = (c.im * scale).round_ties_even() as i64;
            }
        });
        Ok(coeffs)
    }

    /// Encodes up to N/2 real values at `level` and `scale` (≥ 1). Errors:
    /// [`CkksError::TooManyValues`], `ValueOutOfRange`, `InvalidScale`, `LevelOutOfRange`.
    pub fn encode(&self, values: &[f64], level: usize, scale: f64) -> Result<Plaintext> {
        self.encode_parts(values, None, level, scale)
    }

    /// Encodes up to N/2 complex values `re + i·im`. Errors as [`Self::encode`].
    pub fn encode_complex(
        &self,
        re: &[f64],
        im: &[f64],
        level: usize,
        scale: f64,
    ) -> Result<Plaintext> {
        self.encode_parts(re, Some(im), level, scale)
    }

    fn encode_parts(
        &self,
        values: &[f64],
        im: Option<&[f64]>,
        level: usize,
        scale: f64,
    ) -> Result<Plaintext> {
        let (_, data) = self.chain_limbs(values, im, level, scale)?;
        Ok(Plaintext {
            data,
            level,
            scale,
            n_scaled: true,
            digest: self.ctx.digest(),
        })
    }

    /// The integer coefficients and their limbs mod `q_0..=q_level`.
    fn chain_limbs(
        &self,
        values: &[f64],
        im: Option<&[f64]>,
        level: usize,
        scale: f64,
    ) -> Result<(Vec<i64>, Vec<u64>)> {
        let max = self.ctx.max_level();
        if level > max {
            return Err(CkksError::LevelOutOfRange { level, max });
        }
        let coeffs = self.coefficients(values, im, scale)?;
        let n = self.ctx.degree();
        let mut data = vec![0u64; (level + 1) * n];
        for (i, limb) in data.chunks_exact_mut(n).enumerate() {
            self.limb_of(&coeffs, i, limb);
        }
        Ok((coeffs, data))
    }

    /// The N-scaled NTT-form limb modulo prime `i` of integer coefficients.
    fn limb_of(&self, coeffs: &[i64], i: usize, limb: &mut [u64]) {
        crate::modular::reduce_signed_limb(&self.ctx.moduli[i], coeffs, limb);
        self.ctx.fwd(i, limb);
        // N-scaled storage: one SIMD product by N (the constant is N²·N^{-1}).
        self.ctx.mul_scaled(i, limb, &self.ctx.n_sq_vec[i]);
    }

    /// As [`Self::encode`], over `Q_level·P` (double hoisting).
    pub fn encode_extended(
        &self,
        values: &[f64],
        level: usize,
        scale: f64,
    ) -> Result<ExtendedPlaintext> {
        let (coeffs, data) = self.chain_limbs(values, None, level, scale)?;
        let n = self.ctx.degree();
        let mut special = vec![0u64; n];
        self.limb_of(&coeffs, self.ctx.sp(), &mut special);
        Ok(ExtendedPlaintext {
            pt: Plaintext {
                data,
                level,
                scale,
                n_scaled: true,
                digest: self.ctx.digest(),
            },
            special,
        })
    }

    /// Decodes a plaintext to its N/2 real slot values. Panics: for another context's plaintext.
    pub fn decode(&self, pt: &Plaintext) -> Vec<f64> {
        self.decode_complex(pt).into_iter().map(|z| z.re).collect()
    }

    /// As [`Self::decode`], both parts. Panics: for another context's plaintext.
    pub fn decode_complex(&self, pt: &Plaintext) -> Vec<Complex<f64>> {
        assert_eq!(
            pt.digest,
            self.ctx.digest(),
            "decode: plaintext from another context"
        );
        let n = self.ctx.degree();
        let slots = n / 2;
        let limbs = pt.level + 1;
        let mut coeff = pt.data.clone();
        for (i, limb) in coeff.chunks_exact_mut(n).enumerate() {
            self.ctx.inv(i, limb);
            if pt.n_scaled {
                self.ctx.normalize(i, limb);
            }
        }
        let primes: Vec<u64> = (0..limbs).map(|i| self.ctx.prime(i)).collect();
        let inv_scale = 1.0 / pt.scale;
        let mut v = vec![Complex::new(0.0, 0.0); slots];
        if limbs == 1 {
            // One limb (level 0): the balanced residue is the coefficient.
            let (q, half) = (primes[0], primes[0] / 2);
            let (lo, hi) = coeff.split_at(slots);
            let balanced = |t: u64| (t as i64 - q as i64 * (t > half) as i64) as f64 * inv_scale;
            crate::modular::vectorized(|| {
                for (((o, &a), &b), &w) in v.iter_mut().zip(lo).zip(hi).zip(&self.twist) {
                    *o = Complex::new(balanced(a), balanced(b)) * w;
                }
            });
            return self.evaluate(&mut v);
        }
        let mut digits = vec![0i64; limbs];
        for k in 0..n {
            // Garner: digit i is ((x_i − Σ_{j<i} d_j·Π_{l<j} q_l) / Π_{l<i} q_l) mod q_i, balanced.
            for i in 0..limbs {
                let mi = self.ctx.moduli[i];
                let mut t = coeff[i * n + k];
                for (&d, &g) in digits[..i].iter().zip(&self.garner[i]) {
                    t = mi.sub(t, mi.from_i64(d));
                    t = mi.mul_shoup(t, g);
                }
                // Balanced digit, without branching on the (secret) plaintext.
                digits[i] = t as i64 - primes[i] as i64 * (t > primes[i] / 2) as i64;
            }
            let mut x = digits[limbs - 1] as f64;
            for i in (0..limbs - 1).rev() {
                x = x * primes[i] as f64 + digits[i] as f64;
            }
            let x = x * inv_scale;
            if k < slots {
                v[k].re = x;
            } else {
                v[k - slots].im = x;
            }
        }
        crate::modular::vectorized(|| {
            for (o, &w) in v.iter_mut().zip(&self.twist) {
                *o *= w;
            }
        });
        self.evaluate(&mut v)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::OnceLock;

    use proptest::prelude::*;

    use super::*;
    use crate::params::CkksParameters;

    /// N = 4096, two chain primes (39 and 30 bits), scale 2^30.
    fn small_ctx() -> Arc<Context> {
        static CTX: OnceLock<Arc<Context>> = OnceLock::new();
        CTX.get_or_init(|| {
            let params = CkksParameters::builder()
                .degree(4096)
                .moduli_bits(&[39, 30])
                .special_moduli_bits(&[40])
                .scale_bits(30)
                .build()
                .unwrap();
            Context::new(params).unwrap()
        })
        .clone()
    }

    /// xorshift64 stream of `len` integers uniform in `(−2^bits, 2^bits)`.
    fn random_ints(len: usize, bits: u32, mut x: u64) -> Vec<i64> {
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let mag = (x >> 11) as i64 & ((1i64 << bits) - 1);
                if x & 1 == 1 { -mag } else { mag }
            })
            .collect()
    }

    /// Reference canonical embedding, O(N²): `Σ_k c_k·ζ^{e_j·k}`, `e_j = 5^j mod 2N`.
    fn naive_slots(coeffs: &[i64], scale: f64) -> Vec<Complex<f64>> {
        let n = coeffs.len();
        let two_n = 2 * n;
        let powers: Vec<Complex<f64>> = (0..two_n)
            .map(|t| {
                let a = PI * t as f64 / n as f64;
                Complex::new(a.cos(), a.sin())
            })
            .collect();
        let mut e = 1usize;
        (0..n / 2)
            .map(|_| {
                let mut acc = Complex::new(0.0, 0.0);
                for (k, &c) in coeffs.iter().enumerate() {
                    acc += powers[e * k % two_n] * c as f64;
                }
                e = e * 5 % two_n;
                acc / scale
            })
            .collect()
    }

    /// A plaintext holding `coeffs` at `level`, N-scaled or canonical.
    fn plaintext_of(
        enc: &Encoder,
        coeffs: &[i64],
        level: usize,
        scale: f64,
        n_scaled: bool,
    ) -> Plaintext {
        let ctx = enc.context();
        let n = ctx.degree();
        let mut data = vec![0u64; (level + 1) * n];
        for (i, limb) in data.chunks_exact_mut(n).enumerate() {
            if n_scaled {
                enc.limb_of(coeffs, i, limb);
            } else {
                crate::modular::reduce_signed_limb(&ctx.moduli[i], coeffs, limb);
                ctx.fwd(i, limb);
            }
        }
        Plaintext {
            data,
            level,
            scale,
            n_scaled,
            digest: ctx.digest(),
        }
    }

    /// The encoder is `Send + Sync + Clone`.
    #[test]
    fn encoder_is_send_sync_clone() {
        fn check<T: Send + Sync + Clone + std::fmt::Debug>() {}
        check::<Encoder>();
    }

    /// Decode equals the direct evaluation at every slot (one-limb and Garner paths).
    #[test]
    fn decode_matches_direct_evaluation_at_every_slot() {
        let ctx = small_ctx();
        let enc = Encoder::new(&ctx);
        let n = ctx.degree();
        let scale = 2f64.powi(30);
        for (level, bits, seed) in [(0usize, 36u32, 0x1234_5678u64), (1, 50, 0x9e37_79b9)] {
            let coeffs = random_ints(n, bits, seed);
            let want = naive_slots(&coeffs, scale);
            // Any slot is bounded by Σ|c_k|/Δ; allow rounding relative to that.
            let tol = 1e-12 * coeffs.iter().map(|&c| c.abs() as f64).sum::<f64>() / scale;
            for n_scaled in [true, false] {
                let pt = plaintext_of(&enc, &coeffs, level, scale, n_scaled);
                let got = enc.decode(&pt);
                let got_c = enc.decode_complex(&pt);
                assert_eq!(got.len(), n / 2);
                assert_eq!(got_c.len(), n / 2);
                for (j, ((g, gc), w)) in got.iter().zip(&got_c).zip(&want).enumerate() {
                    assert!(
                        (g - w.re).abs() <= tol,
                        "level {level}, slot {j}: {g} vs {} (tol {tol})",
                        w.re
                    );
                    assert!(
                        (gc - w).norm() <= 2.0 * tol,
                        "level {level}, slot {j}: {gc} vs {w} (tol {tol})"
                    );
                }
            }
        }
    }

    /// Encode then direct evaluation gives back the values, imaginary parts ≈ 0.
    #[test]
    fn encode_matches_direct_evaluation_at_every_slot() {
        let ctx = small_ctx();
        let enc = Encoder::new(&ctx);
        let slots = ctx.slots();
        let scale = 2f64.powi(30);
        for len in [slots, 37] {
            let values: Vec<f64> = random_ints(len, 20, 0xdead_beef)
                .into_iter()
                .map(|x| x as f64 / 2f64.powi(17))
                .collect();
            let coeffs = enc.coefficients(&values, None, scale).unwrap();
            let got = naive_slots(&coeffs, scale);
            for (j, g) in got.iter().enumerate() {
                let want = values.get(j).copied().unwrap_or(0.0);
                assert!(
                    (g.re - want).abs() < 1e-6,
                    "len {len}, slot {j}: {g} vs {want}"
                );
                assert!(g.im.abs() < 1e-6, "len {len}, slot {j}: {g}");
            }
        }
    }

    /// `encode_complex`: direct evaluation gives back both parts, each zero padded.
    #[test]
    fn encode_complex_matches_direct_evaluation_at_every_slot() {
        let ctx = small_ctx();
        let enc = Encoder::new(&ctx);
        let scale = 2f64.powi(30);
        let part = |len, seed| -> Vec<f64> {
            random_ints(len, 20, seed)
                .into_iter()
                .map(|x| x as f64 / 2f64.powi(17))
                .collect()
        };
        let (re, im) = (part(301, 0xfeed), part(1000, 0xbeef));
        let coeffs = enc.coefficients(&re, Some(&im), scale).unwrap();
        for (j, g) in naive_slots(&coeffs, scale).iter().enumerate() {
            let want_re = re.get(j).copied().unwrap_or(0.0);
            let want_im = im.get(j).copied().unwrap_or(0.0);
            assert!((g.re - want_re).abs() < 1e-6, "slot {j}: {g} vs {want_re}");
            assert!((g.im - want_im).abs() < 1e-6, "slot {j}: {g} vs {want_im}");
        }
        assert!(matches!(
            enc.encode_complex(&re, &vec![0.0; ctx.slots() + 1], 0, scale),
            Err(CkksError::TooManyValues { .. })
        ));
        assert!(matches!(
            enc.encode_complex(&re, &[0.0, f64::NAN], 0, scale),
            Err(CkksError::ValueOutOfRange { index: 1 })
        ));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// decode ∘ encode ≈ identity (≤ 2^-20 at Δ = 2^30, |v| ≤ 64) at levels 0 and 1.
        #[test]
        fn prop_encode_decode_round_trip_sparse(
            len in 0usize..=2048,
            seed in any::<u64>(),
            level in 0usize..2,
        ) {
            let ctx = small_ctx();
            let enc = Encoder::new(&ctx);
            let scale = 2f64.powi(30);
            let values: Vec<f64> = random_ints(len, 40, seed | 1)
                .into_iter()
                .map(|x| x as f64 / 2f64.powi(34))
                .collect();
            let got = enc.decode(&enc.encode(&values, level, scale).unwrap());
            prop_assert_eq!(got.len(), ctx.slots());
            for (j, g) in got.iter().enumerate() {
                let want = values.get(j).copied().unwrap_or(0.0);
                prop_assert!((g - want).abs() < 2f64.powi(-20), "slot {}: {} vs {}", j, g, want);
            }
        }
    }

    /// Encoding matches a direct O(N²) canonical embedding (small N).
    #[test]
    fn encoding_matches_naive_canonical_embedding() {
        let ctx = small_ctx();
        let enc = Encoder::new(&ctx);
        let n = ctx.degree();
        let values: Vec<f64> = (0..n / 2)
            .map(|i| ((i * 7919) % 1000) as f64 / 250.0 - 2.0)
            .collect();
        let scale = 2f64.powi(30);
        let coeffs = enc.coefficients(&values, None, scale).unwrap();
        for k in [0usize, 1, 2, 17, n / 2 - 1] {
            let e = (0..k).fold(1usize, |g, _| g * 5 % (2 * n)) as f64;
            let (mut re, mut im) = (0.0, 0.0);
            for (j, &c) in coeffs.iter().enumerate() {
                let a = PI * e * j as f64 / n as f64;
                re += c as f64 * a.cos();
                im += c as f64 * a.sin();
            }
            assert!(
                (re / scale - values[k]).abs() < 1e-6,
                "slot {k}: {} vs {}",
                re / scale,
                values[k]
            );
            assert!((im / scale).abs() < 1e-6);
        }
    }
}

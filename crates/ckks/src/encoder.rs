//! Canonical-embedding encoder: real vectors of up to N/2 slots ↔ integer
//! polynomials, written directly into N-scaled NTT form.
//!
//! Slot `k` is the evaluation of the message polynomial at `ζ^{5^k}` with
//! `ζ = e^{iπ/N}` (Cheon–Kim–Kim–Song, Asiacrypt 2017, §3.2 and the
//! "special FFT" of its reference implementation; the same ordering is used
//! by SEAL and Lattigo), so the Galois element `5^r` rotates slots left by
//! `r`. Encoding error: rounding adds at most 1/2 per coefficient, i.e. at
//! most `N/(2Δ)` (worst case) and about `√N/(2Δ)·O(1)` (typical) per slot
//! before encryption.

use std::f64::consts::PI;
use std::sync::Arc;

use crate::context::Context;
use crate::error::{CkksError, Result};
use crate::modular::ShoupConst;
use crate::plaintext::{ExtendedPlaintext, Plaintext};

/// A vector of complex numbers stored as separate real and imaginary parts
/// (structure of arrays), so the FFT butterflies vectorize.
#[derive(Debug, Clone)]
struct Split {
    re: Vec<f64>,
    im: Vec<f64>,
}

impl Split {
    fn zeros(n: usize) -> Self {
        Self {
            re: vec![0.0; n],
            im: vec![0.0; n],
        }
    }
}

/// One FFT stage as a pulp SIMD operation: `with_simd` is inlined into the
/// target-feature dispatch, so the butterflies are compiled for AVX-512 (a
/// closure this large would not be inlined).
struct Stage<'a> {
    v: &'a mut Split,
    len: usize,
    wr: &'a [f64],
    wi: &'a [f64],
    inverse: bool,
}

impl pulp::WithSimd for Stage<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        if self.inverse {
            ifft_stage(self.v, self.len, self.wr, self.wi);
        } else {
            fft_stage(self.v, self.len, self.wr, self.wi);
        }
    }
}

/// One forward radix-2 stage over blocks of `len` (twiddles `wr + i·wi`).
/// `inline(always)` so it is compiled inside the SIMD dispatch of
/// [`crate::modular::vectorized`].
#[inline(always)]
fn fft_stage(v: &mut Split, len: usize, wr: &[f64], wi: &[f64]) {
    let half = len / 2;
    for (re, im) in v.re.chunks_exact_mut(len).zip(v.im.chunks_exact_mut(len)) {
        let (lr, hr) = re.split_at_mut(half);
        let (li, hi) = im.split_at_mut(half);
        for j in 0..half {
            let tr = hr[j] * wr[j] - hi[j] * wi[j];
            let ti = hr[j] * wi[j] + hi[j] * wr[j];
            let (ur, ui) = (lr[j], li[j]);
            lr[j] = ur + tr;
            li[j] = ui + ti;
            hr[j] = ur - tr;
            hi[j] = ui - ti;
        }
    }
}

/// One inverse radix-2 stage (Gentleman–Sande) over blocks of `len`.
#[inline(always)]
fn ifft_stage(v: &mut Split, len: usize, wr: &[f64], wi: &[f64]) {
    let half = len / 2;
    for (re, im) in v.re.chunks_exact_mut(len).zip(v.im.chunks_exact_mut(len)) {
        let (lr, hr) = re.split_at_mut(half);
        let (li, hi) = im.split_at_mut(half);
        for j in 0..half {
            let (ur, ui) = (lr[j] + hr[j], li[j] + hi[j]);
            let (dr, di) = (lr[j] - hr[j], li[j] - hi[j]);
            lr[j] = ur;
            li[j] = ui;
            hr[j] = dr * wr[j] - di * wi[j];
            hi[j] = dr * wi[j] + di * wr[j];
        }
    }
}

/// Encodes and decodes real vectors (see the module docs for the embedding).
#[derive(Debug, Clone)]
pub struct Encoder {
    ctx: Arc<Context>,
    /// Forward special-FFT twiddles `ζ^{5^j}` of every stage (stage with
    /// half-length h at offset h − 1), real and imaginary parts.
    fwd_tw: Split,
    /// The inverse transform's twiddles, laid out the same way.
    inv_tw: Split,
    /// `garner[i][j] = q_j^{-1} mod q_i` for `j < i`.
    garner: Vec<Vec<ShoupConst>>,
    bitrev: Vec<u32>,
}

/// Largest `|value·scale|` accepted (coefficients must fit an i64 with room).
const MAX_COEFF: f64 = 4.611_686_018_427_388e18; // 2^62

impl Encoder {
    /// Precomputes the special-FFT tables for the context's degree.
    pub fn new(ctx: &Arc<Context>) -> Self {
        let n = ctx.degree();
        let slots = n / 2;
        let m = 2 * n;
        let mut rot_group = Vec::with_capacity(slots);
        let mut g = 1usize;
        for _ in 0..slots {
            rot_group.push(g);
            g = g * 5 % m;
        }
        let root = |k: usize| {
            let a = 2.0 * PI * k as f64 / m as f64;
            (a.cos(), a.sin())
        };
        let mut fwd_tw = Split::zeros(slots.max(1) - 1);
        let mut inv_tw = Split::zeros(slots.max(1) - 1);
        let mut half = 1;
        while 2 * half <= slots {
            let lenq = 8 * half;
            let stride = m / lenq;
            for (j, &g) in rot_group[..half].iter().enumerate() {
                let k = g & (lenq - 1);
                let (c, s) = root(k * stride);
                fwd_tw.re[half - 1 + j] = c;
                fwd_tw.im[half - 1 + j] = s;
                let (c, s) = root((lenq - k) * stride);
                inv_tw.re[half - 1 + j] = c;
                inv_tw.im[half - 1 + j] = s;
            }
            half *= 2;
        }
        let levels = ctx.max_level() + 1;
        let garner = (0..levels)
            .map(|i| {
                let mi = ctx.moduli[i];
                (0..i)
                    .map(|j| mi.shoup(mi.inv(mi.reduce(ctx.prime(j)))))
                    .collect()
            })
            .collect();
        let bits = slots.trailing_zeros();
        let bitrev = (0..slots as u32)
            .map(|i| i.reverse_bits() >> (32 - bits))
            .collect();
        Self {
            ctx: ctx.clone(),
            fwd_tw,
            inv_tw,
            garner,
            bitrev,
        }
    }

    /// The context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    fn bit_reverse(&self, v: &mut Split) {
        for (i, &j) in self.bitrev.iter().enumerate() {
            let j = j as usize;
            if i < j {
                v.re.swap(i, j);
                v.im.swap(i, j);
            }
        }
    }

    /// Evaluates at the slot points: coefficients (packed as `m_j + i·m_{j+N/2}`)
    /// → slot values (radix-2 Cooley–Tukey on the bit-reversed input, the
    /// twiddles of stage `len` being `ζ^{5^j}` for `j < len/2`).
    fn special_fft(&self, v: &mut Split) {
        let n = v.re.len();
        self.bit_reverse(v);
        let mut len = 2;
        while len <= n {
            let half = len / 2;
            let wr = &self.fwd_tw.re[half - 1..2 * half - 1];
            let wi = &self.fwd_tw.im[half - 1..2 * half - 1];
            pulp::Arch::new().dispatch(Stage {
                v: &mut *v,
                len,
                wr,
                wi,
                inverse: false,
            });
            len *= 2;
        }
    }

    /// Inverse of [`Self::special_fft`] (includes the `1/n` factor).
    fn special_ifft(&self, v: &mut Split) {
        let n = v.re.len();
        let mut len = n;
        while len >= 2 {
            let half = len / 2;
            let wr = &self.inv_tw.re[half - 1..2 * half - 1];
            let wi = &self.inv_tw.im[half - 1..2 * half - 1];
            pulp::Arch::new().dispatch(Stage {
                v: &mut *v,
                len,
                wr,
                wi,
                inverse: true,
            });
            len /= 2;
        }
        let inv = 1.0 / n as f64;
        crate::modular::vectorized(|| {
            for x in v.re.iter_mut().chain(v.im.iter_mut()) {
                *x *= inv;
            }
        });
        self.bit_reverse(v);
    }

    /// The integer coefficients `round(Δ·m)` of the polynomial whose slots
    /// are `values` (zero padded).
    fn coefficients(&self, values: &[f64], scale: f64) -> Result<Vec<i64>> {
        let slots = self.ctx.slots();
        if values.len() > slots {
            return Err(CkksError::TooManyValues {
                got: values.len(),
                slots,
            });
        }
        if !(scale.is_finite() && scale >= 1.0) {
            return Err(CkksError::InvalidScale { scale });
        }
        let mut v = Split::zeros(slots);
        for (i, (&x, c)) in values.iter().zip(v.re.iter_mut()).enumerate() {
            if !x.is_finite() || (x * scale).abs() >= MAX_COEFF {
                return Err(CkksError::ValueOutOfRange { index: i });
            }
            *c = x;
        }
        self.special_ifft(&mut v);
        let mut coeffs = vec![0i64; 2 * slots];
        let (lo, hi) = coeffs.split_at_mut(slots);
        // |coefficient| ≤ max |value| (the embedding is an isometry up to √N),
        // so the range check above keeps these inside i64.
        crate::modular::vectorized(|| {
            for (a, &c) in lo.iter_mut().zip(&v.re) {
                *a = (c * scale).round_ties_even() as i64;
            }
            for (b, &c) in hi.iter_mut().zip(&v.im) {
                *b = (c * scale).round_ties_even() as i64;
            }
        });
        Ok(coeffs)
    }

    /// Encodes up to N/2 real values (zero padded) at `level` and `scale`
    /// into an N-scaled NTT-form plaintext (one special FFT + `level+1` NTTs).
    /// Any scale ≥ 1 is allowed, e.g. exactly the prime a later rescale
    /// divides by, so callers can keep scales exact.
    ///
    /// # Errors
    /// [`CkksError::TooManyValues`], [`CkksError::ValueOutOfRange`] (NaN, ±∞
    /// or `|value·scale| ≥ 2^62`), [`CkksError::InvalidScale`],
    /// [`CkksError::LevelOutOfRange`].
    pub fn encode(&self, values: &[f64], level: usize, scale: f64) -> Result<Plaintext> {
        let (_, data) = self.chain_limbs(values, level, scale)?;
        Ok(Plaintext {
            data,
            level,
            scale,
            n_scaled: true,
            digest: self.ctx.digest(),
        })
    }

    /// The encoding's integer coefficients and its limbs modulo `q_0..=q_level`
    /// (what [`Self::encode`] and [`Self::encode_extended`] share).
    fn chain_limbs(
        &self,
        values: &[f64],
        level: usize,
        scale: f64,
    ) -> Result<(Vec<i64>, Vec<u64>)> {
        let max = self.ctx.max_level();
        if level > max {
            return Err(CkksError::LevelOutOfRange { level, max });
        }
        let coeffs = self.coefficients(values, scale)?;
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

    /// As [`Self::encode`], over the extended basis `Q_level·P` (one more
    /// NTT, for the special prime): a plaintext for ct×pt products on
    /// [`crate::ExtendedCiphertext`]s (double hoisting).
    ///
    /// # Errors
    /// As [`Self::encode`].
    pub fn encode_extended(
        &self,
        values: &[f64],
        level: usize,
        scale: f64,
    ) -> Result<ExtendedPlaintext> {
        let (coeffs, data) = self.chain_limbs(values, level, scale)?;
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

    /// Decodes a plaintext (from [`Self::encode`] or a decryption) to its
    /// N/2 real slot values: inverse NTT per limb, CRT by Garner's algorithm
    /// with balanced digits (exact, no big integers: the value is summed in
    /// f64 from the top digit), division by the scale, special FFT.
    ///
    /// # Panics
    /// If the plaintext belongs to another context.
    pub fn decode(&self, pt: &Plaintext) -> Vec<f64> {
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
        let mut v = Split::zeros(slots);
        if limbs == 1 {
            // One limb (level 0, what clients decrypt): the balanced residue
            // is the coefficient; branch-free and vectorized.
            let (q, half) = (primes[0], primes[0] / 2);
            let (lo, hi) = coeff.split_at(slots);
            crate::modular::vectorized(|| {
                for (dst, src) in [(&mut v.re, lo), (&mut v.im, hi)] {
                    for (o, &t) in dst.iter_mut().zip(src) {
                        let c = t as i64 - q as i64 * (t > half) as i64;
                        *o = c as f64 * inv_scale;
                    }
                }
            });
            self.special_fft(&mut v);
            return v.re;
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
                v.re[k] = x;
            } else {
                v.im[k - slots] = x;
            }
        }
        self.special_fft(&mut v);
        v.re
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::CkksParameters;

    /// Independent check of the embedding: evaluate the integer polynomial at
    /// ζ^{5^k} directly (O(N²), small N).
    #[test]
    fn encoding_matches_naive_canonical_embedding() {
        let params = CkksParameters::builder()
            .degree(4096)
            .moduli_bits(&[39, 30])
            .special_moduli_bits(&[40])
            .scale_bits(30)
            .build()
            .unwrap();
        let ctx = Context::new(params).unwrap();
        let enc = Encoder::new(&ctx);
        let n = ctx.degree();
        let values: Vec<f64> = (0..n / 2)
            .map(|i| ((i * 7919) % 1000) as f64 / 250.0 - 2.0)
            .collect();
        let scale = 2f64.powi(30);
        let coeffs = enc.coefficients(&values, scale).unwrap();
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

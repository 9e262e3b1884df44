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
use crate::plaintext::Plaintext;

#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct C64 {
    re: f64,
    im: f64,
}

impl C64 {
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        Self {
            re: self.re + o.re,
            im: self.im + o.im,
        }
    }
    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        Self {
            re: self.re - o.re,
            im: self.im - o.im,
        }
    }
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        Self {
            re: self.re * o.re - self.im * o.im,
            im: self.re * o.im + self.im * o.re,
        }
    }
}

/// Encodes and decodes real vectors (see the module docs for the embedding).
#[derive(Debug, Clone)]
pub struct Encoder {
    ctx: Arc<Context>,
    /// `5^j mod 2N` for `j < N/2`.
    rot_group: Vec<usize>,
    /// `e^{2πik/(2N)}` for `k ≤ 2N`.
    roots: Vec<C64>,
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
        let roots = (0..=m)
            .map(|k| {
                let a = 2.0 * PI * k as f64 / m as f64;
                C64 {
                    re: a.cos(),
                    im: a.sin(),
                }
            })
            .collect();
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
            rot_group,
            roots,
            garner,
            bitrev,
        }
    }

    /// The context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    fn bit_reverse(&self, v: &mut [C64]) {
        for (i, &j) in self.bitrev.iter().enumerate() {
            let j = j as usize;
            if i < j {
                v.swap(i, j);
            }
        }
    }

    /// Evaluates at the slot points: coefficients (packed as `m_j + i·m_{j+N/2}`)
    /// → slot values.
    fn special_fft(&self, v: &mut [C64]) {
        let n = v.len();
        let m = 2 * self.ctx.degree();
        self.bit_reverse(v);
        let mut len = 2;
        while len <= n {
            let half = len / 2;
            let lenq = len * 4;
            let stride = m / lenq;
            for chunk in v.chunks_exact_mut(len) {
                let (lo, hi) = chunk.split_at_mut(half);
                for j in 0..half {
                    let w = self.roots[(self.rot_group[j] & (lenq - 1)) * stride];
                    let u = lo[j];
                    let t = hi[j].mul(w);
                    lo[j] = u.add(t);
                    hi[j] = u.sub(t);
                }
            }
            len *= 2;
        }
    }

    /// Inverse of [`Self::special_fft`] (includes the `1/n` factor).
    fn special_ifft(&self, v: &mut [C64]) {
        let n = v.len();
        let m = 2 * self.ctx.degree();
        let mut len = n;
        while len >= 2 {
            let half = len / 2;
            let lenq = len * 4;
            let stride = m / lenq;
            for chunk in v.chunks_exact_mut(len) {
                let (lo, hi) = chunk.split_at_mut(half);
                for j in 0..half {
                    let w = self.roots[(lenq - (self.rot_group[j] & (lenq - 1))) * stride];
                    let u = lo[j].add(hi[j]);
                    let t = lo[j].sub(hi[j]).mul(w);
                    lo[j] = u;
                    hi[j] = t;
                }
            }
            len /= 2;
        }
        let inv = 1.0 / n as f64;
        for x in v.iter_mut() {
            x.re *= inv;
            x.im *= inv;
        }
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
        let mut v = vec![C64::default(); slots];
        for (i, (&x, c)) in values.iter().zip(v.iter_mut()).enumerate() {
            if !x.is_finite() || (x * scale).abs() >= MAX_COEFF {
                return Err(CkksError::ValueOutOfRange { index: i });
            }
            c.re = x;
        }
        self.special_ifft(&mut v);
        let mut coeffs = vec![0i64; 2 * slots];
        let (lo, hi) = coeffs.split_at_mut(slots);
        for ((c, a), b) in v.iter().zip(lo.iter_mut()).zip(hi.iter_mut()) {
            // |coefficient| ≤ max |value| (the embedding is an isometry up to √N),
            // so the range check above keeps these inside i64.
            *a = (c.re * scale).round() as i64;
            *b = (c.im * scale).round() as i64;
        }
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
        let max = self.ctx.max_level();
        if level > max {
            return Err(CkksError::LevelOutOfRange { level, max });
        }
        let coeffs = self.coefficients(values, scale)?;
        let n = self.ctx.degree();
        let mut data = vec![0u64; (level + 1) * n];
        for (i, limb) in data.chunks_exact_mut(n).enumerate() {
            let m = self.ctx.moduli[i];
            let nc = self.ctx.n_mod[i];
            for (x, &c) in limb.iter_mut().zip(&coeffs) {
                *x = m.mul_shoup(m.from_i64(c), nc);
            }
            self.ctx.fwd(i, limb);
        }
        Ok(Plaintext {
            data,
            level,
            scale,
            n_scaled: true,
            digest: self.ctx.digest(),
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
        let mut digits = vec![0i64; limbs];
        let mut v = vec![C64::default(); slots];
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
        self.special_fft(&mut v);
        v.into_iter().map(|c| c.re).collect()
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
            let e = enc.rot_group[k] as f64;
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

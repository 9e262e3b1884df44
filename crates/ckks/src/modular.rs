//! Word-size modular arithmetic for primes below 2^62: Shoup multiplication by a precomputed
//! constant (Harvey 2014, §2), Barrett-style reduction, exponentiation and deterministic
//! Miller–Rabin.

/// A prime modulus `q < 2^62` with its reduction constants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Modulus {
    /// The prime.
    pub q: u64,
    /// `⌊2^64 / q⌋`, used to reduce any `u64`.
    ratio: u64,
}

/// A constant `w < q` with its Shoup companion `⌊w·2^64/q⌋`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShoupConst {
    /// The constant.
    pub w: u64,
    /// `⌊w·2^64/q⌋`.
    pub w_shoup: u64,
}

impl Modulus {
    /// Wraps a prime `q < 2^62`.
    pub fn new(q: u64) -> Self {
        debug_assert!(q > 2 && q < (1 << 62));
        Self {
            q,
            ratio: ((1u128 << 64) / q as u128) as u64,
        }
    }

    /// `x mod q` for any `u64` `x`.
    #[inline(always)]
    pub fn reduce(&self, x: u64) -> u64 {
        let qhat = ((x as u128 * self.ratio as u128) >> 64) as u64;
        let r = x.wrapping_sub(qhat.wrapping_mul(self.q));
        // r ∈ [0, 2q): branch-free final correction.
        r.min(r.wrapping_sub(self.q))
    }

    /// `x mod q` for a `u128` (slow path, set-up only).
    #[inline]
    pub fn reduce_u128(&self, x: u128) -> u64 {
        (x % self.q as u128) as u64
    }

    /// `(a + b) mod q` for `a, b < q`.
    #[inline(always)]
    pub fn add(&self, a: u64, b: u64) -> u64 {
        // Branch-free (min of s and s − q with wrap-around): vectorizes.
        let s = a + b;
        s.min(s.wrapping_sub(self.q))
    }

    /// `(a − b) mod q` for `a, b < q`.
    #[inline(always)]
    pub fn sub(&self, a: u64, b: u64) -> u64 {
        let d = a.wrapping_sub(b);
        d.min(d.wrapping_add(self.q))
    }

    /// `−a mod q` for `a < q` (branch-free).
    #[inline(always)]
    pub fn neg(&self, a: u64) -> u64 {
        let d = self.q - a;
        d.min(d.wrapping_sub(self.q))
    }

    /// `a·b mod q` (set-up path, one 128-bit remainder).
    #[inline]
    pub fn mul(&self, a: u64, b: u64) -> u64 {
        self.reduce_u128(a as u128 * b as u128)
    }

    /// Precomputes the Shoup companion of `w` (reduced mod q first).
    pub fn shoup(&self, w: u64) -> ShoupConst {
        let w = self.reduce(w);
        ShoupConst {
            w,
            w_shoup: (((w as u128) << 64) / self.q as u128) as u64,
        }
    }

    /// `a·w mod q` for any `u64` `a`, with `w` precomputed by [`Modulus::shoup`].
    #[inline(always)]
    pub fn mul_shoup(&self, a: u64, c: ShoupConst) -> u64 {
        let qhat = ((a as u128 * c.w_shoup as u128) >> 64) as u64;
        let r = a.wrapping_mul(c.w).wrapping_sub(qhat.wrapping_mul(self.q));
        r.min(r.wrapping_sub(self.q))
    }

    /// `a^e mod q`.
    pub fn pow(&self, mut a: u64, mut e: u64) -> u64 {
        let mut r = 1u64;
        a = self.reduce(a);
        while e > 0 {
            if e & 1 == 1 {
                r = self.mul(r, a);
            }
            a = self.mul(a, a);
            e >>= 1;
        }
        r
    }

    /// `a^{-1} mod q` (q prime, a ≠ 0 mod q).
    pub fn inv(&self, a: u64) -> u64 {
        self.pow(a, self.q - 2)
    }

    /// Maps a signed value into `[0, q)` (branch-free: used on plaintext coefficients).
    #[inline(always)]
    pub fn from_i64(&self, x: i64) -> u64 {
        let r = self.reduce(x.unsigned_abs());
        let mask = 0u64.wrapping_sub((x < 0) as u64);
        (self.neg(r) & mask) | (r & !mask)
    }

    /// Centered lift of `x ∈ [0, src)` (a residue modulo `src`) into `[0, q)`: the representative
    /// in `(−src/2, src/2]` is reduced modulo `q`.
    #[inline(always)]
    pub fn lift_centered(&self, x: u64, src: u64) -> u64 {
        let negative = x > src / 2;
        let mag = if negative { src - x } else { x };
        let r = self.reduce(mag);
        if negative { self.neg(r) } else { r }
    }
}

/// Centered lift of a limb (residues mod `src_q`) into `[0, m.q)`, as [`Modulus::lift_centered`],
/// branch-free and vectorized.
pub(crate) fn lift_centered_limb(m: &Modulus, src: &[u64], src_q: u64, out: &mut [u64]) {
    lift_centered_combine(m, src, src_q, out, |_, lifted| lifted);
}

/// As [`lift_centered_limb`], with `out[k] ← f(out[k], lift(src[k]))` (`f` branch-free).
#[inline(always)]
pub(crate) fn lift_centered_combine(
    m: &Modulus,
    src: &[u64],
    src_q: u64,
    out: &mut [u64],
    f: impl Fn(u64, u64) -> u64,
) {
    let q = m.q;
    let half = src_q / 2;
    if src_q <= q {
        // |x| < q already: x or x − src_q + q.
        let shift = q - src_q;
        vectorized(|| {
            for (o, &x) in out.iter_mut().zip(src) {
                *o = f(*o, x + shift * ((x > half) as u64));
            }
        });
        return;
    }
    let inv_q = 1.0 / q as f64;
    vectorized(|| {
        for (o, &x) in out.iter_mut().zip(src) {
            let neg = (x > half) as u64;
            let mag = x ^ ((x ^ (src_q - x)) & 0u64.wrapping_sub(neg));
            *o = f(*o, signed_residue(mag, neg, q, inv_q));
        }
    });
}

/// `±mag mod q` (minus when `neg = 1`) for `mag < 2^63`, `q ≥ 2^20`, branch-free.
#[inline(always)]
fn signed_residue(mag: u64, neg: u64, q: u64, inv_q: f64) -> u64 {
    // Round the estimate (< 2^44) to an integer by adding 2^52 and reading the mantissa bits:
    // unlike a saturating `as u64`, this vectorizes.
    const MAGIC: f64 = 4_503_599_627_370_496.0; // 2^52
    let quot = (mag as f64 * inv_q + MAGIC).to_bits() - MAGIC.to_bits();
    let mut r = mag.wrapping_sub(quot.wrapping_mul(q)) as i64;
    let qi = q as i64;
    r += qi & (r >> 63);
    r += qi & (r >> 63);
    r -= qi & !((r - qi) >> 63);
    r -= qi & !((r - qi) >> 63);
    let r = r as u64;
    let negr = (q - r) & 0u64.wrapping_sub((r != 0) as u64);
    r ^ ((r ^ negr) & 0u64.wrapping_sub(neg))
}

/// Residues in `[0, q)` of signed coefficients (`|c| < 2^62`), branch-free and auto-vectorized
/// (used on plaintext coefficients).
pub(crate) fn reduce_signed_limb(m: &Modulus, src: &[i64], out: &mut [u64]) {
    let q = m.q;
    let inv_q = 1.0 / q as f64;
    vectorized(|| {
        for (o, &c) in out.iter_mut().zip(src) {
            *o = signed_residue(c.unsigned_abs(), (c < 0) as u64, q, inv_q);
        }
    });
}

/// Runs `f` compiled for the best instruction set available (pulp's `vectorize`).
#[inline(always)]
pub(crate) fn vectorized<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        if let Some(simd) = pulp::x86::V4::try_new() {
            return simd.vectorize(f);
        }
        if let Some(simd) = pulp::x86::V3::try_new() {
            return simd.vectorize(f);
        }
    }
    f()
}

/// Deterministic Miller–Rabin for 64-bit integers (bases: the first 12 primes, sufficient for all
/// n < 3.3·10^24).
pub fn is_prime(n: u64) -> bool {
    if n < 2 {
        return false;
    }
    const BASES: [u64; 12] = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37];
    for &p in &BASES {
        if n.is_multiple_of(p) {
            return n == p;
        }
    }
    let mut d = n - 1;
    let mut s = 0;
    while d.is_multiple_of(2) {
        d /= 2;
        s += 1;
    }
    let mulm = |a: u64, b: u64| ((a as u128 * b as u128) % n as u128) as u64;
    let powm = |mut a: u64, mut e: u64| {
        let mut r = 1u64;
        while e > 0 {
            if e & 1 == 1 {
                r = mulm(r, a);
            }
            a = mulm(a, a);
            e >>= 1;
        }
        r
    };
    'outer: for &a in &BASES {
        let mut x = powm(a, d);
        if x == 1 || x == n - 1 {
            continue;
        }
        for _ in 1..s {
            x = mulm(x, x);
            if x == n - 1 {
                continue 'outer;
            }
        }
        return false;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const Q: u64 = (1 << 50) - 27 * (1 << 14) + 1;

    #[test]
    fn miller_rabin_matches_trial_division() {
        let naive = |n: u64| {
            n >= 2
                && (2..)
                    .take_while(|d| d * d <= n)
                    .all(|d| !n.is_multiple_of(d))
        };
        for n in 0..5000u64 {
            assert_eq!(is_prime(n), naive(n), "n = {n}");
        }
        assert!(is_prime(0xffff_ffff_ffff_ffc5)); // largest 64-bit prime
        assert!(!is_prime(3_215_031_751)); // strong pseudoprime to bases 2,3,5,7
    }

    proptest! {
        #[test]
        fn shoup_and_reduce_match_u128(a in any::<u64>(), w in any::<u64>(), bits in 20u32..62) {
            let q = ((1u64 << bits) - 1) | 1;
            let m = Modulus::new(q);
            prop_assert_eq!(m.reduce(a), a % q);
            let c = m.shoup(w);
            prop_assert_eq!(m.mul_shoup(a, c), ((a as u128 * (w % q) as u128) % q as u128) as u64);
        }

        #[test]
        fn centered_lift_limb_matches_scalar(
            xs in proptest::collection::vec(any::<u64>(), 1..64),
            src_bits in 20u32..62,
            dst_bits in 20u32..62,
        ) {
            let src_q = ((1u64 << src_bits) - 1) | 1;
            let m = Modulus::new(((1u64 << dst_bits) - 3) | 1);
            let src: Vec<u64> = xs.iter().map(|x| x % src_q).collect();
            let mut out = vec![0u64; src.len()];
            lift_centered_limb(&m, &src, src_q, &mut out);
            for (&x, &o) in src.iter().zip(&out) {
                prop_assert_eq!(o, m.lift_centered(x, src_q));
            }
        }

        #[test]
        fn reduce_signed_limb_matches_from_i64(
            xs in proptest::collection::vec(-(1i64 << 62) + 1..(1i64 << 62), 1..64),
            bits in 20u32..62,
        ) {
            let m = Modulus::new(((1u64 << bits) - 3) | 1);
            let mut out = vec![0u64; xs.len()];
            reduce_signed_limb(&m, &xs, &mut out);
            for (&x, &o) in xs.iter().zip(&out) {
                prop_assert_eq!(o, m.from_i64(x));
            }
        }

        #[test]
        fn centered_lift_is_congruent(x in 0u64..Q, q2 in (1u64 << 30)..(1u64 << 61)) {
            let m = Modulus::new(q2 | 1);
            let signed: i128 = if x > Q / 2 { x as i128 - Q as i128 } else { x as i128 };
            let expect = signed.rem_euclid((q2 | 1) as i128) as u64;
            prop_assert_eq!(m.lift_centered(x, Q), expect);
        }
    }
}

//! The negacyclic NTT modulo a prime `p < 2^50` in AVX2 + FMA doubles: Cooley–Tukey forward and
//! Gentleman–Sande inverse with twiddles in bit-reversed order (Longa–Naehrig, CANS 2016,
//! Algorithms 1 and 2). Its outputs are those of tfhe-ntt's `prime64::Plan` for the same root, in
//! the same order (tests compare them), so ciphertexts move between CPUs with and without IFMA.
//!
//! Between stages every value is an integer of magnitude below p held in an `f64` whose bits sit
//! in the caller's `u64` buffer; the first pass converts the residues, the last one converts back.

use super::Ops;
use crate::modular::Modulus;
use pulp::x86::V3;
use pulp::{as_arrays, as_arrays_mut, cast};
use std::arch::x86_64::__m256d;

/// One direction's twiddles as `f64`.
#[derive(Debug, Clone)]
struct Twiddles {
    /// `ω^{bitrev(k)}`, k < n, indexed as the stages read them (`m + i`).
    w: Vec<f64>,
    /// The stage with butterflies two apart, per pair of vectors `[w_a, w_a, w_b, w_b]`.
    two: Vec<f64>,
    /// The stage with adjacent butterflies, per pair of vectors `[w_0, w_2, w_1, w_3]`.
    one: Vec<f64>,
}

impl Twiddles {
    /// From `w[m + i]`, as the stages with m = n/4 (butterflies two apart) and m = n/2
    /// (adjacent) read them after the vectors' shuffles.
    fn new(w: Vec<u64>) -> Self {
        let n = w.len();
        let two = (0..n / 8)
            .flat_map(|v| {
                let (a, b) = (w[n / 4 + 2 * v], w[n / 4 + 2 * v + 1]);
                [a, a, b, b]
            })
            .map(|x| x as f64)
            .collect();
        let one = (0..n / 8)
            .flat_map(|v| {
                let b = n / 2 + 4 * v;
                [w[b], w[b + 2], w[b + 1], w[b + 3]]
            })
            .map(|x| x as f64)
            .collect();
        Self {
            w: w.into_iter().map(|x| x as f64).collect(),
            two,
            one,
        }
    }
}

/// The NTT of one prime and degree.
#[derive(Debug, Clone)]
pub(crate) struct Ntt {
    simd: V3,
    p: u64,
    n_inv: u64,
    fwd: Twiddles,
    inv: Twiddles,
}

impl Ntt {
    /// The NTT for `p < 2^50` (prime, `p ≡ 1 mod 2n`), degree `n ≥ 16` (a power of two), and
    /// `psi`, the primitive 2n-th root whose odd powers the forward transform evaluates at
    /// (tfhe-ntt's: its transform of `X` at output 0). `None` outside these bounds or on a CPU
    /// without AVX2 + FMA.
    pub(crate) fn new(p: u64, n: usize, psi: u64) -> Option<Self> {
        let simd = V3::try_new()?;
        if !(3..1 << 50).contains(&p) || n < 16 || !n.is_power_of_two() {
            return None;
        }
        let bits = n.trailing_zeros();
        let rev = |k: usize| k.reverse_bits() >> (usize::BITS - bits);
        let m = Modulus::new(p);
        let psi_inv = m.inv(psi);
        let table = |root: u64| {
            let mut w = vec![0u64; n];
            let mut x = 1u64;
            for k in 0..n {
                w[rev(k)] = x;
                x = m.mul(x, root);
            }
            w
        };
        Some(Self {
            simd,
            p,
            n_inv: m.inv(n as u64),
            fwd: Twiddles::new(table(psi)),
            inv: Twiddles::new(table(psi_inv)),
        })
    }

    /// Coefficients → evaluations in place, residues in `[0, p)` in and out; `buf.len()` = n.
    pub(crate) fn forward(&self, buf: &mut [u64]) {
        let (simd, ntt) = (self.simd, self);
        // A `move` closure that consumes `buf` is `FnOnce` only, so pulp calls its body, marked
        // `inline(always)`, directly; a reborrowing closure would go through the `FnOnce` shim,
        // which LLVM may leave out of line, and then no intrinsic inlines.
        simd.vectorize(
            #[inline(always)]
            move || {
                let buf = buf;
                let ops = Ops::new(simd, ntt.p);
                let avx = simd.avx;
                let n = buf.len();
                let (v, _) = as_arrays_mut::<4, u64>(buf);
                for x in v.iter_mut() {
                    put(x, ops.exact_f64(cast(*x)));
                }
                // Stages with butterflies at least four apart: whole vectors.
                let (mut m, mut t) = (1, n / 2);
                while t >= 4 {
                    let (tv, w) = (t / 4, &ntt.fwd.w[m..2 * m]);
                    for (group, &w) in v.chunks_exact_mut(2 * tv).zip(w) {
                        let w = avx._mm256_set1_pd(w);
                        let (lo, hi) = group.split_at_mut(tv);
                        for (a, b) in lo.iter_mut().zip(hi) {
                            let (u, s) = (get(a), ops.mul_reduce(get(b), w));
                            put(a, ops.reduce(ops.add(u, s)));
                            put(b, ops.reduce(ops.sub(u, s)));
                        }
                    }
                    (m, t) = (2 * m, t / 2);
                }
                // Butterflies two apart, then adjacent: shuffle each pair of vectors into (u, v) halves.
                for (pair, (w2, w1)) in v
                    .chunks_exact_mut(2)
                    .zip(quads(&ntt.fwd.two).iter().zip(quads(&ntt.fwd.one)))
                {
                    let (a, b) = (get(&pair[0]), get(&pair[1]));
                    let w2: __m256d = cast(*w2);
                    let (x, y) = (
                        avx._mm256_permute2f128_pd::<0x20>(a, b),
                        avx._mm256_permute2f128_pd::<0x31>(a, b),
                    );
                    let s = ops.mul_reduce(y, w2);
                    let (x, y) = (ops.reduce(ops.add(x, s)), ops.reduce(ops.sub(x, s)));
                    let (a, b) = (
                        avx._mm256_permute2f128_pd::<0x20>(x, y),
                        avx._mm256_permute2f128_pd::<0x31>(x, y),
                    );
                    let w1: __m256d = cast(*w1);
                    let (x, y) = (avx._mm256_unpacklo_pd(a, b), avx._mm256_unpackhi_pd(a, b));
                    let s = ops.mul_reduce(y, w1);
                    let (x, y) = (ops.add(x, s), ops.sub(x, s));
                    let (a, b) = (avx._mm256_unpacklo_pd(x, y), avx._mm256_unpackhi_pd(x, y));
                    pair[0] = cast(ops.canonical(ops.reduce(a)));
                    pair[1] = cast(ops.canonical(ops.reduce(b)));
                }
            },
        );
    }

    /// Evaluations → coefficients in place, including the factor `n^{-1}`; residues in
    /// `[0, p)` in and out; `buf.len()` = n.
    pub(crate) fn inverse(&self, buf: &mut [u64]) {
        let (simd, ntt) = (self.simd, self);
        // A `move` closure that consumes `buf` is `FnOnce` only, so pulp calls its body, marked
        // `inline(always)`, directly; a reborrowing closure would go through the `FnOnce` shim,
        // which LLVM may leave out of line, and then no intrinsic inlines.
        simd.vectorize(
            #[inline(always)]
            move || {
                let buf = buf;
                let ops = Ops::new(simd, ntt.p);
                let avx = simd.avx;
                let n = buf.len();
                let (v, _) = as_arrays_mut::<4, u64>(buf);
                // Adjacent butterflies, then two apart, on each pair of vectors.
                for (pair, (w1, w2)) in v
                    .chunks_exact_mut(2)
                    .zip(quads(&ntt.inv.one).iter().zip(quads(&ntt.inv.two)))
                {
                    let (a, b) = (ops.exact_f64(cast(pair[0])), ops.exact_f64(cast(pair[1])));
                    let w1: __m256d = cast(*w1);
                    let (x, y) = (avx._mm256_unpacklo_pd(a, b), avx._mm256_unpackhi_pd(a, b));
                    let (x, y) = (ops.reduce(ops.add(x, y)), ops.mul_reduce(ops.sub(x, y), w1));
                    let (a, b) = (avx._mm256_unpacklo_pd(x, y), avx._mm256_unpackhi_pd(x, y));
                    let w2: __m256d = cast(*w2);
                    let (x, y) = (
                        avx._mm256_permute2f128_pd::<0x20>(a, b),
                        avx._mm256_permute2f128_pd::<0x31>(a, b),
                    );
                    let (x, y) = (ops.reduce(ops.add(x, y)), ops.mul_reduce(ops.sub(x, y), w2));
                    put(&mut pair[0], avx._mm256_permute2f128_pd::<0x20>(x, y));
                    put(&mut pair[1], avx._mm256_permute2f128_pd::<0x31>(x, y));
                }
                // Stages with butterflies at least four apart.
                let (mut m, mut t) = (n / 8, 4);
                while m >= 1 {
                    let (tv, w) = (t / 4, &ntt.inv.w[m..2 * m]);
                    for (group, &w) in v.chunks_exact_mut(2 * tv).zip(w) {
                        let w = avx._mm256_set1_pd(w);
                        let (lo, hi) = group.split_at_mut(tv);
                        for (a, b) in lo.iter_mut().zip(hi) {
                            let (x, y) = (get(a), get(b));
                            put(a, ops.reduce(ops.add(x, y)));
                            put(b, ops.mul_reduce(ops.sub(x, y), w));
                        }
                    }
                    (m, t) = (m / 2, 2 * t);
                }
                let n_inv = avx._mm256_set1_pd(ntt.n_inv as f64);
                for x in v.iter_mut() {
                    *x = cast(ops.canonical(ops.reduce(ops.mul_reduce(get(x), n_inv))));
                }
            },
        );
    }
}

/// A twiddle table as vectors.
#[inline(always)]
fn quads(t: &[f64]) -> &[[f64; 4]] {
    as_arrays::<4, f64>(t).0
}

/// Loads four lanes of f64 bits.
#[inline(always)]
fn get(v: &[u64; 4]) -> __m256d {
    cast(*v)
}

/// Stores four lanes of f64 bits.
#[inline(always)]
fn put(v: &mut [u64; 4], x: __m256d) {
    *v = cast(x);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tfhe_ntt::prime64::Plan;

    /// The largest NTT-friendly prime below `2^bits` (p ≡ 1 mod 2n).
    fn prime_below(bits: u32, n: u64) -> u64 {
        let mut p = ((1u64 << bits) - 1) / (2 * n) * (2 * n) + 1;
        while !crate::modular::is_prime(p) {
            p -= 2 * n;
        }
        p
    }

    /// tfhe-ntt's plan and ours for the same prime and root.
    fn both(bits: u32, n: usize) -> Option<(Plan, Ntt)> {
        let p = prime_below(bits, n as u64);
        let plan = Plan::try_new(n, p)?;
        let mut x = vec![0u64; n];
        x[1] = 1;
        plan.fwd(&mut x);
        Some((plan, Ntt::new(p, n, x[0])?))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(40))]

        /// Forward and inverse equal tfhe-ntt's (inverse followed by its normalisation), worst
        /// residues included.
        #[test]
        fn matches_tfhe_ntt(
            bits in prop::sample::select(vec![30u32, 40, 49, 50]),
            log_n in 4u32..=13,
            extreme in any::<bool>(),
            seed in any::<u64>(),
        ) {
            let n = 1usize << log_n;
            let Some((plan, ntt)) = both(bits, n) else {
                return Ok(()); // no AVX2 + FMA here
            };
            let p = plan.modulus();
            let mut s = seed | 1;
            let x: Vec<u64> = (0..n)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    if extreme { p - 1 - (s % 2) } else { s % p }
                })
                .collect();
            let (mut ours, mut theirs) = (x.clone(), x.clone());
            ntt.forward(&mut ours);
            plan.fwd(&mut theirs);
            prop_assert_eq!(&ours, &theirs);
            ntt.inverse(&mut ours);
            plan.inv(&mut theirs);
            plan.normalize(&mut theirs);
            prop_assert_eq!(&ours, &theirs);
            prop_assert_eq!(ours, x);
        }
    }

    /// Out-of-bounds primes and degrees are refused.
    #[test]
    fn bounds() {
        assert!(Ntt::new(prime_below(51, 64), 64, 3).map(|_| ()).is_none());
        assert!(Ntt::new(prime_below(40, 8), 8, 3).is_none());
    }
}

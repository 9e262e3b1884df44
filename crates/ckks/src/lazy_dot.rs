//! Many-term modular dot products with lazy reduction (BSGS giant steps, key switching): AVX-512
//! IFMA accumulation, one Montgomery reduction and one Shoup multiplication every [`CHUNK`] terms;
//! on CPUs without IFMA, AVX2 + FMA products in doubles ([`fma`]); or a portable path. Bounds:
//! docs/design/code-notes.md, "ckks: lazy_dot".

#[cfg(target_arch = "x86_64")]
mod fma;

/// Terms summed in registers between two reductions (see the module docs' bounds).
pub(crate) const CHUNK: usize = 8;

/// Coefficients per tile of `dot2_many` (shared terms stay in L2).
pub(crate) const TILE: usize = 1024;

/// One sum of `dot2_many`: its terms and its two outputs.
pub(crate) struct Sum<'a, 'b> {
    pub terms: Vec<Term<'a>>,
    pub out0: &'b mut [u64],
    pub out1: &'b mut [u64],
}

/// Low 52 bits.
const MASK52: u64 = (1 << 52) - 1;

/// One term: `x0 ⊙ w0` to the first output, `x1 ⊙ w1` to the second.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Term<'a> {
    pub x0: &'a [u64],
    pub w0: &'a [u64],
    pub x1: &'a [u64],
    pub w1: &'a [u64],
}

impl<'a> Term<'a> {
    /// The term of a ciphertext `(c0, c1)` times one limb `w`.
    pub(crate) fn paired(c0: &'a [u64], c1: &'a [u64], w: &'a [u64]) -> Self {
        Self {
            x0: c0,
            w0: w,
            x1: c1,
            w1: w,
        }
    }
}

/// A constant `c < p` with its 52-bit Shoup companion `⌊c·2^52 / p⌋`.
#[derive(Debug, Clone, Copy)]
struct Shoup52 {
    c: u64,
    c_shoup: u64,
}

impl Shoup52 {
    fn new(c: u64, p: u64) -> Self {
        Self {
            c,
            c_shoup: (((c as u128) << 52) / p as u128) as u64,
        }
    }
}

/// The IFMA kernel's constants for one prime `p < 2^50`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LazyDot {
    pub(crate) p: u64,
    /// `−p^{-1} mod 2^52`.
    p_inv_neg: u64,
    /// `2^52·N^{-1} mod p`.
    post: Shoup52,
    /// `N^{-1} mod p` (the AVX2 + FMA and scalar paths).
    pub(crate) n_inv: u64,
}

/// `b^e mod p`.
fn pow_mod(b: u64, mut e: u64, p: u64) -> u64 {
    let p = p as u128;
    let mut r = 1u128;
    let mut b = b as u128 % p;
    while e > 0 {
        if e & 1 == 1 {
            r = r * b % p;
        }
        b = b * b % p;
        e >>= 1;
    }
    r as u64
}

impl LazyDot {
    /// The kernel for prime `p`, or `None` (`p ≥ 2^50`, or neither IFMA nor AVX2 + FMA).
    pub(crate) fn new(p: u64, n: usize) -> Option<Self> {
        if !(3..1 << 50).contains(&p) || !(ifma_available() || fma_available()) {
            return None;
        }
        Some(Self::for_prime(p, n))
    }

    /// The constants, whether or not the CPU can run the kernel.
    fn for_prime(p: u64, n: usize) -> Self {
        // Newton's iteration for p^{-1} mod 2^64 (p odd): 6 steps double 1 correct bit to 64.
        let mut inv = 1u64;
        for _ in 0..6 {
            inv = inv.wrapping_mul(2u64.wrapping_sub(p.wrapping_mul(inv)));
        }
        let r = ((1u128 << 52) % p as u128) as u64;
        let n_inv = pow_mod(n as u64, p - 2, p);
        let r_n_inv = ((r as u128 * n_inv as u128) % p as u128) as u64;
        Self {
            p,
            p_inv_neg: inv.wrapping_neg() & MASK52,
            post: Shoup52::new(r_n_inv, p),
            n_inv,
        }
    }

    /// `out0 ← N^{-1}·Σ x0⊙w0`, `out1 ← N^{-1}·Σ x1⊙w1` mod p, in `[0, p)`; lengths a multiple
    /// of 8.
    pub(crate) fn dot2(&self, terms: &[Term<'_>], out0: &mut [u64], out1: &mut [u64]) {
        #[cfg(target_arch = "x86_64")]
        {
            if let Some(simd) = Ifma::try_new() {
                simd.vectorize(
                    #[inline(always)]
                    || dot2_ifma(simd, self, terms, out0, out1),
                );
                return;
            }
            if fma::dot2(self, terms, out0, out1) {
                return;
            }
        }
        self.dot2_scalar(terms, out0, out1);
    }

    /// `lhs ← lhs·rhs·N^{-1}` mod p with the AVX2 + FMA kernel, where it is the best this CPU
    /// has (no IFMA); `false` (nothing done) otherwise. Lengths a multiple of 4.
    pub(crate) fn mul_assign(&self, lhs: &mut [u64], rhs: &[u64]) -> bool {
        #[cfg(target_arch = "x86_64")]
        if !ifma_available() {
            return fma::mul_assign(self, lhs, rhs);
        }
        let _ = (lhs, rhs);
        false
    }

    /// [`Self::dot2`] in `u128` arithmetic: CPUs with neither kernel (only tests reach it there,
    /// since [`Self::new`] refuses them).
    fn dot2_scalar(&self, terms: &[Term<'_>], out0: &mut [u64], out1: &mut [u64]) {
        let p = self.p as u128;
        let f = self.n_inv as u128;
        for (k, out) in [out0, out1].into_iter().enumerate() {
            for (i, o) in out.iter_mut().enumerate() {
                let s = terms.iter().fold(0u128, |s, t| {
                    let (x, w) = if k == 0 { (t.x0, t.w0) } else { (t.x1, t.w1) };
                    (s + x[i] as u128 * w[i] as u128) % p
                });
                *o = (s * f % p) as u64;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
pulp::simd_type! {
    /// AVX-512 with the 52-bit integer multiply-add (IFMA).
    struct Ifma {
        pub avx512f: "avx512f",
        pub avx512ifma: "avx512ifma",
    }
}

/// Whether this CPU runs the AVX2 + FMA kernel.
fn fma_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::fma::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this CPU runs the IFMA kernel.
pub(crate) fn ifma_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        Ifma::is_available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn dot2_ifma(simd: Ifma, k: &LazyDot, terms: &[Term<'_>], out0: &mut [u64], out1: &mut [u64]) {
    use pulp::{as_arrays, as_arrays_mut, cast};
    use std::arch::x86_64::__m512i;

    let f = simd.avx512f;
    let ifma = simd.avx512ifma;
    let zero = f._mm512_setzero_si512();
    let mask = f._mm512_set1_epi64(MASK52 as i64);
    let p = f._mm512_set1_epi64(k.p as i64);
    let two_p = f._mm512_set1_epi64((2 * k.p) as i64);
    let p_inv_neg = f._mm512_set1_epi64(k.p_inv_neg as i64);
    let neg_p = f._mm512_set1_epi64((k.p.wrapping_neg() & MASK52) as i64);
    let c = f._mm512_set1_epi64(k.post.c as i64);
    let c_shoup = f._mm512_set1_epi64(k.post.c_shoup as i64);
    let one = f._mm512_set1_epi64(1);

    // h·2^52 + l → N^{-1}·(h·2^52 + l) mod p, in [0, 2p).
    let reduce = |h: __m512i, l: __m512i| -> __m512i {
        let h = f._mm512_add_epi64(h, f._mm512_srli_epi64::<52>(l));
        let l = f._mm512_and_si512(l, mask);
        let m = ifma._mm512_madd52lo_epu64(zero, l, p_inv_neg);
        let mut t = ifma._mm512_madd52hi_epu64(h, m, p);
        let nz = f._mm512_test_epi64_mask(l, l);
        t = f._mm512_mask_add_epi64(t, nz, t, one);
        // Shoup: q = ⌊t·c'/2^52⌋, r = t·c − q·p (mod 2^52) ∈ [0, 2p).
        let q = ifma._mm512_madd52hi_epu64(zero, t, c_shoup);
        let r = ifma._mm512_madd52lo_epu64(zero, t, c);
        let r = ifma._mm512_madd52lo_epu64(r, q, neg_p);
        f._mm512_and_si512(r, mask)
    };
    // s + r with s, r ∈ [0, 2p) → [0, 2p).
    let add_2p = |s: __m512i, r: __m512i| -> __m512i {
        let s = f._mm512_add_epi64(s, r);
        let ge = f._mm512_cmpge_epu64_mask(s, two_p);
        f._mm512_mask_sub_epi64(s, ge, s, two_p)
    };
    // [0, 2p) → [0, p).
    let finish = |s: __m512i| -> __m512i {
        let ge = f._mm512_cmpge_epu64_mask(s, p);
        f._mm512_mask_sub_epi64(s, ge, s, p)
    };

    let n = out0.len();
    let load = |v: &[u64], i: usize| -> __m512i { cast(as_arrays::<8, u64>(&v[i..i + 8]).0[0]) };
    let (o0, _) = as_arrays_mut::<8, u64>(out0);
    let (o1, _) = as_arrays_mut::<8, u64>(out1);
    for (v, (o0, o1)) in o0.iter_mut().zip(o1.iter_mut()).enumerate().take(n / 8) {
        let i = v * 8;
        let mut s0 = zero;
        let mut s1 = zero;
        for chunk in terms.chunks(CHUNK) {
            let (mut l0, mut h0, mut l1, mut h1) = (zero, zero, zero, zero);
            for t in chunk {
                let w0 = load(t.w0, i);
                let x0 = load(t.x0, i);
                l0 = ifma._mm512_madd52lo_epu64(l0, x0, w0);
                h0 = ifma._mm512_madd52hi_epu64(h0, x0, w0);
                let w1 = load(t.w1, i);
                let x1 = load(t.x1, i);
                l1 = ifma._mm512_madd52lo_epu64(l1, x1, w1);
                h1 = ifma._mm512_madd52hi_epu64(h1, x1, w1);
            }
            s0 = add_2p(s0, reduce(h0, l0));
            s1 = add_2p(s1, reduce(h1, l1));
        }
        *o0 = cast(finish(s0));
        *o1 = cast(finish(s1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::modular::is_prime;
    use proptest::prelude::*;

    /// The largest NTT-friendly prime below `2^bits` (p ≡ 1 mod 2n).
    fn prime_below(bits: u32, n: u64) -> u64 {
        let mut p = ((1u64 << bits) - 1) / (2 * n) * (2 * n) + 1;
        while !is_prime(p) {
            p -= 2 * n;
        }
        p
    }

    /// `N^{-1}·Σ x⊙w mod p` in `u128`, for ring degree `ring_n`, the inverse by Fermat.
    fn reference(p: u64, ring_n: usize, xs: &[Vec<u64>], ws: &[Vec<u64>]) -> Vec<u64> {
        let f = pow_mod(ring_n as u64, p - 2, p) as u128;
        (0..xs.first().map_or(0, Vec::len))
            .map(|i| {
                let s = xs.iter().zip(ws).fold(0u128, |s, (x, w)| {
                    (s + x[i] as u128 * w[i] as u128) % p as u128
                });
                (s * f % p as u128) as u64
            })
            .collect()
    }

    /// Residues modulo `p` from an xorshift stream (`extreme`: only `p − 1` and `p − 2`).
    fn residues(p: u64, seed: u64, extreme: bool) -> impl FnMut() -> u64 {
        let mut s = seed | 1;
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            if extreme { p - 1 - (s % 2) } else { s % p }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Every kernel equals `u128` arithmetic, worst-case residues included.
        #[test]
        fn dot2_matches_u128_reference(
            bits in prop::sample::select(vec![30u32, 36, 40, 45, 49, 50]),
            terms in 0usize..=40,
            extreme in any::<bool>(),
            seed in any::<u64>(),
        ) {
            let n = 64usize;
            let p = prime_below(bits, 8192);
            let mut rnd = residues(p, seed, extreme);
            let mk = |rnd: &mut dyn FnMut() -> u64| -> Vec<Vec<u64>> {
                (0..terms).map(|_| (0..n).map(|_| rnd()).collect()).collect()
            };
            let (x0, w0, x1, w1) = (mk(&mut rnd), mk(&mut rnd), mk(&mut rnd), mk(&mut rnd));
            let ts: Vec<Term<'_>> = (0..terms)
                .map(|k| Term { x0: &x0[k], w0: &w0[k], x1: &x1[k], w1: &w1[k] })
                .collect();
            let k = LazyDot::for_prime(p, 8192);
            let (r0, r1) = if terms == 0 {
                (vec![0; n], vec![0; n])
            } else {
                (reference(p, 8192, &x0, &w0), reference(p, 8192, &x1, &w1))
            };
            // The dispatched kernel, the AVX2 + FMA one where this CPU has it, the portable one.
            type Kernel<'k> = Box<dyn Fn(&mut [u64], &mut [u64]) -> bool + 'k>;
            let mut kernels: Vec<Kernel<'_>> = vec![
                Box::new(|o0, o1| { k.dot2(&ts, o0, o1); true }),
                Box::new(|o0, o1| { k.dot2_scalar(&ts, o0, o1); true }),
            ];
            #[cfg(target_arch = "x86_64")]
            kernels.push(Box::new(|o0, o1| fma::dot2(&k, &ts, o0, o1)));
            for kernel in &kernels {
                let (mut o0, mut o1) = (vec![7u64; n], vec![7u64; n]);
                if kernel(&mut o0, &mut o1) {
                    prop_assert_eq!(&o0, &r0);
                    prop_assert_eq!(&o1, &r1);
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// The element-wise product `x·w·N^{-1}` equals `u128` arithmetic where it runs.
        #[test]
        fn mul_assign_matches_u128_reference(
            bits in prop::sample::select(vec![30u32, 40, 49, 50]),
            extreme in any::<bool>(),
            seed in any::<u64>(),
        ) {
            let n = 64usize;
            let p = prime_below(bits, 8192);
            let mut rnd = residues(p, seed, extreme);
            let x: Vec<u64> = (0..n).map(|_| rnd()).collect();
            let w: Vec<u64> = (0..n).map(|_| rnd()).collect();
            let want = reference(p, 8192, std::slice::from_ref(&x), std::slice::from_ref(&w));
            let mut got = x.clone();
            if LazyDot::for_prime(p, 8192).mul_assign(&mut got, &w) {
                prop_assert_eq!(got, want);
            }
        }
    }

    /// Primes from 2^50 up are refused (the module docs' bounds need `p < 2^50`).
    #[test]
    fn primes_from_2_50_take_the_portable_path() {
        let p = prime_below(51, 8192);
        assert!(p > 1 << 50);
        assert!(LazyDot::new(p, 8192).is_none());
    }
}

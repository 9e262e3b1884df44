//! The AVX2 + FMA kernels of [`super::LazyDot`]: residues below 2^50 as exact `f64` integers,
//! each product reduced by a floating-point quotient (Shoup's trick in doubles, as in NTL's
//! `MulMod` and FLINT's `n_mulmod_precomp`), [`CHUNK`] reduced products summed exactly before
//! one more reduction. Bounds: docs/design/code-notes.md, "ckks: lazy_dot".

use super::{CHUNK, LazyDot, Term};
use pulp::x86::V3;
use pulp::{as_arrays, as_arrays_mut, cast};
use std::arch::x86_64::{__m256d, __m256i};

/// 2^52: `bits(2^52) | x` is the double `2^52 + x` for `x < 2^52`.
const TWO52: f64 = 4_503_599_627_370_496.0;
/// 1.5·2^52: adding it to an integer `|v| < 2^51` puts `v` in the low mantissa bits.
const MAGIC: f64 = 6_755_399_441_055_744.0;
/// `_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC`.
const NEAREST: i32 = 0x08;
/// `_CMP_LT_OQ`.
const LESS: i32 = 0x11;

/// Whether this CPU runs the kernels.
pub(super) fn available() -> bool {
    V3::is_available()
}

/// `out0 ← N^{-1}·Σ x0⊙w0`, `out1 ← N^{-1}·Σ x1⊙w1` mod p, in `[0, p)`; lengths a multiple of
/// 4, every input residue below `p < 2^50`. `false` (nothing done) without AVX2 + FMA.
pub(super) fn dot2(k: &LazyDot, terms: &[Term<'_>], out0: &mut [u64], out1: &mut [u64]) -> bool {
    let Some(simd) = V3::try_new() else {
        return false;
    };
    simd.vectorize(
        #[inline(always)]
        || {
            let ops = Ops::new(simd, k);
            let load =
                |v: &[u64], i: usize| ops.exact_f64(cast(as_arrays::<4, u64>(&v[i..i + 4]).0[0]));
            let (o0, _) = as_arrays_mut::<4, u64>(out0);
            let (o1, _) = as_arrays_mut::<4, u64>(out1);
            for (v, (o0, o1)) in o0.iter_mut().zip(o1.iter_mut()).enumerate() {
                let i = v * 4;
                let (mut s0, mut s1) = (ops.zero, ops.zero);
                for chunk in terms.chunks(CHUNK) {
                    for t in chunk {
                        s0 = ops.add(s0, ops.mul_reduce(load(t.x0, i), load(t.w0, i)));
                        s1 = ops.add(s1, ops.mul_reduce(load(t.x1, i), load(t.w1, i)));
                    }
                    s0 = ops.reduce(s0);
                    s1 = ops.reduce(s1);
                }
                *o0 = cast(ops.finish(s0));
                *o1 = cast(ops.finish(s1));
            }
        },
    );
    true
}

/// `lhs ← lhs·rhs·N^{-1}` mod p, in `[0, p)`; lengths a multiple of 4, every input residue
/// below `p < 2^50`. `false` (nothing done) without AVX2 + FMA.
pub(super) fn mul_assign(k: &LazyDot, lhs: &mut [u64], rhs: &[u64]) -> bool {
    let Some(simd) = V3::try_new() else {
        return false;
    };
    simd.vectorize(
        #[inline(always)]
        || {
            let ops = Ops::new(simd, k);
            let (l, _) = as_arrays_mut::<4, u64>(lhs);
            let (r, _) = as_arrays::<4, u64>(rhs);
            for (l, r) in l.iter_mut().zip(r) {
                let t = ops.mul_reduce(ops.exact_f64(cast(*l)), ops.exact_f64(cast(*r)));
                *l = cast(ops.finish(t));
            }
        },
    );
    true
}

/// The constants and steps of both kernels, four lanes at a time.
#[derive(Clone, Copy)]
struct Ops {
    simd: V3,
    two52_bits: __m256i,
    two52: __m256d,
    magic: __m256d,
    magic_bits: __m256i,
    p: __m256d,
    p_inv: __m256d,
    n_inv: __m256d,
    zero: __m256d,
}

impl Ops {
    #[inline(always)]
    fn new(simd: V3, k: &LazyDot) -> Self {
        let avx = simd.avx;
        Self {
            simd,
            two52_bits: avx._mm256_set1_epi64x(TWO52.to_bits() as i64),
            two52: avx._mm256_set1_pd(TWO52),
            magic: avx._mm256_set1_pd(MAGIC),
            magic_bits: avx._mm256_set1_epi64x(MAGIC.to_bits() as i64),
            p: avx._mm256_set1_pd(k.p as f64),
            p_inv: avx._mm256_set1_pd(1.0 / k.p as f64),
            n_inv: avx._mm256_set1_pd(k.n_inv as f64),
            zero: avx._mm256_setzero_pd(),
        }
    }

    /// A residue `x < 2^52` as the double `x`, exactly.
    #[inline(always)]
    fn exact_f64(&self, x: __m256i) -> __m256d {
        let avx = self.simd.avx;
        let bits = self.simd.avx2._mm256_or_si256(x, self.two52_bits);
        avx._mm256_sub_pd(avx._mm256_castsi256_pd(bits), self.two52)
    }

    /// `a + b` (exact for the integer sums the kernels form, below 2^53).
    #[inline(always)]
    fn add(&self, a: __m256d, b: __m256d) -> __m256d {
        self.simd.avx._mm256_add_pd(a, b)
    }

    /// `x·w − q·p` for the quotient `q` nearest `x·w/p`: exact, below 0.9·p in magnitude, for
    /// integers `|x|, |w| < p < 2^50`.
    #[inline(always)]
    fn mul_reduce(&self, x: __m256d, w: __m256d) -> __m256d {
        let (avx, fma) = (self.simd.avx, self.simd.fma);
        let h = avx._mm256_mul_pd(x, w);
        let l = fma._mm256_fmsub_pd(x, w, h);
        let q = avx._mm256_round_pd::<NEAREST>(avx._mm256_mul_pd(h, self.p_inv));
        avx._mm256_add_pd(fma._mm256_fnmadd_pd(q, self.p, h), l)
    }

    /// `s − q·p` for an integer `|s| < 2^53`: exact, at most about p/2 in magnitude.
    #[inline(always)]
    fn reduce(&self, s: __m256d) -> __m256d {
        let (avx, fma) = (self.simd.avx, self.simd.fma);
        let q = avx._mm256_round_pd::<NEAREST>(avx._mm256_mul_pd(s, self.p_inv));
        fma._mm256_fnmadd_pd(q, self.p, s)
    }

    /// `N^{-1}·s` for an integer `|s| < p`, as a residue in `[0, p)`.
    #[inline(always)]
    fn finish(&self, s: __m256d) -> __m256i {
        let avx = self.simd.avx;
        let r = self.mul_reduce(s, self.n_inv);
        let negative = avx._mm256_cmp_pd::<LESS>(r, self.zero);
        let r = avx._mm256_add_pd(r, avx._mm256_and_pd(negative, self.p));
        let bits = avx._mm256_castpd_si256(avx._mm256_add_pd(r, self.magic));
        self.simd.avx2._mm256_sub_epi64(bits, self.magic_bits)
    }
}

//! Modular arithmetic in AVX2 + FMA doubles, for CPUs without AVX-512 IFMA: residues modulo a
//! prime `p < 2^50` held as exact `f64` integers, each product reduced by a floating-point
//! quotient (Shoup's trick in doubles, as in NTL's `MulMod` and FLINT's `n_mulmod_precomp`).
//! Used by the negacyclic NTT ([`ntt`]) and the lazy dot product (`lazy_dot`'s `fma` kernels).
//! Bounds: docs/design/code-notes.md, "ckks: fma".

pub(crate) mod ntt;

use pulp::x86::V3;
use std::arch::x86_64::{__m256d, __m256i};

/// 2^52: `bits(2^52) | x` is the double `2^52 + x` for `x < 2^52`.
const TWO52: f64 = 4_503_599_627_370_496.0;
/// 1.5·2^52: adding it to an integer `|v| < 2^51` puts `v` in the low mantissa bits.
const MAGIC: f64 = 6_755_399_441_055_744.0;
/// `_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC`.
const NEAREST: i32 = 0x08;
/// `_CMP_LT_OQ`.
const LESS: i32 = 0x11;

/// Whether this CPU runs the kernels (AVX2 and FMA).
pub(crate) fn available() -> bool {
    V3::is_available()
}

/// The constants and steps of the kernels for one prime, four lanes at a time.
#[derive(Clone, Copy)]
pub(crate) struct Ops {
    pub(crate) simd: V3,
    two52_bits: __m256i,
    two52: __m256d,
    magic: __m256d,
    magic_bits: __m256i,
    p: __m256d,
    p_inv: __m256d,
    pub(crate) zero: __m256d,
}

impl Ops {
    #[inline(always)]
    pub(crate) fn new(simd: V3, p: u64) -> Self {
        let avx = simd.avx;
        Self {
            simd,
            two52_bits: avx._mm256_set1_epi64x(TWO52.to_bits() as i64),
            two52: avx._mm256_set1_pd(TWO52),
            magic: avx._mm256_set1_pd(MAGIC),
            magic_bits: avx._mm256_set1_epi64x(MAGIC.to_bits() as i64),
            p: avx._mm256_set1_pd(p as f64),
            p_inv: avx._mm256_set1_pd(1.0 / p as f64),
            zero: avx._mm256_setzero_pd(),
        }
    }

    /// A residue `x < 2^52` as the double `x`, exactly.
    #[inline(always)]
    pub(crate) fn exact_f64(&self, x: __m256i) -> __m256d {
        let avx = self.simd.avx;
        let bits = self.simd.avx2._mm256_or_si256(x, self.two52_bits);
        avx._mm256_sub_pd(avx._mm256_castsi256_pd(bits), self.two52)
    }

    /// `a + b` (exact for the integer sums the kernels form, below 2^53).
    #[inline(always)]
    pub(crate) fn add(&self, a: __m256d, b: __m256d) -> __m256d {
        self.simd.avx._mm256_add_pd(a, b)
    }

    /// `a − b` (exact for the integer differences the kernels form, below 2^53).
    #[inline(always)]
    pub(crate) fn sub(&self, a: __m256d, b: __m256d) -> __m256d {
        self.simd.avx._mm256_sub_pd(a, b)
    }

    /// `x·w − q·p` for a quotient `q` near `x·w/p`: exact for integers `|x| < 4p`, `0 ≤ w < p`,
    /// `p < 2^50`, and at most `p/2 + 3|x|/8` in magnitude (below 0.9·p when `|x| < p`).
    #[inline(always)]
    pub(crate) fn mul_reduce(&self, x: __m256d, w: __m256d) -> __m256d {
        let (avx, fma) = (self.simd.avx, self.simd.fma);
        let h = avx._mm256_mul_pd(x, w);
        let l = fma._mm256_fmsub_pd(x, w, h);
        let q = avx._mm256_round_pd::<NEAREST>(avx._mm256_mul_pd(h, self.p_inv));
        avx._mm256_add_pd(fma._mm256_fnmadd_pd(q, self.p, h), l)
    }

    /// `s − q·p` for an integer `|s| < 2^53`: exact, at most about p/2 in magnitude.
    #[inline(always)]
    pub(crate) fn reduce(&self, s: __m256d) -> __m256d {
        let (avx, fma) = (self.simd.avx, self.simd.fma);
        let q = avx._mm256_round_pd::<NEAREST>(avx._mm256_mul_pd(s, self.p_inv));
        fma._mm256_fnmadd_pd(q, self.p, s)
    }

    /// An integer `|r| < p` as its residue in `[0, p)`.
    #[inline(always)]
    pub(crate) fn canonical(&self, r: __m256d) -> __m256i {
        let avx = self.simd.avx;
        let negative = avx._mm256_cmp_pd::<LESS>(r, self.zero);
        let r = avx._mm256_add_pd(r, avx._mm256_and_pd(negative, self.p));
        let bits = avx._mm256_castpd_si256(avx._mm256_add_pd(r, self.magic));
        self.simd.avx2._mm256_sub_epi64(bits, self.magic_bits)
    }
}

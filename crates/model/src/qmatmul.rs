//! GGUF Q4_0/Q4_1/Q8_0 weights kept quantized, `y = x Wᵀ` on f32 activations quantized to 16 bits
//! per block of 32, with AVX2/AVX-VNNI kernels (formats: ggml's `ggml-common.h`; notes:
//! docs/design/code-notes.md, "model: qmatmul").
//!
//! This module and [`crate::batch_invariant`] hold the crate's only `unsafe` code: `std::arch`
//! intrinsics, called only after `is_x86_feature_detected!` confirmed the features, tested against
//! a scalar fallback.
#![allow(unsafe_code)]

use std::sync::Arc;

/// Weights (and activations) per block.
const QK: usize = 32;
/// Output rows per work item handed to candle's thread pool.
const ROWS_PER_ITEM: usize = 16;
/// Prefetch distance of the SIMD kernels, bytes (whole rows): hardware prefetch lags interleaved
/// rows.
const PREFETCH_BYTES: usize = 4096;

fn f16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// A GGUF weight block format with a kernel here.
pub(crate) trait WeightBlock: Copy + Send + Sync + std::fmt::Debug + 'static {
    /// Bytes of one block in a GGUF file.
    const BYTES: usize;
    /// One block from its GGUF bytes (`BYTES` long).
    fn parse(b: &[u8]) -> Self;
    /// The block's 32 weights.
    #[cfg(test)]
    fn values(&self) -> [f32; QK];
    /// The block's dot product with 32 quantized activations, in plain Rust.
    fn dot_scalar(&self, y: &ActBlock) -> f32;
    /// R × C dot products of weight rows with activation rows, prefetching `ahead` blocks (a hint).
    fn tile<const R: usize, const C: usize>(
        kernel: Kernel,
        w: [&[Self]; R],
        a: [&[ActBlock]; C],
        ahead: usize,
    ) -> [[f32; C]; R];
}

/// One Q4_1 block: scale and minimum as f16 bits, 32 nibbles.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub(crate) struct BlockQ4_1 {
    d: u16,
    m: u16,
    qs: [u8; QK / 2],
}

/// The 4-bit level of weight `j` (0..32) of a Q4 block; low nibbles are weights 0..16.
fn nibble_level(qs: &[u8; QK / 2], j: usize) -> u8 {
    if j < QK / 2 {
        qs[j] & 0x0F
    } else {
        qs[j - QK / 2] >> 4
    }
}

impl BlockQ4_1 {
    /// The 4-bit level (0..=15) of weight `j` (0..32).
    fn level(&self, j: usize) -> u8 {
        nibble_level(&self.qs, j)
    }
}

impl WeightBlock for BlockQ4_1 {
    const BYTES: usize = 20;

    fn parse(b: &[u8]) -> Self {
        let mut qs = [0u8; QK / 2];
        qs.copy_from_slice(&b[4..Self::BYTES]);
        BlockQ4_1 {
            d: u16::from_le_bytes([b[0], b[1]]),
            m: u16::from_le_bytes([b[2], b[3]]),
            qs,
        }
    }

    #[cfg(test)]
    fn values(&self) -> [f32; QK] {
        let (d, m) = (f16_to_f32(self.d), f16_to_f32(self.m));
        std::array::from_fn(|j| d * self.level(j) as f32 + m)
    }

    fn dot_scalar(&self, y: &ActBlock) -> f32 {
        let dot: i32 = (0..QK).map(|j| self.level(j) as i32 * y.qs[j] as i32).sum();
        f16_to_f32(self.d) * y.d * dot as f32 + f16_to_f32(self.m) * y.s
    }

    fn tile<const R: usize, const C: usize>(
        kernel: Kernel,
        w: [&[Self]; R],
        a: [&[ActBlock]; C],
        ahead: usize,
    ) -> [[f32; C]; R] {
        match kernel {
            Kernel::Scalar => scalar_tile(w, a),
            // SAFETY: `Kernel::detect` returned this kernel only after
            // checking its features at run time.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { simd::q4_1_avx2(w, a, ahead) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Kernel::AvxVnni => unsafe { simd::q4_1_avxvnni(w, a, ahead) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Vnni => unsafe { simd::q4_1_avx512vnni(w, a, ahead) },
        }
    }
}

/// One Q4_0 block: scale as f16 bits, 32 nibbles (levels offset by 8).
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub(crate) struct BlockQ4_0 {
    d: u16,
    qs: [u8; QK / 2],
}

impl BlockQ4_0 {
    /// The block's (d, m) as f32: a Q4_1 block with minimum −8d.
    fn scale_min(&self) -> (f32, f32) {
        let d = f16_to_f32(self.d);
        (d, -8.0 * d)
    }
}

impl WeightBlock for BlockQ4_0 {
    const BYTES: usize = 18;

    fn parse(b: &[u8]) -> Self {
        let mut qs = [0u8; QK / 2];
        qs.copy_from_slice(&b[2..Self::BYTES]);
        BlockQ4_0 {
            d: u16::from_le_bytes([b[0], b[1]]),
            qs,
        }
    }

    #[cfg(test)]
    fn values(&self) -> [f32; QK] {
        let d = f16_to_f32(self.d);
        std::array::from_fn(|j| d * (nibble_level(&self.qs, j) as f32 - 8.0))
    }

    fn dot_scalar(&self, y: &ActBlock) -> f32 {
        let dot: i32 = (0..QK)
            .map(|j| nibble_level(&self.qs, j) as i32 * y.qs[j] as i32)
            .sum();
        let (d, m) = self.scale_min();
        d * y.d * dot as f32 + m * y.s
    }

    fn tile<const R: usize, const C: usize>(
        kernel: Kernel,
        w: [&[Self]; R],
        a: [&[ActBlock]; C],
        ahead: usize,
    ) -> [[f32; C]; R] {
        match kernel {
            Kernel::Scalar => scalar_tile(w, a),
            // SAFETY: `Kernel::detect` returned this kernel only after
            // checking its features at run time.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { simd::q4_0_avx2(w, a, ahead) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Kernel::AvxVnni => unsafe { simd::q4_0_avxvnni(w, a, ahead) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Vnni => unsafe { simd::q4_0_avx512vnni(w, a, ahead) },
        }
    }
}

/// One Q8_0 block: scale as f16 bits, 32 signed bytes.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub(crate) struct BlockQ8_0 {
    d: u16,
    qs: [i8; QK],
}

impl WeightBlock for BlockQ8_0 {
    const BYTES: usize = 34;

    fn parse(b: &[u8]) -> Self {
        BlockQ8_0 {
            d: u16::from_le_bytes([b[0], b[1]]),
            qs: std::array::from_fn(|j| b[2 + j] as i8),
        }
    }

    #[cfg(test)]
    fn values(&self) -> [f32; QK] {
        let d = f16_to_f32(self.d);
        std::array::from_fn(|j| d * self.qs[j] as f32)
    }

    fn dot_scalar(&self, y: &ActBlock) -> f32 {
        let dot: i32 = (0..QK).map(|j| self.qs[j] as i32 * y.qs[j] as i32).sum();
        f16_to_f32(self.d) * y.d * dot as f32
    }

    fn tile<const R: usize, const C: usize>(
        kernel: Kernel,
        w: [&[Self]; R],
        a: [&[ActBlock]; C],
        ahead: usize,
    ) -> [[f32; C]; R] {
        match kernel {
            Kernel::Scalar => scalar_tile(w, a),
            // SAFETY: `Kernel::detect` returned this kernel only after
            // checking its features at run time.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { simd::q8_0_avx2(w, a, ahead) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Kernel::AvxVnni => unsafe { simd::q8_0_avxvnni(w, a, ahead) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Vnni => unsafe { simd::q8_0_avx512vnni(w, a, ahead) },
        }
    }
}

/// One block of 32 activations quantized to i16: `x ≈ d · q`, `s = d · Σq`.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C)]
pub(crate) struct ActBlock {
    d: f32,
    s: f32,
    qs: [i16; QK],
}

/// A (rows, cols) quantized weight matrix, row-major blocks, shared between clones.
#[derive(Debug, Clone)]
pub(crate) struct QuantMatrix<B> {
    rows: usize,
    cols: usize,
    blocks: Arc<[B]>,
}

impl<B: WeightBlock> QuantMatrix<B> {
    /// From a (rows, cols) tensor's GGUF data; `None` for partial blocks or a wrong length.
    pub(crate) fn from_gguf_bytes(rows: usize, cols: usize, data: &[u8]) -> Option<Self> {
        if !cols.is_multiple_of(QK) || data.len() != rows * cols / QK * B::BYTES {
            return None;
        }
        let blocks = data.chunks_exact(B::BYTES).map(B::parse).collect();
        Some(QuantMatrix { rows, cols, blocks })
    }

    /// Output features (d_out).
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// Input features (d_in).
    pub(crate) fn cols(&self) -> usize {
        self.cols
    }

    /// The weights as f32, row-major (rows · cols): the dequantized matrix.
    #[cfg(test)]
    fn dequantize(&self) -> Vec<f32> {
        self.blocks.iter().flat_map(|b| b.values()).collect()
    }

    /// `x Wᵀ` for `x` of t rows (t · cols, row-major) → t · rows, row-major, on candle's thread
    /// pool. Panics: if `x.len() != t · cols`.
    pub(crate) fn matmul(&self, x: &[f32], t: usize) -> Vec<f32> {
        self.matmul_with(x, t, Kernel::detect())
    }

    fn matmul_with(&self, x: &[f32], t: usize, kernel: Kernel) -> Vec<f32> {
        assert_eq!(x.len(), t * self.cols, "activations: t · cols values");
        let nb = self.cols / QK;
        let mut acts = vec![ActBlock::default(); t * nb];
        for (row, q) in x.chunks_exact(self.cols).zip(acts.chunks_exact_mut(nb)) {
            quantize_row(kernel, row, q);
        }
        crate::batch_invariant::by_output_rows(self.rows, t, ROWS_PER_ITEM, |rows, out| {
            dot_rows(kernel, &self.blocks, rows, &acts, nb, out)
        })
    }
}

/// Largest |q| of a quantized activation.
const ACT_MAX: f32 = 32767.0;

/// Quantizes a row of activations to [`ActBlock`]s, rounding half to even (as the SIMD version).
fn quantize_row(kernel: Kernel, x: &[f32], out: &mut [ActBlock]) {
    #[cfg(target_arch = "x86_64")]
    if kernel != Kernel::Scalar {
        for (xb, yb) in x.chunks_exact(QK).zip(out) {
            // SAFETY: every SIMD kernel implies AVX2, checked at run time.
            *yb = unsafe { simd::quantize_avx2(xb.try_into().expect("blocks of 32")) };
        }
        return;
    }
    let _ = kernel;
    for (xb, yb) in x.chunks_exact(QK).zip(out) {
        let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / ACT_MAX;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (q, v) in yb.qs.iter_mut().zip(xb) {
            let r = (v * id).round_ties_even() as i16;
            *q = r;
            sum += r as i32;
        }
        yb.d = d;
        yb.s = d * sum as f32;
    }
}

/// Which dot-product kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kernel {
    /// Portable Rust; the reference.
    Scalar,
    /// AVX2 + FMA + F16C (x86_64, checked at run time).
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// [`Kernel::Avx2`] plus AVX-VNNI's `vpdpwssd` for the i16 products.
    #[cfg(target_arch = "x86_64")]
    AvxVnni,
    /// The 256-bit kernels compiled for AVX-512 (F, VL, BW, VNNI), 32 registers.
    #[cfg(target_arch = "x86_64")]
    Avx512Vnni,
}

impl Kernel {
    /// The SIMD kernels, slowest first.
    #[cfg(target_arch = "x86_64")]
    const SIMD: [Kernel; 3] = [Kernel::Avx2, Kernel::AvxVnni, Kernel::Avx512Vnni];

    /// Whether this CPU has the kernel's instructions (checked at run time).
    fn available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        use std::arch::is_x86_feature_detected as has;
        match self {
            Kernel::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => has!("avx2") && has!("fma") && has!("f16c"),
            #[cfg(target_arch = "x86_64")]
            Kernel::AvxVnni => Kernel::Avx2.available() && has!("avxvnni"),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Vnni => {
                Kernel::Avx2.available()
                    && has!("avx512f")
                    && has!("avx512vl")
                    && has!("avx512bw")
                    && has!("avx512vnni")
            }
        }
    }

    /// The fastest kernel this CPU has.
    fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        if let Some(&k) = Kernel::SIMD.iter().rev().find(|k| k.available()) {
            return k;
        }
        Kernel::Scalar
    }
}

/// Dots weight rows `rows` with all t activation rows into `out[(r - rows.start) · t + s]`.
fn dot_rows<B: WeightBlock>(
    kernel: Kernel,
    w: &[B],
    rows: std::ops::Range<usize>,
    acts: &[ActBlock],
    nb: usize,
    out: &mut [f32],
) {
    let t = acts.len() / nb;
    // Prefetch the same block one tile or more further on, about PREFETCH_BYTES away.
    let ahead = |tile_rows: usize| PREFETCH_BYTES.div_ceil(nb * B::BYTES).max(tile_rows) * nb;
    let wrow = |r: usize| &w[r * nb..(r + 1) * nb];
    let arow = |s: usize| &acts[s * nb..(s + 1) * nb];
    let r0 = rows.start;
    let mut put = |r: usize, s: usize, v: f32| out[(r - r0) * t + s] = v;
    let s_main = t - t % 4;
    let r_pairs = r0 + rows.len() / 2 * 2;
    for s in (0..s_main).step_by(4) {
        let a = std::array::from_fn(|j| arow(s + j));
        for r in (r0..r_pairs).step_by(2) {
            let v = B::tile::<2, 4>(kernel, [wrow(r), wrow(r + 1)], a, ahead(2));
            for (i, vi) in v.iter().enumerate() {
                vi.iter()
                    .enumerate()
                    .for_each(|(j, &x)| put(r + i, s + j, x));
            }
        }
        if r_pairs < rows.end {
            let v = B::tile::<1, 4>(kernel, [wrow(r_pairs)], a, ahead(1));
            v[0].iter()
                .enumerate()
                .for_each(|(j, &x)| put(r_pairs, s + j, x));
        }
    }
    let r_quads = r0 + rows.len() / 4 * 4;
    for s in s_main..t {
        for r in (r0..r_quads).step_by(4) {
            let v = B::tile::<4, 1>(
                kernel,
                std::array::from_fn(|i| wrow(r + i)),
                [arow(s)],
                ahead(4),
            );
            (0..4).for_each(|i| put(r + i, s, v[i][0]));
        }
        for r in r_quads..rows.end {
            put(
                r,
                s,
                B::tile::<1, 1>(kernel, [wrow(r)], [arow(s)], ahead(1))[0][0],
            );
        }
    }
}

/// [`WeightBlock::tile`] in plain Rust: the reference.
fn scalar_tile<B: WeightBlock, const R: usize, const C: usize>(
    w: [&[B]; R],
    a: [&[ActBlock]; C],
) -> [[f32; C]; R] {
    std::array::from_fn(|r| {
        std::array::from_fn(|c| w[r].iter().zip(a[c]).map(|(x, y)| x.dot_scalar(y)).sum())
    })
}

#[cfg(target_arch = "x86_64")]
mod simd {
    //! The x86 kernels: safe `#[target_feature]` functions, `unsafe` to call only because the CPU
    //! must have the features; inside, only unaligned loads from in-bounds arrays.

    use std::arch::x86_64::*;

    use super::{ActBlock, BlockQ4_0, BlockQ4_1, BlockQ8_0};

    /// A Q4_1 block as (weights 0..16, weights 16..32, d, m), levels widened to i16.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn prep_q4_1(x: &BlockQ4_1) -> (__m256i, __m256i, f32, f32) {
        let (lo, hi) = nibbles(&x.qs);
        let dm = _mm_cvtph_ps(_mm_cvtsi32_si128((x.d as u32 | (x.m as u32) << 16) as i32));
        let (d, m) = (_mm_cvtss_f32(dm), _mm_cvtss_f32(_mm_movehdup_ps(dm)));
        (lo, hi, d, m)
    }

    /// The 32 levels (0..=15) of 16 nibble bytes widened to i16: the low nibbles are weights 0..16.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn nibbles(qs: &[u8; 16]) -> (__m256i, __m256i) {
        // SAFETY: reads the 16 bytes of `qs`.
        let qs = unsafe { _mm_loadu_si128(qs.as_ptr().cast()) };
        let mask = _mm_set1_epi8(0x0F);
        let lo = _mm256_cvtepu8_epi16(_mm_and_si128(qs, mask));
        let hi = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(qs, 4), mask));
        (lo, hi)
    }

    /// A Q4_0 block as (levels 0..16, levels 16..32, d, −8d).
    #[target_feature(enable = "avx2,fma,f16c")]
    fn prep_q4_0(x: &BlockQ4_0) -> (__m256i, __m256i, f32, f32) {
        let (lo, hi) = nibbles(&x.qs);
        let d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(x.d as i32)));
        (lo, hi, d, -8.0 * d)
    }

    /// A Q8_0 block as (weights 0..16, weights 16..32, d, 0), widened to i16.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn prep_q8_0(x: &BlockQ8_0) -> (__m256i, __m256i, f32, f32) {
        // SAFETY: reads the 32 bytes of `x.qs`, 16 at a time.
        let (lo, hi) = unsafe {
            (
                _mm_loadu_si128(x.qs.as_ptr().cast()),
                _mm_loadu_si128(x.qs.as_ptr().add(16).cast()),
            )
        };
        let d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(x.d as i32)));
        (_mm256_cvtepi8_epi16(lo), _mm256_cvtepi8_epi16(hi), d, 0.0)
    }

    /// The 32 quantized activations of a block, 16 per vector.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn quants(y: &ActBlock) -> (__m256i, __m256i) {
        // SAFETY: reads the 64 bytes of `y.qs`, 32 at a time.
        unsafe {
            (
                _mm256_loadu_si256(y.qs.as_ptr().cast()),
                _mm256_loadu_si256(y.qs.as_ptr().add(16).cast()),
            )
        }
    }

    /// Σ w·q of one block (i16 operands) as eight f32 partial sums.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn products_avx2(w: (__m256i, __m256i), q: (__m256i, __m256i)) -> __m256 {
        let sum = _mm256_add_epi32(_mm256_madd_epi16(w.0, q.0), _mm256_madd_epi16(w.1, q.1));
        _mm256_cvtepi32_ps(sum)
    }

    /// As [`products_avx2`], with two `vpdpwssd` (i16 × i16 pairs into i32).
    #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
    fn products_avxvnni(w: (__m256i, __m256i), q: (__m256i, __m256i)) -> __m256 {
        let sum = _mm256_dpwssd_avx_epi32(_mm256_setzero_si256(), w.0, q.0);
        _mm256_cvtepi32_ps(_mm256_dpwssd_avx_epi32(sum, w.1, q.1))
    }

    /// As [`products_avxvnni`], with AVX-512 VNNI's (EVEX) `vpdpwssd`.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
    fn products_avx512vnni(w: (__m256i, __m256i), q: (__m256i, __m256i)) -> __m256 {
        let sum = _mm256_dpwssd_epi32(_mm256_setzero_si256(), w.0, q.0);
        _mm256_cvtepi32_ps(_mm256_dpwssd_epi32(sum, w.1, q.1))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }

    /// [`super::quantize_row`]'s block quantization, eight lanes at a time (same rounding).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn quantize_avx2(x: &[f32; 32]) -> ActBlock {
        // SAFETY: reads the 32 floats of `x`, 8 at a time.
        let v: [__m256; 4] =
            std::array::from_fn(|i| unsafe { _mm256_loadu_ps(x.as_ptr().add(8 * i)) });
        let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        let m = _mm256_max_ps(
            _mm256_max_ps(_mm256_and_ps(v[0], abs), _mm256_and_ps(v[1], abs)),
            _mm256_max_ps(_mm256_and_ps(v[2], abs), _mm256_and_ps(v[3], abs)),
        );
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
        let d = amax / super::ACT_MAX;
        let id = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
        let q: [__m256i; 4] = std::array::from_fn(|i| _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id)));
        let sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        let sum = _mm_add_epi32(
            _mm256_castsi256_si128(sum),
            _mm256_extracti128_si256(sum, 1),
        );
        let sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0b01_00_11_10));
        let sum = _mm_cvtsi128_si32(_mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0b10_11_00_01)));
        let mut out = ActBlock {
            d,
            s: d * sum as f32,
            qs: [0; 32],
        };
        for (i, pair) in [(0, 1), (2, 3)].into_iter().enumerate() {
            // packs works per 128-bit lane: restore the order of the 16 values.
            let p =
                _mm256_permute4x64_epi64(_mm256_packs_epi32(q[pair.0], q[pair.1]), 0b11_01_10_00);
            // SAFETY: writes 16 of the 32 i16 of `out.qs`.
            unsafe { _mm256_storeu_si256(out.qs.as_mut_ptr().add(16 * i).cast(), p) };
        }
        out
    }

    /// One kernel per block format and instruction set: R × C tiles, R · C accumulators.
    macro_rules! tile {
        ($name:ident, $block:ty, $prep:ident, $mins:literal, $features:literal, $products:ident) => {
            #[target_feature(enable = $features)]
            pub(super) fn $name<const R: usize, const C: usize>(
                w: [&[$block]; R],
                a: [&[ActBlock]; C],
                ahead: usize,
            ) -> [[f32; C]; R] {
                let mut acc = [[_mm256_setzero_ps(); C]; R];
                let mut mins = [[0f32; C]; R];
                for b in 0..w[0].len() {
                    for row in &w {
                        // A hint into L2: computed without dereferencing, may lie past the matrix,
                        // never faults.
                        _mm_prefetch::<_MM_HINT_T1>(row.as_ptr().wrapping_add(ahead + b).cast());
                    }
                    let mut ws = [(_mm256_setzero_si256(), _mm256_setzero_si256()); R];
                    let mut dm = [(0f32, 0f32); R];
                    for r in 0..R {
                        let (w0, w1, d, m) = $prep(&w[r][b]);
                        ws[r] = (w0, w1);
                        dm[r] = (d, m);
                    }
                    for c in 0..C {
                        let y = &a[c][b];
                        let q = quants(y);
                        for r in 0..R {
                            let p = $products(ws[r], q);
                            let scale = _mm256_set1_ps(dm[r].0 * y.d);
                            acc[r][c] = _mm256_fmadd_ps(p, scale, acc[r][c]);
                            if $mins {
                                mins[r][c] += dm[r].1 * y.s;
                            }
                        }
                    }
                }
                let mut out = [[0f32; C]; R];
                for r in 0..R {
                    for c in 0..C {
                        out[r][c] = hsum(acc[r][c]) + mins[r][c];
                    }
                }
                out
            }
        };
    }

    tile!(
        q4_1_avx2,
        BlockQ4_1,
        prep_q4_1,
        true,
        "avx2,fma,f16c",
        products_avx2
    );
    tile!(
        q4_1_avxvnni,
        BlockQ4_1,
        prep_q4_1,
        true,
        "avx2,fma,f16c,avxvnni",
        products_avxvnni
    );
    tile!(
        q4_1_avx512vnni,
        BlockQ4_1,
        prep_q4_1,
        true,
        "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni",
        products_avx512vnni
    );
    tile!(
        q4_0_avx2,
        BlockQ4_0,
        prep_q4_0,
        true,
        "avx2,fma,f16c",
        products_avx2
    );
    tile!(
        q4_0_avxvnni,
        BlockQ4_0,
        prep_q4_0,
        true,
        "avx2,fma,f16c,avxvnni",
        products_avxvnni
    );
    tile!(
        q4_0_avx512vnni,
        BlockQ4_0,
        prep_q4_0,
        true,
        "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni",
        products_avx512vnni
    );
    tile!(
        q8_0_avx2,
        BlockQ8_0,
        prep_q8_0,
        false,
        "avx2,fma,f16c",
        products_avx2
    );
    tile!(
        q8_0_avxvnni,
        BlockQ8_0,
        prep_q8_0,
        false,
        "avx2,fma,f16c,avxvnni",
        products_avxvnni
    );
    tile!(
        q8_0_avx512vnni,
        BlockQ8_0,
        prep_q8_0,
        false,
        "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni",
        products_avx512vnni
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Random GGUF bytes of a (rows, cols) matrix in format B, with realistic f16 scales.
    fn random_bytes<B: WeightBlock>(rows: usize, cols: usize, rng: &mut ChaCha8Rng) -> Vec<u8> {
        let mut bytes = Vec::new();
        for _ in 0..rows * cols / QK {
            let d = half::f16::from_f32(rng.random_range(0.001f32..0.05));
            bytes.extend_from_slice(&d.to_bits().to_le_bytes());
            if B::BYTES == BlockQ4_1::BYTES {
                let m = half::f16::from_f32(rng.random_range(-0.4f32..0.0));
                bytes.extend_from_slice(&m.to_bits().to_le_bytes());
            }
            while !bytes.len().is_multiple_of(B::BYTES) {
                bytes.push(rng.random::<u8>());
            }
        }
        bytes
    }

    fn random_matrix<B: WeightBlock>(rows: usize, cols: usize, seed: u64) -> QuantMatrix<B> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        QuantMatrix::from_gguf_bytes(rows, cols, &random_bytes::<B>(rows, cols, &mut rng)).unwrap()
    }

    fn random_x(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..n).map(|_| rng.random_range(-3f32..3.0)).collect()
    }

    #[test]
    fn rejects_partial_blocks_and_wrong_lengths() {
        let q4 = QuantMatrix::<BlockQ4_1>::from_gguf_bytes;
        assert!(q4(2, 40, &[0; 2 * 40 / 32 * 20]).is_none());
        assert!(q4(2, 64, &[0; 79]).is_none());
        assert!(q4(2, 64, &[0; 80]).is_some());
        let q8 = QuantMatrix::<BlockQ8_0>::from_gguf_bytes;
        assert!(q8(2, 64, &[0; 80]).is_none());
        assert!(q8(2, 64, &[0; 136]).is_some());
    }

    #[test]
    fn dequantize_follows_the_ggml_layouts() {
        // Q4_1: d = 0.5, m = -1; weights 0, 16, 1, 17 from qs[0] = 0x3A, qs[1] = 0xF1.
        let mut b = vec![0u8; 20];
        b[..2].copy_from_slice(&half::f16::from_f32(0.5).to_bits().to_le_bytes());
        b[2..4].copy_from_slice(&half::f16::from_f32(-1.0).to_bits().to_le_bytes());
        b[4] = 0x3A;
        b[5] = 0xF1;
        let w = QuantMatrix::<BlockQ4_1>::from_gguf_bytes(1, 32, &b)
            .unwrap()
            .dequantize();
        assert_eq!(
            (w[0], w[16], w[1], w[17], w[2]),
            (4.0, 0.5, -0.5, 6.5, -1.0)
        );
        // Q8_0: d = 0.25, qs[0] = −128, qs[31] = 7.
        let mut b = vec![0u8; 34];
        b[..2].copy_from_slice(&half::f16::from_f32(0.25).to_bits().to_le_bytes());
        b[2] = 0x80;
        b[33] = 7;
        let w = QuantMatrix::<BlockQ8_0>::from_gguf_bytes(1, 32, &b)
            .unwrap()
            .dequantize();
        assert_eq!((w[0], w[1], w[31]), (-32.0, 0.0, 1.75));
        // Q4_0: d = 0.5; weights 0, 16, 1, 17, 2 from qs[0] = 0x3A, qs[1] = 0xF1.
        let mut b = vec![0u8; 18];
        b[..2].copy_from_slice(&half::f16::from_f32(0.5).to_bits().to_le_bytes());
        b[2] = 0x3A;
        b[3] = 0xF1;
        let w = QuantMatrix::<BlockQ4_0>::from_gguf_bytes(1, 32, &b)
            .unwrap()
            .dequantize();
        assert_eq!(
            (w[0], w[16], w[1], w[17], w[2]),
            (1.0, -2.5, -3.5, 3.5, -4.0)
        );
    }

    /// The scalar kernel against f64 products of the dequantized weights.
    fn scalar_matches_dequantized<B: WeightBlock>() {
        let (rows, cols, t) = (37, 96, 5);
        let m = random_matrix::<B>(rows, cols, 1);
        let x = random_x(t * cols, 11);
        let y = m.matmul_with(&x, t, Kernel::Scalar);
        let w = m.dequantize();
        for s in 0..t {
            for r in 0..rows {
                let xr = &x[s * cols..(s + 1) * cols];
                let wr = &w[r * cols..(r + 1) * cols];
                let exact: f64 = xr.iter().zip(wr).map(|(&a, &b)| a as f64 * b as f64).sum();
                let scale: f64 = xr.iter().zip(wr).map(|(&a, &b)| (a * b).abs() as f64).sum();
                let got = y[s * rows + r] as f64;
                assert!(
                    (got - exact).abs() <= 0.02 * scale,
                    "row {r} pos {s}: {got} vs {exact} (scale {scale})"
                );
            }
        }
    }

    /// The SIMD block quantization gives the scalar one's bits, ties and zero blocks included.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn simd_quantization_matches_scalar() {
        if !Kernel::Avx2.available() {
            eprintln!("no AVX2/FMA/F16C: nothing to compare");
            return;
        }
        let mut x = random_x(32 * 64, 5);
        x[32..64].fill(0.0);
        // Exact halves after scaling: amax 32767 makes id 1.
        x[64] = 32767.0;
        for (j, v) in x[65..96].iter_mut().enumerate() {
            *v = j as f32 - 15.5;
        }
        let mut want = vec![ActBlock::default(); 64];
        let mut got = want.clone();
        quantize_row(Kernel::Scalar, &x, &mut want);
        quantize_row(Kernel::Avx2, &x, &mut got);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                (g.d.to_bits(), g.s.to_bits(), g.qs),
                (w.d.to_bits(), w.s.to_bits(), w.qs),
                "block {i}"
            );
        }
    }

    #[test]
    fn scalar_kernels_match_dequantized_products() {
        scalar_matches_dequantized::<BlockQ4_0>();
        scalar_matches_dequantized::<BlockQ4_1>();
        scalar_matches_dequantized::<BlockQ8_0>();
    }

    /// Every SIMD kernel this CPU has against the scalar one on a random matrix.
    #[cfg(target_arch = "x86_64")]
    fn simd_equals_scalar<B: WeightBlock>(rows: usize, cols: usize, t: usize, seed: u64) {
        let m = random_matrix::<B>(rows, cols, seed);
        let x = random_x(t * cols, seed ^ 0x5eed);
        let want = m.matmul_with(&x, t, Kernel::Scalar);
        for k in Kernel::SIMD.into_iter().filter(|k| k.available()) {
            let got = m.matmul_with(&x, t, k);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-4 * w.abs().max(1.0),
                    "{k:?} ({rows}, {cols}, {t}) output {i}: {g} vs {w}"
                );
            }
        }
    }

    /// Every SIMD kernel, through every tile shape, against the scalar kernel.
    #[cfg(target_arch = "x86_64")]
    fn simd_matches_scalar<B: WeightBlock>() {
        if !Kernel::Avx2.available() {
            eprintln!("no AVX2/FMA/F16C: nothing to compare");
        }
        let shapes = [
            (1, 32, 1),
            (19, 64, 1),
            (7, 64, 3),
            (40, 576, 9),
            (33, 1536, 17),
            (5, 96, 4),
            (18, 64, 6),
        ];
        for (i, (rows, cols, t)) in shapes.into_iter().enumerate() {
            simd_equals_scalar::<B>(rows, cols, t, 20 + i as u64);
        }
    }

    #[cfg(target_arch = "x86_64")]
    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
        /// Random shapes and blocks of every format: SIMD equals scalar.
        #[test]
        fn simd_kernels_match_scalar_on_random_blocks(
            rows in 1usize..24,
            blocks in 1usize..8,
            t in 1usize..11,
            seed in proptest::prelude::any::<u64>(),
        ) {
            simd_equals_scalar::<BlockQ4_0>(rows, 32 * blocks, t, seed);
            simd_equals_scalar::<BlockQ4_1>(rows, 32 * blocks, t, seed);
            simd_equals_scalar::<BlockQ8_0>(rows, 32 * blocks, t, seed);
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn simd_kernels_match_scalar() {
        simd_matches_scalar::<BlockQ4_0>();
        simd_matches_scalar::<BlockQ4_1>();
        simd_matches_scalar::<BlockQ8_0>();
    }

    #[test]
    fn zero_activations_give_zero() {
        let m = random_matrix::<BlockQ4_1>(4, 64, 3);
        assert_eq!(m.matmul(&[0.0; 128], 2), vec![0.0; 8]);
    }
}

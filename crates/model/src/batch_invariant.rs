//! Batch-invariant f32 kernels: the dense projection `y = x Wᵀ` and attention over the KV cache,
//! each output row computed in one fixed order whatever the number of rows in the pass and the
//! row's place in it. A row then has the same bits in a prompt's one pass, in a verify window and
//! decoded token by token, so the private client and the plaintext reference differ only by the
//! deltas the server returns. (Candle's GEMM picks its blocking, and a GEMV path for one row, from
//! the shapes; see He et al., "Defeating Nondeterminism in LLM Inference", Thinking Machines Lab,
//! 2025. Notes: docs/design/code-notes.md, "model: batch invariance".)
//!
//! Every dot product sums lane `k mod 8` in increasing k with fused multiply-adds, then the eight
//! lanes in a fixed tree. Fused multiply-add rounds once, so the AVX2 + FMA build of the kernels
//! and the portable one give the same bits. Work is split over output rows and heads, never over k.
//!
//! Besides [`crate::qmatmul`], this module holds the crate's only `unsafe` code: calls of
//! `#[target_feature]` functions after `is_x86_feature_detected!` confirmed the features.
#![allow(unsafe_code)]

use std::ops::Range;
use std::sync::{Mutex, PoisonError};

use candle_core::{Storage, Tensor};

use crate::ModelError;
use crate::mask::SeenKeys;

/// Partial sums per dot product.
const LANES: usize = 8;
/// Output rows of a projection per work item handed to candle's thread pool.
const ROWS_PER_ITEM: usize = 16;
/// Activation rows per block: a block stays in cache while every weight row of an item passes.
const ACT_ROWS_PER_BLOCK: usize = 64;

type Lanes = [f32; LANES];

/// The eight lanes' sum, in a fixed tree.
#[inline(always)]
fn reduce(a: Lanes) -> f32 {
    let h = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    (h[0] + h[2]) + (h[1] + h[3])
}

/// The arithmetic every kernel shares, in two builds that give the same bits.
trait Dots {
    /// The R × C dot products of weight rows `w` with activation rows `x` (all of one length):
    /// lane `k mod 8` sums its products in increasing k by fused multiply-add, then [`reduce`].
    fn tile<const R: usize, const C: usize>(w: [&[f32]; R], x: [&[f32]; C]) -> [[f32; C]; R];
    /// `out[d] = p · v[d] + out[d]`, fused.
    fn axpy(p: f32, v: &[f32], out: &mut [f32]);
}

/// Plain Rust: the reference, and the build for CPUs without AVX2 and FMA.
struct Portable;

impl Dots for Portable {
    #[inline(always)]
    fn tile<const R: usize, const C: usize>(w: [&[f32]; R], x: [&[f32]; C]) -> [[f32; C]; R] {
        let n = w[0].len() / LANES;
        let wv: [&[Lanes]; R] = w.map(|s| &s.as_chunks::<LANES>().0[..n]);
        let xv: [&[Lanes]; C] = x.map(|s| &s.as_chunks::<LANES>().0[..n]);
        let mut acc = [[[0f32; LANES]; C]; R];
        for i in 0..n {
            for r in 0..R {
                for c in 0..C {
                    for l in 0..LANES {
                        acc[r][c][l] = wv[r][i][l].mul_add(xv[c][i][l], acc[r][c][l]);
                    }
                }
            }
        }
        std::array::from_fn(|r| std::array::from_fn(|c| finish(acc[r][c], w[r], x[c])))
    }

    #[inline(always)]
    fn axpy(p: f32, v: &[f32], out: &mut [f32]) {
        for (o, v) in out.iter_mut().zip(v) {
            *o = p.mul_add(*v, *o);
        }
    }
}

/// A dot product's last `len mod 8` products into lanes 0.., then [`reduce`].
#[inline(always)]
fn finish(mut acc: Lanes, w: &[f32], x: &[f32]) -> f32 {
    let main = w.len() / LANES * LANES;
    for (l, (a, b)) in w[main..].iter().zip(&x[main..]).enumerate() {
        acc[l] = a.mul_add(*b, acc[l]);
    }
    reduce(acc)
}

/// `out[(r − rows.start) · t + s] = w_r · x_s` for the weight rows `rows` and all t activation
/// rows (`cols` values each).
#[inline(always)]
fn project_rows<K: Dots>(
    w: &[f32],
    cols: usize,
    rows: Range<usize>,
    x: &[f32],
    t: usize,
    out: &mut [f32],
) {
    let wrow = |r: usize| &w[r * cols..(r + 1) * cols];
    let xrow = |s: usize| &x[s * cols..(s + 1) * cols];
    let r0 = rows.start;
    for s0 in (0..t).step_by(ACT_ROWS_PER_BLOCK) {
        let s1 = (s0 + ACT_ROWS_PER_BLOCK).min(t);
        let mut r = rows.start;
        while r < rows.end {
            let quad = rows.end - r >= 4;
            let mut s = s0;
            while s < s1 {
                let pair = s1 - s >= 2;
                match (quad, pair) {
                    (true, true) => {
                        let v = K::tile::<4, 2>(
                            std::array::from_fn(|i| wrow(r + i)),
                            [xrow(s), xrow(s + 1)],
                        );
                        for (i, vi) in v.iter().enumerate() {
                            out[(r + i - r0) * t + s] = vi[0];
                            out[(r + i - r0) * t + s + 1] = vi[1];
                        }
                    }
                    (true, false) => {
                        let v = K::tile::<4, 1>(std::array::from_fn(|i| wrow(r + i)), [xrow(s)]);
                        (0..4).for_each(|i| out[(r + i - r0) * t + s] = v[i][0]);
                    }
                    (false, true) => {
                        let v = K::tile::<1, 2>([wrow(r)], [xrow(s), xrow(s + 1)]);
                        out[(r - r0) * t + s] = v[0][0];
                        out[(r - r0) * t + s + 1] = v[0][1];
                    }
                    (false, false) => {
                        out[(r - r0) * t + s] = K::tile::<1, 1>([wrow(r)], [xrow(s)])[0][0];
                    }
                }
                s += if pair { 2 } else { 1 };
            }
            r += if quad { 4 } else { 1 };
        }
    }
}

/// One head's attention for one row: `out = Σ_j softmax(scale · q·k_j)_j · v_j` over the keys
/// `seen` (rows of `keys`/`values`, `hd` values each), in key order; `scores` is scratch.
#[inline(always)]
fn attend_row<K: Dots>(
    q: &[f32],
    (keys, values): (&[f32], &[f32]),
    seen: &SeenKeys,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let hd = q.len();
    let key = |j: usize| &keys[j * hd..(j + 1) * hd];
    scores.clear();
    // Eight keys a tile: eight independent sums instead of one chain of dependent ones.
    let (mut batch, mut n) = ([0usize; 8], 0);
    seen.for_each(|j| {
        batch[n] = j;
        n += 1;
        if n == batch.len() {
            let dots = K::tile::<8, 1>(batch.map(key), [q]);
            scores.extend(dots.iter().map(|d| d[0] * scale));
            n = 0;
        }
    });
    for &j in &batch[..n] {
        scores.push(K::tile::<1, 1>([key(j)], [q])[0][0] * scale);
    }
    let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
    let mut z = 0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        z += *s;
    }
    out.fill(0.0);
    let mut e = scores.iter();
    seen.for_each(|j| {
        let p = e.next().copied().unwrap_or(0.0) / z;
        K::axpy(p, &values[j * hd..(j + 1) * hd], out);
    });
}

/// Rows `rows` of one head: `q` (t, hd) of the head, `kv` its kv head's (capacity, hd) cache
/// rows, `out` the head's (rows.len(), hd) output.
#[inline(always)]
fn attend_rows<K: Dots>(
    q: &[f32],
    kv: (&[f32], &[f32]),
    seen: &[SeenKeys],
    scale: f32,
    rows: Range<usize>,
    out: &mut [f32],
) {
    let hd = out.len() / rows.len().max(1);
    let mut scores = Vec::new();
    for (s, o) in rows.zip(out.chunks_exact_mut(hd)) {
        attend_row::<K>(
            &q[s * hd..(s + 1) * hd],
            kv,
            &seen[s],
            scale,
            &mut scores,
            o,
        );
    }
}

/// Whether this CPU runs the AVX2 + FMA build (checked once).
fn has_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static FMA: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *FMA.get_or_init(|| {
            std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(target_arch = "x86_64")]
mod simd {
    //! The AVX2 + FMA build: the same lanes in 256-bit registers, `vfmadd` for `mul_add`.
    use std::arch::x86_64::*;
    use std::ops::Range;

    use super::{Dots, LANES, Lanes, finish};
    use crate::mask::SeenKeys;

    pub(super) struct Fma;

    impl Dots for Fma {
        #[inline(always)]
        fn tile<const R: usize, const C: usize>(w: [&[f32]; R], x: [&[f32]; C]) -> [[f32; C]; R] {
            // SAFETY: only reached from the `#[target_feature]` functions below, which run only
            // after `has_fma` confirmed AVX2 and FMA.
            unsafe { tile(w, x) }
        }

        #[inline(always)]
        fn axpy(p: f32, v: &[f32], out: &mut [f32]) {
            // SAFETY: as for `tile`.
            unsafe { axpy(p, v, out) }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    fn tile<const R: usize, const C: usize>(w: [&[f32]; R], x: [&[f32]; C]) -> [[f32; C]; R] {
        let n = w[0].len() / LANES;
        assert!(w.iter().chain(&x).all(|s| s.len() >= n * LANES));
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        for i in 0..n {
            // SAFETY: every row holds at least n · 8 values (asserted above).
            let xs: [__m256; C] =
                std::array::from_fn(|c| unsafe { _mm256_loadu_ps(x[c].as_ptr().add(i * LANES)) });
            for r in 0..R {
                // SAFETY: as above.
                let wr = unsafe { _mm256_loadu_ps(w[r].as_ptr().add(i * LANES)) };
                for c in 0..C {
                    acc[r][c] = _mm256_fmadd_ps(wr, xs[c], acc[r][c]);
                }
            }
        }
        std::array::from_fn(|r| {
            std::array::from_fn(|c| {
                if w[r].len() == n * LANES {
                    return reduce(acc[r][c]);
                }
                let mut lanes: Lanes = [0.0; LANES];
                // SAFETY: `lanes` holds 8 f32.
                unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc[r][c]) };
                finish(lanes, w[r], x[c])
            })
        })
    }

    /// [`super::reduce`] in registers: (a₀ + a₄, …, a₃ + a₇), then (h₀ + h₂) + (h₁ + h₃).
    #[target_feature(enable = "avx2,fma")]
    fn reduce(a: __m256) -> f32 {
        let h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
        let g = _mm_add_ps(h, _mm_movehl_ps(h, h));
        _mm_cvtss_f32(_mm_add_ss(g, _mm_shuffle_ps::<0b01>(g, g)))
    }

    #[target_feature(enable = "avx2,fma")]
    fn axpy(p: f32, v: &[f32], out: &mut [f32]) {
        let n = out.len().min(v.len());
        let main = n / LANES * LANES;
        let pv = _mm256_set1_ps(p);
        for i in (0..main).step_by(LANES) {
            // SAFETY: i + 8 ≤ n ≤ both lengths.
            unsafe {
                let o = _mm256_loadu_ps(out.as_ptr().add(i));
                let y = _mm256_fmadd_ps(pv, _mm256_loadu_ps(v.as_ptr().add(i)), o);
                _mm256_storeu_ps(out.as_mut_ptr().add(i), y);
            }
        }
        for (o, v) in out[main..n].iter_mut().zip(&v[main..n]) {
            *o = p.mul_add(*v, *o);
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn project_rows(
        w: &[f32],
        cols: usize,
        rows: Range<usize>,
        x: &[f32],
        t: usize,
        out: &mut [f32],
    ) {
        super::project_rows::<Fma>(w, cols, rows, x, t, out)
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn attend_rows(
        q: &[f32],
        kv: (&[f32], &[f32]),
        seen: &[SeenKeys],
        scale: f32,
        rows: Range<usize>,
        out: &mut [f32],
    ) {
        super::attend_rows::<Fma>(q, kv, seen, scale, rows, out)
    }
}

/// Runs `f(rows, out)` on candle's thread pool over `rows` output rows in items of `per_item`,
/// `out` holding the item's rows × t values (row-major); returns the (t, rows) result row-major.
pub(crate) fn by_output_rows(
    rows: usize,
    t: usize,
    per_item: usize,
    f: impl Fn(Range<usize>, &mut [f32]) + Sync,
) -> Vec<f32> {
    // Output transposed, (rows, t): a work item's rows are contiguous.
    let mut out_t = vec![0f32; rows * t];
    if t == 0 || rows == 0 {
        return out_t;
    }
    let items: Vec<Mutex<&mut [f32]>> = out_t.chunks_mut(per_item * t).map(Mutex::new).collect();
    candle_core::utils::barrier_pool().execute_chunked(items.len(), |range| {
        for i in range {
            let mut out = items[i].lock().unwrap_or_else(PoisonError::into_inner);
            let r0 = i * per_item;
            f(r0..r0 + out.len() / t, &mut out);
        }
    });
    drop(items);
    if t == 1 {
        return out_t;
    }
    let mut out = vec![0f32; t * rows];
    for (r, col) in out_t.chunks_exact(t).enumerate() {
        for (s, &v) in col.iter().enumerate() {
            out[s * rows + r] = v;
        }
    }
    out
}

/// `x Wᵀ` for `x` of t rows (t · cols) and `w` (rows · cols), row-major → (t, rows) row-major.
/// Panics: if the lengths do not match.
pub(crate) fn matmul_t(x: &[f32], t: usize, w: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    assert_eq!(x.len(), t * cols, "activations: t · cols values");
    assert_eq!(w.len(), rows * cols, "weights: rows · cols values");
    let fma = has_fma();
    by_output_rows(rows, t, ROWS_PER_ITEM, |range, out| {
        #[cfg(target_arch = "x86_64")]
        if fma {
            // SAFETY: `has_fma` confirmed AVX2 and FMA on this CPU.
            return unsafe { simd::project_rows(w, cols, range, x, t, out) };
        }
        let _ = fma;
        project_rows::<Portable>(w, cols, range, x, t, out)
    })
}

/// The f32 values of a contiguous CPU tensor, borrowed for `f`. Errors: [`ModelError::Input`]
/// for another device, dtype or a strided view.
fn with_values<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R, ModelError> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        return Err(ModelError::Input(
            "batch-invariant kernels run on the CPU".into(),
        ));
    };
    let data = cpu.as_slice::<f32>()?;
    let (a, b) = layout.contiguous_offsets().ok_or_else(|| {
        ModelError::Input("batch-invariant kernels need contiguous tensors".into())
    })?;
    Ok(f(&data[a..b]))
}

/// `x Wᵀ` for x (T, d_in) and w (d_out, d_in), both f32 → (T, d_out). Errors:
/// [`ModelError::Input`] on a shape mismatch; [`ModelError::Candle`].
pub(crate) fn project(x: &Tensor, w: &Tensor) -> Result<Tensor, ModelError> {
    let (t, cols) = x.dims2()?;
    let (rows, w_cols) = w.dims2()?;
    if cols != w_cols {
        return Err(ModelError::Input(format!(
            "projection input has {cols} features, the weight {w_cols}"
        )));
    }
    let x = x.contiguous()?;
    let w = w.contiguous()?;
    let y = with_values(&x, |xs| {
        with_values(&w, |ws| matmul_t(xs, t, ws, rows, cols))
    })??;
    Ok(Tensor::from_vec(y, (t, rows), x.device())?)
}

/// Attention of T rows: `q` (heads, T, hd) after RoPE; `keys`, `values` one layer's whole cache
/// (kv_heads, capacity, hd), this pass's rows written; `seen[s]` the keys row s attends to.
/// Query head h reads kv head h / (heads / kv_heads) (grouped-query attention). Returns
/// (T, heads · hd), the o projection's input. Errors: [`ModelError::Input`] on inconsistent
/// shapes or a key beyond the cache; [`ModelError::Candle`].
pub(crate) fn attention(
    q: &Tensor,
    keys: &Tensor,
    values: &Tensor,
    seen: &[SeenKeys],
    scale: f32,
) -> Result<Tensor, ModelError> {
    let (heads, t, hd) = q.dims3()?;
    let (kv_heads, capacity, kv_hd) = keys.dims3()?;
    let bad = |what: String| Err(ModelError::Input(format!("attention: {what}")));
    if kv_hd != hd || values.dims() != keys.dims() || kv_heads == 0 || heads % kv_heads != 0 {
        return bad(format!(
            "q {:?}, keys {:?}, values {:?}",
            q.dims(),
            keys.dims(),
            values.dims()
        ));
    }
    if seen.len() != t {
        return bad(format!("{} rows of keys for {t} rows", seen.len()));
    }
    if let Some(s) = seen.iter().find(|s| s.end() > capacity) {
        return bad(format!(
            "a row sees key {} of a cache of {capacity}",
            s.end() - 1
        ));
    }
    let q = q.contiguous()?;
    let n_rep = heads / kv_heads;
    let fma = has_fma();
    let per_head = with_values(&q, |q| {
        with_values(keys, |k| {
            with_values(values, |v| {
                let mut out = vec![0f32; heads * t * hd];
                let items: Vec<Mutex<&mut [f32]>> =
                    out.chunks_mut((t * hd).max(1)).map(Mutex::new).collect();
                candle_core::utils::barrier_pool().execute_chunked(items.len(), |range| {
                    for h in range {
                        let mut o = items[h].lock().unwrap_or_else(PoisonError::into_inner);
                        let g = h / n_rep;
                        let cache = capacity * hd;
                        let kv = (
                            &k[g * cache..(g + 1) * cache],
                            &v[g * cache..(g + 1) * cache],
                        );
                        let qh = &q[h * t * hd..(h + 1) * t * hd];
                        #[cfg(target_arch = "x86_64")]
                        if fma {
                            // SAFETY: `has_fma` confirmed AVX2 and FMA on this CPU.
                            unsafe { simd::attend_rows(qh, kv, seen, scale, 0..t, &mut o) };
                            continue;
                        }
                        let _ = fma;
                        attend_rows::<Portable>(qh, kv, seen, scale, 0..t, &mut o);
                    }
                });
                drop(items);
                out
            })
        })
    })???;
    // (heads, T, hd) → (T, heads · hd).
    let mut out = vec![0f32; t * heads * hd];
    for (h, head) in per_head.chunks_exact((t * hd).max(1)).enumerate() {
        for (s, row) in head.chunks_exact(hd).enumerate() {
            out[(s * heads + h) * hd..(s * heads + h + 1) * hd].copy_from_slice(row);
        }
    }
    Ok(Tensor::from_vec(out, (t, heads * hd), q.device())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(seed: u64, n: usize) -> Vec<f32> {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// The same arithmetic, one value at a time: lanes in order, then the fixed tree.
    fn reference_dot(a: &[f32], b: &[f32]) -> f32 {
        let mut acc = [0f32; LANES];
        for (k, (x, y)) in a.iter().zip(b).enumerate() {
            acc[k % LANES] = x.mul_add(*y, acc[k % LANES]);
        }
        reduce(acc)
    }

    proptest::proptest! {
        /// Every row of a pass of t rows has the bits of the same row computed alone, with the
        /// SIMD kernel and the portable one alike; and it is the lane-order dot product.
        #[test]
        fn projection_rows_do_not_depend_on_the_batch(t in 1usize..70, rows in 1usize..40, cols in 1usize..50, seed in 0u64..1000) {
            let x = values(seed, t * cols);
            let w = values(seed + 1, rows * cols);
            let batched = matmul_t(&x, t, &w, rows, cols);
            let mut portable = vec![0f32; rows * t];
            project_rows::<Portable>(&w, cols, 0..rows, &x, t, &mut portable);
            for s in 0..t {
                let alone = matmul_t(&x[s * cols..(s + 1) * cols], 1, &w, rows, cols);
                for r in 0..rows {
                    let want = reference_dot(&w[r * cols..(r + 1) * cols], &x[s * cols..(s + 1) * cols]);
                    proptest::prop_assert_eq!(batched[s * rows + r].to_bits(), alone[r].to_bits());
                    proptest::prop_assert_eq!(batched[s * rows + r].to_bits(), want.to_bits());
                    proptest::prop_assert_eq!(portable[r * t + s].to_bits(), want.to_bits());
                }
            }
        }
    }

    /// Eight keys a tile give each dot product the bits of one at a time, in both builds.
    #[test]
    fn tile_shapes_agree_in_both_builds() {
        for n in [64, 61, 8, 3] {
            let rows: Vec<Vec<f32>> = (0..8).map(|i| values(10 + i, n)).collect();
            let q = values(99, n);
            let wide = Portable::tile::<8, 1>(std::array::from_fn(|i| &rows[i][..]), [&q[..]]);
            for (i, row) in rows.iter().enumerate() {
                let want = reference_dot(row, &q);
                assert_eq!(wide[i][0].to_bits(), want.to_bits(), "n {n} row {i}");
                assert_eq!(
                    Portable::tile::<1, 1>([row], [&q])[0][0].to_bits(),
                    want.to_bits()
                );
                #[cfg(target_arch = "x86_64")]
                if has_fma() {
                    let simd =
                        simd::Fma::tile::<8, 1>(std::array::from_fn(|i| &rows[i][..]), [&q[..]]);
                    assert_eq!(simd[i][0].to_bits(), want.to_bits(), "n {n} row {i}, AVX2");
                }
            }
        }
    }

    /// Causal attention over a pass equals, bit for bit, each row attending alone to the same
    /// keys; and a row's output is the softmax-weighted sum of the values (within f32 rounding).
    #[test]
    fn attention_rows_do_not_depend_on_the_batch() {
        let (heads, kv_heads, hd, cap, t, start) = (4, 2, 16, 24, 7, 5);
        let tensor = |seed, shape: &[usize]| {
            Tensor::from_vec(
                values(seed, shape.iter().product()),
                shape,
                &candle_core::Device::Cpu,
            )
            .unwrap()
        };
        let q = tensor(1, &[heads, t, hd]);
        let (k, v) = (
            tensor(2, &[kv_heads, cap, hd]),
            tensor(3, &[kv_heads, cap, hd]),
        );
        let seen: Vec<SeenKeys> = (0..t).map(|s| SeenKeys::prefix(start + s + 1)).collect();
        let scale = 0.25;
        let all = attention(&q, &k, &v, &seen, scale)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        let (qv, kv, vv) = (
            values(1, heads * t * hd),
            values(2, kv_heads * cap * hd),
            values(3, kv_heads * cap * hd),
        );
        // The portable build gives the same bits as the one `attention` ran.
        for h in 0..heads {
            let g = h / (heads / kv_heads);
            let mut out = vec![0f32; t * hd];
            let cache = (
                &kv[g * cap * hd..(g + 1) * cap * hd],
                &vv[g * cap * hd..(g + 1) * cap * hd],
            );
            attend_rows::<Portable>(
                &qv[h * t * hd..(h + 1) * t * hd],
                cache,
                &seen,
                scale,
                0..t,
                &mut out,
            );
            for s in 0..t {
                assert_eq!(
                    out[s * hd..(s + 1) * hd],
                    all[s][h * hd..(h + 1) * hd],
                    "head {h} row {s}"
                );
            }
        }
        for s in 0..t {
            let one = attention(&q.narrow(1, s, 1).unwrap(), &k, &v, &seen[s..=s], scale).unwrap();
            let one = one.to_vec2::<f32>().unwrap();
            let bits = |r: &[f32]| r.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&all[s]), bits(&one[0]), "row {s}");
            for h in 0..heads {
                let g = h / (heads / kv_heads);
                let qh = &qv[(h * t + s) * hd..(h * t + s + 1) * hd];
                let n = start + s + 1;
                let sc: Vec<f64> = (0..n)
                    .map(|j| {
                        let kj = &kv[(g * cap + j) * hd..(g * cap + j + 1) * hd];
                        qh.iter().zip(kj).map(|(a, b)| (a * b) as f64).sum::<f64>() * scale as f64
                    })
                    .collect();
                let m = sc.iter().cloned().fold(f64::MIN, f64::max);
                let z: f64 = sc.iter().map(|x| (x - m).exp()).sum();
                for d in 0..hd {
                    let want: f64 = (0..n)
                        .map(|j| (sc[j] - m).exp() / z * vv[(g * cap + j) * hd + d] as f64)
                        .sum();
                    let got = all[s][h * hd + d] as f64;
                    assert!(
                        (got - want).abs() < 1e-5,
                        "row {s} head {h} dim {d}: {got} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn attention_refuses_keys_beyond_the_cache() {
        let z = |shape: &[usize]| {
            Tensor::zeros(shape, candle_core::DType::F32, &candle_core::Device::Cpu).unwrap()
        };
        let (q, k) = (z(&[2, 1, 8]), z(&[1, 4, 8]));
        let err = attention(&q, &k, &k, &[SeenKeys::prefix(5)], 1.0).unwrap_err();
        assert!(matches!(err, ModelError::Input(_)), "{err}");
        assert!(attention(&q, &k, &z(&[1, 3, 8]), &[SeenKeys::prefix(1)], 1.0).is_err());
    }
}

//! The AVX2 + FMA kernels of [`LazyDot`] ([`crate::fma`]'s exact doubles): [`CHUNK`] reduced
//! products summed exactly before one more reduction.

use super::{CHUNK, LazyDot, Term};
use crate::fma::Ops;
use pulp::x86::V3;
use pulp::{as_arrays, as_arrays_mut, cast};

/// `out0 ← N^{-1}·Σ x0⊙w0`, `out1 ← N^{-1}·Σ x1⊙w1` mod p, in `[0, p)`; lengths a multiple of
/// 4, every input residue below `p < 2^50`. `false` (nothing done) without AVX2 + FMA.
pub(crate) fn dot2(k: &LazyDot, terms: &[Term<'_>], out0: &mut [u64], out1: &mut [u64]) -> bool {
    let Some(simd) = V3::try_new() else {
        return false;
    };
    // `move` and consumed captures: an `FnOnce`-only closure inlines (see `fma::ntt`).
    simd.vectorize(
        #[inline(always)]
        move || {
            let (out0, out1) = (out0, out1);
            let ops = Ops::new(simd, k.p);
            let n_inv = simd.avx._mm256_set1_pd(k.n_inv as f64);
            let (o0, _) = as_arrays_mut::<4, u64>(out0);
            let (o1, _) = as_arrays_mut::<4, u64>(out1);
            for (v, (o0, o1)) in o0.iter_mut().zip(o1.iter_mut()).enumerate() {
                let i = v * 4;
                let (mut s0, mut s1) = (ops.zero, ops.zero);
                for chunk in terms.chunks(CHUNK) {
                    for t in chunk {
                        s0 = ops.add(s0, ops.mul_reduce(load(&ops, t.x0, i), load(&ops, t.w0, i)));
                        s1 = ops.add(s1, ops.mul_reduce(load(&ops, t.x1, i), load(&ops, t.w1, i)));
                    }
                    s0 = ops.reduce(s0);
                    s1 = ops.reduce(s1);
                }
                *o0 = cast(ops.canonical(ops.mul_reduce(s0, n_inv)));
                *o1 = cast(ops.canonical(ops.mul_reduce(s1, n_inv)));
            }
        },
    );
    true
}

/// `lhs ← lhs·rhs·N^{-1}` mod p, in `[0, p)`; lengths a multiple of 4, every input residue
/// below `p < 2^50`. `false` (nothing done) without AVX2 + FMA.
pub(crate) fn mul_assign(k: &LazyDot, lhs: &mut [u64], rhs: &[u64]) -> bool {
    let Some(simd) = V3::try_new() else {
        return false;
    };
    simd.vectorize(
        #[inline(always)]
        move || {
            let lhs = lhs;
            let ops = Ops::new(simd, k.p);
            let n_inv = simd.avx._mm256_set1_pd(k.n_inv as f64);
            let (l, _) = as_arrays_mut::<4, u64>(lhs);
            let (r, _) = as_arrays::<4, u64>(rhs);
            for (l, r) in l.iter_mut().zip(r) {
                let t = ops.mul_reduce(ops.exact_f64(cast(*l)), ops.exact_f64(cast(*r)));
                *l = cast(ops.canonical(ops.mul_reduce(t, n_inv)));
            }
        },
    );
    true
}

/// Four residues from `v[i..i + 4]` as doubles. A function, not a closure, so that it inlines
/// into the vectorized kernel at every optimisation level.
#[inline(always)]
fn load(ops: &Ops, v: &[u64], i: usize) -> std::arch::x86_64::__m256d {
    ops.exact_f64(cast(as_arrays::<4, u64>(&v[i..i + 4]).0[0]))
}

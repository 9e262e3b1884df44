//! Hybrid key switching with one special prime P and one chain prime per digit (Han–Ki, CT-RSA
//! 2020; Bossuat et al., EUROCRYPT 2021, §3): ModUp, inner product with the key, ModDown.

use crate::context::Context;
use crate::keys::GaloisKey;
use crate::lazy_dot::Term;
use crate::modular::{lift_centered_combine, lift_centered_limb, vectorized};

/// ModUp: per digit `i ≤ level`, the balanced residue `[c]_{q_i}` extended to `Q_level·P` in NTT
/// form: `level + 1` digits of `level + 2` limbs (optionally on the rayon pool).
pub(crate) fn mod_up(ctx: &Context, c: &[u64], level: usize, parallel: bool) -> Vec<Vec<u64>> {
    use rayon::prelude::*;
    let n = ctx.degree();
    let primes: Vec<usize> = ctx.qp_primes(level).collect();
    let digit_of = |i: usize| {
        let src = &c[i * n..(i + 1) * n];
        let mut coeff = ctx.pool.copy_of(src);
        ctx.inv(i, &mut coeff);
        let qi = ctx.prime(i);
        let mut digit = ctx.pool.take(primes.len() * n);
        for (limb, &j) in digit.chunks_exact_mut(n).zip(&primes) {
            if j == i {
                limb.copy_from_slice(src);
                continue;
            }
            lift_centered_limb(&ctx.moduli[j], &coeff, qi, limb);
            ctx.fwd(j, limb);
        }
        ctx.pool.give(coeff);
        digit
    };
    if parallel {
        (0..=level).into_par_iter().map(digit_of).collect()
    } else {
        (0..=level).map(digit_of).collect()
    }
}

/// Inner product of the decomposed digits with a Galois key: `(Σ_i d_i·b_i, Σ_i d_i·a_i)` over
/// `Q_level·P`, canonical NTT form.
pub(crate) fn inner_product(
    ctx: &Context,
    digits: &[Vec<u64>],
    key: &GaloisKey,
    level: usize,
) -> (Vec<u64>, Vec<u64>) {
    inner_product_plus(ctx, digits, key, level, None)
}

/// [`inner_product`], adding `P·c0` to the first output when `c0` is given (the key-switched
/// ciphertext over `Q_level·P`).
pub(crate) fn inner_product_plus(
    ctx: &Context,
    digits: &[Vec<u64>],
    key: &GaloisKey,
    level: usize,
    c0: Option<&[u64]>,
) -> (Vec<u64>, Vec<u64>) {
    let n = ctx.degree();
    let primes: Vec<usize> = ctx.qp_primes(level).collect();
    // Every limb is overwritten by `dot2`.
    let mut t0 = ctx.pool.take(primes.len() * n);
    let mut t1 = ctx.pool.take(primes.len() * n);
    let mut terms = Vec::with_capacity(digits.len() + 1);
    for (k, &j) in primes.iter().enumerate() {
        let r = k * n..(k + 1) * n;
        let kr = j * n..(j + 1) * n;
        terms.clear();
        terms.extend(digits.iter().enumerate().map(|(i, d)| {
            let x = &d[r.clone()];
            Term {
                x0: x,
                w0: &key.b_scaled[i][kr.clone()],
                x1: x,
                w1: &key.a_scaled[i][kr.clone()],
            }
        }));
        // `P·c0` on the chain primes (`p_mod_vec` is N-scaled like the key).
        if let Some(c0) = c0.filter(|_| j <= level) {
            let x = &c0[j * n..(j + 1) * n];
            terms.push(Term {
                x0: x,
                w0: &ctx.p_mod_vec[j],
                x1: x,
                w1: &ctx.zero_limb,
            });
        }
        // The key is stored N-scaled: the sum takes `N^{-1}` once.
        ctx.dot2(j, &terms, &mut t0[r.clone()], &mut t1[r]);
    }
    (t0, t1)
}

/// `out ← out + (x − y)·c` on one limb of prime `j`, with `c_vec` the N-scaled SIMD constant of `c`
/// (see [`Context`]); `y` is clobbered.
fn sub_scale_add(
    ctx: &Context,
    j: usize,
    x: &[u64],
    y: &mut [u64],
    c_vec: &[u64],
    out: &mut [u64],
) {
    let m = ctx.moduli[j];
    vectorized(|| {
        for (o, &xv) in y.iter_mut().zip(x) {
            *o = m.sub(xv, *o);
        }
    });
    ctx.mul_scaled(j, y, c_vec);
    vectorized(|| {
        for (o, &v) in out.iter_mut().zip(y.iter()) {
            *o = m.add(*o, v);
        }
    });
}

/// `out ← (x − y)·c` on one limb of prime `j` (overwrites `out`).
fn sub_scale_into(ctx: &Context, j: usize, x: &[u64], y: &[u64], c_vec: &[u64], out: &mut [u64]) {
    let m = ctx.moduli[j];
    vectorized(|| {
        for ((o, &xv), &yv) in out.iter_mut().zip(x).zip(y) {
            *o = m.sub(xv, yv);
        }
    });
    ctx.mul_scaled(j, out, c_vec);
}

/// ModDown: `round(x / P)` from `Q_level·P` to `Q_level` (NTT), added into `out` (Bossuat et al.,
/// EUROCRYPT 2021, §3).
pub(crate) fn mod_down_add(ctx: &Context, x: &[u64], level: usize, out: &mut [u64]) {
    mod_down_impl(ctx, x, level, out, true);
}

/// As [`mod_down_add`], overwriting `out` (no zeroing or addition pass).
pub(crate) fn mod_down_into(ctx: &Context, x: &[u64], level: usize, out: &mut [u64]) {
    mod_down_impl(ctx, x, level, out, false);
}

fn mod_down_impl(ctx: &Context, x: &[u64], level: usize, out: &mut [u64], add: bool) {
    let n = ctx.degree();
    let sp = ctx.sp();
    let p = ctx.prime(sp);
    let mut last = ctx.pool.copy_of(&x[(level + 1) * n..(level + 2) * n]);
    ctx.inv(sp, &mut last);
    let mut y = ctx.pool.take(n);
    for j in 0..=level {
        lift_centered_limb(&ctx.moduli[j], &last, p, &mut y);
        ctx.fwd(j, &mut y);
        let r = j * n..(j + 1) * n;
        if add {
            sub_scale_add(
                ctx,
                j,
                &x[r.clone()],
                &mut y,
                &ctx.p_inv_vec[j],
                &mut out[r],
            );
        } else {
            sub_scale_into(ctx, j, &x[r.clone()], &y, &ctx.p_inv_vec[j], &mut out[r]);
        }
    }
    ctx.pool.give(last);
    ctx.pool.give(y);
}

/// Fused ModDown and rescale: `round(x / (P·q_level))` from `Q_level·P` to `Q_{level−1}` (NTT) into
/// `out`, `level ≥ 1` (with RS of Cheon–Han–Kim–Kim–Song, SAC 2018, §3.3): 2 inverse and `level`
/// forward NTTs.
pub(crate) fn mod_down_rescale_into(ctx: &Context, x: &[u64], level: usize, out: &mut [u64]) {
    debug_assert!(level >= 1);
    let n = ctx.degree();
    let sp = ctx.sp();
    let p = ctx.prime(sp);
    let ql = ctx.prime(level);
    let ml = ctx.moduli[level];
    let mut yp = ctx.pool.copy_of(&x[(level + 1) * n..(level + 2) * n]);
    ctx.inv(sp, &mut yp);
    let mut z = ctx.pool.copy_of(&x[level * n..(level + 1) * n]);
    ctx.inv(level, &mut z);
    // z ← (x_l − [y]_{q_l})·P^{-1} mod q_l (coefficient form).
    lift_centered_combine(&ml, &yp, p, &mut z, move |zv, yv| ml.sub(zv, yv));
    ctx.mul_scaled(level, &mut z, &ctx.p_inv_vec[level]);
    let mut t = ctx.pool.take(n);
    for j in 0..level {
        let m = ctx.moduli[j];
        // t ← [y]_{q_j} + P·[z]_{q_j}, then to NTT form.
        lift_centered_limb(&m, &z, ql, &mut t);
        ctx.mul_scaled(j, &mut t, &ctx.p_mod_vec[j]);
        lift_centered_combine(&m, &yp, p, &mut t, move |tv, yv| m.add(tv, yv));
        ctx.fwd(j, &mut t);
        let r = j * n..(j + 1) * n;
        sub_scale_into(
            ctx,
            j,
            &x[r.clone()],
            &t,
            &ctx.pq_inv_vec[level][j],
            &mut out[r],
        );
    }
    for b in [yp, z, t] {
        ctx.pool.give(b);
    }
}

/// Applies the automorphism `σ_g` (a permutation in NTT form) to every limb.
pub(crate) fn permute(n: usize, perm: &[u32], src: &[u64], dst: &mut [u64]) {
    crate::modular::vectorized(|| {
        for (d, s) in dst.chunks_exact_mut(n).zip(src.chunks_exact(n)) {
            for (o, &p) in d.iter_mut().zip(perm) {
                *o = s[p as usize];
            }
        }
    })
}

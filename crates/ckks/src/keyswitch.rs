//! Hybrid key switching with one special prime P and one chain prime per
//! digit (Han–Ki, CT-RSA 2020; Bossuat et al., Eurocrypt 2021, §3):
//! ModUp (decompose `c` into its residues and extend each to `Q_l·P`),
//! inner product with the key, ModDown (divide by P with rounding).

use crate::context::Context;
use crate::keys::GaloisKey;

/// ModUp: for each digit `i ≤ level`, the residue `[c]_{q_i}` (balanced)
/// extended to every prime of `Q_level·P`, in NTT form. `c` is an NTT-form
/// polynomial with `level + 1` limbs. Output: `level + 1` digits of
/// `level + 2` limbs each (limb k ↔ prime `qp_primes(level)[k]`).
///
/// With `parallel`, digits are computed on the rayon pool.
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
            let m = ctx.moduli[j];
            if qi < m.q {
                // Balanced lift without reduction: x or x − q_i + q_j.
                let half = qi / 2;
                let shift = m.q - qi;
                crate::modular::vectorized(|| {
                    for (o, &x) in limb.iter_mut().zip(&coeff) {
                        *o = x + shift * ((x > half) as u64);
                    }
                });
            } else {
                for (o, &x) in limb.iter_mut().zip(&coeff) {
                    *o = m.lift_centered(x, qi);
                }
            }
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

/// Inner product of the decomposed digits with a Galois key:
/// `(Σ_i d_i·b_i, Σ_i d_i·a_i)` over `Q_level·P`, canonical NTT form.
pub(crate) fn inner_product(
    ctx: &Context,
    digits: &[Vec<u64>],
    key: &GaloisKey,
    level: usize,
) -> (Vec<u64>, Vec<u64>) {
    let n = ctx.degree();
    let primes: Vec<usize> = ctx.qp_primes(level).collect();
    let mut t0 = ctx.pool.take_zeroed(primes.len() * n);
    let mut t1 = ctx.pool.take_zeroed(primes.len() * n);
    for (i, d) in digits.iter().enumerate() {
        let (b, a) = (&key.b_scaled[i], &key.a_scaled[i]);
        for (k, &j) in primes.iter().enumerate() {
            let r = k * n..(k + 1) * n;
            let kr = j * n..(j + 1) * n;
            ctx.mul_acc(j, &mut t0[r.clone()], &d[r.clone()], &b[kr.clone()]);
            ctx.mul_acc(j, &mut t1[r.clone()], &d[r.clone()], &a[kr]);
        }
    }
    // The key is stored N-scaled: remove the factor once for the whole sum.
    for (k, &j) in primes.iter().enumerate() {
        ctx.normalize(j, &mut t0[k * n..(k + 1) * n]);
        ctx.normalize(j, &mut t1[k * n..(k + 1) * n]);
    }
    (t0, t1)
}

/// ModDown: `round(x / P)` from `Q_level·P` (level + 2 limbs, NTT) to
/// `Q_level` (level + 1 limbs, NTT), adding the result into `out`.
pub(crate) fn mod_down_add(ctx: &Context, x: &[u64], level: usize, out: &mut [u64]) {
    let n = ctx.degree();
    let sp = ctx.sp();
    let p = ctx.prime(sp);
    let mut last = ctx.pool.copy_of(&x[(level + 1) * n..(level + 2) * n]);
    ctx.inv(sp, &mut last);
    let mut y = ctx.pool.take(n);
    for j in 0..=level {
        let m = ctx.moduli[j];
        for (o, &v) in y.iter_mut().zip(&last) {
            *o = m.lift_centered(v, p);
        }
        ctx.fwd(j, &mut y);
        let pinv = ctx.p_inv[j];
        let r = j * n..(j + 1) * n;
        for ((o, &xv), &yv) in out[r.clone()].iter_mut().zip(&x[r]).zip(&y) {
            // (x − y)·P^{-1}, with x − y + q < 2q fed to the Shoup product.
            *o = m.add(*o, m.mul_shoup(xv + m.q - yv, pinv));
        }
    }
    ctx.pool.give(last);
    ctx.pool.give(y);
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

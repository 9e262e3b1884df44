//! Hoisted rotations (Halevi–Shoup, "Faster homomorphic linear
//! transformations in HElib", Crypto 2018, §5): the expensive part of a
//! rotation, the ModUp decomposition of `c1`, is done once; every further
//! rotation of the same input costs one key inner product, one ModDown and a
//! permutation. Because our Galois keys switch to `σ_{g^{-1}}(s)` (see
//! [`crate::keys`]), the digits are used unpermuted and `σ_g` is applied to
//! the two output polynomials only.
//!
//! "Double hoisting" (Bossuat et al., Eurocrypt 2021, §4.2): an
//! [`ExtendedCiphertext`] keeps a rotation's result over `Q·P`, before
//! ModDown; several can be summed and brought down with a single ModDown.

use std::sync::Arc;

use crate::ciphertext::Ciphertext;
use crate::context::Context;
use crate::error::{CkksError, Result};
use crate::keys::GaloisKey;
use crate::keyswitch::{inner_product, mod_down_add, permute};

/// A ciphertext with its ModUp decomposition precomputed.
pub struct HoistedCiphertext {
    pub(crate) ctx: Arc<Context>,
    pub(crate) c0: Vec<u64>,
    /// `level + 1` digits over `Q_level·P`.
    pub(crate) digits: Vec<Vec<u64>>,
    pub(crate) level: usize,
    pub(crate) scale: f64,
}

impl std::fmt::Debug for HoistedCiphertext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HoistedCiphertext")
            .field("level", &self.level)
            .field("scale", &self.scale)
            .finish_non_exhaustive()
    }
}

impl Drop for HoistedCiphertext {
    fn drop(&mut self) {
        self.ctx.pool.give(std::mem::take(&mut self.c0));
        for d in self.digits.drain(..) {
            self.ctx.pool.give(d);
        }
    }
}

impl HoistedCiphertext {
    /// Level of the input.
    pub fn level(&self) -> usize {
        self.level
    }
    /// Scale of the input.
    pub fn scale(&self) -> f64 {
        self.scale
    }
}

/// A ciphertext over the extended basis `Q_level·P` (NTT form) encrypting
/// `P·m`: the result of a hoisted rotation before ModDown.
#[derive(Clone, Debug, PartialEq)]
pub struct ExtendedCiphertext {
    pub(crate) e0: Vec<u64>,
    pub(crate) e1: Vec<u64>,
    pub(crate) level: usize,
    pub(crate) scale: f64,
    pub(crate) digest: u64,
}

impl ExtendedCiphertext {
    /// Level (of the `Q` part).
    pub fn level(&self) -> usize {
        self.level
    }
    /// Scale of the encrypted values (the factor P is implicit).
    pub fn scale(&self) -> f64 {
        self.scale
    }
}

/// `(P·c0 + t0, t1)` over `Q_level·P`, before the automorphism.
pub(crate) fn key_switched_extended(
    ctx: &Arc<Context>,
    h: &HoistedCiphertext,
    key: &GaloisKey,
) -> (Vec<u64>, Vec<u64>) {
    let n = ctx.degree();
    let (mut t0, t1) = inner_product(ctx, &h.digits, key, h.level);
    for j in 0..=h.level {
        let m = ctx.moduli[j];
        let p = ctx.p_mod[j];
        let r = j * n..(j + 1) * n;
        for (o, &c) in t0[r.clone()].iter_mut().zip(&h.c0[r]) {
            *o = m.add(*o, m.mul_shoup(c, p));
        }
    }
    (t0, t1)
}

/// Rotation of a hoisted input: key switch `c1` to `σ_{g^{-1}}(s)`, ModDown,
/// add `c0`, then apply `σ_g` to both polynomials.
pub(crate) fn rotate_hoisted(
    ctx: &Arc<Context>,
    h: &HoistedCiphertext,
    key: &GaloisKey,
) -> Ciphertext {
    let n = ctx.degree();
    let (t0, t1) = inner_product(ctx, &h.digits, key, h.level);
    let mut u0 = ctx.pool.copy_of(&h.c0);
    let mut u1 = ctx.pool.take_zeroed(h.c0.len());
    mod_down_add(ctx, &t0, h.level, &mut u0);
    mod_down_add(ctx, &t1, h.level, &mut u1);
    ctx.pool.give(t0);
    ctx.pool.give(t1);
    let mut c0 = ctx.pool.take(u0.len());
    let mut c1 = ctx.pool.take(u1.len());
    permute(n, &key.perm, &u0, &mut c0);
    permute(n, &key.perm, &u1, &mut c1);
    ctx.pool.give(u0);
    ctx.pool.give(u1);
    Ciphertext {
        ctx: ctx.clone(),
        c0,
        c1,
        level: h.level,
        scale: h.scale,
    }
}

/// Rotation of a hoisted input kept over `Q·P` (no ModDown).
pub(crate) fn rotate_hoisted_extended(
    ctx: &Arc<Context>,
    h: &HoistedCiphertext,
    key: &GaloisKey,
) -> ExtendedCiphertext {
    let n = ctx.degree();
    let (t0, t1) = key_switched_extended(ctx, h, key);
    let mut e0 = vec![0u64; t0.len()];
    let mut e1 = vec![0u64; t1.len()];
    permute(n, &key.perm, &t0, &mut e0);
    permute(n, &key.perm, &t1, &mut e1);
    ctx.pool.give(t0);
    ctx.pool.give(t1);
    ExtendedCiphertext {
        e0,
        e1,
        level: h.level,
        scale: h.scale,
        digest: ctx.digest(),
    }
}

/// `acc += x` over `Q_level·P`.
pub(crate) fn add_extended(
    ctx: &Arc<Context>,
    acc: &mut ExtendedCiphertext,
    x: &ExtendedCiphertext,
) -> Result<()> {
    if acc.level != x.level {
        return Err(CkksError::LevelMismatch {
            left: acc.level,
            right: x.level,
        });
    }
    crate::evaluator::check_scale(acc.scale, x.scale)?;
    let n = ctx.degree();
    for (k, j) in ctx.qp_primes(acc.level).enumerate() {
        let m = ctx.moduli[j];
        let r = k * n..(k + 1) * n;
        for (a, &b) in acc.e0[r.clone()].iter_mut().zip(&x.e0[r.clone()]) {
            *a = m.add(*a, b);
        }
        for (a, &b) in acc.e1[r.clone()].iter_mut().zip(&x.e1[r]) {
            *a = m.add(*a, b);
        }
    }
    Ok(())
}

/// ModDown of an extended ciphertext: divides by P with rounding.
pub(crate) fn mod_down(ctx: &Arc<Context>, x: &ExtendedCiphertext) -> Ciphertext {
    let len = (x.level + 1) * ctx.degree();
    let mut c0 = ctx.pool.take_zeroed(len);
    let mut c1 = ctx.pool.take_zeroed(len);
    mod_down_add(ctx, &x.e0, x.level, &mut c0);
    mod_down_add(ctx, &x.e1, x.level, &mut c1);
    Ciphertext {
        ctx: ctx.clone(),
        c0,
        c1,
        level: x.level,
        scale: x.scale,
    }
}

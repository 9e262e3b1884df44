//! Hoisted rotations (Halevi–Shoup, CRYPTO 2018, §5) and double hoisting (Bossuat et al., EUROCRYPT
//! 2021, §4.2): [`ExtendedCiphertext`]s stay over `Q·P` until one ModDown.

use std::sync::Arc;

use crate::ciphertext::Ciphertext;
use crate::context::Context;
use crate::error::{CkksError, Result};
use crate::keys::GaloisKey;
use crate::keyswitch::{
    inner_product, inner_product_plus, mod_down_add, mod_down_into, mod_down_rescale_into, permute,
};
use crate::lazy_dot::{Sum, Term};
use crate::plaintext::ExtendedPlaintext;
use crate::scale::{BatchPath, check_batch, check_fresh_batches};

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

/// A ciphertext over `Q_level·P` (NTT, `P` last) encrypting `P·m`.
pub struct ExtendedCiphertext {
    pub(crate) ctx: Arc<Context>,
    pub(crate) e0: Vec<u64>,
    pub(crate) e1: Vec<u64>,
    pub(crate) level: usize,
    pub(crate) scale: f64,
    pub(crate) digest: u64,
}

impl std::fmt::Debug for ExtendedCiphertext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExtendedCiphertext")
            .field("level", &self.level)
            .field("scale", &self.scale)
            .finish_non_exhaustive()
    }
}

impl Clone for ExtendedCiphertext {
    fn clone(&self) -> Self {
        Self {
            ctx: self.ctx.clone(),
            e0: self.ctx.pool.copy_of(&self.e0),
            e1: self.ctx.pool.copy_of(&self.e1),
            level: self.level,
            scale: self.scale,
            digest: self.digest,
        }
    }
}

impl PartialEq for ExtendedCiphertext {
    fn eq(&self, o: &Self) -> bool {
        self.digest == o.digest
            && self.level == o.level
            && self.scale == o.scale
            && self.e0 == o.e0
            && self.e1 == o.e1
    }
}

impl Drop for ExtendedCiphertext {
    fn drop(&mut self) {
        self.ctx.pool.give(std::mem::take(&mut self.e0));
        self.ctx.pool.give(std::mem::take(&mut self.e1));
    }
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
    inner_product_plus(ctx, &h.digits, key, h.level, Some(&h.c0))
}
/// Key switch `c1` to `σ_{g^{-1}}(s)`, ModDown, add `c0`, then apply `σ_g`.
pub(crate) fn rotate_hoisted(
    ctx: &Arc<Context>,
    h: &HoistedCiphertext,
    key: &GaloisKey,
) -> Ciphertext {
    let n = ctx.degree();
    let (t0, t1) = inner_product(ctx, &h.digits, key, h.level);
    let mut u0 = ctx.pool.copy_of(&h.c0);
    let mut u1 = ctx.pool.take(h.c0.len());
    mod_down_add(ctx, &t0, h.level, &mut u0);
    mod_down_into(ctx, &t1, h.level, &mut u1);
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
    let mut e0 = ctx.pool.take(t0.len());
    let mut e1 = ctx.pool.take(t1.len());
    permute(n, &key.perm, &t0, &mut e0);
    permute(n, &key.perm, &t1, &mut e1);
    ctx.pool.give(t0);
    ctx.pool.give(t1);
    ExtendedCiphertext {
        ctx: ctx.clone(),
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
    crate::scale::check_scale(acc.scale, x.scale)?;
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
    let mut c0 = ctx.pool.take(len);
    let mut c1 = ctx.pool.take(len);
    mod_down_into(ctx, &x.e0, x.level, &mut c0);
    mod_down_into(ctx, &x.e1, x.level, &mut c1);
    Ciphertext {
        ctx: ctx.clone(),
        c0,
        c1,
        level: x.level,
        scale: x.scale,
    }
}

/// Fused ModDown and rescale into `Q_{level−1}`; the scale is divided by `q_level`.
pub(crate) fn mod_down_rescale(ctx: &Arc<Context>, x: &ExtendedCiphertext) -> Result<Ciphertext> {
    if x.level == 0 {
        return Err(CkksError::CannotRescale);
    }
    let len = x.level * ctx.degree();
    let mut c0 = ctx.pool.take(len);
    let mut c1 = ctx.pool.take(len);
    mod_down_rescale_into(ctx, &x.e0, x.level, &mut c0);
    mod_down_rescale_into(ctx, &x.e1, x.level, &mut c1);
    Ok(Ciphertext {
        ctx: ctx.clone(),
        c0,
        c1,
        level: x.level - 1,
        scale: x.scale / ctx.prime(x.level) as f64,
    })
}

/// Sums ct×pt products over `Q_level·P`, normalising once in [`Self::finish`].
#[derive(Debug)]
pub struct ExtendedMulAccumulator {
    pub(crate) ctx: Arc<Context>,
    pub(crate) acc0: Vec<u64>,
    pub(crate) acc1: Vec<u64>,
    pub(crate) level: usize,
    pub(crate) scale: Option<f64>,
    pub(crate) terms: usize,
    /// The sums already carry `N^{-1}` (one [`Self::add_products`] on an empty accumulator).
    pub(crate) normalized: bool,
}

/// Checks one term at `level` (context, level, scale) and records the scale.
fn check_extended_term(
    ctx: &Context,
    level: usize,
    scale: &mut Option<f64>,
    ct: &ExtendedCiphertext,
    pt: &ExtendedPlaintext,
) -> Result<()> {
    ctx.check(ct.digest)?;
    ctx.check(pt.pt.digest)?;
    let s = ct.scale * pt.pt.scale;
    crate::scale::check_product_term(level, scale, ct.level, pt.pt.level, s)
}

/// The terms of `Σ cts[k] × pts[k]` on limb `r` (prime `j`).
fn limb_terms<'a>(
    cts: &[&'a ExtendedCiphertext],
    pts: &[&'a ExtendedPlaintext],
    j: usize,
    r: std::ops::Range<usize>,
    sp: usize,
) -> Vec<Term<'a>> {
    cts.iter()
        .zip(pts)
        .map(|(ct, pt)| {
            Term::paired(
                &ct.e0[r.clone()],
                &ct.e1[r.clone()],
                pt.limb(j, r.len(), sp),
            )
        })
        .collect()
}

impl ExtendedMulAccumulator {
    /// Adds `ct × pt`. Errors: [`CkksError::ParameterMismatch`], `LevelMismatch`, `ScaleMismatch`.
    pub fn add_product(&mut self, ct: &ExtendedCiphertext, pt: &ExtendedPlaintext) -> Result<()> {
        check_extended_term(&self.ctx, self.level, &mut self.scale, ct, pt)?;
        self.start_or_denormalize();
        let n = self.ctx.degree();
        for (k, j) in self.ctx.qp_primes(self.level).enumerate() {
            let r = k * n..(k + 1) * n;
            let p = pt.limb(j, n, self.ctx.sp());
            self.ctx
                .mul_acc(j, &mut self.acc0[r.clone()], &ct.e0[r.clone()], p);
            self.ctx.mul_acc(j, &mut self.acc1[r.clone()], &ct.e1[r], p);
        }
        self.terms += 1;
        Ok(())
    }

    /// Adds `Σ_k cts[k] × pts[k]` lazily reduced. Errors: [`CkksError::TermCountMismatch`]; as
    /// [`Self::add_product`].
    pub fn add_products(
        &mut self,
        cts: &[&ExtendedCiphertext],
        pts: &[&ExtendedPlaintext],
    ) -> Result<()> {
        if self.terms == 0 {
            // The one-pass lazy sum, normalised on the way.
            return Self::add_fresh_products_tiled(std::slice::from_mut(self), &[(cts, pts)]);
        }
        let (ctx, level) = (&self.ctx, self.level);
        let path = check_batch(
            cts.len(),
            pts.len(),
            self.terms,
            &mut self.scale,
            |scale, k| check_extended_term(ctx, level, scale, cts[k], pts[k]),
        )?;
        if path == BatchPath::OntoEarlierTerms {
            for (ct, pt) in cts.iter().zip(pts) {
                self.add_product(ct, pt)?;
            }
        }
        Ok(())
    }

    /// [`Self::add_products`] into empty accumulators, tile by tile; errors change none.
    pub(crate) fn add_fresh_products_tiled(
        accs: &mut [Self],
        sums: &[(&[&ExtendedCiphertext], &[&ExtendedPlaintext])],
    ) -> Result<()> {
        let Some(first) = accs.first() else {
            return Ok(());
        };
        let (ctx, level) = (first.ctx.clone(), first.level);
        debug_assert!(accs.iter().all(|a| a.level == level && a.terms == 0));
        let mut scales: Vec<&mut Option<f64>> = accs.iter_mut().map(|a| &mut a.scale).collect();
        let fresh = check_fresh_batches(
            &mut scales,
            sums.iter().map(|(c, p)| (c.len(), p.len())),
            |m, scale, k| check_extended_term(&ctx, level, scale, sums[m].0[k], sums[m].1[k]),
        )?;
        let (n, sp) = (ctx.degree(), ctx.sp());
        for (k, j) in ctx.qp_primes(level).enumerate() {
            let r = k * n..(k + 1) * n;
            let mut batch: Vec<Sum<'_, '_>> = accs
                .iter_mut()
                .zip(sums)
                .zip(&fresh)
                .filter(|(_, fresh)| **fresh)
                .map(|((acc, (cts, pts)), _)| Sum {
                    terms: limb_terms(cts, pts, j, r.clone(), sp),
                    out0: &mut acc.acc0[r.clone()],
                    out1: &mut acc.acc1[r.clone()],
                })
                .collect();
            ctx.dot2_many(j, &mut batch);
        }
        for ((acc, (cts, _)), &fresh) in accs.iter_mut().zip(sums).zip(&fresh) {
            (acc.normalized, acc.terms) = (fresh, cts.len());
        }
        Ok(())
    }

    /// See [`start_or_denormalize`].
    fn start_or_denormalize(&mut self) {
        let limbs = self.ctx.qp_primes(self.level).enumerate();
        let (acc0, acc1) = (&mut self.acc0, &mut self.acc1);
        start_or_denormalize(
            &self.ctx,
            acc0,
            acc1,
            self.terms,
            &mut self.normalized,
            limbs,
        );
    }

    /// Number of products added.
    pub fn terms(&self) -> usize {
        self.terms
    }

    /// The sum over `Q_level·P`, of scale `ct.scale·pt.scale` (`None` if no term was added).
    pub fn finish(mut self) -> Option<ExtendedCiphertext> {
        let scale = self.scale?;
        let n = self.ctx.degree();
        let primes = self.ctx.qp_primes(self.level).enumerate();
        for (k, j) in primes.filter(|_| !self.normalized) {
            self.ctx.normalize(j, &mut self.acc0[k * n..(k + 1) * n]);
            self.ctx.normalize(j, &mut self.acc1[k * n..(k + 1) * n]);
        }
        Some(ExtendedCiphertext {
            ctx: self.ctx.clone(),
            e0: std::mem::take(&mut self.acc0),
            e1: std::mem::take(&mut self.acc1),
            level: self.level,
            scale,
            digest: self.ctx.digest(),
        })
    }
}

impl Drop for ExtendedMulAccumulator {
    fn drop(&mut self) {
        self.ctx.pool.give(std::mem::take(&mut self.acc0));
        self.ctx.pool.give(std::mem::take(&mut self.acc1));
    }
}

/// Prepares an accumulator for a single product (zeros, or back to unnormalised).
pub(crate) fn start_or_denormalize(
    ctx: &Context,
    acc0: &mut [u64],
    acc1: &mut [u64],
    terms: usize,
    normalized: &mut bool,
    limbs: impl Iterator<Item = (usize, usize)>,
) {
    if terms == 0 {
        acc0.fill(0);
        acc1.fill(0);
        return;
    }
    if !*normalized {
        return;
    }
    let n = ctx.degree();
    for (k, j) in limbs {
        ctx.scale_by_n(j, &mut acc0[k * n..(k + 1) * n]);
        ctx.scale_by_n(j, &mut acc1[k * n..(k + 1) * n]);
    }
    *normalized = false;
}

//! Homomorphic evaluation on NTT-form ciphertexts: addition, ct×pt products, rescaling
//! (Cheon–Han–Kim–Kim–Song, SAC 2018, §3.3), level dropping, hoisted rotations.

use std::borrow::Cow;
use std::sync::Arc;

use crate::ciphertext::Ciphertext;
use crate::context::Context;
use crate::error::{CkksError, Result};
use crate::hoisting::{
    self, ExtendedCiphertext, ExtendedMulAccumulator, HoistedCiphertext, start_or_denormalize,
};
use crate::keys::GaloisKeys;
use crate::keyswitch::mod_up;
use crate::lazy_dot::{Sum, Term};
use crate::plaintext::{ExtendedPlaintext, Plaintext};

pub use crate::scale::SCALE_TOLERANCE;
use crate::scale::{BatchPath, check_batch, check_fresh_batches, check_product_term, check_scale};

fn check_same(a: &Ciphertext, b: &Ciphertext) -> Result<()> {
    a.ctx.check(b.ctx.digest())?;
    if a.level != b.level {
        return Err(CkksError::LevelMismatch {
            left: a.level,
            right: b.level,
        });
    }
    check_scale(a.scale, b.scale)
}

/// Evaluates operations on ciphertexts of one context.
#[derive(Debug, Clone)]
pub struct Evaluator {
    ctx: Arc<Context>,
    parallel: bool,
}

/// Sums many ct×pt products at one level, normalising once in [`MulAccumulator::finish`].
#[derive(Debug, Clone)]
pub struct MulAccumulator {
    ctx: Arc<Context>,
    acc0: Vec<u64>,
    acc1: Vec<u64>,
    level: usize,
    scale: Option<f64>,
    terms: usize,
    /// The sums already carry `N^{-1}` (one [`Self::add_products`] on an empty accumulator).
    normalized: bool,
}

impl MulAccumulator {
    /// Adds `ct × pt`. Errors: [`CkksError::LevelMismatch`], [`CkksError::ScaleMismatch`].
    pub fn add_product(&mut self, ct: &Ciphertext, pt: &Plaintext) -> Result<()> {
        check_term(&self.ctx, self.level, &mut self.scale, ct, pt)?;
        self.start_or_denormalize();
        let n = self.ctx.degree();
        for i in 0..=self.level {
            let r = i * n..(i + 1) * n;
            let p = scaled_limb(&self.ctx, pt, i);
            self.ctx
                .mul_acc(i, &mut self.acc0[r.clone()], &ct.c0[r.clone()], &p);
            self.ctx
                .mul_acc(i, &mut self.acc1[r.clone()], &ct.c1[r], &p);
        }
        self.terms += 1;
        Ok(())
    }

    /// Adds `Σ_k cts[k] × pts[k]` lazily reduced, all terms checked first. Errors:
    /// [`CkksError::TermCountMismatch`]; else as [`Self::add_product`].
    pub fn add_products(&mut self, cts: &[&Ciphertext], pts: &[&Plaintext]) -> Result<()> {
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
            |scale, k| check_term(ctx, level, scale, cts[k], pts[k]),
        )?;
        if path == BatchPath::OntoEarlierTerms {
            for (ct, pt) in cts.iter().zip(pts) {
                self.add_product(ct, pt)?;
            }
        }
        Ok(())
    }

    /// [`Self::add_products`] into empty accumulators, tile by tile; errors change none.
    fn add_fresh_products_tiled(
        accs: &mut [Self],
        sums: &[(&[&Ciphertext], &[&Plaintext])],
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
            |m, scale, k| check_term(&ctx, level, scale, sums[m].0[k], sums[m].1[k]),
        )?;
        let n = ctx.degree();
        for i in 0..=level {
            let r = i * n..(i + 1) * n;
            let limbs: Vec<Vec<Cow<'_, [u64]>>> = sums
                .iter()
                .map(|(_, pts)| pts.iter().map(|pt| scaled_limb(&ctx, pt, i)).collect())
                .collect();
            let mut batch: Vec<Sum<'_, '_>> = accs
                .iter_mut()
                .zip(sums)
                .zip(&limbs)
                .zip(&fresh)
                .filter(|(_, fresh)| **fresh)
                .map(|(((acc, (cts, _)), ws), _)| Sum {
                    terms: cts
                        .iter()
                        .zip(ws)
                        .map(|(ct, w)| Term::paired(&ct.c0[r.clone()], &ct.c1[r.clone()], w))
                        .collect(),
                    out0: &mut acc.acc0[r.clone()],
                    out1: &mut acc.acc1[r.clone()],
                })
                .collect();
            ctx.dot2_many(i, &mut batch);
        }
        for ((acc, (cts, _)), &fresh) in accs.iter_mut().zip(sums).zip(&fresh) {
            (acc.normalized, acc.terms) = (fresh, cts.len());
        }
        Ok(())
    }

    /// See [`start_or_denormalize`].
    fn start_or_denormalize(&mut self) {
        let limbs = (0..=self.level).map(|i| (i, i));
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

    /// The sum as a ciphertext of scale `ct.scale·pt.scale` (`None` if no term was added).
    pub fn finish(mut self) -> Option<Ciphertext> {
        let scale = self.scale?;
        let n = self.ctx.degree();
        for i in (0..=self.level).filter(|_| !self.normalized) {
            self.ctx.normalize(i, &mut self.acc0[i * n..(i + 1) * n]);
            self.ctx.normalize(i, &mut self.acc1[i * n..(i + 1) * n]);
        }
        Some(Ciphertext {
            ctx: self.ctx.clone(),
            c0: self.acc0,
            c1: self.acc1,
            level: self.level,
            scale,
        })
    }
}

/// Checks one term at `level` (context, level, scale) and records the scale.
fn check_term(
    ctx: &Context,
    level: usize,
    scale: &mut Option<f64>,
    ct: &Ciphertext,
    pt: &Plaintext,
) -> Result<()> {
    ctx.check(ct.ctx.digest())?;
    ctx.check(pt.digest)?;
    check_product_term(level, scale, ct.level, pt.level, ct.scale * pt.scale)
}

/// Limb `i` of a plaintext in N-scaled form.
fn scaled_limb<'a>(ctx: &Context, pt: &'a Plaintext, i: usize) -> Cow<'a, [u64]> {
    let n = ctx.degree();
    let limb = &pt.data[i * n..(i + 1) * n];
    if pt.n_scaled {
        Cow::Borrowed(limb)
    } else {
        let mut v = limb.to_vec();
        ctx.scale_by_n(i, &mut v);
        Cow::Owned(v)
    }
}

impl Evaluator {
    /// An evaluator for `ctx`.
    pub fn new(ctx: &Arc<Context>) -> Self {
        Self {
            ctx: ctx.clone(),
            parallel: false,
        }
    }

    /// Turns rayon parallelism on or off (off by default).
    pub fn with_parallelism(mut self, parallel: bool) -> Self {
        self.parallel = parallel;
        self
    }

    /// Several rotations of one hoisted input. Errors: [`CkksError::MissingGaloisKey`].
    pub fn rotate_hoisted_many(
        &self,
        h: &HoistedCiphertext,
        steps: &[i64],
        gks: &GaloisKeys,
    ) -> Result<Vec<Ciphertext>> {
        use rayon::prelude::*;
        if self.parallel {
            steps
                .par_iter()
                .map(|&s| self.rotate_hoisted(h, s, gks))
                .collect()
        } else {
            steps
                .iter()
                .map(|&s| self.rotate_hoisted(h, s, gks))
                .collect()
        }
    }

    /// The context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Galois elements needed for rotation `steps` (deduplicated, identity removed).
    pub fn required_galois_elements(&self, steps: &[i64]) -> Vec<u64> {
        let mut g: Vec<u64> = steps
            .iter()
            .map(|&s| self.ctx.galois_element(s))
            .filter(|&g| g != 1)
            .collect();
        g.sort_unstable();
        g.dedup();
        g
    }

    fn zip_limbs(
        &self,
        a: &mut [u64],
        b: &[u64],
        level: usize,
        f: impl Fn(&crate::modular::Modulus, u64, u64) -> u64,
    ) {
        let n = self.ctx.degree();
        crate::modular::vectorized(|| {
            for i in 0..=level {
                let m = self.ctx.moduli[i];
                let r = i * n..(i + 1) * n;
                for (x, &y) in a[r.clone()].iter_mut().zip(&b[r]) {
                    *x = f(&m, *x, y);
                }
            }
        })
    }

    /// `a ← a + b`. Errors: [`CkksError::LevelMismatch`], [`CkksError::ScaleMismatch`].
    pub fn add_assign(&self, a: &mut Ciphertext, b: &Ciphertext) -> Result<()> {
        self.ctx.check(a.ctx.digest())?;
        check_same(a, b)?;
        let l = a.level;
        self.zip_limbs(&mut a.c0, &b.c0, l, |m, x, y| m.add(x, y));
        self.zip_limbs(&mut a.c1, &b.c1, l, |m, x, y| m.add(x, y));
        Ok(())
    }

    /// `a + b`; errors as [`Self::add_assign`].
    pub fn add(&self, a: &Ciphertext, b: &Ciphertext) -> Result<Ciphertext> {
        let mut r = a.clone();
        self.add_assign(&mut r, b)?;
        Ok(r)
    }

    /// `a ← a − b`. Errors: [`CkksError::LevelMismatch`], [`CkksError::ScaleMismatch`].
    pub fn sub_assign(&self, a: &mut Ciphertext, b: &Ciphertext) -> Result<()> {
        self.ctx.check(a.ctx.digest())?;
        check_same(a, b)?;
        let l = a.level;
        self.zip_limbs(&mut a.c0, &b.c0, l, |m, x, y| m.sub(x, y));
        self.zip_limbs(&mut a.c1, &b.c1, l, |m, x, y| m.sub(x, y));
        Ok(())
    }

    /// `a − b`; errors as [`Self::sub_assign`].
    pub fn sub(&self, a: &Ciphertext, b: &Ciphertext) -> Result<Ciphertext> {
        let mut r = a.clone();
        self.sub_assign(&mut r, b)?;
        Ok(r)
    }

    /// `ct ← ct + pt`. Errors: [`CkksError::LevelMismatch`], [`CkksError::ScaleMismatch`].
    pub fn add_plain_assign(&self, ct: &mut Ciphertext, pt: &Plaintext) -> Result<()> {
        self.ctx.check(ct.ctx.digest())?;
        self.ctx.check(pt.digest)?;
        if pt.level < ct.level {
            return Err(CkksError::LevelMismatch {
                left: ct.level,
                right: pt.level,
            });
        }
        check_scale(ct.scale, pt.scale)?;
        let n = self.ctx.degree();
        let mut limb = vec![0u64; n];
        for i in 0..=ct.level {
            crate::encrypt::canonical_limb(&self.ctx, pt, i, &mut limb);
            let m = self.ctx.moduli[i];
            for (x, &y) in ct.c0[i * n..(i + 1) * n].iter_mut().zip(&limb) {
                *x = m.add(*x, y);
            }
        }
        Ok(())
    }

    /// `ct ← ct × pt`: scales multiply. Errors: [`CkksError::LevelMismatch`] if `pt` is below `ct`.
    pub fn mul_plain_assign(&self, ct: &mut Ciphertext, pt: &Plaintext) -> Result<()> {
        self.ctx.check(ct.ctx.digest())?;
        self.ctx.check(pt.digest)?;
        if pt.level < ct.level {
            return Err(CkksError::LevelMismatch {
                left: ct.level,
                right: pt.level,
            });
        }
        let n = self.ctx.degree();
        for i in 0..=ct.level {
            let p = scaled_limb(&self.ctx, pt, i);
            let r = i * n..(i + 1) * n;
            self.ctx.mul_scaled(i, &mut ct.c0[r.clone()], &p);
            self.ctx.mul_scaled(i, &mut ct.c1[r], &p);
        }
        ct.scale *= pt.scale;
        Ok(())
    }

    /// `ct × pt`; errors as [`Self::mul_plain_assign`].
    pub fn mul_plain(&self, ct: &Ciphertext, pt: &Plaintext) -> Result<Ciphertext> {
        let mut r = ct.clone();
        self.mul_plain_assign(&mut r, pt)?;
        Ok(r)
    }

    /// An empty multiply-accumulator at `level`. Errors: [`CkksError::LevelOutOfRange`].
    pub fn mul_accumulator(&self, level: usize) -> Result<MulAccumulator> {
        let max = self.ctx.max_level();
        if level > max {
            return Err(CkksError::LevelOutOfRange { level, max });
        }
        let len = (level + 1) * self.ctx.degree();
        Ok(MulAccumulator {
            ctx: self.ctx.clone(),
            // Contents unspecified until the first term (see `add_product`).
            acc0: self.ctx.pool.take(len),
            acc1: self.ctx.pool.take(len),
            level,
            scale: None,
            terms: 0,
            normalized: false,
        })
    }

    /// Rescale in place by the last prime `q_l`. Errors: [`CkksError::CannotRescale`] at level 0.
    pub fn rescale_assign(&self, ct: &mut Ciphertext) -> Result<()> {
        self.ctx.check(ct.ctx.digest())?;
        let l = ct.level;
        if l == 0 {
            return Err(CkksError::CannotRescale);
        }
        let ctx = &self.ctx;
        let n = ctx.degree();
        let ql = ctx.prime(l);
        let mut last = ctx.pool.take(n);
        let mut y = ctx.pool.take(n);
        for poly in [&mut ct.c0, &mut ct.c1] {
            last.copy_from_slice(&poly[l * n..(l + 1) * n]);
            ctx.inv(l, &mut last);
            for j in 0..l {
                let m = ctx.moduli[j];
                crate::modular::lift_centered_limb(&m, &last, ql, &mut y);
                ctx.fwd(j, &mut y);
                let limb = &mut poly[j * n..(j + 1) * n];
                crate::modular::vectorized(|| {
                    for (x, &yv) in limb.iter_mut().zip(y.iter()) {
                        *x = m.sub(*x, yv);
                    }
                });
                ctx.mul_scaled(j, limb, &ctx.rescale_inv_vec[l][j]);
            }
            poly.truncate(l * n);
        }
        ctx.pool.give(last);
        ctx.pool.give(y);
        ct.level = l - 1;
        ct.scale /= ql as f64;
        Ok(())
    }

    /// Rescaled copy; errors as [`Self::rescale_assign`].
    pub fn rescale(&self, ct: &Ciphertext) -> Result<Ciphertext> {
        let mut r = ct.clone();
        self.rescale_assign(&mut r)?;
        Ok(r)
    }

    /// Drops limbs down to `level`. Errors: [`CkksError::LevelOutOfRange`] above the ciphertext's.
    pub fn drop_to_level_assign(&self, ct: &mut Ciphertext, level: usize) -> Result<()> {
        self.ctx.check(ct.ctx.digest())?;
        if level > ct.level {
            return Err(CkksError::LevelOutOfRange {
                level,
                max: ct.level,
            });
        }
        let len = (level + 1) * self.ctx.degree();
        ct.c0.truncate(len);
        ct.c1.truncate(len);
        ct.level = level;
        Ok(())
    }

    /// Copy dropped to `level`; errors as [`Self::drop_to_level_assign`].
    pub fn drop_to_level(&self, ct: &Ciphertext, level: usize) -> Result<Ciphertext> {
        let mut r = ct.clone();
        self.drop_to_level_assign(&mut r, level)?;
        Ok(r)
    }

    /// Precomputes `ct`'s ModUp decomposition for hoisted rotations.
    pub fn hoist(&self, ct: &Ciphertext) -> HoistedCiphertext {
        // Built in the ciphertext's own context: foreign ciphertexts cannot make this panic.
        HoistedCiphertext {
            ctx: ct.ctx.clone(),
            c0: ct.ctx.pool.copy_of(&ct.c0),
            digits: mod_up(&ct.ctx, &ct.c1, ct.level, self.parallel),
            level: ct.level,
            scale: ct.scale,
        }
    }

    /// Left rotation of a hoisted input by `step` (negative: right). Errors: missing Galois key.
    pub fn rotate_hoisted(
        &self,
        h: &HoistedCiphertext,
        step: i64,
        gks: &GaloisKeys,
    ) -> Result<Ciphertext> {
        self.ctx.check(h.ctx.digest())?;
        if self.ctx.galois_element(step) == 1 {
            let n = self.ctx.degree();
            let primes: Vec<usize> = self.ctx.qp_primes(h.level).collect();
            // Identity: rebuild c1 from its own residues (digit i, limb i).
            let mut c1 = self.ctx.pool.take(h.c0.len());
            for (i, d) in h.digits.iter().enumerate() {
                let k = primes.iter().position(|&p| p == i).unwrap_or(i);
                c1[i * n..(i + 1) * n].copy_from_slice(&d[k * n..(k + 1) * n]);
            }
            return Ok(Ciphertext {
                ctx: self.ctx.clone(),
                c0: self.ctx.pool.copy_of(&h.c0),
                c1,
                level: h.level,
                scale: h.scale,
            });
        }
        self.ctx.check(gks.ctx.digest())?;
        let key = gks.for_step(&self.ctx, step)?;
        Ok(hoisting::rotate_hoisted(&self.ctx, h, key))
    }

    /// Left rotation by `step` slots (one key switch). Errors: [`CkksError::MissingGaloisKey`].
    pub fn rotate(&self, ct: &Ciphertext, step: i64, gks: &GaloisKeys) -> Result<Ciphertext> {
        self.ctx.check(ct.ctx.digest())?;
        if self.ctx.galois_element(step) == 1 {
            return Ok(ct.clone());
        }
        self.ctx.check(gks.ctx.digest())?;
        let key = gks.for_step(&self.ctx, step)?;
        Ok(hoisting::rotate_hoisted(&self.ctx, &self.hoist(ct), key))
    }

    /// Hoisted rotation kept over `Q·P` (double hoisting). Errors: [`CkksError::MissingGaloisKey`]
    /// (step 0: use [`Self::extend`]).
    pub fn rotate_hoisted_extended(
        &self,
        h: &HoistedCiphertext,
        step: i64,
        gks: &GaloisKeys,
    ) -> Result<ExtendedCiphertext> {
        self.ctx.check(h.ctx.digest())?;
        self.ctx.check(gks.ctx.digest())?;
        let key = gks.for_step(&self.ctx, step)?;
        Ok(hoisting::rotate_hoisted_extended(&self.ctx, h, key))
    }

    /// The unrotated input over `Q·P` (`(P·c0, P·c1)`).
    pub fn extend(&self, ct: &Ciphertext) -> ExtendedCiphertext {
        let ctx = &ct.ctx;
        let n = ctx.degree();
        let len = (ct.level + 2) * n;
        let mut e0 = ctx.pool.take_zeroed(len);
        let mut e1 = ctx.pool.take_zeroed(len);
        let chain = (ct.level + 1) * n;
        e0[..chain].copy_from_slice(&ct.c0);
        e1[..chain].copy_from_slice(&ct.c1);
        for j in 0..=ct.level {
            let r = j * n..(j + 1) * n;
            ctx.mul_scaled(j, &mut e0[r.clone()], &ctx.p_mod_vec[j]);
            ctx.mul_scaled(j, &mut e1[r], &ctx.p_mod_vec[j]);
        }
        ExtendedCiphertext {
            ctx: ctx.clone(),
            e0,
            e1,
            level: ct.level,
            scale: ct.scale,
            digest: ctx.digest(),
        }
    }

    /// An empty accumulator over `Q_level·P`. Errors: [`CkksError::LevelOutOfRange`].
    pub fn mul_accumulator_extended(&self, level: usize) -> Result<ExtendedMulAccumulator> {
        let max = self.ctx.max_level();
        if level > max {
            return Err(CkksError::LevelOutOfRange { level, max });
        }
        let len = (level + 2) * self.ctx.degree();
        Ok(ExtendedMulAccumulator {
            ctx: self.ctx.clone(),
            // Contents unspecified until the first term (see `add_product`).
            acc0: self.ctx.pool.take(len),
            acc1: self.ctx.pool.take(len),
            level,
            scale: None,
            terms: 0,
            normalized: false,
        })
    }

    /// Several sums of products at `level` in one tiled pass (BSGS giant steps, Halevi–Shoup,
    /// CRYPTO 2018, §3). Errors: [`CkksError::LevelOutOfRange`]; as
    /// [`MulAccumulator::add_products`].
    pub fn sums_of_products(
        &self,
        level: usize,
        sums: &[(&[&Ciphertext], &[&Plaintext])],
    ) -> Result<Vec<Option<Ciphertext>>> {
        let mut accs = sums
            .iter()
            .map(|_| self.mul_accumulator(level))
            .collect::<Result<Vec<_>>>()?;
        MulAccumulator::add_fresh_products_tiled(&mut accs, sums)?;
        Ok(accs.into_iter().map(MulAccumulator::finish).collect())
    }

    /// [`Self::sums_of_products`] over `Q_level·P`. Errors: [`CkksError::LevelOutOfRange`]; as
    /// [`ExtendedMulAccumulator::add_products`].
    pub fn sums_of_products_extended(
        &self,
        level: usize,
        sums: &[(&[&ExtendedCiphertext], &[&ExtendedPlaintext])],
    ) -> Result<Vec<Option<ExtendedCiphertext>>> {
        let mut accs = sums
            .iter()
            .map(|_| self.mul_accumulator_extended(level))
            .collect::<Result<Vec<_>>>()?;
        ExtendedMulAccumulator::add_fresh_products_tiled(&mut accs, sums)?;
        Ok(accs
            .into_iter()
            .map(ExtendedMulAccumulator::finish)
            .collect())
    }

    /// Fused ModDown and rescale, `Q_level·P` → `Q_{level−1}`. Errors:
    /// [`CkksError::ParameterMismatch`], [`CkksError::CannotRescale`] at level 0.
    pub fn mod_down_rescale(&self, x: &ExtendedCiphertext) -> Result<Ciphertext> {
        self.ctx.check(x.digest)?;
        hoisting::mod_down_rescale(&self.ctx, x)
    }

    /// `acc ← acc + x` over `Q·P`. Errors: [`CkksError::LevelMismatch`], `ScaleMismatch`.
    pub fn add_extended_assign(
        &self,
        acc: &mut ExtendedCiphertext,
        x: &ExtendedCiphertext,
    ) -> Result<()> {
        self.ctx.check(acc.digest)?;
        self.ctx.check(x.digest)?;
        hoisting::add_extended(&self.ctx, acc, x)
    }

    /// ModDown: `round(x / P)` back to `Q`. Errors: [`CkksError::ParameterMismatch`].
    pub fn mod_down(&self, x: &ExtendedCiphertext) -> Result<Ciphertext> {
        self.ctx.check(x.digest)?;
        Ok(hoisting::mod_down(&self.ctx, x))
    }
}

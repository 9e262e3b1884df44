//! Batched BFV over the CKKS context's ring: exact arithmetic on vectors over `Z_t` for a prime
//! plaintext modulus `t ≡ 1 mod 2N` (Brakerski, CRYPTO 2012; Fan–Vercauteren, ePrint 2012/144;
//! SIMD slots: Smart–Vercauteren, DCC 2014). It is the offline phase of masked-ring
//! preprocessing (docs/design/wire.md, "Masked ring values").
//!
//! A BFV ciphertext here is an ordinary [`Ciphertext`] whose `c0 + c1·s` is `round(Q_l·m/t) + e`
//! mod `Q_l`. Everything linear is shared with CKKS unchanged: [`crate::Evaluator`]'s ct×pt
//! products and accumulators (with operands from [`BatchEncoder::operand`]), rotations and
//! hoisting under the same [`crate::GaloisKeys`], additions, and [`crate::Evaluator::rescale`],
//! which is BFV's modulus switching. The scale field means nothing for BFV: keep it at 1
//! ([`Ciphertext::set_scale`] after a modulus switch), as additions compare scales.
//!
//! Slots: `N` values in two rows of `N/2`; value `j < N/2` sits at the root `ζ^{5^j}`, value
//! `N/2 + j` at `ζ^{−5^j}`, so a rotation by `k` (Galois element `5^k`) rotates each row left by
//! `k`, exactly as it rotates CKKS's N/2 complex slots: the same baby-step/giant-step plans run on
//! both rows at once.

use std::sync::Arc;

use rand::{CryptoRng, RngExt};
use tfhe_ntt::prime64::Plan;

use crate::ciphertext::{Ciphertext, SeededCiphertext};
use crate::context::Context;
use crate::decrypt::Decryptor;
use crate::encrypt::Encryptor;
use crate::error::{CkksError, Result};
use crate::keys::{PublicKey, SecretKey, small_ntt};
use crate::modular::{Modulus, is_prime, reduce_signed_limb};
use crate::plaintext::{ExtendedPlaintext, Plaintext};
use crate::sampling::{gaussian, ternary};

/// Largest flooding width (bits) [`flood`] accepts: its noise must stay below `2^62`.
pub const MAX_FLOOD_BITS: u32 = 61;

/// A decryption with its remaining noise budget.
#[derive(Debug, Clone, PartialEq)]
pub struct Decrypted {
    /// The `N` slot values in `[0, t)`, row 0 then row 1.
    pub values: Vec<u64>,
    /// `−log2(2·max |t·e/Q_l|)` over the coefficients: bits the noise `e` may still grow by
    /// before decryption fails; readable up to about 45 bits (f64 rounding), and 0 when the noise
    /// may have reached the message (the values are then meaningless: one wrong coefficient
    /// changes every slot).
    pub budget_bits: f64,
}

/// Encoding, encryption and decryption of `Z_t` slot vectors in a CKKS [`Context`].
pub struct BatchEncoder {
    ctx: Arc<Context>,
    t: Modulus,
    plan: Plan,
    /// NTT output index (mod t) of each slot.
    slot_idx: Vec<u32>,
    /// `t^{-1} mod q_i` per chain prime.
    t_inv: Vec<u64>,
}

impl std::fmt::Debug for BatchEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchEncoder")
            .field("t", &self.t.q)
            .field("degree", &self.ctx.degree())
            .finish_non_exhaustive()
    }
}

impl BatchEncoder {
    /// An encoder for plaintext modulus `t`. Errors: [`CkksError::InvalidPlaintextModulus`]
    /// unless `t` is a prime `≡ 1 mod 2N` below `2^61` and not one of the context's primes.
    pub fn new(ctx: &Arc<Context>, t: u64) -> Result<Self> {
        let n = ctx.degree();
        let bad = |reason| Err(CkksError::InvalidPlaintextModulus { t, reason });
        if !is_prime(t) || t % (2 * n as u64) != 1 {
            return bad("not a prime ≡ 1 mod 2N");
        }
        if t >= 1 << 61 {
            return bad("above 2^61");
        }
        if ctx.moduli.iter().any(|m| m.q == t) {
            return bad("equal to a ciphertext prime");
        }
        let Some(plan) = Plan::try_new(n, t) else {
            return bad("no negacyclic NTT plan");
        };
        let tm = Modulus::new(t);
        // Transforming the monomial X gives each NTT output's evaluation point ψ^e.
        let mut x = vec![0u64; n];
        x[1] = 1;
        plan.fwd(&mut x);
        let two_n = 2 * n;
        let mut exp_idx = vec![u32::MAX; two_n];
        let (psi, psi2) = (x[0], tm.mul(x[0], x[0]));
        let mut power_to_exp = std::collections::HashMap::with_capacity(n);
        let mut cur = psi;
        for k in 0..n {
            power_to_exp.insert(cur, 2 * k + 1);
            cur = tm.mul(cur, psi2);
        }
        for (j, w) in x.iter().enumerate() {
            let Some(&e) = power_to_exp.get(w) else {
                return bad("NTT outputs are not the odd powers of a 2N-th root");
            };
            exp_idx[e] = j as u32;
        }
        let half = n / 2;
        let mut slot_idx = vec![0u32; n];
        let mut g = 1usize;
        for j in 0..half {
            slot_idx[j] = exp_idx[g];
            slot_idx[half + j] = exp_idx[two_n - g];
            g = g * 5 % two_n;
        }
        let t_inv = (0..=ctx.max_level())
            .map(|i| ctx.moduli[i].inv(ctx.moduli[i].reduce(t)))
            .collect();
        Ok(Self {
            ctx: ctx.clone(),
            t: tm,
            plan,
            slot_idx,
            t_inv,
        })
    }

    /// The plaintext modulus t.
    pub fn plaintext_modulus(&self) -> u64 {
        self.t.q
    }

    /// Values per ciphertext: N (two rows of N/2).
    pub fn slots(&self) -> usize {
        self.ctx.degree()
    }

    /// The coefficients in `[0, t)` of the polynomial whose slots are `values` (zero-padded).
    fn coefficients(&self, values: &[u64]) -> Result<Vec<u64>> {
        let n = self.ctx.degree();
        if values.len() > n {
            return Err(CkksError::TooManyValues {
                got: values.len(),
                slots: n,
            });
        }
        if let Some(index) = values.iter().position(|&v| v >= self.t.q) {
            return Err(CkksError::ValueOutOfRange { index });
        }
        let mut eval = vec![0u64; n];
        for (&v, &i) in values.iter().zip(&self.slot_idx) {
            eval[i as usize] = v;
        }
        self.plan.inv(&mut eval);
        self.plan.normalize(&mut eval);
        Ok(eval)
    }

    fn check_level(&self, level: usize) -> Result<()> {
        let max = self.ctx.max_level();
        if level > max {
            return Err(CkksError::LevelOutOfRange { level, max });
        }
        Ok(())
    }

    /// The coefficients of `values`' polynomial lifted to `(−t/2, t/2]`.
    fn signed_coefficients(&self, values: &[u64]) -> Result<Vec<i64>> {
        let t = self.t.q;
        Ok(self
            .coefficients(values)?
            .into_iter()
            .map(|c| {
                if c > t / 2 {
                    c as i64 - t as i64
                } else {
                    c as i64
                }
            })
            .collect())
    }

    /// N-scaled NTT limbs of signed coefficients over the listed primes.
    fn operand_limbs(&self, signed: &[i64], primes: impl Iterator<Item = usize>) -> Vec<u64> {
        let ctx = &self.ctx;
        let n = ctx.degree();
        let primes: Vec<usize> = primes.collect();
        let mut data = vec![0u64; primes.len() * n];
        for (limb, &i) in data.chunks_exact_mut(n).zip(&primes) {
            reduce_signed_limb(&ctx.moduli[i], signed, limb);
            ctx.fwd(i, limb);
            ctx.scale_by_n(i, limb);
        }
        data
    }

    /// A ct×pt operand at `level`: the polynomial of `values` (each `< t`, at most N) with its
    /// coefficients lifted to `(−t/2, t/2]`, so a product with a ciphertext of `m` encrypts the
    /// slotwise product mod t. The product multiplies the noise by up to `N·t/2`. Errors:
    /// [`CkksError::TooManyValues`], [`CkksError::ValueOutOfRange`],
    /// [`CkksError::LevelOutOfRange`].
    pub fn operand(&self, values: &[u64], level: usize) -> Result<Plaintext> {
        self.check_level(level)?;
        let signed = self.signed_coefficients(values)?;
        Ok(Plaintext {
            data: self.operand_limbs(&signed, 0..=level),
            level,
            scale: 1.0,
            n_scaled: true,
            digest: self.ctx.digest(),
        })
    }

    /// [`Self::operand`] over `Q_l·P`, for products with rotations kept over `Q_l·P` (double
    /// hoisting). Errors: as [`Self::operand`].
    pub fn operand_extended(&self, values: &[u64], level: usize) -> Result<ExtendedPlaintext> {
        self.check_level(level)?;
        let signed = self.signed_coefficients(values)?;
        let special = self.operand_limbs(&signed, std::iter::once(self.ctx.sp()));
        Ok(ExtendedPlaintext {
            pt: Plaintext {
                data: self.operand_limbs(&signed, 0..=level),
                level,
                scale: 1.0,
                n_scaled: true,
                digest: self.ctx.digest(),
            },
            special,
        })
    }

    /// The message encoding of `values` at `level`, `round(Q_l·m/t)` (canonical NTT form): what
    /// [`Self::encrypt_sk`] encrypts, and what [`crate::Evaluator::add_plain_assign`] adds to a
    /// ciphertext at that level. Errors: as [`Self::operand`].
    pub fn message(&self, values: &[u64], level: usize) -> Result<Plaintext> {
        self.check_level(level)?;
        let ctx = &self.ctx;
        let n = ctx.degree();
        let t = self.t.q;
        // Q_l·m = t·k + ρ with ρ = (Q_l mod t)·m mod t; round(Q_l·m/t) = k + [2ρ > t] and
        // k ≡ −ρ·t^{-1} mod q_i because Q_l ≡ 0 mod q_i.
        let q_mod_t = (0..=level).fold(1u64, |acc, i| self.t.mul(acc, self.t.reduce(ctx.prime(i))));
        let rho: Vec<u64> = self
            .coefficients(values)?
            .into_iter()
            .map(|m| self.t.mul(q_mod_t, m))
            .collect();
        let mut data = vec![0u64; (level + 1) * n];
        for (i, limb) in data.chunks_exact_mut(n).enumerate() {
            let qi = ctx.moduli[i];
            for (x, &r) in limb.iter_mut().zip(&rho) {
                let k = qi.neg(qi.mul(qi.reduce(r), self.t_inv[i]));
                *x = qi.add(k, u64::from(2 * r > t));
            }
            ctx.fwd(i, limb);
        }
        Ok(Plaintext {
            data,
            level,
            scale: 1.0,
            n_scaled: false,
            digest: ctx.digest(),
        })
    }

    /// Secret-key encryption of `values` (each `< t`, at most N) at `level`: `c0 + c1·s =
    /// round(Q_l·m/t) + e`, seeded as CKKS uploads are. Errors: as [`Self::operand`];
    /// [`CkksError::ParameterMismatch`] for another context's key.
    pub fn encrypt_sk<R: CryptoRng + ?Sized>(
        &self,
        values: &[u64],
        level: usize,
        sk: &SecretKey,
        rng: &mut R,
    ) -> Result<SeededCiphertext> {
        let pt = self.message(values, level)?;
        Encryptor::new(&self.ctx).encrypt_sk(&pt, sk, rng)
    }

    /// Decrypts the N slot values: `round(t·(c0 + c1·s)/Q_l) mod t`, by the RNS scaling of
    /// Halevi–Polyakov–Shoup (CT-RSA 2019, §3) with the fractional parts in f64. Errors:
    /// [`CkksError::ParameterMismatch`] for another context's ciphertext or key.
    pub fn decrypt(&self, ct: &Ciphertext, sk: &SecretKey) -> Result<Decrypted> {
        let ctx = &self.ctx;
        ctx.check(sk.ctx.digest())?;
        let n = ctx.degree();
        let level = ct.level;
        let mut x = Decryptor::new(sk).decrypt(ct)?.data;
        for (i, limb) in x.chunks_exact_mut(n).enumerate() {
            ctx.inv(i, limb);
        }
        // y_i = (Q_l/q_i)^{-1} mod q_i.
        let y: Vec<u64> = (0..=level)
            .map(|i| {
                let qi = ctx.moduli[i];
                let rest = (0..=level)
                    .filter(|&j| j != i)
                    .fold(1u64, |acc, j| qi.mul(acc, qi.reduce(ctx.prime(j))));
                qi.inv(rest)
            })
            .collect();
        let t = self.t.q;
        let mut coeffs = vec![0u64; n];
        let mut worst = 0f64;
        for (k, c) in coeffs.iter_mut().enumerate() {
            // t·x/Q_l ≡ Σ_i [x_i·y_i]_{q_i}·t/q_i (mod t).
            let (mut whole, mut frac) = (0u64, 0f64);
            for (i, &yi) in y.iter().enumerate() {
                let qi = ctx.moduli[i];
                let v = qi.mul(x[i * n + k], yi) as u128 * t as u128;
                whole = self.t.add(whole, (v / qi.q as u128) as u64);
                frac += (v % qi.q as u128) as f64 / qi.q as f64;
            }
            let r = frac.round();
            worst = worst.max((frac - r).abs());
            *c = self.t.add(whole, self.t.reduce(r as u64));
        }
        self.plan.fwd(&mut coeffs);
        Ok(Decrypted {
            values: self.slot_idx.iter().map(|&i| coeffs[i as usize]).collect(),
            budget_bits: -(2.0 * worst.max(f64::MIN_POSITIVE)).log2(),
        })
    }
}

/// Circuit privacy by noise flooding: adds a fresh public-key encryption of zero whose `c0` error
/// is uniform in `[−2^bits, 2^bits]`, so the ciphertext's distribution depends on the
/// computation's noise only to within `2^(log2(noise) − bits)` statistical distance (Gentry, STOC
/// 2009, §21; the smudging lemma). Use `bits` ≥ 40 above the noise bound. The message is kept
/// when `2^bits` fits the noise budget. Errors: [`CkksError::InvalidParameters`] for `bits` above
/// [`MAX_FLOOD_BITS`]; [`CkksError::ParameterMismatch`] for another context's key.
pub fn flood<R: CryptoRng + ?Sized>(
    ct: &mut Ciphertext,
    pk: &PublicKey,
    bits: u32,
    rng: &mut R,
) -> Result<()> {
    let ctx = ct.ctx.clone();
    ctx.check(pk.ctx.digest())?;
    if bits > MAX_FLOOD_BITS {
        return Err(CkksError::InvalidParameters {
            reason: "flooding wider than 2^61",
        });
    }
    let n = ctx.degree();
    let level = ct.level;
    let bound = 1i64 << bits;
    let wide: Vec<i64> = (0..n).map(|_| rng.random_range(-bound..=bound)).collect();
    let u = small_ntt(&ctx, &ternary(rng, n), 0..=level);
    let e1 = small_ntt(&ctx, &gaussian(rng, n), 0..=level);
    let mut e0 = vec![0u64; n];
    let mut tmp = vec![0u64; n];
    for i in 0..=level {
        let r = i * n..(i + 1) * n;
        let m = ctx.moduli[i];
        reduce_signed_limb(&m, &wide, &mut e0);
        ctx.fwd(i, &mut e0);
        tmp.copy_from_slice(&u[r.clone()]);
        ctx.mul_scaled(i, &mut tmp, &pk.b_scaled[r.clone()]);
        for ((c, &a), &e) in ct.c0[r.clone()].iter_mut().zip(&tmp).zip(&e0) {
            *c = m.add(*c, m.add(a, e));
        }
        tmp.copy_from_slice(&u[r.clone()]);
        ctx.mul_scaled(i, &mut tmp, &pk.a_scaled[r.clone()]);
        for ((c, &a), &e) in ct.c1[r.clone()].iter_mut().zip(&tmp).zip(&e1[r]) {
            *c = m.add(*c, m.add(a, e));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;

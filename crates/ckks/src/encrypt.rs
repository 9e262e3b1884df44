//! Encryption: secret-key (seeded, half-size) and public-key.
//!
//! Secret key (Lyubashevsky–Peikert–Regev RLWE; seeded form as in SEAL's
//! "symmetric seeded" ciphertexts): `c1 = a` expanded from a fresh 32-byte
//! seed, `c0 = −a·s + e + m`. Public key: `c = u·(b, a) + (e0 + m, e1)` with
//! ternary `u` (CKKS, Cheon–Kim–Kim–Song 2017, §3.4).

use std::sync::Arc;

use rand::CryptoRng;

use crate::ciphertext::{Ciphertext, SeededCiphertext};
use crate::context::Context;
use crate::error::Result;
use crate::keys::{PublicKey, SecretKey, small_ntt};
use crate::plaintext::Plaintext;
use crate::sampling::{expand_uniform, gaussian, ternary};

/// Encrypts plaintexts under a secret or public key.
#[derive(Debug, Clone)]
pub struct Encryptor {
    ctx: Arc<Context>,
}

/// Limb `i` of a plaintext in canonical NTT form (copying, un-scaling if needed).
pub(crate) fn canonical_limb(ctx: &Context, pt: &Plaintext, i: usize, out: &mut [u64]) {
    let n = ctx.degree();
    out.copy_from_slice(&pt.data[i * n..(i + 1) * n]);
    if pt.n_scaled {
        ctx.normalize(i, out);
    }
}

impl Encryptor {
    /// An encryptor for `ctx`.
    pub fn new(ctx: &Arc<Context>) -> Self {
        Self { ctx: ctx.clone() }
    }

    /// Secret-key encryption at the plaintext's level and scale; the uniform
    /// part is replaced by its seed.
    ///
    /// # Errors
    /// [`crate::CkksError::ParameterMismatch`] if the plaintext or the key
    /// belong to another context.
    pub fn encrypt_sk<R: CryptoRng + ?Sized>(
        &self,
        pt: &Plaintext,
        sk: &SecretKey,
        rng: &mut R,
    ) -> Result<SeededCiphertext> {
        let ctx = &self.ctx;
        ctx.check(pt.digest)?;
        ctx.check(sk.ctx.digest())?;
        let n = ctx.degree();
        let mut seed = [0u8; 32];
        rng.fill_bytes(&mut seed);
        let mut c0 = vec![0u64; (pt.level + 1) * n];
        expand_uniform(ctx, &seed, 0, 0..=pt.level, &mut c0);
        let e = small_ntt(ctx, &gaussian(rng, n), 0..=pt.level);
        let mut m = vec![0u64; n];
        for (i, limb) in c0.chunks_exact_mut(n).enumerate() {
            ctx.mul_scaled(i, limb, sk.scaled_limb(i));
            canonical_limb(ctx, pt, i, &mut m);
            let md = ctx.moduli[i];
            crate::modular::vectorized(|| {
                for ((c, &ev), &mv) in limb.iter_mut().zip(&e[i * n..(i + 1) * n]).zip(&m) {
                    *c = md.sub(md.add(ev, mv), *c);
                }
            });
        }
        Ok(SeededCiphertext {
            ctx: ctx.clone(),
            c0,
            seed,
            level: pt.level,
            scale: pt.scale,
        })
    }

    /// Public-key encryption at the plaintext's level and scale.
    ///
    /// # Errors
    /// [`crate::CkksError::ParameterMismatch`] if the plaintext or the key
    /// belong to another context.
    pub fn encrypt_pk<R: CryptoRng + ?Sized>(
        &self,
        pt: &Plaintext,
        pk: &PublicKey,
        rng: &mut R,
    ) -> Result<Ciphertext> {
        let ctx = &self.ctx;
        ctx.check(pt.digest)?;
        ctx.check(pk.ctx.digest())?;
        let n = ctx.degree();
        let u = small_ntt(ctx, &ternary(rng, n), 0..=pt.level);
        let e0 = small_ntt(ctx, &gaussian(rng, n), 0..=pt.level);
        let e1 = small_ntt(ctx, &gaussian(rng, n), 0..=pt.level);
        let mut c0 = u.clone();
        let mut c1 = u;
        let mut m = vec![0u64; n];
        for i in 0..=pt.level {
            let r = i * n..(i + 1) * n;
            ctx.mul_scaled(i, &mut c0[r.clone()], &pk.b_scaled[r.clone()]);
            ctx.mul_scaled(i, &mut c1[r.clone()], &pk.a_scaled[r.clone()]);
            canonical_limb(ctx, pt, i, &mut m);
            let md = ctx.moduli[i];
            for ((c, &ev), &mv) in c0[r.clone()].iter_mut().zip(&e0[r.clone()]).zip(&m) {
                *c = md.add(*c, md.add(ev, mv));
            }
            for (c, &ev) in c1[r.clone()].iter_mut().zip(&e1[r.clone()]) {
                *c = md.add(*c, ev);
            }
        }
        Ok(Ciphertext {
            ctx: ctx.clone(),
            c0,
            c1,
            level: pt.level,
            scale: pt.scale,
        })
    }
}

//! Encryption: secret-key (RLWE, Lyubashevsky–Peikert–Regev; seeded as SEAL's symmetric seeded
//! ciphertexts: `c1 = a` from a 32-byte seed, `c0 = −a·s + e + m`) and public-key (`c = u·(b, a) +
//! (e0 + m, e1)`, ternary `u`; CKKS §3.4).

use std::sync::Arc;

use rand::CryptoRng;

use crate::ciphertext::{Ciphertext, SeededCiphertext};
use crate::context::Context;
use crate::encoder::Encoder;
use crate::error::{CkksError, Result};
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

    /// Secret-key encryption at the plaintext's level and scale, `a` as its seed. Errors:
    /// [`crate::CkksError::ParameterMismatch`] for another context's plaintext or key.
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
        let e = small_ntt(ctx, &gaussian(rng, n), 0..=pt.level);
        Ok(self.seeded(sk, seed, pt.level, pt.scale, |i, limb| {
            canonical_limb(ctx, pt, i, limb);
            let md = ctx.moduli[i];
            crate::modular::vectorized(|| {
                for (m, &ev) in limb.iter_mut().zip(&e[i * n..(i + 1) * n]) {
                    *m = md.add(*m, ev);
                }
            });
        }))
    }

    /// Shared by both secret-key encryptions: `a` from `seed`, limb by limb `c0 = (m + e) − a·s`,
    /// `message_limb(i, buf)` writing limb `i` of `m + e`.
    fn seeded(
        &self,
        sk: &SecretKey,
        seed: [u8; 32],
        level: usize,
        scale: f64,
        mut message_limb: impl FnMut(usize, &mut [u64]),
    ) -> SeededCiphertext {
        let ctx = &self.ctx;
        let n = ctx.degree();
        let mut c0 = vec![0u64; (level + 1) * n];
        expand_uniform(ctx, &seed, 0, 0..=level, &mut c0);
        let mut m = vec![0u64; n];
        for (i, limb) in c0.chunks_exact_mut(n).enumerate() {
            ctx.mul_scaled(i, limb, sk.scaled_limb(i));
            message_limb(i, &mut m);
            let md = ctx.moduli[i];
            crate::modular::vectorized(|| {
                for (c, &mv) in limb.iter_mut().zip(&m) {
                    *c = md.sub(mv, *c);
                }
            });
        }
        SeededCiphertext {
            ctx: ctx.clone(),
            c0,
            seed,
            level,
            scale,
        }
    }

    /// Encodes `re + i·im` and encrypts it under the secret key in one pass (the error is added
    /// before the forward NTT); bit-identical to `encode_complex` then [`Self::encrypt_sk`] from
    /// the same generator state. Errors: as [`Encoder::encode_complex`];
    /// [`CkksError::ParameterMismatch`] for another context's encoder or key.
    #[allow(clippy::too_many_arguments)]
    pub fn encrypt_values_sk<R: CryptoRng + ?Sized>(
        &self,
        encoder: &Encoder,
        re: &[f64],
        im: &[f64],
        level: usize,
        scale: f64,
        sk: &SecretKey,
        rng: &mut R,
    ) -> Result<SeededCiphertext> {
        let ctx = &self.ctx;
        ctx.check(encoder.context().digest())?;
        ctx.check(sk.ctx.digest())?;
        let max = ctx.max_level();
        if level > max {
            return Err(CkksError::LevelOutOfRange { level, max });
        }
        let mut coeffs = encoder.coefficients(re, Some(im), scale)?;
        let mut seed = [0u8; 32];
        rng.fill_bytes(&mut seed);
        // |m| < 2^62 (checked by the encoder) and |e| ≤ 19: no overflow.
        for (c, &e) in coeffs.iter_mut().zip(&gaussian(rng, ctx.degree())) {
            *c += i64::from(e);
        }
        Ok(self.seeded(sk, seed, level, scale, |i, limb| {
            crate::modular::reduce_signed_limb(&ctx.moduli[i], &coeffs, limb);
            ctx.fwd(i, limb);
        }))
    }

    /// Public-key encryption at the plaintext's level and scale. Errors:
    /// [`crate::CkksError::ParameterMismatch`] for another context's plaintext or key.
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

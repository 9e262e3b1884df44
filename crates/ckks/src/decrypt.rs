//! Decryption: `m = c0 + c1·s` in NTT form (one SIMD product per limb).

use crate::ciphertext::Ciphertext;
use crate::error::Result;
use crate::keys::SecretKey;
use crate::plaintext::Plaintext;

/// Decrypts with a secret key; the plaintext must never be sent back to the server (IND-CPA-D,
/// Li–Micciancio 2021).
#[derive(Debug, Clone)]
pub struct Decryptor {
    pub(crate) sk: SecretKey,
}

impl Decryptor {
    /// A decryptor holding (a clone of) the secret key.
    pub fn new(sk: &SecretKey) -> Self {
        Self { sk: sk.clone() }
    }

    /// Decrypts at the ciphertext's level and scale. Errors:
    /// [`crate::CkksError::ParameterMismatch`] for another context's ciphertext.
    pub fn decrypt(&self, ct: &Ciphertext) -> Result<Plaintext> {
        let ctx = &self.sk.ctx;
        ctx.check(ct.ctx.digest())?;
        let n = ctx.degree();
        let mut data = ct.c1.clone();
        for (i, limb) in data.chunks_exact_mut(n).enumerate() {
            ctx.mul_scaled(i, limb, self.sk.scaled_limb(i));
            let m = ctx.moduli[i];
            for (x, &c) in limb.iter_mut().zip(&ct.c0[i * n..(i + 1) * n]) {
                *x = m.add(*x, c);
            }
        }
        Ok(Plaintext {
            data,
            level: ct.level,
            scale: ct.scale,
            n_scaled: false,
            digest: ctx.digest(),
        })
    }
}

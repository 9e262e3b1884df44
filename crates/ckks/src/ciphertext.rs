//! Ciphertexts: pairs of RNS polynomials in NTT form, and the seeded form of fresh secret-key
//! ciphertexts.

use std::sync::Arc;

use crate::context::Context;
use crate::sampling::expand_uniform;

/// A CKKS ciphertext `(c0, c1)` with `c0 + c1·s ≈ m` mod `Q_level`: NTT form, `level + 1` limbs of
/// N words each, with its scale.
pub struct Ciphertext {
    pub(crate) ctx: Arc<Context>,
    pub(crate) c0: Vec<u64>,
    pub(crate) c1: Vec<u64>,
    pub(crate) level: usize,
    pub(crate) scale: f64,
}

impl std::fmt::Debug for Ciphertext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ciphertext")
            .field("degree", &self.ctx.degree())
            .field("level", &self.level)
            .field("scale", &self.scale)
            .finish_non_exhaustive()
    }
}

impl Clone for Ciphertext {
    fn clone(&self) -> Self {
        Self {
            ctx: self.ctx.clone(),
            c0: self.ctx.pool.copy_of(&self.c0),
            c1: self.ctx.pool.copy_of(&self.c1),
            level: self.level,
            scale: self.scale,
        }
    }
}

impl Drop for Ciphertext {
    fn drop(&mut self) {
        self.ctx.pool.give(std::mem::take(&mut self.c0));
        self.ctx.pool.give(std::mem::take(&mut self.c1));
    }
}

impl PartialEq for Ciphertext {
    fn eq(&self, o: &Self) -> bool {
        self.ctx.params().digest() == o.ctx.params().digest()
            && self.level == o.level
            && self.scale == o.scale
            && self.c0 == o.c0
            && self.c1 == o.c1
    }
}

impl Ciphertext {
    /// Level (number of chain primes − 1).
    pub fn level(&self) -> usize {
        self.level
    }
    /// Scale Δ of the encrypted values.
    pub fn scale(&self) -> f64 {
        self.scale
    }
    /// Overrides the tracked scale (e.g. to declare `Δ²/q ≈ Δ` exact after a rescale when the
    /// caller has arranged the scales to match).
    pub fn set_scale(&mut self, scale: f64) {
        self.scale = scale;
    }
    /// The context the ciphertext lives in.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

/// A fresh secret-key ciphertext whose uniform part `c1 = a` is replaced by the 32-byte seed it was
/// expanded from (ChaCha8, `sampling::expand_uniform`): half the upload size.
#[derive(Clone)]
pub struct SeededCiphertext {
    pub(crate) ctx: Arc<Context>,
    pub(crate) c0: Vec<u64>,
    pub(crate) seed: [u8; 32],
    pub(crate) level: usize,
    pub(crate) scale: f64,
}

impl std::fmt::Debug for SeededCiphertext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeededCiphertext")
            .field("degree", &self.ctx.degree())
            .field("level", &self.level)
            .field("scale", &self.scale)
            .finish_non_exhaustive()
    }
}

impl PartialEq for SeededCiphertext {
    fn eq(&self, o: &Self) -> bool {
        self.ctx.params().digest() == o.ctx.params().digest()
            && self.level == o.level
            && self.scale == o.scale
            && self.seed == o.seed
            && self.c0 == o.c0
    }
}

impl SeededCiphertext {
    /// Level.
    pub fn level(&self) -> usize {
        self.level
    }
    /// Scale.
    pub fn scale(&self) -> f64 {
        self.scale
    }
    /// Re-derives `a` from the seed and returns the full ciphertext.
    pub fn expand(&self) -> Ciphertext {
        let n = self.ctx.degree();
        let mut c1 = vec![0u64; (self.level + 1) * n];
        expand_uniform(&self.ctx, &self.seed, 0, 0..=self.level, &mut c1);
        Ciphertext {
            ctx: self.ctx.clone(),
            c0: self.c0.clone(),
            c1,
            level: self.level,
            scale: self.scale,
        }
    }
}

//! Lossy compression of fresh seeded ciphertexts for the upload: dropping `d` low bits of `c0`
//! (Kyber's `Compress_q`, Bos et al., EuroS&P 2018), a public function of `c0`, so RLWE security is
//! unchanged. Error analysis: docs/design/code-notes.md, "ckks: rounded".

use std::sync::Arc;

use crate::ciphertext::{Ciphertext, SeededCiphertext};
use crate::context::Context;
use crate::error::{CkksError, Result};

/// Failure probability (log2) of the high-probability bound on the slot error, per ciphertext.
const FAILURE_LOG2: f64 = 40.0;

fn bits_of(q: u64) -> u32 {
    64 - q.leading_zeros()
}

/// Bound (failure 2^-40) on the added slot error: `2^(d−1)·sqrt(N·ln(2N·2^40))/Δ`.
#[must_use]
pub fn predicted_error(degree: usize, scale: f64, dropped: u32) -> f64 {
    if dropped == 0 {
        return 0.0;
    }
    let n = degree as f64;
    let log = (2.0 * n).ln() + FAILURE_LOG2 * std::f64::consts::LN_2;
    2f64.powi(dropped as i32 - 1) * (n * log).sqrt() / scale
}

/// The most droppable low bits with [`predicted_error`] ≤ `max_error` (≤ `bits(q_0) − 2`).
#[must_use]
pub fn max_dropped_bits(ctx: &Context, scale: f64, max_error: f64) -> u32 {
    if !(max_error.is_finite() && max_error > 0.0 && scale.is_finite() && scale > 0.0) {
        return 0;
    }
    let cap = bits_of(ctx.prime(0)).saturating_sub(2);
    (1..=cap)
        .take_while(|&d| predicted_error(ctx.degree(), scale, d) <= max_error)
        .last()
        .unwrap_or(0)
}

/// A seeded ciphertext with `c0`'s low `d` bits dropped (limb 0 in coefficient form). Rebuilt with
/// [`Self::expand`]; serialized as kind 6.
#[derive(Clone)]
pub struct RoundedSeededCiphertext {
    pub(crate) ctx: Arc<Context>,
    /// `N` values below `⌈q_0 / 2^d⌉`.
    pub(crate) high: Vec<u64>,
    /// Limbs `1..=level` of `c0'`, NTT form, canonical.
    pub(crate) rest: Vec<u64>,
    pub(crate) seed: [u8; 32],
    pub(crate) level: usize,
    pub(crate) scale: f64,
    pub(crate) dropped: u32,
}

impl std::fmt::Debug for RoundedSeededCiphertext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoundedSeededCiphertext")
            .field("degree", &self.ctx.degree())
            .field("level", &self.level)
            .field("scale", &self.scale)
            .field("dropped", &self.dropped)
            .finish_non_exhaustive()
    }
}

/// The limb-0 residue the receiver rebuilds from `h`: `min(h·2^d + 2^(d−1), q_0 − 1)`.
fn rebuilt(h: u64, d: u32, q0: u64) -> u64 {
    ((h << d) + (1u64 << (d - 1))).min(q0 - 1)
}

/// Checks `1 ≤ d ≤ bits(q_0) − 2`.
pub(crate) fn check_dropped(ctx: &Context, dropped: u32) -> Result<()> {
    if dropped == 0 || dropped + 2 > bits_of(ctx.prime(0)) {
        return Err(CkksError::InvalidCompression {
            reason: "dropped bits must be in 1..=bits(q0) - 2",
        });
    }
    Ok(())
}

/// Bits per value of limb 0 after dropping `d`: `bits(q_0) − d`.
pub(crate) fn high_bits(ctx: &Context, dropped: u32) -> u32 {
    bits_of(ctx.prime(0)) - dropped
}

/// The bound every sent `h` is below: `⌊(q_0 − 1)/2^d⌋ + 1`.
pub(crate) fn high_limit(ctx: &Context, dropped: u32) -> u64 {
    ((ctx.prime(0) - 1) >> dropped) + 1
}

impl SeededCiphertext {
    /// Drops `dropped` low bits of `c0` (error within [`predicted_error`]). Errors:
    /// [`CkksError::InvalidCompression`] unless `1 ≤ dropped ≤ bits(q_0) − 2`.
    pub fn round_low_bits(&self, dropped: u32) -> Result<RoundedSeededCiphertext> {
        let ctx = &self.ctx;
        check_dropped(ctx, dropped)?;
        let n = ctx.degree();
        let q0 = ctx.prime(0);
        let mut coeffs = self.c0[..n].to_vec();
        ctx.inv(0, &mut coeffs);
        let mut high = vec![0u64; n];
        // δ_i ∈ [−2^(d−1), 2^(d−1)], as an i64.
        let mut delta = vec![0i64; n];
        for ((a, h), dl) in coeffs.iter().zip(&mut high).zip(&mut delta) {
            *h = *a >> dropped;
            *dl = *a as i64 - rebuilt(*h, dropped, q0) as i64;
        }
        let mut rest = self.c0[n..].to_vec();
        let mut reduced = vec![0u64; n];
        for (j, limb) in rest.chunks_exact_mut(n).enumerate() {
            let i = j + 1;
            let m = ctx.moduli[i];
            // |δ| < 2^48 may exceed a smaller q_i: reduced in full.
            for (r, &dl) in reduced.iter_mut().zip(&delta) {
                *r = m.from_i64(dl);
            }
            ctx.fwd(i, &mut reduced);
            for (c, &r) in limb.iter_mut().zip(&reduced) {
                *c = m.sub(*c, r);
            }
        }
        Ok(RoundedSeededCiphertext {
            ctx: ctx.clone(),
            high,
            rest,
            seed: self.seed,
            level: self.level,
            scale: self.scale,
            dropped,
        })
    }
}

impl RoundedSeededCiphertext {
    /// Level.
    pub fn level(&self) -> usize {
        self.level
    }
    /// Scale.
    pub fn scale(&self) -> f64 {
        self.scale
    }
    /// `d`, the low bits dropped from `c0`.
    pub fn dropped(&self) -> u32 {
        self.dropped
    }

    /// The seeded ciphertext `(c0', seed)`, limb 0 rebuilt and transformed.
    pub fn to_seeded(&self) -> SeededCiphertext {
        let ctx = &self.ctx;
        let n = ctx.degree();
        let q0 = ctx.prime(0);
        let mut c0 = Vec::with_capacity((self.level + 1) * n);
        c0.extend(self.high.iter().map(|&h| rebuilt(h, self.dropped, q0)));
        ctx.fwd(0, &mut c0[..n]);
        c0.extend_from_slice(&self.rest);
        SeededCiphertext {
            ctx: ctx.clone(),
            c0,
            seed: self.seed,
            level: self.level,
            scale: self.scale,
        }
    }

    /// The full ciphertext: [`Self::to_seeded`], then `c1` re-expanded from the seed.
    pub fn expand(&self) -> Ciphertext {
        self.to_seeded().expand()
    }
}

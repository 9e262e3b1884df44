//! Lossy, controlled compression of fresh seeded ciphertexts for the
//! upload: dropping the low bits of `c0`.
//!
//! # The transformation
//! A seeded ciphertext ([`SeededCiphertext`]) at level `L` sends `c0`
//! modulo `Q = q_0·…·q_L` (its `c1 = a` is re-expanded from the seed). As an
//! integer in `[0, Q)`, `c0`'s mixed-radix digits are
//! `c0 = a_0 + q_0·(…)` with `a_0 = c0 mod q_0`: the integer's low `d` bits
//! are those of its limb-0 residue (in coefficient form). Rounding the
//! integer to `c0' = c0 − δ` with
//!
//! * `h = ⌊a_0 / 2^d⌋` (what is sent, `bits(q_0) − d` bits),
//! * `a_0' = min(h·2^d + 2^(d−1), q_0 − 1)` (what the receiver rebuilds),
//! * `δ = a_0 − a_0'`, `|δ| ≤ 2^(d−1)`,
//!
//! changes every residue by the same small integer: limb 0 becomes `a_0'`
//! and limb `j ≥ 1` becomes `c0_j − δ mod q_j`, which the sender computes
//! in NTT form by subtracting `NTT_j(δ)`. Then
//! `c0' + c1·s = m + e − δ (mod Q)`: the ciphertext decrypts to the same
//! message with one more error term, `δ`, per coefficient. Limbs `1..=L`
//! travel whole (NTT form); limb 0 travels as its `N` values `h` in
//! coefficient form, `d` bits fewer each. The receiver rebuilds `a_0'` and
//! takes its forward NTT.
//!
//! This is the low-bit dropping of Kyber's `Compress_q` (Bos et al.,
//! "CRYSTALS-Kyber", EuroS&P 2018) on the part of an RLWE ciphertext that
//! is not multiplied by the secret, applied here to a fresh CKKS
//! ciphertext whose `c1` is a seed; the mixed-radix view of an RNS integer
//! is Garner's (Knuth, TAOCP vol. 2, §4.3.2). Implemented here from those
//! descriptions; no code is copied. The download's compression
//! ([`crate::compress`]) also switches the modulus, which a fresh
//! ciphertext cannot afford: the server still needs its levels.
//!
//! # Security
//! `c0'` is a public function of `c0`: whatever can be learnt from the
//! rounded ciphertext can be learnt from the original, so the rounding
//! keeps RLWE security as it is.
//!
//! # Error analysis ([`max_dropped_bits`])
//! The slot error is `σ(δ)/Δ`: each real or imaginary part of a slot is
//! `Σ_i δ_i·w_i` with `w_i` the real or imaginary part of `ζ_j^i`, so
//! `Σ_i w_i² = N/2` for every slot. Heuristically (as in every CKKS noise
//! analysis) the `δ_i` are independent and centred (the low bits of a
//! residue that is uniform modulo `q_0`: `c0` contains `−a·s` for a uniform
//! `a`), and bounded by `2^(d−1)`, so each part is sub-Gaussian with
//! variance proxy `4^(d−1)·N/2` (Hoeffding) and
//! `P(|part| > t) ≤ 2·exp(−t²/(4^(d−1)·N))`. Over the `N` parts of a
//! ciphertext, the error stays below
//! `t_d = 2^(d−1)·sqrt(N·ln(2N·2^40))` except with probability 2^-40:
//! [`predicted_error`] is `t_d/Δ`. At N = 8192 and Δ = 2^40 that is
//! `2^(d−31.9)`: 18 bits of `q_0`'s 50 can go at a precision of 2^-13 in
//! slot units and 8 at 2^-23, the evaluation's own precision (the client
//! drops none on a round's last trip). Measured maxima sit about 4× below
//! the bound (`tests/rounded_upload.rs`).

use std::sync::Arc;

use crate::ciphertext::{Ciphertext, SeededCiphertext};
use crate::context::Context;
use crate::error::{CkksError, Result};

/// Failure probability (log2) of the high-probability bound on the slot
/// error, per ciphertext.
const FAILURE_LOG2: f64 = 40.0;

fn bits_of(q: u64) -> u32 {
    64 - q.leading_zeros()
}

/// The high-probability bound (failure 2^-40 per ciphertext, module docs)
/// on the absolute error that dropping `dropped` low bits of `c0` adds to
/// the real or imaginary part of any slot, in slot units at scale `scale`,
/// for ring degree `degree`: `2^(d−1)·sqrt(N·ln(2N·2^40))/Δ` (0 for d = 0).
#[must_use]
pub fn predicted_error(degree: usize, scale: f64, dropped: u32) -> f64 {
    if dropped == 0 {
        return 0.0;
    }
    let n = degree as f64;
    let log = (2.0 * n).ln() + FAILURE_LOG2 * std::f64::consts::LN_2;
    2f64.powi(dropped as i32 - 1) * (n * log).sqrt() / scale
}

/// The most low bits of `c0` a ciphertext of `ctx` at scale `scale` can
/// drop while its added slot error ([`predicted_error`]) stays at most
/// `max_error` (slot units, absolute): 0 when none can go, never more than
/// `bits(q_0) − 2` (limb 0 keeps at least two bits). Non-finite or
/// non-positive arguments give 0.
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

/// A fresh seeded ciphertext whose `c0` had its low `d` bits dropped
/// (module docs): limb 0 as the `N` values `h = ⌊a_0/2^d⌋` in coefficient
/// form, limbs `1..=L` whole in NTT form, and the seed of `c1`. Built by
/// [`SeededCiphertext::round_low_bits`]; the receiver rebuilds the
/// ciphertext with [`Self::expand`]. Serialized as kind 6
/// ([`crate::serialize`]).
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

/// The limb-0 residue the receiver rebuilds from `h`:
/// `min(h·2^d + 2^(d−1), q_0 − 1)`.
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
    /// Drops the low `dropped` bits of `c0` (module docs of
    /// [`crate::rounded`]): the result decrypts to the same message with an
    /// added error of at most [`predicted_error`] per slot part (with high
    /// probability), and serializes `dropped` bits per coefficient smaller.
    /// Costs one inverse and `level + 1` forward NTTs.
    ///
    /// # Errors
    /// [`CkksError::InvalidCompression`] unless
    /// `1 ≤ dropped ≤ bits(q_0) − 2`.
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

    /// The seeded ciphertext `(c0', seed)`: limb 0 rebuilt from `h` and
    /// taken to NTT form (one forward NTT), the other limbs as sent.
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

    /// The full ciphertext: [`Self::to_seeded`], then `c1` re-expanded from
    /// the seed.
    pub fn expand(&self) -> Ciphertext {
        self.to_seeded().expand()
    }
}

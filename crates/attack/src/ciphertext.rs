//! What the HE-LoRA server receives, as attacker features.
//!
//! The adapter server sees each projection input only as a fresh CKKS
//! ciphertext under the client's secret key (RLWE: Lyubashevsky–Peikert–
//! Regev 2010; CKKS: Cheon–Kim–Kim–Song 2017). [`ciphertext_features`]
//! encrypts every hidden state (the residual stream after `a` layers, one
//! state per ciphertext, its values in the first `hidden` slots) under a
//! fresh secret key per window (one "session"), serialises the seeded
//! ciphertext as it travels (`SeededCiphertext::to_bytes`: header, scale,
//! the 32-byte seed of the uniform part, then `c0 = m + e − a·s` bit-packed)
//! and takes `dim` little-endian 32-bit words of the packed `c0` after the
//! header, scale and seed, scaled to [0, 1), as the feature vector. Under
//! RLWE these words are indistinguishable from uniform without the key, so
//! the learned inverters trained on them must score at the frequency
//! baseline ([`crate::learned::frequency_baseline`]): the same attackers,
//! the same training and evaluation text, only the view differs.

use cipherlora_ckks::{CkksParameters, Context, Encoder, Encryptor, Preset, SecretKey};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

use crate::{AttackError, Result};

/// Bytes before the packed `c0` in a serialised seeded ciphertext: the
/// 16-byte header, the 8-byte scale and the 32-byte seed.
pub const SEEDED_PREFIX: usize = 16 + 8 + 32;

/// The CKKS parameters used: N = 8192, moduli 60 + 40 bits, Δ = 2^40
/// (the engine's smallest 128-bit preset).
pub const PRESET: Preset = Preset::N8192Depth1;

/// Ciphertext features (row-major (positions, `dim`) in [0, 1)) of states
/// `states` (row-major (positions, `hidden`)), a fresh secret key per window
/// of `window_lens` positions; keys and encryption randomness from ChaCha20
/// seeded with `seed` (reproducible; the keys are never used for anything
/// else).
///
/// # Errors
/// [`AttackError::Input`] if the sizes do not add up, `hidden` exceeds the
/// slots, or `dim` exceeds the packed `c0`'s 32-bit words; CKKS errors.
pub fn ciphertext_features(
    states: &[f32],
    hidden: usize,
    window_lens: &[usize],
    dim: usize,
    seed: u64,
) -> Result<Vec<f32>> {
    let total: usize = window_lens.iter().sum();
    if hidden == 0 || total == 0 || states.len() != total * hidden {
        return Err(AttackError::Input(format!(
            "{} state values for {total} positions of {hidden}",
            states.len()
        )));
    }
    let ctx = Context::new(CkksParameters::preset(PRESET)?)?;
    if hidden > ctx.slots() {
        return Err(AttackError::Input(format!(
            "{hidden} values > {} slots",
            ctx.slots()
        )));
    }
    let enc = Encoder::new(&ctx);
    let encryptor = Encryptor::new(&ctx);
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(total * dim);
    let mut rows = states.chunks_exact(hidden);
    let mut values = vec![0f64; hidden];
    for &len in window_lens {
        let sk = SecretKey::generate(&ctx, &mut rng);
        for _ in 0..len {
            let row = rows.next().expect("sizes checked");
            for (v, &s) in values.iter_mut().zip(row) {
                *v = s as f64;
            }
            let pt = enc.encode(&values, ctx.max_level(), ctx.params().scale())?;
            let bytes = encryptor.encrypt_sk(&pt, &sk, &mut rng)?.to_bytes();
            let words = &bytes[SEEDED_PREFIX.min(bytes.len())..];
            if words.len() < 4 * dim {
                return Err(AttackError::Input(format!(
                    "{dim} features > {} packed 32-bit words",
                    words.len() / 4
                )));
            }
            out.extend(
                words[..4 * dim]
                    .chunks_exact(4)
                    .map(|w| unit_interval(u32::from_le_bytes([w[0], w[1], w[2], w[3]]))),
            );
        }
    }
    Ok(out)
}

/// A 32-bit word mapped into [0, 1): its top 24 bits over 2^24, exact in
/// f32. (`w as f32 / 2^32` rounds words above 2^32 − 2^7 up to 1.0.)
fn unit_interval(w: u32) -> f32 {
    (w >> 8) as f32 / 16_777_216.0
}

#[cfg(test)]
mod tests {
    use super::unit_interval;

    /// CI failure (stop 27): a ciphertext word near 2^32 became the feature
    /// 1.0, outside [0, 1), because `u32 as f32` rounds to 24 bits.
    #[test]
    fn largest_words_stay_below_one() {
        for w in [
            u32::MAX,
            u32::MAX - 127,
            u32::MAX - 128,
            1 << 31,
            0,
            255,
            256,
        ] {
            let v = unit_interval(w);
            assert!((0.0..1.0).contains(&v), "{w} -> {v}");
        }
        assert_eq!(unit_interval(0), 0.0);
        assert_eq!(unit_interval(1 << 31), 0.5);
        assert!(unit_interval(u32::MAX) > unit_interval(u32::MAX - 256));
    }
}

//! What the HE-LoRA server receives, as attacker features: `dim` words of each state's packed `c0`
//! under a fresh per-window key (RLWE; CKKS 2017), which must score at the baseline.

use cipherlora_ckks::{CkksParameters, Context, Encoder, Encryptor, Preset, SecretKey};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

use crate::{AttackError, Result};

/// Bytes before the packed `c0` of a seeded ciphertext: header, scale, seed.
pub const SEEDED_PREFIX: usize = 16 + 8 + 32;

/// The CKKS parameters: N = 8192, moduli 60 + 40 bits, Δ = 2^40.
pub const PRESET: Preset = Preset::N8192Depth1;

/// Ciphertext features ((positions, `dim`) in [0, 1)) of `states` ((positions, `hidden`)), a key
/// per window, seeded. Errors: [`AttackError::Input`] for bad sizes; CKKS errors.
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

/// A word's top 24 bits over 2^24: exact in f32 and below 1.
fn unit_interval(w: u32) -> f32 {
    (w >> 8) as f32 / 16_777_216.0
}

#[cfg(test)]
mod tests {
    use super::unit_interval;

    /// A word near 2^32 maps below 1.0 (`u32 as f32` would round to 1.0).
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

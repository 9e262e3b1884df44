//! Shared helpers of the integration tests.
#![allow(dead_code)]

use std::sync::Arc;

use cipherlora_ckks::*;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

pub struct Fixture {
    pub ctx: Arc<Context>,
    pub enc: Encoder,
    pub sk: SecretKey,
    pub ev: Evaluator,
    pub rng: ChaCha20Rng,
}

pub fn fixture(preset: Preset, seed: u8) -> Fixture {
    let ctx = Context::new(CkksParameters::preset(preset).unwrap()).unwrap();
    let mut rng = ChaCha20Rng::from_seed([seed; 32]);
    let sk = SecretKey::generate(&ctx, &mut rng);
    Fixture {
        enc: Encoder::new(&ctx),
        ev: Evaluator::new(&ctx),
        ctx,
        sk,
        rng,
    }
}

pub fn values(n: usize, seed: u64, amp: f64) -> Vec<f64> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * amp
        })
        .collect()
}

/// Largest absolute error, in bits of precision relative to 1: −log2(max err).
pub fn precision_bits(got: &[f64], want: &[f64]) -> f64 {
    let err = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f64, f64::max);
    -err.log2()
}

//! Randomness: OS-seeded ChaCha20, ternary secrets, bounded discrete Gaussian errors (σ = 3.2, |e|
//! ≤ 19, as in the HE standard), and public uniform polynomials expanded from 32-byte seeds with
//! ChaCha8. Secret-dependent sampling is branch-free.

use std::sync::OnceLock;

use rand::{CryptoRng, Rng, RngExt, SeedableRng};
use rand_chacha::{ChaCha8Rng, ChaCha20Rng};

use crate::context::Context;
use crate::error::{CkksError, Result};

/// Standard deviation of the error distribution (HE standard: 8/√(2π) ≈ 3.19).
pub const SIGMA: f64 = 3.2;
/// Errors are bounded by `ERROR_BOUND` (≈ 6σ) in absolute value.
pub const ERROR_BOUND: i64 = 19;

/// A ChaCha20 generator seeded from the OS (getrandom). Errors: [`CkksError::Rng`].
pub fn os_rng() -> Result<ChaCha20Rng> {
    Ok(ChaCha20Rng::from_seed(os_seed()?))
}

/// 32 bytes from the OS CSPRNG. Errors: [`CkksError::Rng`].
pub fn os_seed() -> Result<[u8; 32]> {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| CkksError::Rng(e.to_string()))?;
    Ok(seed)
}

/// `n` ternary coefficients, uniform in {−1, 0, 1}.
pub(crate) fn ternary<R: CryptoRng + ?Sized>(rng: &mut R, n: usize) -> Vec<i8> {
    (0..n)
        .map(|_| (((rng.next_u32() as u64 * 3) >> 32) as i8) - 1)
        .collect()
}

fn cdt() -> &'static [u32; 2 * ERROR_BOUND as usize] {
    static TABLE: OnceLock<[u32; 2 * ERROR_BOUND as usize]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let w: Vec<f64> = (-ERROR_BOUND..=ERROR_BOUND)
            .map(|k| (-(k * k) as f64 / (2.0 * SIGMA * SIGMA)).exp())
            .collect();
        let total: f64 = w.iter().sum();
        let mut t = [0u32; 2 * ERROR_BOUND as usize];
        let mut acc = 0.0;
        for (i, slot) in t.iter_mut().enumerate() {
            acc += w[i];
            // P(X ≤ −B + i) scaled to 2^32.
            *slot = ((acc / total) * 4_294_967_296.0).min(u32::MAX as f64) as u32;
        }
        t
    })
}

/// `n` errors from the discrete Gaussian of width σ, truncated to ±19, by branch-free inversion
/// sampling (table exact to 2^-32).
pub(crate) fn gaussian<R: CryptoRng + ?Sized>(rng: &mut R, n: usize) -> Vec<i8> {
    let t = cdt();
    let mut words = vec![0u32; n];
    rng.fill(&mut words[..]);
    let mut above = vec![0u8; n];
    crate::modular::vectorized(|| {
        for &c in t.iter() {
            for (a, &r) in above.iter_mut().zip(&words) {
                *a += (r >= c) as u8;
            }
        }
    });
    above
        .into_iter()
        .map(|a| (a as i64 - ERROR_BOUND) as i8)
        .collect()
}

/// `n` uniform 64-bit words from one bulk draw of `8n` bytes (little-endian words, as `fill`
/// defines them).
fn random_words<R: Rng + ?Sized>(rng: &mut R, n: usize) -> Vec<u64> {
    let mut words = vec![0u64; n];
    rng.fill(&mut words[..]);
    words
}

/// Writes small signed coefficients (|x| < q) into `[0, q)` without branching on their value.
#[inline(always)]
pub(crate) fn small_to_mod(x: i8, q: u64) -> u64 {
    let t = (x as i64 + q as i64) as u64;
    t - q * ((t >= q) as u64)
}

/// Fills `out` (one limb of N words per listed prime) with coefficients uniform mod each prime,
/// from ChaCha8 keyed by `seed` on `stream` (rejection sampling); deterministic, and part of format
/// version 2 ([`crate::serialize::FORMAT_VERSION`]). Eight rounds suffice for public polynomials
/// (Aumasson, "Too Much Crypto", ePrint 2019/1492); see docs/design/code-notes.md, "ckks:
/// sampling".
pub(crate) fn expand_uniform(
    ctx: &Context,
    seed: &[u8; 32],
    stream: u64,
    primes: impl Iterator<Item = usize>,
    out: &mut [u64],
) {
    let n = ctx.degree();
    let mut rng = ChaCha8Rng::from_seed(*seed);
    rng.set_stream(stream);
    for (limb, i) in out.chunks_exact_mut(n).zip(primes) {
        let q = ctx.prime(i);
        let mask = u64::MAX >> q.leading_zeros();
        let mut filled = 0;
        for w in random_words(&mut rng, n) {
            let r = w & mask;
            if r < q {
                limb[filled] = r;
                filled += 1;
            }
        }
        while filled < n {
            let r = rng.next_u64() & mask;
            if r < q {
                limb[filled] = r;
                filled += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaussian_has_the_stated_width_and_bound() {
        let mut rng = ChaCha20Rng::from_seed([7; 32]);
        let e = gaussian(&mut rng, 200_000);
        let mean = e.iter().map(|&x| x as f64).sum::<f64>() / e.len() as f64;
        let var = e.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / e.len() as f64;
        assert!(mean.abs() < 0.03, "mean {mean}");
        assert!((var.sqrt() - SIGMA).abs() < 0.03, "sigma {}", var.sqrt());
        assert!(e.iter().all(|&x| (x as i64).abs() <= ERROR_BOUND));
    }

    #[test]
    fn ternary_is_balanced() {
        let mut rng = ChaCha20Rng::from_seed([9; 32]);
        let s = ternary(&mut rng, 90_000);
        for v in -1..=1i8 {
            let c = s.iter().filter(|&&x| x == v).count();
            assert!((c as i64 - 30_000).abs() < 600, "{v}: {c}");
        }
    }

    /// FNV-1a over the little-endian bytes of the words.
    fn fnv1a(words: &[u64]) -> u64 {
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for b in words.iter().flat_map(|w| w.to_le_bytes()) {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        h
    }

    /// Known-answer pin of format version 2's seed expansion (cross-checked against an independent
    /// ChaCha8): any change needs a new `FORMAT_VERSION`.
    #[test]
    fn expand_uniform_matches_format_version_2_vectors() {
        use crate::params::{CkksParameters, Preset};
        assert_eq!(crate::serialize::FORMAT_VERSION, 2);
        let ctx = Context::new(CkksParameters::preset(Preset::N8192Depth2Fast).unwrap()).unwrap();
        let n = ctx.degree();
        let seed: [u8; 32] = std::array::from_fn(|i| i as u8);
        // A seeded ciphertext's `a` (stream 0, chain primes) and a Galois key digit's (stream 2,
        // chain primes and P).
        let chain: Vec<usize> = (0..=ctx.max_level()).collect();
        let qp: Vec<usize> = ctx.qp_primes(ctx.max_level()).collect();
        for (stream, primes, want_head, want_hash) in [
            (
                0u64,
                &chain,
                [864690996647232, 779766267832537, 477807177601015],
                0x7b5d9e654bc1c612,
            ),
            (
                2,
                &qp,
                [757935738786698, 37899081039394, 649649560489001],
                0x8907d065c17ba86a,
            ),
        ] {
            let mut out = vec![0u64; primes.len() * n];
            expand_uniform(&ctx, &seed, stream, primes.iter().copied(), &mut out);
            for (limb, &i) in out.chunks_exact(n).zip(primes.iter()) {
                assert!(limb.iter().all(|&x| x < ctx.prime(i)));
            }
            assert_eq!(&out[..3], &want_head, "stream {stream}");
            assert_eq!(fnv1a(&out), want_hash, "stream {stream}");
        }
    }

    #[test]
    fn small_to_mod_is_congruent() {
        let q = 1_099_511_480_321u64;
        for x in -19i8..=19 {
            assert_eq!(
                small_to_mod(x, q) as i128,
                (x as i128).rem_euclid(q as i128)
            );
        }
    }
}

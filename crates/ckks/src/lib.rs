//! RNS-CKKS homomorphic encryption, specialised for encrypted LoRA deltas but
//! knowing nothing of LoRA or models.
//!
//! * Scheme: full-RNS CKKS (Cheon–Kim–Kim–Song, Asiacrypt 2017;
//!   Cheon–Han–Kim–Kim–Song, SAC 2018), ciphertexts and plaintexts kept in
//!   NTT form throughout (tfhe-ntt 0.7 `prime64` plans: AVX-512 IFMA for
//!   primes < 2^50, AVX-512 otherwise).
//! * Key switching: hybrid, one special prime, one chain prime per digit
//!   (Bossuat et al., Eurocrypt 2021); hoisted rotations (Halevi–Shoup,
//!   Crypto 2018) and double hoisting (Bossuat et al., §4.2): rotations kept
//!   over `Q·P` ([`ExtendedCiphertext`]), multiplied by plaintexts encoded
//!   over `Q·P` ([`ExtendedPlaintext`], [`ExtendedMulAccumulator`]) and
//!   brought down once, by a ModDown fused with the following rescale
//!   ([`Evaluator::mod_down_rescale`]).
//! * RNS inner loops (centered lifts, ModDown, rescale, encoding) are
//!   branch-free and vectorized: constant products run as tfhe-ntt SIMD
//!   products by precomputed constant vectors.
//! * Security: 128-bit HE-standard parameter sets only
//!   ([`params::SecurityBound`]); randomness from the OS CSPRNG through
//!   ChaCha20; seeded uniform parts halve upload sizes (public seeds are
//!   expanded with ChaCha8).
//!
//! * Downloads: level-0 ciphertexts compress lossily by modulus switching
//!   to a power of two and dropping headroom and low bits
//!   ([`compress`], Brakerski–Vaikuntanathan modulus switching, Kyber-style
//!   compression), with a chooser that bounds the added error.
//! * Uploads: fresh seeded ciphertexts drop low bits of `c0` for requests
//!   that need less precision ([`rounded`], the same Kyber-style
//!   compression on the part not multiplied by the secret; levels are
//!   kept), with [`rounded::max_dropped_bits`] bounding the added error.
//!
//! * Parallelism: single-threaded by default; [`Evaluator::with_parallelism`]
//!   runs ModUp digits and independent hoisted rotations on rayon.
//!
//! # Precision (tested bounds, absolute error on slots)
//!
//! | operation | bound | test |
//! | --- | --- | --- |
//! | encode → decode, \|v\| ≤ 100, Δ = 2^40 | ≤ 2^-30 | `prop_encode_decode` |
//! | secret-key encrypt → decrypt, \|v\| ≤ 4 | ≤ 2^-25 | `encrypt_decrypt_sk_and_pk_every_preset` |
//! | public-key encrypt → decrypt | ≤ 2^-20 (√N more noise) | same |
//! | ct×pt + rescale, \|x\|, \|w\| ≤ 8, Δ = 2^40 | ≤ 2^-25 | `prop_ct_pt_rescale_precision` |
//! | rotate / hoisted rotate after ct×pt + rescale | ≤ 2^-22 | `prop_rotate_random_steps` |
//! | double-hoisted dot product (5 terms, \|x\| ≤ 2, \|w\| ≤ 1.5) | ≤ 2^-20 | `double_hoisted_dot_product_matches_plain_path_and_reference` |
//! | compress → decrypt, vs uncompressed, \|v\| ≤ M | ≤ [`CompressionParams::predicted_error`] ≤ M·2^-P | `compressed_decryption_matches_uncompressed_to_the_predicted_precision` |
//! | round low bits of `c0` → decrypt, vs unrounded | ≤ [`rounded::predicted_error`] | `rounding_adds_at_most_the_predicted_error_at_every_level` |
//!
//! The fast presets (`*Fast`, 50-bit `q_0`) bound decrypted values at
//! level 0 by `q_0 / (2Δ) = 2^9`; the 60-bit presets by `2^19`.
//!
//! # Storage conventions
//!
//! Ciphertexts and plaintexts are in NTT (evaluation) form at all times, in
//! tfhe-ntt's bit-reversed order; rotations are slot permutations computed
//! from that order ([`Context`]). Encoded plaintexts and keys are stored
//! multiplied by N so each product is one SIMD `mul_assign_normalize`.
//!
//! ```
//! use cipherlora_ckks::*;
//! let ctx = Context::new(CkksParameters::preset(Preset::N8192Depth1).unwrap()).unwrap();
//! let mut rng = os_rng().unwrap();
//! let sk = SecretKey::generate(&ctx, &mut rng);
//! let enc = Encoder::new(&ctx);
//! let pt = enc.encode(&[1.0, 2.0, 3.0], ctx.max_level(), ctx.params().scale()).unwrap();
//! let ct = Encryptor::new(&ctx).encrypt_sk(&pt, &sk, &mut rng).unwrap().expand();
//! let w = enc.encode(&[0.5, 0.5, 0.5], ctx.max_level(), ctx.params().scale()).unwrap();
//! let ev = Evaluator::new(&ctx);
//! let prod = ev.rescale(&ev.mul_plain(&ct, &w).unwrap()).unwrap();
//! let out = enc.decode(&Decryptor::new(&sk).decrypt(&prod).unwrap());
//! assert!((out[2] - 1.5).abs() < 1e-5);
//! ```

pub mod ciphertext;
pub mod compress;
pub mod context;
pub mod decrypt;
#[cfg(test)]
mod differential_tests;
pub mod encoder;
pub mod encrypt;
pub mod error;
pub mod evaluator;
pub mod hoisting;
pub mod keys;
mod keyswitch;
mod lazy_dot;
pub mod modular;
pub mod params;
pub mod plaintext;
mod pool;
pub mod rounded;
pub mod sampling;
mod scale;
pub mod serialize;

pub use ciphertext::{Ciphertext, SeededCiphertext};
pub use compress::{CompressedCiphertext, CompressionParams};
pub use context::Context;
pub use decrypt::Decryptor;
pub use encoder::Encoder;
pub use encrypt::Encryptor;
pub use error::{CkksError, Result};
pub use evaluator::{Evaluator, MulAccumulator};
pub use hoisting::{ExtendedCiphertext, ExtendedMulAccumulator, HoistedCiphertext};
pub use keys::{GaloisKey, GaloisKeys, PublicKey, SecretKey};
pub use params::{CkksParameters, Preset, SecurityBound};
pub use plaintext::{ExtendedPlaintext, Plaintext};
pub use rounded::RoundedSeededCiphertext;
/// Complex slot values ([`Encoder::encode_complex`], [`Encoder::decode_complex`]).
pub use rustfft::num_complex::Complex64;
pub use sampling::{os_rng, os_seed};
pub use serialize::ObjectKind;

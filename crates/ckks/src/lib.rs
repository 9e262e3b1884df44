//! RNS-CKKS homomorphic encryption (full-RNS CKKS: Cheon–Kim–Kim–Song, Asiacrypt 2017;
//! Cheon–Han–Kim–Kim–Song, SAC 2018), knowing nothing of LoRA or models. This crate owns parameters
//! ([`params`], 128-bit HE-standard sets only), encoding, keys, encryption, evaluation with hybrid
//! key switching and (double) hoisting (Bossuat et al., EUROCRYPT 2021; Halevi–Shoup, CRYPTO 2018),
//! compressed downloads ([`compress`]) and uploads ([`rounded`]) and serialization; [`bfv`] runs
//! exact batched BFV over `Z_t` on the same ring, keys and evaluator. Start at
//! [`Context`], [`Encoder`] and [`Evaluator`]; tested precision bounds and storage conventions:
//! docs/design/code-notes.md, "ckks".
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

pub mod bfv;
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
#[cfg(target_arch = "x86_64")]
mod fma;
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

pub use bfv::BatchEncoder;
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

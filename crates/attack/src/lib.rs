//! Inversion attacks on the hidden states a split-inference server sees, and the same attackers
//! against what the HE-LoRA server sees: learned inverters ([`learned`]), the exact search with
//! public weights ([`exact`], SipIt), the inverters on CKKS ciphertexts ([`ciphertext`]), the data
//! ([`dataset`]). Start at [`study`], which produces a [`report::AttackReport`].

pub mod ciphertext;
pub mod dataset;
mod error;
pub mod exact;
pub mod learned;
pub mod report;
pub mod study;

pub use error::{AttackError, Result};

//! Inversion attacks on the hidden states a split-inference server sees
//! (issue 17), and the same attackers against what the HE-LoRA server sees.
//!
//! A split deployment runs the first `a` decoder layers on the client and
//! sends the residual stream (T, hidden) to a server. This crate measures how
//! much of the prompt that stream gives away, at depths such as 1, 2, 4, 8:
//!
//! * [`learned`]: linear and MLP inverters trained on public text (state →
//!   token), evaluated on held-out works and code;
//! * [`exact`]: a search with the public weights (SipIt, arXiv 2510.15511),
//!   position by position, for the token whose state matches;
//! * [`ciphertext`]: the learned inverters on CKKS ciphertexts of the same
//!   states (what the HE-LoRA adapter server receives), which must score at
//!   the frequency baseline;
//! * [`dataset`]: corpus split, token windows and states;
//! * [`study`]: all of it, producing a [`report::AttackReport`] (JSON and
//!   Markdown).

pub mod ciphertext;
pub mod dataset;
mod error;
pub mod exact;
pub mod learned;
pub mod report;
pub mod study;

pub use error::{AttackError, Result};

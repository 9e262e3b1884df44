//! Split inference (issue 17): the client keeps the token embedding, the
//! first `a` and last `b` decoder layers, the final norm and the output
//! head; an untrusted server runs the middle layers `[a, L − b)` on the
//! client's hidden states. Raw tokens and logits never leave the client,
//! but the hidden states travel in plaintext: the privacy is empirical
//! only (BENCHMARKS.md, "Inversion attacks on split activations"; HE-LoRA
//! is the mode with cryptographic privacy).
//!
//! - [`backend`]: the server side, [`ModelBackend`], a
//!   [`cipherlora_service::SplitBackend`] over a [`cipherlora_model::Model`]
//!   (served over gRPC by `cipherlora_service`'s server, TLS and tokens
//!   included).
//! - [`middle`]: where the client's middle layers run: [`MiddleLayers`],
//!   implemented by the gRPC client and, for references, in process.
//! - [`draft`]: drafters: prompt lookup (`cipherlora_spec::ngram`),
//!   lookahead decoding (Fu et al. 2024: a Jacobi window and an n-gram
//!   pool verified as one token tree per round trip) and none.
//! - [`replay`]: [`ReplayingClient`], the gRPC client that reopens a lost
//!   session and replays the prefix the server held.
//! - [`decode`]: generation, K+1 positions (or a lookahead tree) verified
//!   per round trip, local and remote KV rolled back (or compacted) to the
//!   accepted prefix; greedy output is the
//!   whole model's greedy output, sampled output follows its sampling
//!   distribution (exact speculative sampling, `accept`).

mod accept;
pub mod backend;
pub mod decode;
pub mod draft;
mod error;
pub mod middle;
pub mod replay;

pub use backend::ModelBackend;
pub use decode::{SplitConfig, SplitOutput, SplitStep, generate};
pub use draft::{Drafter, Lookahead};
pub use error::SplitError;
pub use middle::{Forwarded, InProcess, MiddleLayers, MiddlePass};
pub use replay::ReplayingClient;

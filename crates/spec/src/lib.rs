//! Speculative decoding for private inference.
//!
//! An encrypted verify pass costs about the same for one position as for
//! many SIMD slots, so the client drafts K tokens cheaply, verifies all K+1
//! positions in one batched forward pass (one round trip per adapted layer
//! group) and keeps the longest acceptable prefix plus one bonus token.
//!
//! This crate holds the parts that do not depend on a model or on HE:
//! - [`acceptance`]: greedy acceptance (longest matching prefix + bonus token)
//!   and exact speculative sampling (Leviathan et al. 2023, "Fast Inference
//!   from Transformers via Speculative Decoding", Algorithm 1; Chen et al.
//!   2023), which makes the output follow the adapted model's distribution
//!   exactly whatever the drafter proposes.
//! - [`draw_bounds`]: deciding a sampled round's draws from a bound on its
//!   logits, so a fixed-point round needs no more trips than its draws do.
//! - [`ngram`]: the prompt-lookup (n-gram) drafter, which costs nothing.
//! - [`decode`]: the generation loop over a [`cipherlora_model::Model`]:
//!   drafting, one verify pass per round through a delta hook, KV rollback.
//! - [`tree`], [`tree_draft`]: draft trees (several candidate
//!   continuations verified in one pass under a tree attention mask), their
//!   growth by the base drafter and their greedy and sampled acceptance.
//! - [`tree_plan`]: expected tokens per round of a chain or of the best
//!   tree of the same node budget (Sequoia's positional acceptance), the
//!   width model's reason to pick one or the other.
//! - [`prefix_cache`]: the adapted keys and values of recent contexts, so
//!   that a chat's next request prefills only its new tokens.
//! - [`adaptive`]: choosing K per round from the observed acceptance rate
//!   and the measured cost of a round.
//!
//! Design choice: acceptance works on plain probability vectors and token
//! ids, so the same code serves the plaintext reference, the private path
//! and the statistical tests; nothing here can tell whether the deltas came
//! from a ciphertext.

pub mod acceptance;
pub mod adaptive;
pub mod decode;
pub mod draft_bias;
mod drafted_inputs;
pub mod draw_bounds;
mod error;
pub mod ngram;
pub mod prefix_cache;
pub mod race;
mod row_deltas;
pub mod schedule;
pub mod target_probs;
pub mod tree;
pub mod tree_draft;
pub mod tree_plan;

pub use error::SpecError;

//! Speculative decoding for private inference: an encrypted verify pass
//! costs about the same for one position as for many, so the client drafts
//! K tokens cheaply, verifies K+1 positions in one pass and keeps the longest
//! acceptable prefix plus a bonus token. Nothing here depends on HE:
//! acceptance works on probability vectors and token ids, so the same code
//! serves the plaintext reference, the private path and the statistical
//! tests. Start with [`decode`] (the generation loop), then [`acceptance`]
//! (greedy and exact speculative sampling, Leviathan et al. 2023, Alg. 1),
//! [`schedule`] (per-group and fixed-point passes) and [`tree`] (draft trees).

pub mod acceptance;
pub mod adaptive;
pub mod context_drafter;
pub mod decode;
pub mod draft_bias;
mod drafted_inputs;
pub mod draw_bounds;
mod error;
pub mod ngram;
pub mod prefix_cache;
pub mod race;
pub mod replay;
mod row_deltas;
pub mod schedule;
pub mod target_probs;
pub mod tree;
pub mod tree_draft;
pub mod tree_plan;

pub use context_drafter::ContextDrafter;
pub use error::{ConfigError, SpecError, TreeFault};

//! The crate's error type.

/// Errors of speculative decoding.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// The verifier returned a number of positions that does not match the draft: verifying K
    /// drafts needs exactly K+1 target rows.
    #[error("verify returned {got} target rows for {drafts} drafts (expected drafts + 1)")]
    TargetCount {
        /// Number of drafted tokens.
        drafts: usize,
        /// Number of target rows (logits or probability vectors) supplied.
        got: usize,
    },
    /// A drafter's probability rows do not match its drafted tokens.
    #[error("drafter gave {got} probability rows for {drafts} drafts")]
    DraftProbCount {
        /// Number of drafted tokens.
        drafts: usize,
        /// Number of draft probability rows supplied.
        got: usize,
    },
    /// A probability vector is not a distribution over the vocabulary.
    #[error("probability row {row} is invalid: {reason}")]
    BadDistribution {
        /// Index of the offending row.
        row: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A round's pre-drawn uniforms do not cover its target rows
    /// ([`crate::acceptance::accept_sampled_with`]).
    #[error("{got} rows of uniforms for {rows} target rows")]
    UniformCount {
        /// Number of target rows.
        rows: usize,
        /// Number of rows of uniforms supplied.
        got: usize,
    },
    /// Rank acceptance rates that are not probabilities of disjoint events.
    #[error("invalid acceptance by rank: {reason}")]
    BadRankAcceptance {
        /// What is wrong with them.
        reason: String,
    },
    /// A drafted token id lies outside the vocabulary.
    #[error("draft token {token} at index {index} is outside the vocabulary of {vocab}")]
    TokenOutOfVocab {
        /// Position in the draft.
        index: usize,
        /// The token id.
        token: u32,
        /// Vocabulary size.
        vocab: usize,
    },
    /// The generation was configured inconsistently (empty prompt, K = 0 with a drafter, …).
    #[error("invalid generation settings: {0}")]
    Config(String),
    /// Returned by an `on_tokens` callback to stop early; the generator then returns `Ok` with
    /// [`SpecOutput::stopped_by_caller`](crate::decode::SpecOutput) set.
    #[error("the caller stopped the generation")]
    Stopped,
    /// The forward pass, the sampler or the delta hook (in private mode: the HE client or the
    /// transport) failed.
    #[error(transparent)]
    Model(#[from] cipherlora_model::ModelError),
}

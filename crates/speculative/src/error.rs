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
    Config(#[from] ConfigError),
    /// A draft tree or its proposals are inconsistent.
    #[error("invalid draft tree: {0}")]
    Tree(#[from] TreeFault),
    /// The draft-ahead thread panicked (optimistic drafting); the generation cannot go on.
    #[error("the draft-ahead thread panicked")]
    DraftAheadPanicked,
    /// An invariant of the decoder broke: a bug, never bad input.
    #[error("decoder invariant broken: {what}")]
    Invariant {
        /// Which invariant.
        what: &'static str,
    },
    /// Returned by an `on_tokens` callback to stop early; the generator then returns `Ok` with
    /// [`SpecOutput::stopped_by_caller`](crate::decode::SpecOutput) set.
    #[error("the caller stopped the generation")]
    Stopped,
    /// The forward pass, the sampler or the delta hook (in private mode: the HE client or the
    /// transport) failed.
    #[error(transparent)]
    Model(#[from] cipherlora_model::ModelError),
}

/// Settings a generation cannot run with ([`SpecError::Config`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The prompt has no token.
    #[error("empty prompt")]
    EmptyPrompt,
    /// A drafter was asked for K = 0 drafted tokens.
    #[error("a drafter needs K ≥ 1")]
    ZeroK,
    /// A replay acceptance outside [0, 1].
    #[error("replay acceptance {acceptance} is not in [0, 1]")]
    ReplayAcceptance {
        /// The acceptance asked for.
        acceptance: f64,
    },
    /// A replay over fewer than two tokens (a rejected draft needs another token).
    #[error("replay needs a vocabulary of at least two tokens, got {vocab}")]
    ReplayVocabulary {
        /// The vocabulary size given.
        vocab: usize,
    },
    /// A separate draft model was asked for tree drafts.
    #[error("tree drafts need a copy of the target's weights, not a separate draft model")]
    TreeWithSeparateDrafter,
    /// A copy of the target's weights (e.g. quantized) whose shape differs from the target's.
    #[error("the draft model's layers, KV heads, head size or vocabulary differ from the target's")]
    DraftCopyShape,
    /// A separate draft model with another vocabulary (another tokenizer).
    #[error(
        "the draft model's vocabulary ({draft}) differs from the target's ({target}): it needs the same tokenizer"
    )]
    DraftVocabulary {
        /// The draft model's vocabulary size.
        draft: usize,
        /// The target's.
        target: usize,
    },
    /// A prefix cache with a budget of 0 bytes.
    #[error("a prefix cache needs a memory budget above 0 bytes (turn it off instead)")]
    ZeroCacheBudget,
    /// A setting's text form did not parse.
    #[error("unknown {what} {given:?} (expected {expected})")]
    Unparsed {
        /// Which setting.
        what: &'static str,
        /// The text given (cut to 64 characters).
        given: String,
        /// The forms accepted.
        expected: &'static str,
    },
}

impl ConfigError {
    /// [`ConfigError::Unparsed`] for `given` (cut to 64 characters).
    pub(crate) fn unparsed(what: &'static str, given: &str, expected: &'static str) -> Self {
        Self::Unparsed {
            what,
            given: given.chars().take(64).collect(),
            expected,
        }
    }
}

/// What is wrong with a draft tree or its proposals ([`SpecError::Tree`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TreeFault {
    /// The parent array's length differs from the token list's.
    #[error("{tokens} tokens but {parents} parents")]
    ParentCount {
        /// Tokens (nodes).
        tokens: usize,
        /// Parents given.
        parents: usize,
    },
    /// A node's parent is not an earlier node.
    #[error("node {node}'s parent is not an earlier node")]
    ParentNotEarlier {
        /// The node.
        node: usize,
    },
    /// The tree (plus its root) does not fit the verify pass.
    #[error("{nodes} nodes do not fit a verify pass of {width} positions")]
    TooWide {
        /// Nodes of the tree.
        nodes: usize,
        /// Positions of the verify pass.
        width: usize,
    },
    /// Another number of proposal rows than nodes.
    #[error("{got} proposals for {nodes} nodes")]
    ProposalCount {
        /// Proposal rows given.
        got: usize,
        /// Nodes of the tree.
        nodes: usize,
    },
    /// A sampled node is not its parent's first child.
    #[error("node {node} was sampled but is not its parent's first child")]
    SampledNotFirstChild {
        /// The node.
        node: usize,
    },
}

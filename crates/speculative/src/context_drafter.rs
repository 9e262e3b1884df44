//! Drafters that guess from the context alone, running no model: prompt
//! lookup and adaptive prompt lookup ([`crate::ngram`]) and replayed
//! reference drafts ([`crate::replay`]). Private decoding drafts chains
//! through this trait (alone, or as the lookup half of the hybrid drafter);
//! split decoding drafts its chains and its lookahead fallback through it.

/// Proposes the tokens to follow a context from the context alone.
///
/// Implementations are deterministic functions of `(context, k)` and their
/// own settings: a draft that is rejected costs verify positions, never
/// correctness (acceptance decides what is kept).
pub trait ContextDrafter {
    /// Up to [`ContextDrafter::max_drafts`]`(k)` tokens to follow `context`;
    /// fewer, or none, when it has no guess.
    fn draft(&self, context: &[u32], k: usize) -> Vec<u32>;

    /// The most tokens [`ContextDrafter::draft`] proposes for `k` (K unless
    /// the drafter lengthens its drafts on strong evidence).
    fn max_drafts(&self, k: usize) -> usize {
        k
    }
}

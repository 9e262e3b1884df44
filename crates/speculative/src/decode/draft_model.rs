//! Which weights the base drafter runs: a copy of the target's, or a
//! separate network with its vocabulary.

use cipherlora_model::Model;

use super::SpecConfig;
use crate::{ConfigError, SpecError};

/// The model the base drafter runs ([`super::ChainDrafter::Base`], the base half of
/// [`super::ChainDrafter::Hybrid`], tree drafts).
#[derive(Debug, Clone, Copy)]
pub enum DraftModel<'m> {
    /// The target or a copy of its weights ([`Model::to_f16_weights`],
    /// [`Model::fast_drafter`]): its KV cache copies the target's adapted rows
    /// before each draft, so it drafts over the adapted prefix, and
    /// delta-guided drafting applies.
    Copy(&'m Model),
    /// Another network with the target's vocabulary, e.g. a 1B model drafting
    /// for an 8B target (Leviathan et al., ICML 2023, §2): it keeps its own KV
    /// cache, fed the context's tokens, drafts chains only, and neither delta
    /// guidance nor drafted starts apply (its activations are not the
    /// target's).
    Separate(&'m Model),
}

impl<'m> DraftModel<'m> {
    /// The drafter's weights.
    #[must_use]
    pub fn model(self) -> &'m Model {
        match self {
            DraftModel::Copy(m) | DraftModel::Separate(m) => m,
        }
    }

    /// Whether the drafter is another network ([`DraftModel::Separate`]).
    #[must_use]
    pub fn is_separate(self) -> bool {
        matches!(self, DraftModel::Separate(_))
    }
}

impl<'m> From<&'m Model> for DraftModel<'m> {
    fn from(m: &'m Model) -> Self {
        DraftModel::Copy(m)
    }
}

/// Errors: [`SpecError::Config`] ([`ConfigError::DraftCopyShape`],
/// `DraftVocabulary`, `TreeWithSeparateDrafter`) when a copy's layers, KV heads, head size
/// or vocabulary differ from the target's, when a separate drafter's
/// vocabulary does, or when a separate drafter is asked for trees.
pub(super) fn check_draft_model(
    model: &Model,
    drafting: DraftModel<'_>,
    cfg: &SpecConfig,
) -> Result<(), SpecError> {
    let (t, d) = (model.config(), drafting.model().config());
    match drafting {
        DraftModel::Copy(_)
            if (t.num_layers, t.num_kv_heads, t.head_dim, t.vocab_size)
                != (d.num_layers, d.num_kv_heads, d.head_dim, d.vocab_size) =>
        {
            Err(ConfigError::DraftCopyShape.into())
        }
        DraftModel::Separate(_) if t.vocab_size != d.vocab_size => {
            Err(ConfigError::DraftVocabulary {
                draft: d.vocab_size,
                target: t.vocab_size,
            }
            .into())
        }
        DraftModel::Separate(_) if cfg.drafting.tree_drafts().is_some() => {
            Err(ConfigError::TreeWithSeparateDrafter.into())
        }
        _ => Ok(()),
    }
}

//! The base drafter's model: the target's own weights in some form
//! (`--draft-weights`), or a separate, smaller network with the target's
//! tokenizer (`--draft-model`).

use std::borrow::Cow;
use std::path::Path;

use anyhow::Context as _;
use cipherlora_model::{LoadOptions, Model, Tokenizer, WeightMode};
use cipherlora_speculative::decode::DraftModel;

use crate::cmd::demo::DraftWeightsArg;

/// Text whose token ids must match between the two tokenizers.
const PROBE: &str = "def greet(name):\n    return f\"Hello, {name}!\"  # The café's 3 menus.";

/// The drafter's model, owned or borrowed from the target.
#[derive(Debug)]
pub enum DrafterModel<'a> {
    /// The target's weights, as `--draft-weights` holds them.
    Copy(Cow<'a, Model>),
    /// A separate network (`--draft-model`).
    Separate(Box<Model>),
}

impl<'a> DrafterModel<'a> {
    /// `path`'s model (quantized weights as stored) when given, else
    /// `weights`'s form of `target`. Errors: an unreadable model, or a
    /// separate model whose tokenizer differs from `tokenizer` (another
    /// vocabulary size, or other ids for the same text).
    pub fn new(
        target: &'a Model,
        weights: DraftWeightsArg,
        path: Option<&Path>,
        tokenizer: &Tokenizer,
    ) -> anyhow::Result<Self> {
        let Some(path) = path else {
            return Ok(Self::Copy(weights.drafter(target)?));
        };
        let options = LoadOptions {
            weights: WeightMode::Quantized,
        };
        let model = Model::load_with(path, &options)
            .with_context(|| format!("loading the draft model {}", path.display()))?;
        let theirs = Tokenizer::for_model(path)
            .with_context(|| format!("reading the draft model's tokenizer ({})", path.display()))?;
        anyhow::ensure!(
            theirs.vocab_size() == tokenizer.vocab_size()
                && theirs.encode(PROBE)? == tokenizer.encode(PROBE)?,
            "the draft model {} has another tokenizer than the target ({} tokens against {}): a \
             draft model must share the target's tokenizer",
            path.display(),
            theirs.vocab_size(),
            tokenizer.vocab_size()
        );
        Ok(Self::Separate(Box::new(model)))
    }

    /// The weights drafts run on.
    pub fn model(&self) -> &Model {
        match self {
            Self::Copy(m) => m,
            Self::Separate(m) => m,
        }
    }

    /// What the decoder gets ([`DraftModel`]).
    pub fn draft_model(&self) -> DraftModel<'_> {
        match self {
            Self::Copy(m) => DraftModel::Copy(m),
            Self::Separate(m) => DraftModel::Separate(m),
        }
    }
}

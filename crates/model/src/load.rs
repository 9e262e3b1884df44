//! Loading a model: a GGUF file or a Hugging Face folder, by path.

use std::path::Path;

use crate::weights::{LoadOptions, WeightMode};
use crate::{Model, ModelError};

impl Model {
    /// Loads a GGUF file or an HF folder (config.json + *.safetensors). Errors: see [`ModelError`]:
    /// I/O, malformed or truncated files, missing tensors, shape mismatches, unsupported
    /// architectures.
    pub fn load(path: &Path) -> Result<Self, ModelError> {
        Self::load_with(path, &LoadOptions::default())
    }

    /// [`Model::load`] with options; errors as there.
    pub fn load_with(path: &Path, opts: &LoadOptions) -> Result<Self, ModelError> {
        let model = if path.is_dir() {
            crate::hf::load(path)?
        } else {
            crate::gguf::load(path, opts)?
        };
        if opts.weights == WeightMode::F16 {
            model.to_f16_weights()
        } else {
            Ok(model)
        }
    }

    /// The fastest copy for drafting: itself when quantized, its GGUF reloaded with
    /// [`WeightMode::Quantized`], or an f16 copy of an HF folder. The output never depends on it.
    /// Errors: as [`Model::load`], or a failed f16 conversion.
    pub fn fast_drafter(&self) -> Result<std::borrow::Cow<'_, Model>, ModelError> {
        use std::borrow::Cow;
        if self.weights_held() == "quantized" {
            return Ok(Cow::Borrowed(self));
        }
        Ok(Cow::Owned(match self.format() {
            crate::WeightsFormat::Gguf => Model::load_with(
                self.path(),
                &LoadOptions {
                    weights: WeightMode::Quantized,
                },
            )?,
            _ => self.to_f16_weights()?,
        }))
    }
}

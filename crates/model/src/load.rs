//! Loading a model: a GGUF file or a Hugging Face folder, by path.

use std::path::Path;

use crate::weights::{LoadOptions, WeightMode};
use crate::{Model, ModelError};

impl Model {
    /// Loads a GGUF file or an HF folder (config.json + *.safetensors).
    ///
    /// # Errors
    /// See [`ModelError`]: I/O, malformed or truncated files, missing tensors,
    /// shape mismatches, unsupported architectures.
    pub fn load(path: &Path) -> Result<Self, ModelError> {
        Self::load_with(path, &LoadOptions::default())
    }

    /// [`Model::load`] with options.
    ///
    /// # Errors
    /// As [`Model::load`].
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
}

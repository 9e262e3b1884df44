//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong while loading or running a model; variants name the file and tensor
/// involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// A file could not be opened, read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A file is not in the expected format (bad magic, bad header, bad JSON).
    #[error("{path}: malformed file: {reason}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A file ends before the data of a tensor does.
    #[error(
        "{path}: file truncated: tensor `{tensor}` needs bytes {start}..{end} but the file has {file_len}"
    )]
    Truncated {
        /// The file.
        path: PathBuf,
        /// The tensor whose data is cut off.
        tensor: String,
        /// First byte of the tensor's data.
        start: u64,
        /// One past the last byte of the tensor's data.
        end: u64,
        /// Length of the file in bytes.
        file_len: u64,
    },
    /// A tensor the architecture needs is absent from the weights.
    #[error("{path}: missing tensor `{tensor}`")]
    MissingTensor {
        /// The weights file or folder.
        path: PathBuf,
        /// The tensor name.
        tensor: String,
    },
    /// A tensor has a shape other than the configuration implies.
    #[error("{path}: tensor `{tensor}` has shape {actual:?}, expected {expected:?}")]
    ShapeMismatch {
        /// The file holding the tensor.
        path: PathBuf,
        /// The tensor name.
        tensor: String,
        /// The shape the model configuration requires.
        expected: Vec<usize>,
        /// The shape found in the file.
        actual: Vec<usize>,
    },
    /// A metadata key (GGUF) or config field (config.json) is missing or invalid.
    #[error("{path}: bad config value `{key}`: {reason}")]
    Config {
        /// The file.
        path: PathBuf,
        /// The key or field.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// The architecture is not a Llama- or Qwen2-family decoder.
    #[error("{path}: unsupported architecture `{arch}`")]
    UnsupportedArch {
        /// The file.
        path: PathBuf,
        /// The architecture name found.
        arch: String,
    },
    /// A PEFT adapter does not fit the base model.
    #[error("{path}: adapter does not fit the base model: tensor `{tensor}`: {reason}")]
    Adapter {
        /// The adapter file (adapter_config.json or adapter_model.safetensors).
        path: PathBuf,
        /// The adapter tensor or config field involved.
        tensor: String,
        /// What does not match.
        reason: String,
    },
    /// The tokenizer could not be built, or failed to encode/decode.
    #[error("tokenizer ({source_name}): {reason}")]
    Tokenizer {
        /// Where the tokenizer came from (a path, or "GGUF metadata").
        source_name: String,
        /// What went wrong.
        reason: String,
    },
    /// The model has no chat template, or its template failed to render these messages (a template
    /// may refuse some role orders).
    #[error("chat template: {reason}")]
    ChatTemplate {
        /// What went wrong.
        reason: String,
    },
    /// A delta hook returned something of the wrong shape, or failed.
    #[error("delta hook, layer {layer}, {proj:?}: {reason}")]
    Hook {
        /// The decoder layer.
        layer: usize,
        /// The projection.
        proj: crate::Proj,
        /// What is wrong.
        reason: String,
    },
    /// Invalid arguments to forward (empty tokens, bad tree, cache overflow, bad token id).
    #[error("invalid forward input: {0}")]
    Input(String),
    /// Invalid sampling parameters.
    #[error("invalid sampling parameter: {0}")]
    Sampling(String),
    /// Fetching the default model failed (pip, archive member, checksum).
    #[error("fetch {what}: {reason}")]
    Fetch {
        /// What was being fetched or checked.
        what: String,
        /// What went wrong.
        reason: String,
    },
    /// An error from candle's tensor operations.
    #[error("tensor op: {0}")]
    Candle(#[from] candle_core::Error),
}

impl ModelError {
    /// Wraps an I/O error with the path it concerns.
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ModelError::Io {
            path: path.into(),
            source,
        }
    }
}

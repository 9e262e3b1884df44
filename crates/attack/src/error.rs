//! The crate's error type.

use thiserror::Error;

/// Everything an attack can fail with; no input makes the crate panic.
#[derive(Debug, Error)]
pub enum AttackError {
    /// The corpus manifest or a corpus file is missing, unreadable or does not match its sha256.
    #[error("corpus: {0}")]
    Corpus(String),
    /// A bad argument: depth beyond the model, empty data, zero sizes, …
    #[error("invalid input: {0}")]
    Input(String),
    /// From the model (forward pass, tokenizer).
    #[error(transparent)]
    Model(#[from] cipherlora_model::ModelError),
    /// From candle (training the learned inverters).
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    /// From the CKKS engine (the ciphertext attacker's features).
    #[error(transparent)]
    Ckks(#[from] cipherlora_ckks::CkksError),
    /// Writing a report.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// Serialising a report.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
}

/// Shorthand.
pub type Result<T> = std::result::Result<T, AttackError>;

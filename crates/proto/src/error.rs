//! The crate's one error type.

use thiserror::Error;

/// Everything that can be wrong with a message envelope.
///
/// Decoding untrusted bytes always yields one of these variants, never a panic.
#[non_exhaustive]
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ProtoError {
    /// The bytes are not a valid protobuf encoding of the expected message.
    #[error("protobuf decode error: {0}")]
    Decode(prost::DecodeError),
    /// A session id is not exactly 16 bytes.
    #[error("session id must be 16 bytes, got {got}")]
    SessionIdLength {
        /// Length received.
        got: usize,
    },
    /// A request carries no ciphertext.
    #[error("request carries no ciphertext")]
    NoCiphertexts,
    /// A request carries more ciphertexts than the server accepts.
    #[error("{got} ciphertexts in one request, limit is {limit}")]
    TooManyCiphertexts {
        /// Ciphertexts in the request.
        got: usize,
        /// The server's limit.
        limit: usize,
    },
    /// One ciphertext is empty.
    #[error("ciphertext {index} is empty")]
    EmptyCiphertext {
        /// Index of the ciphertext in the request.
        index: usize,
    },
    /// One ciphertext is larger than the server accepts.
    #[error("ciphertext {index} has {got} bytes, limit is {limit}")]
    CiphertextTooLarge {
        /// Index of the ciphertext in the request.
        index: usize,
        /// Its size in bytes.
        got: usize,
        /// The server's limit in bytes.
        limit: usize,
    },
    /// Hidden states carry no position.
    #[error("hidden states carry no position")]
    NoPositions,
    /// Hidden states are not the announced T × d values of 4 bytes.
    #[error("hidden states have {got} bytes, expected {expected} ({positions} × {width} f32)")]
    ActivationLength {
        /// Bytes received.
        got: usize,
        /// Bytes T × d × 4.
        expected: usize,
        /// Positions T announced.
        positions: usize,
        /// Width d of the residual stream.
        width: usize,
    },
    /// A hidden-state value is NaN or infinite.
    #[error("hidden state value {index} is not finite")]
    NonFiniteActivation {
        /// Index of the first such value (row-major).
        index: usize,
    },
    /// The activation encoding is not one this version knows.
    #[error("unsupported activation encoding {code}")]
    UnsupportedEncoding {
        /// The enum value received.
        code: i32,
    },
    /// Packed ring values are not exactly `count` values of `bits` bits.
    #[error("{what}: {got} bytes, expected {expected} ({count} values of {bits} bits)")]
    PackedLength {
        /// Which field.
        what: &'static str,
        /// Bytes received.
        got: usize,
        /// Bytes `⌈count·bits/8⌉`.
        expected: usize,
        /// Values expected.
        count: usize,
        /// Bits per value.
        bits: u32,
    },
    /// A masked online request also carries ciphertexts.
    #[error("a masked request carries {ciphertexts} ciphertexts, expected none")]
    MaskedWithCiphertexts {
        /// Ciphertexts in the request.
        ciphertexts: usize,
    },
    /// The rows of a masked request do not name one batch and one position each, are none, or
    /// are more than the server accepts.
    #[error("masked request: {batches} batches for {positions} positions")]
    MaskRows {
        /// Batch entries.
        batches: usize,
        /// Position entries.
        positions: usize,
    },
    /// A tree attention mask does not have one parent per row.
    #[error("tree mask has {got} parents for {positions} rows")]
    TreeLength {
        /// Parents received.
        got: usize,
        /// Rows T announced.
        positions: usize,
    },
    /// A tree row's parent is not an earlier row.
    #[error("tree row {index} has parent entry {entry}: not 0 (the prefix) nor an earlier row + 1")]
    TreeParent {
        /// The row.
        index: usize,
        /// Its wire entry (parent + 1, or 0).
        entry: u32,
    },
    /// A compaction list does not increase strictly.
    #[error("keep entry {index} ({value}) does not follow the previous one")]
    KeepOrder {
        /// Index in the list.
        index: usize,
        /// Its value.
        value: u32,
    },
    /// A compaction list names a row that is not cached.
    #[error("keep entry {index} ({value}) is not below the {held} rows cached from start")]
    KeepRange {
        /// Index in the list.
        index: usize,
        /// Its value.
        value: u32,
        /// Rows cached from `start` on.
        held: usize,
    },
}

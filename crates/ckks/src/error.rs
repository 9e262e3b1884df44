//! The crate's one error type.

use thiserror::Error;

/// Everything that can go wrong in `cipherlora-ckks`; bad input always yields one of these, never a
/// panic.
#[non_exhaustive]
#[derive(Debug, Error, Clone, PartialEq)]
pub enum CkksError {
    /// The ring degree is not one of the supported powers of two (4096, 8192, 16384).
    #[error("unsupported ring degree {degree} (supported: 4096, 8192, 16384)")]
    UnsupportedDegree {
        /// The requested degree N.
        degree: usize,
    },
    /// A modulus bit size is outside the supported range.
    #[error("modulus bit size {bits} outside the supported range {min}..={max}")]
    InvalidModulusBits {
        /// The requested bit size.
        bits: u32,
        /// Smallest supported size.
        min: u32,
        /// Largest supported size.
        max: u32,
    },
    /// The parameter set is structurally invalid (empty chain, wrong number of special primes,
    /// special prime smaller than a chain prime, ...).
    #[error("invalid parameters: {reason}")]
    InvalidParameters {
        /// What is wrong, in words.
        reason: &'static str,
    },
    /// Not enough NTT-friendly primes (q ≡ 1 mod 2N) of the requested size exist.
    #[error("no NTT-friendly prime of {bits} bits left for N = {degree}")]
    NoPrimeFound {
        /// Requested bit size.
        bits: u32,
        /// Ring degree.
        degree: usize,
    },
    /// The parameter set is above the HE-standard bound for 128-bit classical security with a
    /// ternary secret.
    #[error(
        "insecure parameters: log2(QP) = {log_qp} > {max_log_qp} allowed for N = {degree} at 128-bit security"
    )]
    InsecureParameters {
        /// Ring degree.
        degree: usize,
        /// Total modulus size log2(Q·P) counted in bits (sum of prime sizes).
        log_qp: u32,
        /// HE-standard maximum for this degree.
        max_log_qp: u32,
    },
    /// More values than slots were given to the encoder.
    #[error("{got} values given but only {slots} slots")]
    TooManyValues {
        /// Number of values given.
        got: usize,
        /// Number of slots (N/2).
        slots: usize,
    },
    /// A value to encode is NaN/infinite, or too large once multiplied by the scale.
    #[error(
        "value at index {index} cannot be encoded at this scale (non-finite or |value·scale| ≥ 2^62)"
    )]
    ValueOutOfRange {
        /// Slot index of the offending value.
        index: usize,
    },
    /// A scale is non-finite, non-positive or larger than the modulus allows.
    #[error("invalid scale {scale}")]
    InvalidScale {
        /// The offending scale.
        scale: f64,
    },
    /// A level is above the parameter set's maximum level.
    #[error("level {level} out of range (max {max})")]
    LevelOutOfRange {
        /// Requested level.
        level: usize,
        /// Maximum level of the parameters.
        max: usize,
    },
    /// Two operands are at different levels.
    #[error("level mismatch: {left} vs {right}")]
    LevelMismatch {
        /// Level of the left operand.
        left: usize,
        /// Level of the right operand.
        right: usize,
    },
    /// Two operands have different scales (relative difference above 1e-9).
    #[error("scale mismatch: {left} vs {right}")]
    ScaleMismatch {
        /// Scale of the left operand.
        left: f64,
        /// Scale of the right operand.
        right: f64,
    },
    /// A ciphertext at level 0 cannot be rescaled.
    #[error("cannot rescale a ciphertext at level 0")]
    CannotRescale,
    /// No Galois key for the requested rotation.
    #[error("no Galois key for rotation step {step} (Galois element {galois_element})")]
    MissingGaloisKey {
        /// Rotation step in slots (left rotation positive).
        step: i64,
        /// The Galois element 5^step mod 2N.
        galois_element: u64,
    },
    /// The operating system's random number generator failed.
    #[error("OS random number generator failed: {0}")]
    Rng(String),
    /// Deserialisation: fewer bytes than the header announces.
    #[error("truncated input: need {expected} bytes, got {got}")]
    Truncated {
        /// Bytes needed.
        expected: usize,
        /// Bytes available.
        got: usize,
    },
    /// Deserialisation: more bytes than the header announces.
    #[error("trailing bytes: expected {expected} bytes, got {got}")]
    TrailingBytes {
        /// Bytes expected.
        expected: usize,
        /// Bytes given.
        got: usize,
    },
    /// Deserialisation: the input does not start with the `CKLR` magic.
    #[error("bad magic bytes (not a cipherlora-ckks object)")]
    BadMagic,
    /// Deserialisation: unknown format version.
    #[error("unsupported format version {version}")]
    UnsupportedVersion {
        /// Version byte found.
        version: u8,
    },
    /// Deserialisation: the object is of another kind than asked for.
    #[error("wrong object kind: expected {expected}, found {found}")]
    WrongKind {
        /// Kind byte expected.
        expected: u8,
        /// Kind byte found.
        found: u8,
    },
    /// Deserialisation: the object was made under other parameters.
    #[error("parameter mismatch: {what}")]
    ParameterMismatch {
        /// Which field differs.
        what: &'static str,
    },
    /// Deserialisation: a coefficient is not below its modulus.
    #[error("coefficient {index} of limb {limb} is not below its modulus")]
    CoefficientOutOfRange {
        /// Limb (prime index).
        limb: usize,
        /// Coefficient index within the limb.
        index: usize,
    },
    /// Compression: invalid parameters or input (non-finite bound, a ciphertext above level 0, `b`,
    /// `k`, `d` out of range, …).
    #[error("invalid compression: {reason}")]
    InvalidCompression {
        /// What is wrong, in words.
        reason: &'static str,
    },
    /// Compression: slot values up to `bound` would wrap around modulo `q_0` at this scale even
    /// without compression (`2√2·bound·scale ≳ q_0`).
    #[error("value bound {bound} too large for q_0 at scale {scale}")]
    CompressionBoundTooLarge {
        /// The bound on |real part| and |imaginary part| of every slot.
        bound: f64,
        /// The scale Δ of the ciphertext.
        scale: f64,
    },
    /// Compression: no modulus `2^b` with `b ≤ max_bits` reaches the requested precision.
    #[error("compression to {precision_bits} bits of precision needs more than {max_bits} bits")]
    CompressionInfeasible {
        /// Requested precision, bits relative to the value bound.
        precision_bits: u32,
        /// Largest `b` allowed (`bits(q_0) − 1`).
        max_bits: u32,
    },
    /// BFV: the plaintext modulus cannot batch-encode in this ring.
    #[error("plaintext modulus {t}: {reason}")]
    InvalidPlaintextModulus {
        /// The requested plaintext modulus.
        t: u64,
        /// What is wrong, in words.
        reason: &'static str,
    },
    /// A sum of products was given different numbers of ciphertexts and plaintexts.
    #[error("{ciphertexts} ciphertexts against {plaintexts} plaintexts")]
    TermCountMismatch {
        /// Ciphertexts given.
        ciphertexts: usize,
        /// Plaintexts given.
        plaintexts: usize,
    },
    /// Deserialisation: a structural field (count, Galois element, flag) is invalid.
    #[error("malformed field: {what}")]
    Malformed {
        /// Which field.
        what: &'static str,
    },
}

/// Shorthand for `Result<T, CkksError>`.
pub type Result<T> = std::result::Result<T, CkksError>;

//! The crate's one error type.

use thiserror::Error;

/// Everything that can go wrong in `cipherlora-helora`; bad input never panics.
#[non_exhaustive]
#[derive(Debug, Error, Clone, PartialEq)]
pub enum HeloraError {
    /// A projection's fixed-point product could reach half the ring's modulus
    /// ([`crate::ring::RingProjection::new`]): fewer input or weight bits are needed.
    #[error("ring bound 2^{bound_log2} does not fit the {ring_bits}-bit ring with its margin")]
    RingBound {
        /// `log₂` of the bound on `|M̂·x̂|`.
        bound_log2: u32,
        /// Bits of the ring's modulus.
        ring_bits: u32,
    },
    /// An adapter or activation matrix does not have the size its shape implies.
    #[error("{what}: expected {expected} values, got {got}")]
    ShapeMismatch {
        /// Which matrix.
        what: &'static str,
        /// Values implied by the declared shape.
        expected: usize,
        /// Values actually given.
        got: usize,
    },
    /// A group shape is degenerate (no projection, zero rank, zero dimension).
    #[error("invalid group shape: {reason}")]
    InvalidShape {
        /// What is wrong, in words.
        reason: &'static str,
    },
    /// The requested plan parameters violate a packing constraint.
    #[error("infeasible plan: {reason}")]
    InfeasiblePlan {
        /// Which constraint, in words.
        reason: &'static str,
    },
    /// No plan fits the slots for this number of positions.
    #[error("no feasible plan for T = {t} positions in {slots} slots")]
    NoFeasiblePlan {
        /// Positions per verify round.
        t: usize,
        /// Slots per ciphertext.
        slots: usize,
    },
    /// The number of ciphertexts handed over differs from what the plan needs.
    #[error("{what}: plan needs {expected} ciphertexts, got {got}")]
    CiphertextCount {
        /// Which message or stage.
        what: &'static str,
        /// Count implied by the plan.
        expected: usize,
        /// Count given.
        got: usize,
    },
    /// A request or response belongs to a different plan, layer, group or T.
    #[error("message does not match the plan: {field} is {got}, expected {expected}")]
    PlanMismatch {
        /// The mismatching header field.
        field: &'static str,
        /// Value in the plan.
        expected: u64,
        /// Value in the message.
        got: u64,
    },
    /// Malformed bytes in a serialised plan, request or response.
    #[error("malformed {what}: {reason}")]
    Malformed {
        /// What was being decoded.
        what: &'static str,
        /// What is wrong, in words.
        reason: &'static str,
    },
    /// The level budget of the backend is too small for the plan's depth.
    #[error("plan needs {needed} levels, backend offers {available}")]
    NotEnoughLevels {
        /// Multiplicative depth the plan needs.
        needed: usize,
        /// Levels above 0 in the backend's chain.
        available: usize,
    },
    /// The CKKS engine refused an operation (malformed or mismatched ciphertext, scale or level out
    /// of range, …), with its typed error so callers can tell client faults from their own.
    #[error("CKKS: {0}")]
    Ckks(#[from] cipherlora_ckks::CkksError),
    /// A sum of products was given no terms, or a different number of ciphertexts and
    /// plaintexts: a programming error, never client input.
    #[error("{op}: {ciphertexts} ciphertexts for {plaintexts} plaintexts (a sum needs ≥ 1 pair)")]
    TermCount {
        /// The backend operation.
        op: &'static str,
        /// Ciphertexts given.
        ciphertexts: usize,
        /// Plaintexts given.
        plaintexts: usize,
    },
    /// Operands of one backend operation are at different levels.
    #[error("{op}: operands at levels {left} and {right}")]
    LevelMismatch {
        /// The backend operation.
        op: &'static str,
        /// Level of the first operand.
        left: usize,
        /// Level of the operand that differs.
        right: usize,
    },
    /// A one-time mask refused by the server's ledger or the client's pool.
    #[error("masks: {0}")]
    Mask(#[from] crate::masks::MaskError),
    /// Rerandomisation was asked of a backend built without the client's public key.
    #[error("rerandomisation needs the client's public key")]
    NoPublicKey,
    /// The slot simulator was built or fed outside its range.
    #[error("slot simulator: {values} values for {slots} slots (levels < {levels})")]
    SimulatorRange {
        /// Values given (or the level asked for).
        values: usize,
        /// Slots of the simulator.
        slots: usize,
        /// Levels it models.
        levels: usize,
    },
}

/// Shorthand for results of this crate.
pub type Result<T> = std::result::Result<T, HeloraError>;

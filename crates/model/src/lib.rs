//! Plaintext inference for the client's public base model.
//!
//! (Skeleton: the engine lands with the plaintext inference engine issue.)

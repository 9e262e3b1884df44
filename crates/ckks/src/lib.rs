//! RNS-CKKS homomorphic encryption, specialised for encrypted LoRA deltas.
//!
//! (Skeleton: the engine lands with the CKKS engine issue.)

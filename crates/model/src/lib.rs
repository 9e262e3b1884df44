//! Plaintext inference for the client's public base model: a Llama/Qwen2
//! decoder on candle with what private LoRA inference and speculative
//! decoding need. [`Model::forward`] runs T positions at once under a causal
//! or tree [`AttentionMask`]; a [`DeltaHook`] at every projection group adds
//! adapter deltas ([`PlainLora`]: the plaintext reference); a [`KvCache`]
//! rolls back. Weights come from GGUF or HF folders, adapters from PEFT
//! folders ([`LoraAdapter`]); [`fetch`] downloads the default model. Start
//! with [`Model`] and [`DeltaHook`].

mod batch_invariant;
mod chat;
mod config;
mod error;
pub mod fetch;
mod fixed_point;
mod generation;
mod gguf;
mod hf;
mod hook;
mod kv_cache;
mod linear;
mod load;
mod lora;
mod mask;
mod model;
mod progress;
mod qmatmul;
mod rope;
mod sampling;
mod synthetic;
mod synthetic_gguf;
mod tokenizer;
mod wavefront;
mod weights;

pub use chat::{ChatMessage, ChatTemplate};
pub use config::{Arch, ModelConfig, RopeStyle};
pub use error::ModelError;
pub use fixed_point::{FixedPointPass, FixedPointStep, NextTrip, wanted_groups};
pub use generation::{GenerateOptions, Generated, TextStream, generate};
pub use hook::{
    DeltaHook, DeltaStream, GroupDeltas, GroupInput, KeepDeltas, NoAdapter, PassDeltas, Proj,
    ProjGroup, TripId, Wavefront,
};
pub use kv_cache::{KvCache, KvRows};
pub use lora::{LoraAdapter, LoraWeights, PlainLora, gguf_qk_row_permutation};
pub use mask::AttentionMask;
pub use model::Model;
pub use sampling::{Sampler, SamplingParams, argmax};
pub use synthetic::{RandomAdapterSpec, write_random_adapter};
pub use synthetic_gguf::{
    SYNTHETIC_SEED_KEY, SYNTHETIC_SHAPES, SyntheticQuant, is_synthetic_gguf, synthetic_shape,
    write_synthetic_gguf, write_synthetic_gguf_with_tokenizer,
};
pub use tokenizer::Tokenizer;
pub use weights::{LoadOptions, WeightMode, WeightsFormat};

/// Re-export of candle's tensor and device types used throughout the API.
pub use candle_core::{Device, Tensor};

/// The number of CPU threads candle uses, read once from `RAYON_NUM_THREADS`
/// / `CANDLE_NUM_THREADS` (changing it takes a fresh process).
pub fn num_threads() -> usize {
    candle_core::utils::get_num_threads()
}

/// The thread count to give candle when the process may use fewer CPUs
/// ([`std::thread::available_parallelism`]) than candle would start threads
/// for, and neither variable is set; `None` otherwise. Candle's pools spin
/// while they wait, so two on one CPU slow a pass by an order of magnitude.
#[must_use]
pub fn threads_for_allowed_cpus() -> Option<usize> {
    let set = |v: &str| std::env::var_os(v).is_some();
    let allowed = std::thread::available_parallelism().ok()?.get();
    capped_threads(
        set("RAYON_NUM_THREADS") || set("CANDLE_NUM_THREADS"),
        allowed,
        num_threads(),
    )
}

/// [`threads_for_allowed_cpus`]'s rule: no change when the user chose a
/// count (`chosen`), else `allowed` when it is below candle's `default`.
fn capped_threads(chosen: bool, allowed: usize, default: usize) -> Option<usize> {
    (!chosen && allowed < default).then_some(allowed)
}

#[cfg(test)]
mod thread_tests {
    use super::capped_threads;

    /// Regression: a process pinned to one CPU of two started two spinning threads.
    #[test]
    fn a_process_allowed_one_cpu_of_two_asks_for_one_thread() {
        assert_eq!(capped_threads(false, 1, 2), Some(1));
        // The user's count is kept; a process allowed every core keeps the default.
        assert_eq!(capped_threads(true, 1, 2), None);
        assert_eq!(capped_threads(false, 2, 2), None);
        assert_eq!(capped_threads(false, 16, 8), None);
    }
}

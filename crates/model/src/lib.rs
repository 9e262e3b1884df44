//! Plaintext inference for the client's public base model.
//!
//! A Llama/Qwen2 decoder written on candle's tensors and quantized matmul, with
//! what off-the-shelf implementations lack for private LoRA inference and
//! speculative decoding:
//!
//! - [`Model::forward`] runs T positions at once with explicit positions and a
//!   causal or tree [`AttentionMask`], returning logits for every position;
//! - a [`DeltaHook`] at every projection group receives the group's input and
//!   returns deltas to add ([`PlainLora`] is the plaintext reference,
//!   [`NoAdapter`] the drafter);
//! - a preallocated [`KvCache`] with rollback ([`KvCache::truncate`]), tree-path
//!   compaction and fork.
//!
//! Weights come from GGUF files (kept quantized) or HF safetensors folders;
//! adapters from PEFT folders ([`LoraAdapter`]). [`Tokenizer`] wraps the
//! `tokenizers` crate (tokenizer.json, or rebuilt from GGUF metadata);
//! [`Sampler`] does greedy/temperature/top-k/top-p/repetition-penalty sampling;
//! [`fetch`] downloads the default model (SmolLM2-135M-Instruct Q4_1).

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
mod weights;

pub use chat::{ChatMessage, ChatTemplate};
pub use config::{Arch, ModelConfig, RopeStyle};
pub use error::ModelError;
pub use fixed_point::{FixedPointPass, FixedPointStep, NextTrip, wanted_groups};
pub use generation::{GenerateOptions, Generated, TextStream, generate};
pub use hook::{
    DeltaHook, DeltaStream, GroupDeltas, GroupInput, KeepDeltas, NoAdapter, PassDeltas, Proj,
    ProjGroup, TripId,
};
pub use kv_cache::{KvCache, KvRows};
pub use lora::{LoraAdapter, LoraWeights, PlainLora, gguf_qk_row_permutation};
pub use mask::AttentionMask;
pub use model::Model;
pub use sampling::{Sampler, SamplingParams, argmax};
pub use synthetic::{RandomAdapterSpec, write_random_adapter};
pub use synthetic_gguf::{
    SYNTHETIC_SEED_KEY, SYNTHETIC_SHAPES, SyntheticQuant, is_synthetic_gguf, synthetic_shape,
    write_synthetic_gguf,
};
pub use tokenizer::Tokenizer;
pub use weights::{LoadOptions, WeightMode, WeightsFormat};

/// Re-export of candle's tensor type used throughout the API.
pub use candle_core::Tensor;

/// The number of CPU threads candle uses. Candle reads it once, from the
/// `RAYON_NUM_THREADS` (and `CANDLE_NUM_THREADS`) environment variables, when
/// its pools first start; changing it takes a fresh process (the CLI's
/// `--threads` re-executes the binary with the variables set).
pub fn num_threads() -> usize {
    candle_core::utils::get_num_threads()
}

/// The thread count a process should give candle when it may run on fewer
/// CPUs than candle would start threads for: `Some(allowed)` when neither
/// `RAYON_NUM_THREADS` nor `CANDLE_NUM_THREADS` is set and the CPUs the
/// process may use ([`std::thread::available_parallelism`]: its affinity
/// mask and CPU quota) are fewer than candle's default (the machine's
/// physical cores); `None` otherwise. A binary sets both variables to it
/// before any thread starts.
///
/// Why: candle's pools spin while they wait for each other. Two of them on
/// one CPU (a client under `taskset -c 0`, or a container with one CPU)
/// made a one-position pass of the quantized default model take 290 ms
/// instead of 9–14 ms (21×), and an f32 pass of 8 positions 137–192 ms
/// instead of 114 (session 23, measured with `taskset -c 1`).
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

    /// Regression (session 23): a process pinned to one CPU of a two-core
    /// machine started two spinning pool threads on it.
    #[test]
    fn a_process_allowed_one_cpu_of_two_asks_for_one_thread() {
        assert_eq!(capped_threads(false, 1, 2), Some(1));
        // The user's own count is kept, and a process allowed every core
        // keeps candle's default.
        assert_eq!(capped_threads(true, 1, 2), None);
        assert_eq!(capped_threads(false, 2, 2), None);
        assert_eq!(capped_threads(false, 16, 8), None);
    }
}

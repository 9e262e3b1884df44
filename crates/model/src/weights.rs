//! What a loaded model's weights are made of and how they are held: one
//! decoder layer's tensors, the in-memory weight mode, load options and the
//! source format. Shared by the model and its loaders (`gguf`, `hf`).

use candle_core::Tensor;

use crate::hook::Proj;
use crate::linear::Linear;

/// Weights of one decoder layer.
#[derive(Debug, Clone)]
pub(crate) struct Layer {
    pub(crate) attn_norm: Tensor,
    pub(crate) q: Linear,
    pub(crate) k: Linear,
    pub(crate) v: Linear,
    pub(crate) o: Linear,
    pub(crate) ffn_norm: Tensor,
    pub(crate) gate: Linear,
    pub(crate) up: Linear,
    pub(crate) down: Linear,
}

impl Layer {
    pub(crate) fn linear(&self, p: Proj) -> &Linear {
        match p {
            Proj::Q => &self.q,
            Proj::K => &self.k,
            Proj::V => &self.v,
            Proj::O => &self.o,
            Proj::Gate => &self.gate,
            Proj::Up => &self.up,
            Proj::Down => &self.down,
        }
    }
}

/// How GGUF weights are held in memory.
///
/// Q4_1 and Q8_0 weights kept quantized go through our kernels
/// (`crates/model/src/qmatmul.rs`), which quantize the activations to 16 bits
/// per block of 32: on SmolLM2-135M their greedy argmax agrees with the f32
/// path's at every one of 3368 teacher-forced held-out positions (`tests/quantized_fidelity.rs`) and they reproduce the NumPy
/// reference's golden continuation, but the logits are not bit-identical to
/// f32's, and they are faster than f32 at every shape we run (decode 4.7×,
/// 9- and 17-position passes 2.2× on one thread; BENCHMARKS.md, "Plaintext
/// model"), so [`WeightMode::Auto`] keeps such files quantized. Other
/// quantized types (Q4_0, K-quants) use candle's `QMatMul` (8-bit
/// activations, which moved the argmax at 3 % of positions): `Auto`
/// dequantizes those when they fit in 2 GiB. [`WeightMode::F32`] stays the
/// exact reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightMode {
    /// Quantized if every quantized tensor is Q4_1 or Q8_0 (our kernels);
    /// otherwise f32 if the dequantized weights take at most 2 GiB, else
    /// quantized.
    #[default]
    Auto,
    /// Keep Q4_0/Q4_1/Q8_0/K-quant tensors quantized: Q4_1 and Q8_0 through
    /// our AVX2/AVX-VNNI/AVX-512 kernels, the others through candle's
    /// `QMatMul`.
    Quantized,
    /// Dequantize everything to f32 at load time.
    F32,
    /// Dequantize to f32, then hold the projection and output weights as
    /// f16 (see [`crate::Model::to_f16_weights`]): for a drafter, not for the
    /// model whose output must match a reference.
    F16,
}

impl WeightMode {
    /// The weights of a private client's target model, which verifies
    /// drafts through the adapter server: [`WeightMode::Auto`] means f32
    /// there, other modes are kept.
    ///
    /// Why: the fixed-point schedule certifies a row when the last trips
    /// moved its logits by little, which assumes activations that move
    /// continuously with the LoRA deltas. Quantized activations round to
    /// 16-bit levels, so a tiny change can jump a level; measured, sampling
    /// under `fixed-point:2` then left the per-group schedule's samples at
    /// the 8th of 16 tokens (`crates/spec/tests/real_model_speculative.rs`,
    /// `fixed_point_sampling_continues_rounds_and_matches_per_group_sampling`,
    /// which passes with f32). Per-group private generation with quantized
    /// weights equals the plaintext reference with the same weights
    /// (`crates/private/tests/private_generation.rs`); choose
    /// [`WeightMode::Quantized`] for it explicitly. The drafter's weights do
    /// not affect the output ([`crate::Model::fast_drafter`]).
    #[must_use]
    pub fn for_private_verify(self) -> Self {
        match self {
            WeightMode::Auto => WeightMode::F32,
            other => other,
        }
    }
}

/// Options of [`crate::Model::load_with`].
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// How GGUF weights are held. Safetensors folders are always loaded as
    /// f32; [`WeightMode::F16`] then converts them like GGUF weights.
    pub weights: WeightMode,
}

/// Where the weights came from: decides the q/k row layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WeightsFormat {
    /// A llama.cpp GGUF file.
    Gguf,
    /// An HF folder of safetensors files.
    Safetensors,
}

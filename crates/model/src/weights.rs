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
/// Candle's quantized matmul (like llama.cpp's) quantizes the activations to
/// 8 bits per block of 32 before the dot products. On SmolLM2-135M that changes
/// the greedy continuation of the golden prompt after 11 tokens and derails the
/// chat answer, while f32 weights reproduce the NumPy reference exactly; so
/// small models are dequantized by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightMode {
    /// f32 if the dequantized weights take at most 2 GiB, else quantized.
    #[default]
    Auto,
    /// Keep Q4_0/Q4_1/Q8_0/K-quant tensors quantized (`QMatMul`).
    Quantized,
    /// Dequantize everything to f32 at load time.
    F32,
    /// Dequantize to f32, then hold the projection and output weights as
    /// f16 (see [`crate::Model::to_f16_weights`]): for a drafter, not for the
    /// model whose output must match a reference.
    F16,
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

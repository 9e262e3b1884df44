//! What a loaded model's weights are made of and how they are held: one decoder layer's tensors,
//! the in-memory weight mode, load options and the source format. Shared by the model and its
//! loaders (`gguf`, `hf`).

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

/// How GGUF weights are held in memory. Q4_1/Q8_0 kept quantized use our kernels (16-bit
/// activations, argmax equal to f32's on held-out text, faster); other quantized types use candle's
/// `QMatMul`. [`WeightMode::F32`] is the exact reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightMode {
    /// Quantized if every quantized tensor is Q4_1 or Q8_0; else f32 up to 2 GiB dequantized, else
    /// quantized.
    #[default]
    Auto,
    /// Keep quantized tensors quantized (Q4_1/Q8_0 through our kernels, others through candle's
    /// `QMatMul`).
    Quantized,
    /// Dequantize everything to f32 at load time.
    F32,
    /// f32, with projection and output weights held as f16: for a drafter only.
    F16,
}

impl WeightMode {
    /// A private client's target weights: [`WeightMode::Auto`] means f32 (quantized activations
    /// jump levels, which breaks the fixed point's certification); other modes are kept.
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
    /// How GGUF weights are held. Safetensors folders are always loaded as f32; [`WeightMode::F16`]
    /// then converts them like GGUF weights.
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

//! A projection `y = x Wᵀ (+ b)`: quantized (GGUF Q4_0/Q4_1/Q8_0/K-quants, via
//! candle's `QMatMul`, which quantizes x to 8 bits per block and dots blocks) or
//! dense f32.

use candle_core::quantized::{QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};

use crate::ModelError;

/// Weight of shape (d_out, d_in) plus optional bias (d_out).
#[derive(Debug, Clone)]
pub(crate) struct Linear {
    w: QMatMul,
    b: Option<Tensor>,
}

impl Linear {
    /// From a GGUF tensor: kept quantized unless it is F16/F32/BF16 or
    /// `dequantize` asks for f32.
    pub(crate) fn from_qtensor(
        q: std::sync::Arc<QTensor>,
        b: Option<Tensor>,
        dequantize: bool,
    ) -> Result<Self, ModelError> {
        if dequantize {
            return Ok(Linear::dense(q.dequantize(&Device::Cpu)?, b));
        }
        Ok(Linear {
            w: QMatMul::from_arc(q)?,
            b,
        })
    }

    /// From a dense f32 weight (d_out, d_in).
    pub(crate) fn dense(w: Tensor, b: Option<Tensor>) -> Self {
        Linear {
            w: QMatMul::Tensor(w),
            b,
        }
    }

    /// x: (T, d_in) f32 → (T, d_out) f32.
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor, ModelError> {
        let y = self.w.forward(x)?;
        Ok(match &self.b {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }
}

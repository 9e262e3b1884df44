//! A projection `y = x Wᵀ (+ b)`: quantized (Q4_0/Q4_1/Q8_0 via [`crate::qmatmul`], K-quants via
//! candle's `QMatMul`), dense f32, or dense f16 (x rounded to f16, output f32).

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor};

use crate::qmatmul::{BlockQ4_0, BlockQ4_1, BlockQ8_0, QuantMatrix, WeightBlock};
use crate::{ModelError, batch_invariant};

/// Weight of shape (d_out, d_in) plus optional bias (d_out).
#[derive(Debug, Clone)]
pub(crate) struct Linear {
    w: Weight,
    b: Option<Tensor>,
}

/// How the weight is held.
#[derive(Debug, Clone)]
enum Weight {
    /// Candle: dense f32/f16 or a quantized type with a candle kernel.
    Candle(QMatMul),
    /// Q4_0: our kernels, with 16-bit activations where candle's use 8.
    Q4_0(QuantMatrix<BlockQ4_0>),
    /// Q4_1, which candle's CPU backend only has a scalar kernel for.
    Q4_1(QuantMatrix<BlockQ4_1>),
    /// Q8_0: candle's kernel dots one row at a time without VNNI.
    Q8_0(QuantMatrix<BlockQ8_0>),
}

impl Linear {
    /// From a GGUF tensor: kept quantized unless it is F16/F32/BF16 or `dequantize` asks for f32.
    pub(crate) fn from_qtensor(
        q: std::sync::Arc<QTensor>,
        b: Option<Tensor>,
        dequantize: bool,
    ) -> Result<Self, ModelError> {
        if dequantize {
            return Ok(Linear::dense(q.dequantize(&Device::Cpu)?, b));
        }
        if let &[rows, cols] = q.shape().dims() {
            let own = match q.dtype() {
                GgmlDType::Q4_0 => {
                    QuantMatrix::from_gguf_bytes(rows, cols, &q.data()?).map(Weight::Q4_0)
                }
                GgmlDType::Q4_1 => {
                    QuantMatrix::from_gguf_bytes(rows, cols, &q.data()?).map(Weight::Q4_1)
                }
                GgmlDType::Q8_0 => {
                    QuantMatrix::from_gguf_bytes(rows, cols, &q.data()?).map(Weight::Q8_0)
                }
                _ => None,
            };
            if let Some(w) = own {
                return Ok(Linear { w, b });
            }
        }
        Ok(Linear {
            w: Weight::Candle(QMatMul::from_arc(q)?),
            b,
        })
    }

    /// From a dense f32 weight (d_out, d_in).
    pub(crate) fn dense(w: Tensor, b: Option<Tensor>) -> Self {
        Linear {
            w: Weight::Candle(QMatMul::Tensor(w)),
            b,
        }
    }

    /// The same projection with a dense f32 weight held as f16 (half the bytes); quantized and f16
    /// weights are kept as they are.
    pub(crate) fn to_f16(&self) -> Result<Self, ModelError> {
        let w = match &self.w {
            Weight::Candle(QMatMul::Tensor(w)) => {
                Weight::Candle(QMatMul::TensorF16(w.to_dtype(DType::F16)?))
            }
            other => other.clone(),
        };
        Ok(Linear {
            w,
            b: self.b.clone(),
        })
    }

    /// How the weight is held: "quantized", "f16" or "f32".
    pub(crate) fn holding(&self) -> &'static str {
        match &self.w {
            Weight::Candle(QMatMul::Tensor(_)) => "f32",
            Weight::Candle(QMatMul::TensorF16(_)) => "f16",
            Weight::Candle(QMatMul::QTensor(_))
            | Weight::Q4_0(_)
            | Weight::Q4_1(_)
            | Weight::Q8_0(_) => "quantized",
        }
    }

    /// x: (T, d_in) f32 → (T, d_out) f32; dense f32 and our quantized kernels compute each row
    /// the same way whatever T ([`crate::batch_invariant`]), f16 and K-quants through candle.
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor, ModelError> {
        let y = match &self.w {
            Weight::Candle(QMatMul::Tensor(w)) => batch_invariant::project(x, w)?,
            Weight::Candle(w) => w.forward(x)?,
            Weight::Q4_0(w) => quant_forward(w, x)?,
            Weight::Q4_1(w) => quant_forward(w, x)?,
            Weight::Q8_0(w) => quant_forward(w, x)?,
        };
        Ok(match &self.b {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }
}

/// x: (T, d_in) f32 → (T, d_out) f32 through one of our quantized kernels.
fn quant_forward<B: WeightBlock>(w: &QuantMatrix<B>, x: &Tensor) -> Result<Tensor, ModelError> {
    let (t, d_in) = x.dims2()?;
    if d_in != w.cols() {
        return Err(ModelError::Input(format!(
            "projection input has {d_in} features, the weight {}",
            w.cols()
        )));
    }
    let xs = x.flatten_all()?.to_vec1::<f32>()?;
    Ok(Tensor::from_vec(
        w.matmul(&xs, t),
        (t, w.rows()),
        x.device(),
    )?)
}

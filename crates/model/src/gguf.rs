//! Loading llama.cpp GGUF files (ggml's `docs/gguf.md`): configuration from `{arch}.*` metadata,
//! weights quantized or dense. Llama-family q/k rows stay in llama.cpp's permuted layout, used with
//! [`RopeStyle::Interleaved`] (adapters are permuted to match, [`crate::lora`]).

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::QTensor;
use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::{DType, Device, Tensor};

use crate::linear::Linear;
use crate::progress::progress_bar;
use crate::weights::{Layer, LoadOptions, WeightMode, WeightsFormat};
use crate::{Arch, Model, ModelConfig, ModelError, RopeStyle};

/// [`WeightMode::Auto`] dequantizes a file with quantized tensors outside our kernels' formats when
/// the f32 weights fit in this many bytes.
pub(crate) const AUTO_F32_LIMIT: u64 = 2 << 30;

/// Whether every quantized tensor of a file goes through our kernels (Q4_0, Q4_1, Q8_0;
/// `crate::qmatmul`): dense (F32/F16/BF16) tensors count as covered.
fn own_kernels_cover(content: &Content) -> bool {
    use candle_core::quantized::GgmlDType as T;
    content.tensor_infos.values().all(|i| {
        matches!(
            i.ggml_dtype,
            T::Q4_0 | T::Q4_1 | T::Q8_0 | T::F32 | T::F16 | T::BF16
        )
    })
}

/// The parsed header of a GGUF file.
pub(crate) struct GgufHeader {
    pub(crate) path: PathBuf,
    pub(crate) content: Content,
}

impl GgufHeader {
    /// Reads the header and checks that every tensor's data lies inside the file.
    pub(crate) fn read(path: &Path) -> Result<Self, ModelError> {
        let file = File::open(path).map_err(|e| ModelError::io(path, e))?;
        let file_len = file.metadata().map_err(|e| ModelError::io(path, e))?.len();
        let mut reader = BufReader::new(file);
        let content = Content::read(&mut reader).map_err(|e| ModelError::Format {
            path: path.to_path_buf(),
            reason: format!("GGUF header: {e}"),
        })?;
        let mut infos: Vec<_> = content.tensor_infos.iter().collect();
        infos.sort_by_key(|(_, i)| i.offset);
        for (name, info) in infos {
            let dt = info.ggml_dtype;
            let elems = info.shape.elem_count();
            if !elems.is_multiple_of(dt.block_size()) {
                return Err(ModelError::Format {
                    path: path.to_path_buf(),
                    reason: format!("tensor `{name}`: {elems} elements, not whole {dt:?} blocks"),
                });
            }
            let size = (elems / dt.block_size() * dt.type_size()) as u64;
            let start = content.tensor_data_offset.saturating_add(info.offset);
            let end = start.saturating_add(size);
            if end > file_len {
                return Err(ModelError::Truncated {
                    path: path.to_path_buf(),
                    tensor: name.clone(),
                    start,
                    end,
                    file_len,
                });
            }
        }
        Ok(GgufHeader {
            path: path.to_path_buf(),
            content,
        })
    }

    pub(crate) fn meta(&self, key: &str) -> Option<&Value> {
        self.content.metadata.get(key)
    }

    fn bad(&self, key: &str, reason: impl Into<String>) -> ModelError {
        ModelError::Config {
            path: self.path.clone(),
            key: key.to_string(),
            reason: reason.into(),
        }
    }

    fn usize_key(&self, key: &str) -> Result<Option<usize>, ModelError> {
        match self.meta(key) {
            None => Ok(None),
            Some(v) => {
                let n = match v {
                    Value::U8(x) => *x as u64,
                    Value::U16(x) => *x as u64,
                    Value::U32(x) => *x as u64,
                    Value::U64(x) => *x,
                    Value::I32(x) if *x >= 0 => *x as u64,
                    Value::I64(x) if *x >= 0 => *x as u64,
                    other => return Err(self.bad(key, format!("not a count: {other:?}"))),
                };
                Ok(Some(n as usize))
            }
        }
    }

    fn req_usize(&self, key: &str) -> Result<usize, ModelError> {
        self.usize_key(key)?.ok_or_else(|| self.bad(key, "missing"))
    }

    fn f64_key(&self, key: &str) -> Result<Option<f64>, ModelError> {
        match self.meta(key) {
            None => Ok(None),
            Some(Value::F32(x)) => Ok(Some(*x as f64)),
            Some(Value::F64(x)) => Ok(Some(*x)),
            Some(other) => Err(self.bad(key, format!("not a float: {other:?}"))),
        }
    }

    /// The architecture name (`general.architecture`).
    pub(crate) fn arch_name(&self) -> Result<String, ModelError> {
        match self.meta("general.architecture") {
            Some(Value::String(s)) => Ok(s.clone()),
            _ => Err(self.bad("general.architecture", "missing or not a string")),
        }
    }

    /// The model configuration from `{arch}.*` metadata.
    pub(crate) fn config(&self) -> Result<ModelConfig, ModelError> {
        let name = self.arch_name()?;
        let (arch, rope_style) = match name.as_str() {
            "llama" | "mistral" => (Arch::Llama, RopeStyle::Interleaved),
            "qwen2" => (Arch::Qwen2, RopeStyle::Half),
            _ => {
                return Err(ModelError::UnsupportedArch {
                    path: self.path.clone(),
                    arch: name,
                });
            }
        };
        let k = |s: &str| format!("{name}.{s}");
        let hidden_size = self.req_usize(&k("embedding_length"))?;
        let num_heads = self.req_usize(&k("attention.head_count"))?;
        let num_kv_heads = self
            .usize_key(&k("attention.head_count_kv"))?
            .unwrap_or(num_heads);
        let head_dim = match self.usize_key(&k("attention.key_length"))? {
            Some(h) => h,
            None => hidden_size / num_heads.max(1),
        };
        let vocab_size = match self.usize_key(&k("vocab_size"))? {
            Some(v) => v,
            None => match self.content.tensor_infos.get("token_embd.weight") {
                Some(i) => i.shape.dims()[0],
                None => return Err(self.bad(&k("vocab_size"), "missing")),
            },
        };
        let cfg = ModelConfig {
            arch,
            hidden_size,
            num_layers: self.req_usize(&k("block_count"))?,
            num_heads,
            num_kv_heads,
            head_dim,
            intermediate_size: self.req_usize(&k("feed_forward_length"))?,
            vocab_size,
            rms_norm_eps: self
                .f64_key(&k("attention.layer_norm_rms_epsilon"))?
                .unwrap_or(1e-5),
            rope_theta: self.f64_key(&k("rope.freq_base"))?.unwrap_or(10_000.0),
            max_position_embeddings: self.usize_key(&k("context_length"))?.unwrap_or(4096),
            tie_word_embeddings: !self.content.tensor_infos.contains_key("output.weight"),
            rope_style,
        };
        cfg.validate(&self.path)?;
        Ok(cfg)
    }
}

/// Reads named tensors, checking shapes and advancing a progress bar.
struct TensorReader<'a> {
    header: &'a GgufHeader,
    dequantize: bool,
    reader: BufReader<File>,
    progress: indicatif::ProgressBar,
}

impl TensorReader<'_> {
    fn qtensor(&mut self, name: &str, expected: &[usize]) -> Result<QTensor, ModelError> {
        let h = self.header;
        let Some(info) = h.content.tensor_infos.get(name) else {
            return Err(ModelError::MissingTensor {
                path: h.path.clone(),
                tensor: name.to_string(),
            });
        };
        if info.shape.dims() != expected {
            return Err(ModelError::ShapeMismatch {
                path: h.path.clone(),
                tensor: name.to_string(),
                expected: expected.to_vec(),
                actual: info.shape.dims().to_vec(),
            });
        }
        let q = info
            .read(&mut self.reader, h.content.tensor_data_offset, &Device::Cpu)
            .map_err(|e| ModelError::Format {
                path: h.path.clone(),
                reason: format!("tensor `{name}`: {e}"),
            })?;
        self.progress.inc(q.storage_size_in_bytes() as u64);
        Ok(q)
    }

    fn dense(&mut self, name: &str, expected: &[usize]) -> Result<Tensor, ModelError> {
        Ok(self
            .qtensor(name, expected)?
            .dequantize(&Device::Cpu)?
            .to_dtype(DType::F32)?)
    }

    fn linear(
        &mut self,
        name: &str,
        out: usize,
        inp: usize,
        bias: bool,
    ) -> Result<Linear, ModelError> {
        let w = Arc::new(self.qtensor(&format!("{name}.weight"), &[out, inp])?);
        let b = if bias {
            Some(self.dense(&format!("{name}.bias"), &[out])?)
        } else {
            None
        };
        Linear::from_qtensor(w, b, self.dequantize)
    }
}

/// Loads a GGUF model.
pub(crate) fn load(path: &Path, opts: &LoadOptions) -> Result<Model, ModelError> {
    let _span = tracing::info_span!("load_gguf", path = %path.display()).entered();
    let header = GgufHeader::read(path)?;
    let cfg = header.config()?;
    let file = File::open(path).map_err(|e| ModelError::io(path, e))?;
    let total: u64 = header
        .content
        .tensor_infos
        .values()
        .map(|i| {
            (i.shape.elem_count() / i.ggml_dtype.block_size() * i.ggml_dtype.type_size()) as u64
        })
        .sum();
    let f32_bytes = header
        .content
        .tensor_infos
        .values()
        .map(|i| i.shape.elem_count() as u64 * 4)
        .sum::<u64>();
    let dequantize = match opts.weights {
        WeightMode::Quantized => false,
        WeightMode::F32 | WeightMode::F16 => true,
        WeightMode::Auto => !own_kernels_cover(&header.content) && f32_bytes <= AUTO_F32_LIMIT,
    };
    tracing::debug!(dequantize, f32_bytes, "GGUF weight mode");
    let mut r = TensorReader {
        header: &header,
        dequantize,
        reader: BufReader::new(file),
        progress: progress_bar(total, "loading weights"),
    };
    let (d, v) = (cfg.hidden_size, cfg.vocab_size);
    let embed_q = Arc::new(r.qtensor("token_embd.weight", &[v, d])?);
    let embed = embed_q.dequantize(&Device::Cpu)?.to_dtype(DType::F32)?;
    let bias = cfg.arch == Arch::Qwen2;
    let mut layers = Vec::with_capacity(cfg.num_layers);
    for i in 0..cfg.num_layers {
        let p = |s: &str| format!("blk.{i}.{s}");
        let qd = cfg.num_heads * cfg.head_dim;
        let kvd = cfg.num_kv_heads * cfg.head_dim;
        layers.push(Layer {
            attn_norm: r.dense(&p("attn_norm.weight"), &[d])?,
            q: r.linear(&p("attn_q"), qd, d, bias)?,
            k: r.linear(&p("attn_k"), kvd, d, bias)?,
            v: r.linear(&p("attn_v"), kvd, d, bias)?,
            o: r.linear(&p("attn_output"), d, qd, false)?,
            ffn_norm: r.dense(&p("ffn_norm.weight"), &[d])?,
            gate: r.linear(&p("ffn_gate"), cfg.intermediate_size, d, false)?,
            up: r.linear(&p("ffn_up"), cfg.intermediate_size, d, false)?,
            down: r.linear(&p("ffn_down"), d, cfg.intermediate_size, false)?,
        });
    }
    let norm = r.dense("output_norm.weight", &[d])?;
    let lm_head = if cfg.tie_word_embeddings {
        Linear::from_qtensor(embed_q, None, dequantize)?
    } else {
        r.linear("output", v, d, false)?
    };
    r.progress.finish_and_clear();
    Ok(Model {
        config: cfg,
        embed,
        layers,
        norm,
        lm_head,
        path: path.to_path_buf(),
        format: WeightsFormat::Gguf,
    })
}

/// String-array metadata (tokenizer vocab/merges).
pub(crate) fn string_array(
    header: &GgufHeader,
    key: &str,
) -> Result<Option<Vec<String>>, ModelError> {
    match header.meta(key) {
        None => Ok(None),
        Some(Value::Array(vs)) => vs
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.clone()),
                other => Err(header.bad(key, format!("array element not a string: {other:?}"))),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(other) => Err(header.bad(key, format!("not an array: {:?}", other.value_type()))),
    }
}

/// Integer-array metadata (token types).
pub(crate) fn int_array(header: &GgufHeader, key: &str) -> Result<Option<Vec<i64>>, ModelError> {
    match header.meta(key) {
        None => Ok(None),
        Some(Value::Array(vs)) => vs
            .iter()
            .map(|v| match v {
                Value::I32(x) => Ok(*x as i64),
                Value::U32(x) => Ok(*x as i64),
                Value::I64(x) => Ok(*x),
                Value::U8(x) => Ok(*x as i64),
                Value::I8(x) => Ok(*x as i64),
                other => Err(header.bad(key, format!("array element not an integer: {other:?}"))),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(other) => Err(header.bad(key, format!("not an array: {:?}", other.value_type()))),
    }
}

/// Unsigned metadata value, for token ids.
pub(crate) fn u32_key(header: &GgufHeader, key: &str) -> Option<u32> {
    header.meta(key).and_then(|v| v.to_u32().ok())
}

/// String metadata value.
pub(crate) fn string_key(header: &GgufHeader, key: &str) -> Option<String> {
    match header.meta(key) {
        Some(Value::String(s)) => Some(s.clone()),
        _ => None,
    }
}

/// Bool metadata value.
pub(crate) fn bool_key(header: &GgufHeader, key: &str) -> Option<bool> {
    match header.meta(key) {
        Some(Value::Bool(b)) => Some(*b),
        _ => None,
    }
}

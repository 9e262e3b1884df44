//! GGUF files of random quantized weights shaped like a real model (llama.cpp layout, marked by
//! `cipherlora.synthetic_seed`), for benchmarks without downloads; with another GGUF's tokenizer
//! ([`write_synthetic_gguf_with_tokenizer`]) every command runs on them.

use std::io::{BufWriter, Write};
use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::gguf::GgufHeader;
use crate::{Arch, ModelConfig, ModelError, RopeStyle};

/// The metadata key that marks a synthetic file (its value: the seed).
pub const SYNTHETIC_SEED_KEY: &str = "cipherlora.synthetic_seed";

/// Names accepted by [`synthetic_shape`].
pub const SYNTHETIC_SHAPES: [&str; 5] = [
    "llama-3.2-1b",
    "qwen2.5-1.5b",
    "qwen2.5-3b",
    "llama-3.1-8b",
    "test-d1024",
];

/// A real model's configuration by name (from its `config.json`, RoPE scaling omitted), or
/// `test-d1024`, a two-layer Llama of hidden size 1024 for tests; `None` otherwise.
pub fn synthetic_shape(name: &str) -> Option<ModelConfig> {
    let llama =
        |hidden_size, num_layers, num_heads, num_kv_heads, head_dim, ffn, vocab| ModelConfig {
            arch: Arch::Llama,
            hidden_size,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            intermediate_size: ffn,
            vocab_size: vocab,
            rms_norm_eps: 1e-5,
            rope_theta: 500_000.0,
            max_position_embeddings: 131_072,
            tie_word_embeddings: true,
            rope_style: RopeStyle::Interleaved,
        };
    // Qwen2.5: 2 KV heads of 128, tied embeddings.
    let qwen = |hidden_size, num_layers, num_heads, ffn| ModelConfig {
        arch: Arch::Qwen2,
        hidden_size,
        num_layers,
        num_heads,
        num_kv_heads: 2,
        head_dim: 128,
        intermediate_size: ffn,
        vocab_size: 151_936,
        rms_norm_eps: 1e-6,
        rope_theta: 1_000_000.0,
        max_position_embeddings: 32_768,
        tie_word_embeddings: true,
        rope_style: RopeStyle::Half,
    };
    let cfg = match name {
        "qwen2.5-3b" => qwen(2048, 36, 16, 11_008),
        "llama-3.1-8b" => ModelConfig {
            tie_word_embeddings: false,
            ..llama(4096, 32, 32, 8, 128, 14_336, 128_256)
        },
        "test-d1024" => ModelConfig {
            max_position_embeddings: 4096,
            ..llama(1024, 2, 16, 4, 64, 2816, 49_152)
        },
        "qwen2.5-1.5b" => qwen(1536, 28, 12, 8960),
        "llama-3.2-1b" => llama(2048, 16, 32, 8, 64, 8192, 128_256),
        _ => return None,
    };
    Some(cfg)
}

/// Block formats a synthetic file can hold (every matrix in one format; norms, biases F32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SyntheticQuant {
    /// ggml Q4_0 (32 weights, 4 bits + f16 scale): our kernels.
    Q4_0,
    /// ggml Q4_1 (32 weights, 4 bits + f16 scale and minimum): our kernels.
    Q4_1,
    /// ggml Q8_0 (32 weights, 8 bits + f16 scale): our kernels.
    Q8_0,
    /// ggml Q4_K (candle's kernels); input widths must be multiples of 256.
    Q4K,
}

impl SyntheticQuant {
    /// Parses `q4_0`, `q4_1`, `q8_0` or `q4_k` (case-insensitive).
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "q4_0" => Some(Self::Q4_0),
            "q4_1" => Some(Self::Q4_1),
            "q8_0" => Some(Self::Q8_0),
            "q4_k" => Some(Self::Q4K),
            _ => None,
        }
    }

    /// The lower-case name (`q4_0`, `q4_1`, `q8_0`, `q4_k`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Q4_0 => "q4_0",
            Self::Q4_1 => "q4_1",
            Self::Q8_0 => "q8_0",
            Self::Q4K => "q4_k",
        }
    }

    fn dtype(self) -> GgmlDType {
        match self {
            Self::Q4_0 => GgmlDType::Q4_0,
            Self::Q4_1 => GgmlDType::Q4_1,
            Self::Q8_0 => GgmlDType::Q8_0,
            Self::Q4K => GgmlDType::Q4K,
        }
    }
}

/// Whether `path` is a GGUF written by [`write_synthetic_gguf`]. Errors: [`ModelError::Io`],
/// `Format`, `Truncated`.
pub fn is_synthetic_gguf(path: &Path) -> Result<bool, ModelError> {
    Ok(GgufHeader::read(path)?.meta(SYNTHETIC_SEED_KEY).is_some())
}

/// Writes a GGUF of random `quant` weights shaped like `config`, without a vocabulary (via a
/// `.part` file). Errors: [`ModelError::Config`] for bad widths or heads; [`ModelError::Io`];
/// [`ModelError::Candle`].
pub fn write_synthetic_gguf(
    path: &Path,
    config: &ModelConfig,
    quant: SyntheticQuant,
    seed: u64,
) -> Result<(), ModelError> {
    write_gguf(path, config, quant, seed, Vec::new())
}

/// [`write_synthetic_gguf`] with the tokenizer of the GGUF file `tokenizer_from` (every
/// `tokenizer.*` key, chat template included) and the vocabulary size set to its token count, so
/// that text goes in and out as with that model. Returns the configuration written. Errors: as
/// [`write_synthetic_gguf`]; [`ModelError::Format`] when `tokenizer_from` has no token list.
pub fn write_synthetic_gguf_with_tokenizer(
    path: &Path,
    config: &ModelConfig,
    quant: SyntheticQuant,
    seed: u64,
    tokenizer_from: &Path,
) -> Result<ModelConfig, ModelError> {
    let header = GgufHeader::read(tokenizer_from)?;
    let vocab = match header.meta("tokenizer.ggml.tokens") {
        Some(Value::Array(tokens)) if !tokens.is_empty() => tokens.len(),
        _ => {
            return Err(ModelError::Format {
                path: tokenizer_from.to_path_buf(),
                reason: "no tokenizer.ggml.tokens to copy".into(),
            });
        }
    };
    let mut keys: Vec<(String, Value)> = header
        .content
        .metadata
        .iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    keys.sort_by(|a, b| a.0.cmp(&b.0));
    let config = ModelConfig {
        vocab_size: vocab,
        ..config.clone()
    };
    write_gguf(path, &config, quant, seed, keys)?;
    Ok(config)
}

fn write_gguf(
    path: &Path,
    config: &ModelConfig,
    quant: SyntheticQuant,
    seed: u64,
    tokenizer: Vec<(String, Value)>,
) -> Result<(), ModelError> {
    config.validate(path)?;
    let block = quant.dtype().block_size();
    let qd = config.num_heads * config.head_dim;
    for (key, width) in [
        ("hidden_size", config.hidden_size),
        ("intermediate_size", config.intermediate_size),
        ("num_heads * head_dim", qd),
    ] {
        if !width.is_multiple_of(block) {
            return Err(ModelError::Config {
                path: path.to_path_buf(),
                key: key.into(),
                reason: format!(
                    "{width} is not a multiple of {}'s block of {block}",
                    quant.name()
                ),
            });
        }
    }
    let arch = match config.arch {
        Arch::Llama => "llama",
        Arch::Qwen2 => "qwen2",
    };
    let u32v = |n: usize| Value::U32(n as u32);
    let k = |s: &str| format!("{arch}.{s}");
    let metadata: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        (
            "general.name".into(),
            Value::String(format!("cipherlora synthetic {arch} ({})", quant.name())),
        ),
        (k("context_length"), u32v(config.max_position_embeddings)),
        (k("embedding_length"), u32v(config.hidden_size)),
        (k("block_count"), u32v(config.num_layers)),
        (k("feed_forward_length"), u32v(config.intermediate_size)),
        (k("attention.head_count"), u32v(config.num_heads)),
        (k("attention.head_count_kv"), u32v(config.num_kv_heads)),
        (k("attention.key_length"), u32v(config.head_dim)),
        (k("attention.value_length"), u32v(config.head_dim)),
        (k("rope.dimension_count"), u32v(config.head_dim)),
        (k("rope.freq_base"), Value::F32(config.rope_theta as f32)),
        (
            k("attention.layer_norm_rms_epsilon"),
            Value::F32(config.rms_norm_eps as f32),
        ),
        (k("vocab_size"), u32v(config.vocab_size)),
        (SYNTHETIC_SEED_KEY.into(), Value::U64(seed)),
    ];
    let mut metadata = metadata;
    if tokenizer.is_empty() {
        metadata.push(("tokenizer.ggml.model".into(), Value::String("none".into())));
    }
    metadata.extend(tokenizer);

    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    let matrix = |name: String, rows: usize, cols: usize, rng: &mut ChaCha8Rng| {
        let bound = 1.0 / (cols as f32).sqrt();
        let data: Vec<f32> = (0..rows * cols)
            .map(|_| rng.random_range(-bound..bound))
            .collect();
        let t = Tensor::from_vec(data, (rows, cols), &Device::Cpu)?;
        Ok::<_, ModelError>((name, QTensor::quantize(&t, quant.dtype())?))
    };
    let dense = |name: String, data: Vec<f32>| -> Result<(String, QTensor), ModelError> {
        let n = data.len();
        let t = Tensor::from_vec(data, n, &Device::Cpu)?;
        Ok((name, QTensor::quantize(&t, GgmlDType::F32)?))
    };
    let (d, f) = (config.hidden_size, config.intermediate_size);
    let kvd = config.num_kv_heads * config.head_dim;
    tensors.push(matrix(
        "token_embd.weight".into(),
        config.vocab_size,
        d,
        &mut rng,
    )?);
    for i in 0..config.num_layers {
        let p = |s: &str| format!("blk.{i}.{s}");
        tensors.push(dense(p("attn_norm.weight"), vec![1.0; d])?);
        tensors.push(matrix(p("attn_q.weight"), qd, d, &mut rng)?);
        tensors.push(matrix(p("attn_k.weight"), kvd, d, &mut rng)?);
        tensors.push(matrix(p("attn_v.weight"), kvd, d, &mut rng)?);
        if config.arch == Arch::Qwen2 {
            for (name, n) in [
                ("attn_q.bias", qd),
                ("attn_k.bias", kvd),
                ("attn_v.bias", kvd),
            ] {
                let b = (0..n).map(|_| rng.random_range(-0.1f32..0.1)).collect();
                tensors.push(dense(p(name), b)?);
            }
        }
        tensors.push(matrix(p("attn_output.weight"), d, qd, &mut rng)?);
        tensors.push(dense(p("ffn_norm.weight"), vec![1.0; d])?);
        tensors.push(matrix(p("ffn_gate.weight"), f, d, &mut rng)?);
        tensors.push(matrix(p("ffn_up.weight"), f, d, &mut rng)?);
        tensors.push(matrix(p("ffn_down.weight"), d, f, &mut rng)?);
    }
    tensors.push(dense("output_norm.weight".into(), vec![1.0; d])?);
    if !config.tie_word_embeddings {
        tensors.push(matrix(
            "output.weight".into(),
            config.vocab_size,
            d,
            &mut rng,
        )?);
    }

    let part = path.with_extension("gguf.part");
    let file = std::fs::File::create(&part).map_err(|e| ModelError::io(&part, e))?;
    let mut w = BufWriter::new(file);
    let meta: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let ts: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
    candle_core::quantized::gguf_file::write(&mut w, &meta, &ts)?;
    w.flush().map_err(|e| ModelError::io(&part, e))?;
    drop(w);
    std::fs::rename(&part, path).map_err(|e| ModelError::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AttentionMask, LoadOptions, Model, NoAdapter, WeightMode};

    fn tiny(arch: Arch) -> ModelConfig {
        ModelConfig {
            arch,
            hidden_size: 64,
            num_layers: 2,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 16,
            intermediate_size: 96,
            vocab_size: 80,
            rms_norm_eps: 1e-6,
            rope_theta: 10_000.0,
            max_position_embeddings: 128,
            tie_word_embeddings: true,
            rope_style: match arch {
                Arch::Llama => RopeStyle::Interleaved,
                Arch::Qwen2 => RopeStyle::Half,
            },
        }
    }

    #[test]
    fn synthetic_gguf_loads_back_with_its_shape() {
        let dir = tempfile::tempdir().unwrap();
        for (arch, quant) in [
            (Arch::Qwen2, SyntheticQuant::Q4_1),
            (Arch::Llama, SyntheticQuant::Q8_0),
            (Arch::Llama, SyntheticQuant::Q4_0),
        ] {
            let cfg = tiny(arch);
            let path = dir.path().join(format!("{}.gguf", quant.name()));
            write_synthetic_gguf(&path, &cfg, quant, 7).unwrap();
            assert!(is_synthetic_gguf(&path).unwrap());
            let model = Model::load_with(
                &path,
                &LoadOptions {
                    weights: WeightMode::Quantized,
                },
            )
            .unwrap();
            // GGUF stores the epsilon as f32.
            let mut want = cfg.clone();
            want.rms_norm_eps = cfg.rms_norm_eps as f32 as f64;
            assert_eq!(model.config(), &want);
            let mut cache = model.new_cache(8).unwrap();
            let logits = model
                .forward(
                    &[1, 2, 3],
                    &mut cache,
                    &AttentionMask::Causal,
                    &mut NoAdapter,
                )
                .unwrap();
            let v: Vec<f32> = logits.flatten_all().unwrap().to_vec1().unwrap();
            assert_eq!(v.len(), 3 * cfg.vocab_size);
            assert!(v.iter().all(|x| x.is_finite()));
            // No vocabulary: our tokenizer refuses the file.
            assert!(crate::Tokenizer::for_model(&path).is_err());
        }
    }

    #[test]
    fn synthetic_gguf_refuses_widths_off_the_block() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.gguf");
        // 64 is not a multiple of Q4_K's 256.
        let err = write_synthetic_gguf(&path, &tiny(Arch::Llama), SyntheticQuant::Q4K, 1);
        assert!(matches!(err, Err(ModelError::Config { .. })), "{err:?}");
        assert!(!path.exists());
    }

    #[test]
    fn synthetic_shapes_are_valid_and_named() {
        for name in SYNTHETIC_SHAPES {
            let cfg = synthetic_shape(name).unwrap();
            cfg.validate(Path::new(name)).unwrap();
            assert!(cfg.intermediate_size.is_multiple_of(256));
        }
        assert!(synthetic_shape("gpt-5").is_none());
        assert_eq!(SyntheticQuant::parse("Q4_K"), Some(SyntheticQuant::Q4K));
        assert_eq!(SyntheticQuant::parse("q5_0"), None);
    }
}

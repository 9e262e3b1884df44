//! Model shape and architecture: parsed from GGUF metadata or an HF `config.json`.

use std::path::Path;

use serde::Deserialize;

use crate::ModelError;

/// Decoder family. Both are pre-norm (RMSNorm), SwiGLU, grouped-query attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Llama family: Llama 2/3, Mistral, SmolLM2. No projection biases.
    Llama,
    /// Qwen2 family: biases on q/k/v projections.
    Qwen2,
}

/// How rotary position embedding pairs the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs (2i, 2i+1): llama.cpp's "normal" RoPE, used with llama-family GGUF files whose q/k
    /// rows the converter permuted (see the `lora` module).
    Interleaved,
    /// Pairs (i, i + head_dim/2): HF "rotate_half" (GPT-NeoX style); HF checkpoints and Qwen2 GGUF
    /// files.
    Half,
}

/// Shapes and hyper-parameters of a decoder-only model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Architecture family.
    pub arch: Arch,
    /// Model width d.
    pub hidden_size: usize,
    /// Number of decoder layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (grouped-query attention; divides `num_heads`).
    pub num_kv_heads: usize,
    /// Per-head dimension (usually hidden_size / num_heads).
    pub head_dim: usize,
    /// SwiGLU inner width.
    pub intermediate_size: usize,
    /// Vocabulary size (rows of the embedding and of the LM head).
    pub vocab_size: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base frequency theta.
    pub rope_theta: f64,
    /// Maximum context the model was trained for.
    pub max_position_embeddings: usize,
    /// Whether the LM head reuses the token embedding.
    pub tie_word_embeddings: bool,
    /// RoPE dimension pairing used by the loaded weights.
    pub rope_style: RopeStyle,
}

impl ModelConfig {
    /// Output width of projection `proj`: rows of its weight matrix.
    pub fn proj_out_dim(&self, proj: crate::Proj) -> usize {
        use crate::Proj::*;
        match proj {
            Q => self.num_heads * self.head_dim,
            K | V => self.num_kv_heads * self.head_dim,
            O => self.hidden_size,
            Gate | Up => self.intermediate_size,
            Down => self.hidden_size,
        }
    }

    /// Input width of projection `proj`: columns of its weight matrix.
    pub fn proj_in_dim(&self, proj: crate::Proj) -> usize {
        use crate::Proj::*;
        match proj {
            Q | K | V | Gate | Up => self.hidden_size,
            O => self.num_heads * self.head_dim,
            Down => self.intermediate_size,
        }
    }

    /// Bytes a prompt's pass ([`Model::forward_wavefront`](crate::Model::forward_wavefront) or
    /// [`Model::forward`](crate::Model::forward)) holds per row while it runs, with the groups
    /// `adapted` (one entry per (layer, group)) and `context` positions of attention: the
    /// deltas it keeps until it returns (every projection of an adapted group, f32), one
    /// layer's attention scores and bias over the context, and the residual stream, attention
    /// and MLP activations of a layer. An upper bound, to size a pass from a memory budget.
    pub fn pass_row_bytes(&self, adapted: &[(usize, crate::ProjGroup)], context: usize) -> usize {
        let deltas: usize = adapted
            .iter()
            .flat_map(|&(_, g)| g.projs())
            .map(|&p| self.proj_out_dim(p))
            .sum();
        let attention = (self.num_heads + 1) * context;
        let activations =
            4 * self.hidden_size + 2 * self.num_heads * self.head_dim + 3 * self.intermediate_size;
        4 * (deltas + attention + activations)
    }

    /// Checks the internal consistency of the shapes.
    pub(crate) fn validate(&self, path: &Path) -> Result<(), ModelError> {
        let bad = |key: &str, reason: String| ModelError::Config {
            path: path.to_path_buf(),
            key: key.to_string(),
            reason,
        };
        for (k, v) in [
            ("hidden_size", self.hidden_size),
            ("num_layers", self.num_layers),
            ("num_heads", self.num_heads),
            ("num_kv_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("intermediate_size", self.intermediate_size),
            ("vocab_size", self.vocab_size),
        ] {
            if v == 0 {
                return Err(bad(k, "must be positive".into()));
            }
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(bad(
                "num_kv_heads",
                format!(
                    "{} does not divide num_heads {}",
                    self.num_kv_heads, self.num_heads
                ),
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(bad("head_dim", format!("{} is odd", self.head_dim)));
        }
        if self.rope_theta.is_nan()
            || self.rms_norm_eps.is_nan()
            || self.rope_theta <= 0.0
            || self.rms_norm_eps <= 0.0
        {
            return Err(bad("rope_theta/rms_norm_eps", "must be positive".into()));
        }
        Ok(())
    }

    /// The configuration of a GGUF file or an HF folder, without loading its weights. Errors: as
    /// [`crate::Model::load`] reading the header or `config.json`.
    pub fn read(path: &Path) -> Result<Self, ModelError> {
        if path.is_dir() {
            Self::from_hf_config(&path.join("config.json"))
        } else {
            crate::gguf::GgufHeader::read(path)?.config()
        }
    }

    /// Parses an HF `config.json` (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM). Errors:
    /// [`ModelError::Io`], [`ModelError::Format`] for bad JSON, [`ModelError::UnsupportedArch`] for
    /// other model types.
    pub fn from_hf_config(path: &Path) -> Result<Self, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
        let c: HfConfig = serde_json::from_str(&text).map_err(|e| ModelError::Format {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let arch = match c.model_type.as_str() {
            "llama" | "mistral" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            other => {
                return Err(ModelError::UnsupportedArch {
                    path: path.to_path_buf(),
                    arch: other.to_string(),
                });
            }
        };
        let num_kv_heads = c.num_key_value_heads.unwrap_or(c.num_attention_heads);
        let head_dim = c
            .head_dim
            .unwrap_or(c.hidden_size / c.num_attention_heads.max(1));
        let cfg = ModelConfig {
            arch,
            hidden_size: c.hidden_size,
            num_layers: c.num_hidden_layers,
            num_heads: c.num_attention_heads,
            num_kv_heads,
            head_dim,
            intermediate_size: c.intermediate_size,
            vocab_size: c.vocab_size,
            rms_norm_eps: c.rms_norm_eps.unwrap_or(1e-6),
            rope_theta: c.rope_theta.unwrap_or(10_000.0),
            max_position_embeddings: c.max_position_embeddings.unwrap_or(4096),
            tie_word_embeddings: c.tie_word_embeddings.unwrap_or(false),
            rope_style: RopeStyle::Half,
        };
        cfg.validate(path)?;
        Ok(cfg)
    }
}

#[derive(Debug, Deserialize)]
struct HfConfig {
    model_type: String,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    intermediate_size: usize,
    vocab_size: usize,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    max_position_embeddings: Option<usize>,
    tie_word_embeddings: Option<bool>,
}

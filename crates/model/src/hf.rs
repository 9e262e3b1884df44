//! Loading HF folders: `config.json` plus one or more `*.safetensors` files
//! (tensor names `model.layers.{i}.self_attn.q_proj.weight`, …), any float dtype,
//! converted to f32. Q/K rows are in HF layout, so RoPE is rotate-half.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use crate::linear::Linear;
use crate::weights::{Layer, WeightsFormat};
use crate::{Arch, Model, ModelConfig, ModelError};

/// Tensors of a set of safetensors files, remembering which file held each.
pub(crate) struct SafetensorsSet {
    folder: PathBuf,
    tensors: HashMap<String, (Tensor, PathBuf)>,
}

impl SafetensorsSet {
    /// Reads the files (sorted by name).
    pub(crate) fn read(folder: &Path, files: &[PathBuf]) -> Result<Self, ModelError> {
        let total: u64 = files
            .iter()
            .map(|f| f.metadata().map(|m| m.len()).unwrap_or(0))
            .sum();
        let pb = crate::progress::progress_bar(total, "loading weights");
        let mut tensors = HashMap::new();
        for f in files {
            let loaded = read_file(f)?;
            pb.inc(f.metadata().map(|m| m.len()).unwrap_or(0));
            for (name, t) in loaded {
                tensors.insert(name, (t, f.clone()));
            }
        }
        pb.finish_and_clear();
        Ok(SafetensorsSet {
            folder: folder.to_path_buf(),
            tensors,
        })
    }

    /// Whether the set holds `name`.
    pub(crate) fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Tensor `name` as f32, checked to have shape `expected`.
    pub(crate) fn get(&self, name: &str, expected: &[usize]) -> Result<Tensor, ModelError> {
        let Some((t, file)) = self.tensors.get(name) else {
            return Err(ModelError::MissingTensor {
                path: self.folder.clone(),
                tensor: name.to_string(),
            });
        };
        if t.dims() != expected {
            return Err(ModelError::ShapeMismatch {
                path: file.clone(),
                tensor: name.to_string(),
                expected: expected.to_vec(),
                actual: t.dims().to_vec(),
            });
        }
        Ok(t.to_dtype(DType::F32)?)
    }
}

/// Reads one safetensors file, naming it in any error.
pub(crate) fn read_file(path: &Path) -> Result<HashMap<String, Tensor>, ModelError> {
    let bytes = std::fs::read(path).map_err(|e| ModelError::io(path, e))?;
    candle_core::safetensors::load_buffer(&bytes, &Device::Cpu).map_err(|e| ModelError::Format {
        path: path.to_path_buf(),
        reason: format!("safetensors: {e}"),
    })
}

/// Loads an HF model folder.
pub(crate) fn load(folder: &Path) -> Result<Model, ModelError> {
    let _span = tracing::info_span!("load_hf", path = %folder.display()).entered();
    let cfg = ModelConfig::from_hf_config(&folder.join("config.json"))?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(folder)
        .map_err(|e| ModelError::io(folder, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(ModelError::MissingTensor {
            path: folder.to_path_buf(),
            tensor: "*.safetensors (no weight files)".into(),
        });
    }
    let st = SafetensorsSet::read(folder, &files)?;
    let (d, v) = (cfg.hidden_size, cfg.vocab_size);
    let qd = cfg.num_heads * cfg.head_dim;
    let kvd = cfg.num_kv_heads * cfg.head_dim;
    let bias = cfg.arch == Arch::Qwen2;
    let lin = |name: &str, out: usize, inp: usize, b: bool| -> Result<Linear, ModelError> {
        let w = st.get(&format!("{name}.weight"), &[out, inp])?;
        let b = if b {
            Some(st.get(&format!("{name}.bias"), &[out])?)
        } else {
            None
        };
        Ok(Linear::dense(w, b))
    };
    let embed = st.get("model.embed_tokens.weight", &[v, d])?;
    let mut layers = Vec::with_capacity(cfg.num_layers);
    for i in 0..cfg.num_layers {
        let p = |s: &str| format!("model.layers.{i}.{s}");
        layers.push(Layer {
            attn_norm: st.get(&p("input_layernorm.weight"), &[d])?,
            q: lin(&p("self_attn.q_proj"), qd, d, bias)?,
            k: lin(&p("self_attn.k_proj"), kvd, d, bias)?,
            v: lin(&p("self_attn.v_proj"), kvd, d, bias)?,
            o: lin(&p("self_attn.o_proj"), d, qd, false)?,
            ffn_norm: st.get(&p("post_attention_layernorm.weight"), &[d])?,
            gate: lin(&p("mlp.gate_proj"), cfg.intermediate_size, d, false)?,
            up: lin(&p("mlp.up_proj"), cfg.intermediate_size, d, false)?,
            down: lin(&p("mlp.down_proj"), d, cfg.intermediate_size, false)?,
        });
    }
    let norm = st.get("model.norm.weight", &[d])?;
    let lm_head = if cfg.tie_word_embeddings || !st.contains("lm_head.weight") {
        Linear::dense(embed.clone(), None)
    } else {
        lin("lm_head", v, d, false)?
    };
    let mut cfg = cfg;
    cfg.tie_word_embeddings = !st.contains("lm_head.weight");
    Ok(Model {
        config: cfg,
        embed,
        layers,
        norm,
        lm_head,
        path: folder.to_path_buf(),
        format: WeightsFormat::Safetensors,
    })
}

//! Tiny random fixtures: the same weights as an HF safetensors folder and as a
//! llama.cpp-style GGUF (q/k rows permuted for llama), plus PEFT adapters.

#![allow(dead_code)]

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use cipherlora_model::gguf_qk_row_permutation;

/// Shape of a tiny model.
#[derive(Clone, Copy, Debug)]
pub struct Tiny {
    pub arch: &'static str,
    pub d: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv: usize,
    pub hd: usize,
    pub ff: usize,
    pub vocab: usize,
}

pub const LLAMA: Tiny = Tiny {
    arch: "llama",
    d: 64,
    layers: 2,
    heads: 4,
    kv: 2,
    hd: 16,
    ff: 96,
    vocab: 50,
};

/// The PEFT names of all seven linear projections (`all-linear`).
pub const ALL_MODULES: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

pub const QWEN2: Tiny = Tiny {
    arch: "qwen2",
    ..LLAMA
};

/// Deterministic uniform values in [-scale, scale).
pub fn rand_tensor(seed: u64, shape: &[usize], scale: f32, offset: f32) -> Tensor {
    let n: usize = shape.iter().product();
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407)
        | 1;
    let v: Vec<f32> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            offset + scale * (((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0)
        })
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

/// HF-named random weights.
pub fn weights(t: &Tiny, seed: u64) -> HashMap<String, Tensor> {
    let mut w = HashMap::new();
    let mut k = seed;
    let mut put = |name: String, shape: &[usize], scale: f32, offset: f32| {
        k += 1;
        w.insert(name, rand_tensor(k, shape, scale, offset));
    };
    put(
        "model.embed_tokens.weight".into(),
        &[t.vocab, t.d],
        1.0,
        0.0,
    );
    put("model.norm.weight".into(), &[t.d], 0.2, 1.0);
    put("lm_head.weight".into(), &[t.vocab, t.d], 0.2, 0.0);
    let (qd, kvd) = (t.heads * t.hd, t.kv * t.hd);
    for i in 0..t.layers {
        let p = |s: &str| format!("model.layers.{i}.{s}");
        put(p("input_layernorm.weight"), &[t.d], 0.2, 1.0);
        put(p("post_attention_layernorm.weight"), &[t.d], 0.2, 1.0);
        put(p("self_attn.q_proj.weight"), &[qd, t.d], 0.25, 0.0);
        put(p("self_attn.k_proj.weight"), &[kvd, t.d], 0.25, 0.0);
        put(p("self_attn.v_proj.weight"), &[kvd, t.d], 0.25, 0.0);
        put(p("self_attn.o_proj.weight"), &[t.d, qd], 0.25, 0.0);
        put(p("mlp.gate_proj.weight"), &[t.ff, t.d], 0.25, 0.0);
        put(p("mlp.up_proj.weight"), &[t.ff, t.d], 0.25, 0.0);
        put(p("mlp.down_proj.weight"), &[t.d, t.ff], 0.25, 0.0);
        if t.arch == "qwen2" {
            put(p("self_attn.q_proj.bias"), &[qd], 0.3, 0.0);
            put(p("self_attn.k_proj.bias"), &[kvd], 0.3, 0.0);
            put(p("self_attn.v_proj.bias"), &[kvd], 0.3, 0.0);
        }
    }
    w
}

pub fn write_hf(dir: &Path, t: &Tiny, w: &HashMap<String, Tensor>) {
    std::fs::create_dir_all(dir).unwrap();
    let cfg = serde_json::json!({
        "model_type": t.arch,
        "hidden_size": t.d,
        "num_hidden_layers": t.layers,
        "num_attention_heads": t.heads,
        "num_key_value_heads": t.kv,
        "intermediate_size": t.ff,
        "vocab_size": t.vocab,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 256,
        "tie_word_embeddings": false
    });
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    candle_core::safetensors::save(w, dir.join("model.safetensors")).unwrap();
}

fn gguf_name(hf: &str) -> String {
    let fixed = [
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("model.norm.weight", "output_norm.weight"),
        ("lm_head.weight", "output.weight"),
    ];
    if let Some((_, g)) = fixed.iter().find(|(h, _)| *h == hf) {
        return g.to_string();
    }
    let rest = hf.strip_prefix("model.layers.").unwrap();
    let (i, rest) = rest.split_once('.').unwrap();
    let map = [
        ("input_layernorm", "attn_norm"),
        ("post_attention_layernorm", "ffn_norm"),
        ("self_attn.q_proj", "attn_q"),
        ("self_attn.k_proj", "attn_k"),
        ("self_attn.v_proj", "attn_v"),
        ("self_attn.o_proj", "attn_output"),
        ("mlp.gate_proj", "ffn_gate"),
        ("mlp.up_proj", "ffn_up"),
        ("mlp.down_proj", "ffn_down"),
    ];
    let (h, g) = map.iter().find(|(h, _)| rest.starts_with(h)).unwrap();
    format!("blk.{i}.{g}{}", &rest[h.len()..])
}

/// Writes the weights as llama.cpp's converter would: llama q/k rows permuted.
pub fn write_gguf(path: &Path, t: &Tiny, w: &HashMap<String, Tensor>, dtype: GgmlDType) {
    let a = t.arch;
    let meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(a.into())),
        (format!("{a}.block_count"), Value::U32(t.layers as u32)),
        (format!("{a}.embedding_length"), Value::U32(t.d as u32)),
        (format!("{a}.feed_forward_length"), Value::U32(t.ff as u32)),
        (
            format!("{a}.attention.head_count"),
            Value::U32(t.heads as u32),
        ),
        (
            format!("{a}.attention.head_count_kv"),
            Value::U32(t.kv as u32),
        ),
        (
            format!("{a}.attention.layer_norm_rms_epsilon"),
            Value::F32(1e-5),
        ),
        (format!("{a}.rope.freq_base"), Value::F32(10000.0)),
        (format!("{a}.context_length"), Value::U32(256)),
    ];
    let mut names: Vec<&String> = w.keys().collect();
    names.sort();
    let mut tensors = Vec::new();
    for n in names {
        let mut x = w[n].clone();
        if t.arch == "llama" && (n.contains("q_proj.weight") || n.contains("k_proj.weight")) {
            let heads = if n.contains("q_proj") { t.heads } else { t.kv };
            let idx = gguf_qk_row_permutation(heads, t.hd);
            let idx = Tensor::new(idx.as_slice(), &Device::Cpu).unwrap();
            x = x.index_select(&idx, 0).unwrap();
        }
        let dt = if x.rank() == 1 { GgmlDType::F32 } else { dtype };
        tensors.push((gguf_name(n), QTensor::quantize(&x, dt).unwrap()));
    }
    let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut f = File::create(path).unwrap();
    candle_core::quantized::gguf_file::write(&mut f, &meta_refs, &tensor_refs).unwrap();
}

/// A PEFT adapter: per (layer, module) lora_A (r × d_in), lora_B (d_out × r).
pub struct Adapter {
    pub r: usize,
    pub alpha: f64,
    pub rslora: bool,
    pub targets: Vec<&'static str>,
    pub tensors: HashMap<String, Tensor>,
}

pub fn dims(t: &Tiny, module: &str) -> (usize, usize) {
    let (qd, kvd) = (t.heads * t.hd, t.kv * t.hd);
    match module {
        "q_proj" => (t.d, qd),
        "k_proj" | "v_proj" => (t.d, kvd),
        "o_proj" => (qd, t.d),
        "gate_proj" | "up_proj" => (t.d, t.ff),
        "down_proj" => (t.ff, t.d),
        _ => (t.d, t.d),
    }
}

pub fn module_path(module: &str) -> &'static str {
    match module {
        "q_proj" | "k_proj" | "v_proj" | "o_proj" => "self_attn",
        _ => "mlp",
    }
}

pub fn adapter(
    t: &Tiny,
    r: usize,
    alpha: f64,
    rslora: bool,
    targets: &[&'static str],
    seed: u64,
) -> Adapter {
    let mut tensors = HashMap::new();
    let mut k = seed;
    for i in 0..t.layers {
        for &m in targets {
            let (din, dout) = dims(t, m);
            let base = format!("base_model.model.model.layers.{i}.{}.{m}", module_path(m));
            k += 2;
            tensors.insert(
                format!("{base}.lora_A.weight"),
                rand_tensor(k, &[r, din], 0.3, 0.0),
            );
            tensors.insert(
                format!("{base}.lora_B.weight"),
                rand_tensor(k + 1, &[dout, r], 0.3, 0.0),
            );
        }
    }
    Adapter {
        r,
        alpha,
        rslora,
        targets: targets.to_vec(),
        tensors,
    }
}

impl Adapter {
    pub fn scaling(&self) -> f64 {
        if self.rslora {
            self.alpha / (self.r as f64).sqrt()
        } else {
            self.alpha / self.r as f64
        }
    }

    pub fn write(&self, dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        let cfg = serde_json::json!({
            "peft_type": "LORA",
            "r": self.r,
            "lora_alpha": self.alpha,
            "target_modules": self.targets,
            "use_rslora": self.rslora,
            "fan_in_fan_out": false,
            "lora_dropout": 0.0,
            "bias": "none"
        });
        std::fs::write(dir.join("adapter_config.json"), cfg.to_string()).unwrap();
        candle_core::safetensors::save(&self.tensors, dir.join("adapter_model.safetensors"))
            .unwrap();
    }

    /// The base weights with W + s·B·A merged in (HF layout): the reference.
    pub fn merge(&self, t: &Tiny, w: &HashMap<String, Tensor>) -> HashMap<String, Tensor> {
        let mut out = w.clone();
        for i in 0..t.layers {
            for &m in &self.targets {
                let base = format!("model.layers.{i}.{}.{m}", module_path(m));
                let pre = format!("base_model.model.{base}");
                let a = &self.tensors[&format!("{pre}.lora_A.weight")];
                let b = &self.tensors[&format!("{pre}.lora_B.weight")];
                let delta = (b.matmul(a).unwrap() * self.scaling()).unwrap();
                let key = format!("{base}.weight");
                let merged = (&out[&key] + delta).unwrap();
                out.insert(key, merged);
            }
        }
        out
    }
}

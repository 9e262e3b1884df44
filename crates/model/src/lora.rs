//! PEFT LoRA adapters (Hu et al. 2021, eq. 3: `h = W x + (α/r)·B A x`; rsLoRA, Kalajdzievski 2023:
//! α/√r) and the plaintext LoRA hook. For llama-family GGUF models ([`RopeStyle::Interleaved`])
//! lora_B's q/k rows get llama.cpp's per-head permutation (HF row `h·hd + s·hd/2 + i` → `h·hd +
//! 2i + s`) at load, so `B·A·x` lands in the model's row order; A·B is never formed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde::Deserialize;

use crate::hook::{DeltaHook, GroupDeltas, Proj, ProjGroup};
use crate::{ModelConfig, ModelError, RopeStyle, batch_invariant};

/// lora_A, lora_B and scaling of one adapted projection.
#[derive(Debug, Clone)]
pub struct LoraWeights {
    /// lora_A, (r × d_in) f32.
    pub a: Tensor,
    /// lora_B, (d_out × r) f32, rows in the target model's layout.
    pub b: Tensor,
    /// α/r, or α/√r with rsLoRA.
    pub scaling: f64,
}

impl LoraWeights {
    /// The rank r of this module.
    pub fn rank(&self) -> usize {
        self.a.dims()[0]
    }

    /// `scaling · (x Aᵀ) Bᵀ` for x (T × d_in): the delta (T × d_out). Errors:
    /// [`ModelError::Candle`] on a shape mismatch.
    pub fn delta(&self, x: &Tensor) -> Result<Tensor, ModelError> {
        // Row by row as the model's projections ([`crate::batch_invariant`]).
        let xa = batch_invariant::project(x, &self.a)?;
        Ok((batch_invariant::project(&xa, &self.b)? * self.scaling)?)
    }
}

/// A parsed PEFT LoRA adapter mapped onto a base model's projections.
#[derive(Debug, Clone)]
pub struct LoraAdapter {
    rank: usize,
    alpha: f64,
    use_rslora: bool,
    target_modules: Vec<Proj>,
    layers: Vec<BTreeMap<Proj, LoraWeights>>,
    path: PathBuf,
}

#[derive(Debug, Deserialize)]
struct AdapterConfig {
    r: usize,
    lora_alpha: f64,
    #[serde(default)]
    target_modules: TargetModules,
    #[serde(default)]
    use_rslora: bool,
    #[serde(default)]
    fan_in_fan_out: bool,
    #[serde(default)]
    rank_pattern: HashMap<String, usize>,
    #[serde(default)]
    alpha_pattern: HashMap<String, f64>,
    #[serde(default)]
    peft_type: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(untagged)]
enum TargetModules {
    #[default]
    Unset,
    One(String),
    List(Vec<String>),
}

/// Looks `module` ("model.layers.3.self_attn.q_proj") up in a PEFT pattern map, whose keys match as
/// the module's full name or a dotted suffix of it.
fn pattern<T: Copy>(map: &HashMap<String, T>, module: &str) -> Option<T> {
    map.iter()
        .filter(|(k, _)| module == k.as_str() || module.ends_with(&format!(".{k}")))
        .max_by_key(|(k, _)| k.len())
        .map(|(_, v)| *v)
}

/// Parses "….layers.{i}.{self_attn|mlp}.{proj}.lora_{A|B}[.adapter].weight".
fn parse_key(key: &str) -> Option<(usize, &str, char)> {
    let rest = &key[key.find("layers.")? + "layers.".len()..];
    let (layer, rest) = rest.split_once('.')?;
    let layer = layer.parse().ok()?;
    let (_, rest) = rest.split_once('.')?; // self_attn / mlp
    let (module, rest) = rest.split_once('.')?;
    let ab = if rest.starts_with("lora_A.") {
        'A'
    } else if rest.starts_with("lora_B.") {
        'B'
    } else {
        return None;
    };
    Some((layer, module, ab))
}

/// Row permutation llama.cpp's converter applies to q/k weights of llama-family models: new row
/// `h·hd + 2i + s` = old row `h·hd + s·hd/2 + i`.
pub fn gguf_qk_row_permutation(n_heads: usize, head_dim: usize) -> Vec<u32> {
    let half = head_dim / 2;
    let mut idx = Vec::with_capacity(n_heads * head_dim);
    for h in 0..n_heads {
        for i in 0..half {
            for s in 0..2 {
                idx.push((h * head_dim + s * half + i) as u32);
            }
        }
    }
    idx
}

impl LoraAdapter {
    /// Loads a PEFT adapter folder for a model of configuration `config`. Errors:
    /// [`ModelError::Adapter`] naming file and tensor for an unknown target module, an out-of-range
    /// layer, a rank or width mismatch, or an unpaired lora_A/lora_B;
    /// [`ModelError::Io`]/[`ModelError::Format`] for unreadable files.
    pub fn load(dir: &Path, config: &ModelConfig) -> Result<Self, ModelError> {
        let cfg_path = dir.join("adapter_config.json");
        let text = std::fs::read_to_string(&cfg_path).map_err(|e| ModelError::io(&cfg_path, e))?;
        let ac: AdapterConfig = serde_json::from_str(&text).map_err(|e| ModelError::Format {
            path: cfg_path.clone(),
            reason: e.to_string(),
        })?;
        let cfg_err = |tensor: &str, reason: String| ModelError::Adapter {
            path: cfg_path.clone(),
            tensor: tensor.to_string(),
            reason,
        };
        if let Some(t) = &ac.peft_type
            && t != "LORA"
        {
            return Err(cfg_err("peft_type", format!("`{t}` is not LORA")));
        }
        if ac.r == 0 {
            return Err(cfg_err("r", "rank must be positive".into()));
        }
        if ac.fan_in_fan_out {
            return Err(cfg_err(
                "fan_in_fan_out",
                "true is for Conv1D (GPT-2) bases; Llama/Qwen2 projections are nn.Linear".into(),
            ));
        }
        let declared: Option<Vec<String>> = match &ac.target_modules {
            TargetModules::Unset => None,
            TargetModules::One(s) if s == "all-linear" => None,
            TargetModules::One(s) => Some(vec![s.clone()]),
            TargetModules::List(v) => Some(v.clone()),
        };
        if let Some(names) = &declared {
            for n in names {
                if Proj::from_peft_name(n).is_none() {
                    return Err(cfg_err(
                        "target_modules",
                        format!(
                            "`{n}` is not a projection of the base model (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)"
                        ),
                    ));
                }
            }
        }

        let st_path = dir.join("adapter_model.safetensors");
        let tensors = crate::hf::read_file(&st_path)?;
        let err = |tensor: &str, reason: String| ModelError::Adapter {
            path: st_path.clone(),
            tensor: tensor.to_string(),
            reason,
        };
        let mut pairs: BTreeMap<(usize, Proj), (Named, Named)> = BTreeMap::new();
        let mut names: Vec<&String> = tensors.keys().collect();
        names.sort();
        for name in names {
            let Some((layer, module, ab)) = parse_key(name) else {
                return Err(err(name, "not a LoRA weight of a decoder layer".into()));
            };
            let Some(proj) = Proj::from_peft_name(module) else {
                return Err(err(
                    name,
                    format!("target module `{module}` is not a projection of the base model"),
                ));
            };
            if layer >= config.num_layers {
                return Err(err(
                    name,
                    format!(
                        "layer {layer} but the base model has {} layers",
                        config.num_layers
                    ),
                ));
            }
            if let Some(d) = &declared
                && !d.iter().any(|n| n == module)
            {
                return Err(err(
                    name,
                    format!("module `{module}` is not in target_modules {d:?}"),
                ));
            }
            let t = tensors[name].to_dtype(DType::F32)?;
            let e = pairs.entry((layer, proj)).or_default();
            if ab == 'A' {
                e.0 = Some((name.clone(), t));
            } else {
                e.1 = Some((name.clone(), t));
            }
        }
        if pairs.is_empty() {
            return Err(err("*", "no lora_A/lora_B tensors".into()));
        }

        let mut layers: Vec<BTreeMap<Proj, LoraWeights>> = vec![BTreeMap::new(); config.num_layers];
        let mut targets = BTreeSet::new();
        for ((layer, proj), (a, b)) in pairs {
            let module = format!("model.layers.{layer}.{}", proj.peft_name());
            let (Some((a_name, a)), Some((b_name, b))) = (a, b) else {
                return Err(err(
                    &module,
                    "lora_A and lora_B must both be present".into(),
                ));
            };
            let r = pattern(&ac.rank_pattern, &module).unwrap_or(ac.r);
            let alpha = pattern(&ac.alpha_pattern, &module).unwrap_or(ac.lora_alpha);
            let (d_in, d_out) = (config.proj_in_dim(proj), config.proj_out_dim(proj));
            if a.dims() != [r, d_in] {
                return Err(err(
                    &a_name,
                    format!(
                        "shape {:?}, expected [{r}, {d_in}] (rank r={r} from adapter_config.json, d_in={d_in} of the base model's {})",
                        a.dims(),
                        proj.peft_name()
                    ),
                ));
            }
            if b.dims() != [d_out, r] {
                return Err(err(
                    &b_name,
                    format!(
                        "shape {:?}, expected [{d_out}, {r}] (d_out={d_out} of the base model's {}, rank r={r})",
                        b.dims(),
                        proj.peft_name()
                    ),
                ));
            }
            let b = match (config.rope_style, proj) {
                (RopeStyle::Interleaved, Proj::Q) => {
                    permute_rows(&b, config.num_heads, config.head_dim)?
                }
                (RopeStyle::Interleaved, Proj::K) => {
                    permute_rows(&b, config.num_kv_heads, config.head_dim)?
                }
                _ => b,
            };
            let scaling = if ac.use_rslora {
                alpha / (r as f64).sqrt()
            } else {
                alpha / r as f64
            };
            targets.insert(proj);
            layers[layer].insert(proj, LoraWeights { a, b, scaling });
        }
        Ok(LoraAdapter {
            rank: ac.r,
            alpha: ac.lora_alpha,
            use_rslora: ac.use_rslora,
            target_modules: targets.into_iter().collect(),
            layers,
            path: dir.to_path_buf(),
        })
    }

    /// The configured rank r (`adapter_config.json`'s `r`).
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The configured lora_alpha.
    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    /// Whether rsLoRA scaling (α/√r) is used.
    pub fn use_rslora(&self) -> bool {
        self.use_rslora
    }

    /// The projections adapted in at least one layer, in forward order.
    pub fn target_modules(&self) -> &[Proj] {
        &self.target_modules
    }

    /// Number of decoder layers of the base model.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// The weights of `proj` in `layer`, if adapted.
    pub fn get(&self, layer: usize, proj: Proj) -> Option<&LoraWeights> {
        self.layers.get(layer).and_then(|m| m.get(&proj))
    }

    /// The adapter folder.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// A tensor with its name in the adapter file, if present.
type Named = Option<(String, Tensor)>;

fn permute_rows(b: &Tensor, n_heads: usize, head_dim: usize) -> Result<Tensor, ModelError> {
    let idx = gguf_qk_row_permutation(n_heads, head_dim);
    let idx = Tensor::new(idx.as_slice(), &Device::Cpu)?;
    Ok(b.index_select(&idx, 0)?)
}

/// The plaintext LoRA hook: the reference every encrypted hook must match.
#[derive(Debug, Clone, Copy)]
pub struct PlainLora<'a> {
    adapter: &'a LoraAdapter,
}

impl<'a> PlainLora<'a> {
    /// A hook applying `adapter`.
    pub fn new(adapter: &'a LoraAdapter) -> Self {
        PlainLora { adapter }
    }
}

impl DeltaHook for PlainLora<'_> {
    fn deltas(
        &mut self,
        layer: usize,
        group: ProjGroup,
        x: &Tensor,
    ) -> Result<GroupDeltas, ModelError> {
        let mut out = GroupDeltas::none();
        for &p in group.projs() {
            if let Some(w) = self.adapter.get(layer, p) {
                out.push(p, w.delta(x)?);
            }
        }
        Ok(out)
    }

    fn wants(&self, layer: usize, group: ProjGroup) -> bool {
        group
            .projs()
            .iter()
            .any(|&p| self.adapter.get(layer, p).is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn randn(shape: (usize, usize)) -> Tensor {
        Tensor::randn(0f32, 1.0, shape, &Device::Cpu).unwrap()
    }

    /// x·(W + s·B·A)ᵀ (merged weights) = x·Wᵀ + the hook's delta, on random inputs.
    #[test]
    fn hook_delta_equals_merged_weights_reference() {
        let (t, d_in, d_out, r, s) = (9, 48, 40, 6, 16.0 / 6.0);
        let (x, w, a, b) = (
            randn((t, d_in)),
            randn((d_out, d_in)),
            randn((r, d_in)),
            randn((d_out, r)),
        );
        let merged = (&w + (b.matmul(&a).unwrap() * s).unwrap()).unwrap();
        let reference = x.matmul(&merged.t().unwrap()).unwrap();
        let lw = LoraWeights { a, b, scaling: s };
        let got = (x.matmul(&w.t().unwrap()).unwrap() + lw.delta(&x).unwrap()).unwrap();
        let err = (&got - &reference)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        let scale = reference
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(err <= 1e-4 * scale, "{err} vs {scale}");
    }

    #[test]
    fn gguf_permutation_interleaves_rotary_halves() {
        // One head of dim 4: HF rows [0, 1 | 2, 3] → GGUF rows [0, 2, 1, 3].
        assert_eq!(gguf_qk_row_permutation(1, 4), vec![0, 2, 1, 3]);
        assert_eq!(gguf_qk_row_permutation(2, 4), vec![0, 2, 1, 3, 4, 6, 5, 7]);
    }

    #[test]
    fn pattern_matches_dotted_suffix_longest_first() {
        let m: HashMap<String, usize> = [
            ("q_proj".to_string(), 4),
            ("layers.1.self_attn.q_proj".to_string(), 2),
        ]
        .into_iter()
        .collect();
        assert_eq!(pattern(&m, "model.layers.0.self_attn.q_proj"), Some(4));
        assert_eq!(pattern(&m, "model.layers.1.self_attn.q_proj"), Some(2));
        assert_eq!(pattern(&m, "model.layers.1.self_attn.xq_proj"), None);
    }
}

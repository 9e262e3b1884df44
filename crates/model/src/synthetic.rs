//! Seeded random PEFT adapters for tests that need shapes no committed adapter has: lora_A from
//! `U(−1/√d_in, 1/√d_in)` (FFA-LoRA's initialisation), lora_B from `N(0, b_std²)` (`b_std` sets the
//! strength).

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::hook::Proj;
use crate::{ModelConfig, ModelError};

/// What [`write_random_adapter`] writes.
#[derive(Debug, Clone, PartialEq)]
pub struct RandomAdapterSpec {
    /// Adapted projections (PEFT `target_modules`).
    pub targets: Vec<Proj>,
    /// Rank r.
    pub rank: usize,
    /// lora_alpha (scaling α/r).
    pub alpha: f64,
    /// Standard deviation of lora_B's entries.
    pub b_std: f64,
    /// Mark the adapter FFA-LoRA (public lora_A) in `cipherlora.json`.
    pub ffa: bool,
    /// Seed of the ChaCha8 stream the weights come from.
    pub seed: u64,
}

/// Writes a PEFT adapter folder (HF row layout, with `cipherlora.json`) for every layer of a model
/// shaped like `config`. Errors: [`ModelError::Io`], [`ModelError::Candle`].
pub fn write_random_adapter(
    dir: &Path,
    config: &ModelConfig,
    spec: &RandomAdapterSpec,
) -> Result<(), ModelError> {
    std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed);
    let r = spec.rank;
    let mut tensors = HashMap::new();
    for layer in 0..config.num_layers {
        for &p in &spec.targets {
            let (d_in, d_out) = (config.proj_in_dim(p), config.proj_out_dim(p));
            let bound = 1.0 / (d_in as f64).sqrt();
            let a: Vec<f32> = (0..r * d_in)
                .map(|_| rng.random_range(-bound..bound) as f32)
                .collect();
            let b: Vec<f32> = (0..d_out * r)
                .map(|_| (spec.b_std * normal(&mut rng)) as f32)
                .collect();
            let module = match p.group() {
                crate::ProjGroup::Qkv | crate::ProjGroup::O => "self_attn",
                _ => "mlp",
            };
            let prefix = format!(
                "base_model.model.model.layers.{layer}.{module}.{}",
                p.peft_name()
            );
            tensors.insert(
                format!("{prefix}.lora_A.weight"),
                Tensor::from_vec(a, (r, d_in), &Device::Cpu)?,
            );
            tensors.insert(
                format!("{prefix}.lora_B.weight"),
                Tensor::from_vec(b, (d_out, r), &Device::Cpu)?,
            );
        }
    }
    candle_core::safetensors::save(&tensors, dir.join("adapter_model.safetensors"))?;
    let names: Vec<&str> = spec.targets.iter().map(|p| p.peft_name()).collect();
    let config_json = serde_json::json!({
        "peft_type": "LORA",
        "r": r,
        "lora_alpha": spec.alpha,
        "target_modules": names,
        "fan_in_fan_out": false,
        "use_rslora": false,
        "bias": "none",
        "task_type": "CAUSAL_LM",
    });
    let ours = serde_json::json!({ "ffa": spec.ffa, "synthetic_seed": spec.seed });
    for (file, value) in [
        ("adapter_config.json", config_json),
        ("cipherlora.json", ours),
    ] {
        let path = dir.join(file);
        std::fs::write(&path, value.to_string()).map_err(|e| ModelError::io(&path, e))?;
    }
    Ok(())
}

/// Box–Muller standard normal.
fn normal(rng: &mut ChaCha8Rng) -> f64 {
    let u1: f64 = rng.random_range(f64::EPSILON..1.0);
    let u2: f64 = rng.random_range(0.0..1.0);
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

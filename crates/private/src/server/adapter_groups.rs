//! A PEFT adapter as fused layer groups in the PEFT (Hugging Face) row layout.

use std::path::Path;

use cipherlora_helora::{GroupAdapter, ProjectionAdapter};
use cipherlora_model::{LoraAdapter, ModelConfig, ProjGroup, RopeStyle};

use crate::PrivateError;

/// Which LoRA variant the adapter is, from its `cipherlora.json` sidecar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoraKind {
    /// lora_A and lora_B secret: the server computes both products (depth 2).
    Standard,
    /// FFA-LoRA (Sun et al., ICLR 2024): lora_A frozen at a public random
    /// init, so the server may publish it and the client computes A·x.
    Ffa,
}

/// One adapted group of one layer.
#[derive(Debug, Clone)]
pub struct LayerGroup {
    /// Decoder layer.
    pub layer: usize,
    /// Which projections.
    pub group: ProjGroup,
    /// Fused weights (scaling folded into B at use; f32, row-major).
    pub adapter: GroupAdapter,
}

/// Every adapted group of an adapter, in forward order.
#[derive(Debug, Clone)]
pub struct AdapterGroups {
    /// LoRA variant.
    pub kind: LoraKind,
    /// The groups.
    pub groups: Vec<LayerGroup>,
}

impl AdapterGroups {
    /// Loads a PEFT folder for a base model of shape `config`, keeping lora_B
    /// in the PEFT row layout (no GGUF q/k permutation). FFA is read from
    /// `cipherlora.json` (`{"ffa": true}`); without the file the adapter is
    /// standard.
    ///
    /// # Errors
    /// [`PrivateError::Model`] for unreadable or mismatched adapter files,
    /// [`PrivateError::Sidecar`] for a malformed `cipherlora.json`.
    pub fn load(dir: &Path, config: &ModelConfig) -> Result<Self, PrivateError> {
        let mut hf_layout = config.clone();
        hf_layout.rope_style = RopeStyle::Half;
        let adapter = LoraAdapter::load(dir, &hf_layout)?;
        let kind = read_kind(dir)?;
        Self::from_adapter(&adapter, kind)
    }

    /// Splits a loaded adapter (in whatever row layout it was loaded) into
    /// fused groups.
    ///
    /// # Errors
    /// [`PrivateError::Model`] if a weight tensor cannot be read as f32.
    pub fn from_adapter(adapter: &LoraAdapter, kind: LoraKind) -> Result<Self, PrivateError> {
        let mut groups = Vec::new();
        for layer in 0..adapter.num_layers() {
            for group in ProjGroup::ALL {
                let mut projections = Vec::new();
                for &p in group.projs() {
                    if let Some(w) = adapter.get(layer, p) {
                        projections.push(ProjectionAdapter {
                            name: p.peft_name().to_string(),
                            d_out: w.b.dims()[0],
                            rank: w.rank(),
                            a: flat(&w.a)?,
                            b: flat(&w.b)?,
                            scaling: w.scaling as f32,
                        });
                    }
                }
                if let Some(first) = projections.first() {
                    let d_in = first.a.len() / first.rank;
                    groups.push(LayerGroup {
                        layer,
                        group,
                        adapter: GroupAdapter { d_in, projections },
                    });
                }
            }
        }
        Ok(AdapterGroups { kind, groups })
    }

    /// Wire index of a group kind.
    #[must_use]
    pub fn group_index(group: ProjGroup) -> u32 {
        match group {
            ProjGroup::Qkv => 0,
            ProjGroup::O => 1,
            ProjGroup::GateUp => 2,
            ProjGroup::Down => 3,
        }
    }

    /// The group adapted at (`layer`, `group`), if any.
    #[must_use]
    pub fn get(&self, layer: usize, group: ProjGroup) -> Option<&LayerGroup> {
        self.groups
            .iter()
            .find(|g| g.layer == layer && g.group == group)
    }
}

fn flat(t: &cipherlora_model::Tensor) -> Result<Vec<f32>, PrivateError> {
    let v = t.flatten_all().and_then(|t| t.to_vec1::<f32>());
    v.map_err(|e| PrivateError::Model(e.into()))
}

fn read_kind(dir: &Path) -> Result<LoraKind, PrivateError> {
    let path = dir.join("cipherlora.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(LoraKind::Standard);
    };
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| PrivateError::Sidecar {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    match v.get("ffa") {
        None | Some(serde_json::Value::Bool(false)) => Ok(LoraKind::Standard),
        Some(serde_json::Value::Bool(true)) => Ok(LoraKind::Ffa),
        Some(other) => Err(PrivateError::Sidecar {
            path,
            reason: format!("`ffa` must be a boolean, not {other}"),
        }),
    }
}

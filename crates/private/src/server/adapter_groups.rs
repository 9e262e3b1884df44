//! A PEFT adapter as fused layer groups in the PEFT (Hugging Face) row layout.

use std::path::Path;

use cipherlora_helora::{GroupAdapter, ProjectionAdapter};
use cipherlora_model::{LoraAdapter, ModelConfig, Proj, ProjGroup, RopeStyle};

use crate::PrivateError;
use crate::protocol::{LoraKind, PublicA, is_acceptance_hint, layer_runs};

/// One adapted group: one layer's projections of a shared input, or a fused run of layers.
#[derive(Debug, Clone)]
pub struct LayerGroup {
    /// Decoder layer (the first of a fused run).
    pub layer: usize,
    /// Which projections (a fused group: its first layer's first group).
    pub group: ProjGroup,
    /// Fused weights (scaling folded into B at use; f32, row-major).
    pub adapter: GroupAdapter,
    /// The decoder layer of each of `adapter.projections`.
    pub projection_layers: Vec<usize>,
}

impl LayerGroup {
    /// A group of one layer's projections.
    #[must_use]
    pub fn new(layer: usize, group: ProjGroup, adapter: GroupAdapter) -> Self {
        let projection_layers = vec![layer; adapter.projections.len()];
        Self {
            layer,
            group,
            adapter,
            projection_layers,
        }
    }

    /// Each known projection with its layer, in the group's order.
    #[must_use]
    pub fn layer_projections(&self) -> Vec<(usize, Proj)> {
        self.projection_layers
            .iter()
            .zip(&self.adapter.projections)
            .filter_map(|(&l, p)| Some((l, Proj::from_peft_name(&p.name)?)))
            .collect()
    }
}

/// Every adapted group of an adapter, in forward order.
#[derive(Debug, Clone)]
pub struct AdapterGroups {
    /// LoRA variant.
    pub kind: LoraKind,
    /// The groups.
    pub groups: Vec<LayerGroup>,
    /// The owner's per-token acceptance of a base drafter (`cipherlora.json`), published in offers.
    pub acceptance: Option<f64>,
}

impl AdapterGroups {
    /// Loads a PEFT folder for a model of shape `config`; `cipherlora.json` may set `{"ffa": true}`
    /// and `"acceptance"`. Errors: [`PrivateError::Model`], `Sidecar`.
    pub fn load(dir: &Path, config: &ModelConfig) -> Result<Self, PrivateError> {
        let mut hf_layout = config.clone();
        hf_layout.rope_style = RopeStyle::Half;
        let adapter = LoraAdapter::load(dir, &hf_layout)?;
        let (kind, acceptance) = read_sidecar(dir)?;
        Ok(AdapterGroups {
            acceptance,
            ..Self::from_adapter(&adapter, kind)?
        })
    }

    /// Splits a loaded adapter into fused groups. Errors: [`PrivateError::Model`].
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
                    groups.push(LayerGroup::new(
                        layer,
                        group,
                        GroupAdapter { d_in, projections },
                    ));
                }
            }
        }
        Ok(AdapterGroups {
            kind,
            groups,
            acceptance: None,
        })
    }

    /// Every projection's lora_A (public for FFA adapters), in group order, for
    /// [`crate::protocol::encode_public_a`].
    #[must_use]
    pub fn public_a(&self) -> Vec<PublicA> {
        self.groups
            .iter()
            .flat_map(|g| {
                g.adapter.projections.iter().filter_map(move |p| {
                    Some(PublicA {
                        layer: g.layer,
                        proj: Proj::from_peft_name(&p.name)?,
                        rank: p.rank,
                        d_in: g.adapter.d_in,
                        a: p.a.clone(),
                    })
                })
            })
            .collect()
    }

    /// One group per run of `layers` adapted layers (FFA), inputs concatenated and lora_A
    /// zero-padded; standard LoRA stays unfused.
    #[must_use]
    pub fn fuse_layers(&self, layers: usize) -> AdapterGroups {
        if self.kind != LoraKind::Ffa || layers == 0 {
            return self.clone();
        }
        let mut groups: Vec<LayerGroup> = Vec::new();
        let group_layers: Vec<usize> = self.groups.iter().map(|g| g.layer).collect();
        for run in layer_runs(&group_layers, layers) {
            let members = &self.groups[run];
            let d_in: usize = members.iter().map(|g| g.adapter.d_in).sum();
            let mut projections = Vec::new();
            let mut projection_layers = Vec::new();
            let mut offset = 0;
            for g in members {
                for (p, &l) in g.adapter.projections.iter().zip(&g.projection_layers) {
                    let mut a = vec![0.0f32; p.rank * d_in];
                    for (row, src) in p.a.chunks(g.adapter.d_in).enumerate() {
                        let at = row * d_in + offset;
                        a[at..at + src.len()].copy_from_slice(src);
                    }
                    projections.push(ProjectionAdapter { a, ..p.clone() });
                    projection_layers.push(l);
                }
                offset += g.adapter.d_in;
            }
            groups.push(LayerGroup {
                layer: members[0].layer,
                group: members[0].group,
                adapter: GroupAdapter { d_in, projections },
                projection_layers,
            });
        }
        AdapterGroups {
            kind: self.kind,
            groups,
            acceptance: self.acceptance,
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

/// The LoRA variant and acceptance hint from `cipherlora.json` (standard, none without it).
fn read_sidecar(dir: &Path) -> Result<(LoraKind, Option<f64>), PrivateError> {
    let path = dir.join("cipherlora.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok((LoraKind::Standard, None));
    };
    let bad = |reason: String| PrivateError::Sidecar {
        path: path.clone(),
        reason,
    };
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let kind = match v.get("ffa") {
        None | Some(serde_json::Value::Bool(false)) => LoraKind::Standard,
        Some(serde_json::Value::Bool(true)) => LoraKind::Ffa,
        Some(other) => return Err(bad(format!("`ffa` must be a boolean, not {other}"))),
    };
    let acceptance = match v.get("acceptance") {
        None => None,
        Some(a) => match a.as_f64() {
            Some(a) if is_acceptance_hint(a) => Some(a),
            _ => {
                return Err(bad(format!(
                    "`acceptance` must be a number in (0, 1), not {a}"
                )));
            }
        },
    };
    Ok((kind, acceptance))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A q,k,v (d_in 3) and o (d_in 2) layer at ranks 2 and 1, plus an o-only layer.
    fn groups(kind: LoraKind) -> AdapterGroups {
        let proj =
            |name: &str, d_out: usize, rank: usize, d_in: usize, seed: f32| ProjectionAdapter {
                name: name.into(),
                d_out,
                rank,
                a: (0..rank * d_in).map(|i| seed + i as f32 * 0.1).collect(),
                b: (0..d_out * rank).map(|i| seed - i as f32 * 0.05).collect(),
                scaling: 1.5,
            };
        let group = |layer, group, d_in, projections| {
            LayerGroup::new(layer, group, GroupAdapter { d_in, projections })
        };
        AdapterGroups {
            kind,
            groups: vec![
                group(
                    0,
                    ProjGroup::Qkv,
                    3,
                    vec![proj("q_proj", 4, 2, 3, 0.3), proj("k_proj", 2, 2, 3, -0.2)],
                ),
                group(0, ProjGroup::O, 2, vec![proj("o_proj", 4, 1, 2, 0.7)]),
                group(1, ProjGroup::O, 2, vec![proj("o_proj", 4, 1, 2, -0.4)]),
            ],
            acceptance: None,
        }
    }

    /// The sidecar's acceptance hint: a probability, or a typed error.
    #[test]
    fn the_sidecar_acceptance_hint_is_a_probability_or_an_error() {
        let dir = std::env::temp_dir().join(format!("cl-sidecar-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(read_sidecar(&dir).unwrap(), (LoraKind::Standard, None));
        let write = |text: &str| std::fs::write(dir.join("cipherlora.json"), text).unwrap();
        write(r#"{"ffa": true, "acceptance": 0.885}"#);
        assert_eq!(read_sidecar(&dir).unwrap(), (LoraKind::Ffa, Some(0.885)));
        for bad in ["1.0", "0", "-0.5", "\"high\"", "null"] {
            write(&format!(r#"{{"acceptance": {bad}}}"#));
            assert!(
                matches!(read_sidecar(&dir), Err(PrivateError::Sidecar { .. })),
                "{bad}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The fused group's delta equals each unfused group's delta on its own input.
    #[test]
    fn a_layer_group_gives_every_projection_its_unfused_delta() {
        let unfused = groups(LoraKind::Ffa);
        let fused = unfused.fuse_layers(1);
        assert_eq!(fused.groups.len(), 2);
        let layer0 = &fused.groups[0];
        assert_eq!((layer0.layer, layer0.group), (0, ProjGroup::Qkv));
        assert_eq!(layer0.adapter.d_in, 5);
        layer0.adapter.validate().unwrap();
        // Two positions, position-major.
        let x_qkv = [0.5f32, -1.0, 2.0, 0.25, 0.75, -0.5];
        let x_o = [1.5f32, -0.25, -2.0, 0.5];
        let mut x = Vec::new();
        for p in 0..2 {
            x.extend_from_slice(&x_qkv[p * 3..p * 3 + 3]);
            x.extend_from_slice(&x_o[p * 2..p * 2 + 2]);
        }
        let got = layer0.adapter.reference_delta(&x).unwrap();
        let mut want = unfused.groups[0].adapter.reference_delta(&x_qkv).unwrap();
        want.extend(unfused.groups[1].adapter.reference_delta(&x_o).unwrap());
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            for (a, b) in g.iter().zip(w) {
                assert!((a - b).abs() < 1e-9, "{a} vs {b}");
            }
        }
        // A layer with one group is unchanged.
        assert_eq!(fused.groups[1].adapter, unfused.groups[2].adapter);
    }

    /// Two layers in one group give each projection its unfused delta and own layer.
    #[test]
    fn a_run_of_layers_gives_every_projection_its_unfused_delta_and_layer() {
        let unfused = groups(LoraKind::Ffa);
        for n in [2, 3] {
            let fused = unfused.fuse_layers(n);
            assert_eq!(fused.groups.len(), 1, "n = {n}");
            let g = &fused.groups[0];
            assert_eq!((g.layer, g.group, g.adapter.d_in), (0, ProjGroup::Qkv, 7));
            assert_eq!(
                g.layer_projections(),
                [(0, Proj::Q), (0, Proj::K), (0, Proj::O), (1, Proj::O)]
            );
            g.adapter.validate().unwrap();
            let x_qkv = [0.5f32, -1.0, 2.0];
            let (x_o0, x_o1) = ([1.5f32, -0.25], [-2.0f32, 0.5]);
            let x: Vec<f32> = [&x_qkv[..], &x_o0, &x_o1].concat();
            let got = g.adapter.reference_delta(&x).unwrap();
            let mut want = unfused.groups[0].adapter.reference_delta(&x_qkv).unwrap();
            want.extend(unfused.groups[1].adapter.reference_delta(&x_o0).unwrap());
            want.extend(unfused.groups[2].adapter.reference_delta(&x_o1).unwrap());
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(&want) {
                for (a, b) in g.iter().zip(w) {
                    assert!((a - b).abs() < 1e-9, "{a} vs {b}");
                }
            }
        }
    }

    #[test]
    fn layer_runs_hold_at_most_n_layers_each() {
        let layers = [0, 0, 1, 1, 3, 4, 4, 7];
        assert_eq!(layer_runs(&layers, 1), [0..2, 2..4, 4..5, 5..7, 7..8]);
        assert_eq!(layer_runs(&layers, 2), [0..4, 4..7, 7..8]);
        assert_eq!(layer_runs(&layers, 3), [0..5, 5..8]);
        let all = layer_runs(&layers, 9);
        assert_eq!((all.len(), all[0].clone()), (1, 0..8));
        assert!(layer_runs(&[], 2).is_empty());
    }

    #[test]
    fn standard_adapters_stay_grouped_by_input() {
        let g = groups(LoraKind::Standard);
        for n in [0, 1, 2, 3] {
            assert_eq!(g.fuse_layers(n).groups.len(), 3);
        }
    }
}

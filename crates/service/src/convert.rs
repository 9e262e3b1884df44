//! Conversions between [`AdapterInfo`] and its protobuf form.

use cipherlora_proto::v1;

use crate::backend::AdapterInfo;

impl From<&AdapterInfo> for v1::AdapterInfo {
    fn from(a: &AdapterInfo) -> Self {
        Self {
            adapter_id: a.adapter_id.clone(),
            base_model: Some(v1::BaseModel {
                name: a.base_model.clone(),
                revision: a.base_model_revision.clone(),
                sha256: bytes::Bytes::copy_from_slice(&a.base_model_sha256),
            }),
            target_modules: a.target_modules.clone(),
            rank: a.rank,
            rank_pattern: a.rank_pattern.clone().into_iter().collect(),
            lora_alpha: a.lora_alpha,
            num_layers: a.num_layers,
            groups: a
                .groups
                .iter()
                .zip(0u32..)
                .map(|(m, g)| v1::LayerGroupInfo {
                    group: g,
                    modules: m.clone(),
                })
                .collect(),
            ffa: a.ffa_lora_a.is_some(),
            ffa_lora_a: a.ffa_lora_a.clone(),
            ckks_presets: a.ckks_presets.clone(),
        }
    }
}

impl From<v1::AdapterInfo> for AdapterInfo {
    /// Lenient: a missing base model or a hash of the wrong length gives
    /// empty/zero fields, which never match a real model's hash.
    fn from(a: v1::AdapterInfo) -> Self {
        let bm = a.base_model.unwrap_or_default();
        let mut sha = [0u8; 32];
        if bm.sha256.len() == 32 {
            sha.copy_from_slice(&bm.sha256);
        }
        let mut groups = a.groups;
        groups.sort_by_key(|g| g.group);
        Self {
            adapter_id: a.adapter_id,
            base_model: bm.name,
            base_model_revision: bm.revision,
            base_model_sha256: sha,
            target_modules: a.target_modules,
            rank: a.rank,
            rank_pattern: a.rank_pattern.into_iter().collect(),
            lora_alpha: a.lora_alpha,
            num_layers: a.num_layers,
            groups: groups.into_iter().map(|g| g.modules).collect(),
            ffa_lora_a: a.ffa_lora_a.filter(|_| a.ffa),
            ckks_presets: a.ckks_presets,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adapter_info_round_trips_through_protobuf() {
        let info = AdapterInfo {
            adapter_id: "a".into(),
            base_model: "m".into(),
            base_model_revision: "r".into(),
            base_model_sha256: [9; 32],
            target_modules: vec!["q_proj".into(), "o_proj".into()],
            rank: 8,
            rank_pattern: [("o_proj".to_string(), 4)].into_iter().collect(),
            lora_alpha: 16.0,
            num_layers: 30,
            groups: vec![vec!["q_proj".into()], vec!["o_proj".into()]],
            ffa_lora_a: Some(v1::PublicLoraA {
                projections: vec![v1::PublicA {
                    layer: 3,
                    projection: v1::Projection::O.into(),
                    rank: 1,
                    d_in: 2,
                    values: vec![0.5, -1.0],
                }],
            }),
            ckks_presets: vec!["n8192".into()],
        };
        assert_eq!(AdapterInfo::from(v1::AdapterInfo::from(&info)), info);
    }
}

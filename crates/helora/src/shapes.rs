//! Layer-group shapes of the models the benchmarks and tests use.

use crate::adapter::GroupShape;

/// A model's LoRA layout: identical groups in every layer.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelShape {
    /// Short name (`smollm2-135m`, `qwen2.5-3b`).
    pub name: &'static str,
    /// Transformer layers.
    pub layers: usize,
    /// Groups of one layer, with a name each (`qkv`, `o`).
    pub groups: Vec<(&'static str, GroupShape)>,
}

impl ModelShape {
    /// SmolLM2-135M (the default model): d = 576, 30 layers, 9 heads and 3 KV heads of 64; LoRA r =
    /// 16 on q,k,v,o.
    pub fn smollm2_135m() -> Self {
        Self::llama_like("smollm2-135m", 30, 576, 9 * 64, 3 * 64, 16)
    }

    /// Qwen2.5-3B: d = 2048, 36 layers, 16 heads and 2 KV heads of 128; LoRA r = 32 on q,k,v,o.
    pub fn qwen25_3b() -> Self {
        Self::llama_like("qwen2.5-3b", 36, 2048, 16 * 128, 2 * 128, 32)
    }

    /// Both benchmark shapes.
    pub fn all() -> Vec<Self> {
        vec![Self::smollm2_135m(), Self::qwen25_3b()]
    }

    fn llama_like(
        name: &'static str,
        layers: usize,
        d: usize,
        q: usize,
        kv: usize,
        r: usize,
    ) -> Self {
        ModelShape {
            name,
            layers,
            groups: vec![
                (
                    "qkv",
                    GroupShape {
                        d_in: d,
                        d_outs: vec![q, kv, kv],
                        ranks: vec![r, r, r],
                    },
                ),
                (
                    "o",
                    GroupShape {
                        d_in: q,
                        d_outs: vec![d],
                        ranks: vec![r],
                    },
                ),
            ],
        }
    }
}

//! The decoder forward pass over T positions at once (pre-norm Llama/Qwen2 block, Touvron et al.
//! 2023, §2.2), causal or tree-masked, with a [`DeltaHook`] at every projection group.

use std::path::{Path, PathBuf};

use candle_core::{D, DType, Device, Tensor};

use crate::hook::{DeltaHook, GroupDeltas, ProjGroup};
use crate::linear::Linear;
use crate::mask::SeenKeys;
use crate::weights::{Layer, WeightsFormat};
use crate::{AttentionMask, KvCache, ModelConfig, ModelError, batch_invariant, rope};

/// What every layer of one pass shares: first position, RoPE tables, each row's keys.
pub(crate) struct Pass {
    pub(crate) start: usize,
    pub(crate) cos: Tensor,
    pub(crate) sin: Tensor,
    /// The keys each row attends to.
    pub(crate) seen: Vec<SeenKeys>,
}

/// A loaded decoder-only model (CPU, f32 activations).
#[derive(Debug, Clone)]
pub struct Model {
    pub(crate) config: ModelConfig,
    pub(crate) embed: Tensor,
    pub(crate) layers: Vec<Layer>,
    pub(crate) norm: Tensor,
    pub(crate) lm_head: Linear,
    pub(crate) path: PathBuf,
    pub(crate) format: WeightsFormat,
}

impl Model {
    /// A copy with f16 projection and lm_head weights, for drafting. Errors:
    /// [`ModelError::Candle`].
    pub fn to_f16_weights(&self) -> Result<Self, ModelError> {
        let _span = tracing::info_span!("to_f16_weights").entered();
        let layers = self
            .layers
            .iter()
            .map(|l| {
                Ok(Layer {
                    attn_norm: l.attn_norm.clone(),
                    q: l.q.to_f16()?,
                    k: l.k.to_f16()?,
                    v: l.v.to_f16()?,
                    o: l.o.to_f16()?,
                    ffn_norm: l.ffn_norm.clone(),
                    gate: l.gate.to_f16()?,
                    up: l.up.to_f16()?,
                    down: l.down.to_f16()?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(Model {
            config: self.config.clone(),
            embed: self.embed.clone(),
            layers,
            norm: self.norm.clone(),
            lm_head: self.lm_head.to_f16()?,
            path: self.path.clone(),
            format: self.format.clone(),
        })
    }

    /// Shapes and hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The file or folder the weights were loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The weights' container format.
    pub fn format(&self) -> &WeightsFormat {
        &self.format
    }

    /// How the projection weights are held: "quantized", "f16" or "f32".
    #[must_use]
    pub fn weights_held(&self) -> &'static str {
        self.layers.first().map_or("f32", |l| l.q.holding())
    }

    /// An empty KV cache for `capacity` positions. Errors: [`ModelError::Candle`].
    pub fn new_cache(&self, capacity: usize) -> Result<KvCache, ModelError> {
        KvCache::new(&self.config, capacity)
    }

    /// Runs `tokens` (T ≥ 1) after the cached positions, returning logits (T, vocab_size) f32; the
    /// cache grows by T, `hook`'s deltas are added. Errors: [`ModelError::Input`] (empty input, bad
    /// ids or tree, full cache), [`ModelError::Hook`], the hook's. On error the cache is unchanged.
    pub fn forward(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        mask: &AttentionMask,
        hook: &mut dyn DeltaHook,
    ) -> Result<Tensor, ModelError> {
        let n = self.layers.len();
        let mut states = self.run_layers(tokens, cache, mask, hook, &[n])?;
        let x = states.pop().expect("one depth requested");
        self.head(&x)
    }

    /// The residual stream (T, hidden) f32 after the first `layers` layers, as a split server
    /// receives it. Errors: [`ModelError::Input`] if `layers > num_layers`; as [`Model::forward`].
    pub fn hidden_states(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        mask: &AttentionMask,
        layers: usize,
    ) -> Result<Tensor, ModelError> {
        let mut states = self.hidden_states_at(tokens, cache, mask, &[layers])?;
        Ok(states.pop().expect("one depth requested"))
    }

    /// [`Model::hidden_states`] at several `depths` in one pass. Errors: [`ModelError::Input`].
    pub fn hidden_states_at(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        mask: &AttentionMask,
        depths: &[usize],
    ) -> Result<Vec<Tensor>, ModelError> {
        let n = self.layers.len();
        if depths.is_empty() {
            return Err(ModelError::Input("no depth requested".into()));
        }
        if let Some(&bad) = depths.iter().find(|&&d| d > n) {
            return Err(ModelError::Input(format!(
                "depth {bad} > {n} decoder layers"
            )));
        }
        self.run_layers(tokens, cache, mask, &mut crate::NoAdapter, depths)
    }

    /// Final RMSNorm and output projection on `x` (T, hidden): logits (T, vocab_size).
    pub fn head(&self, x: &Tensor) -> Result<Tensor, ModelError> {
        let x = candle_nn::ops::rms_norm(x, &self.norm, self.config.rms_norm_eps as f32)?;
        let _span = tracing::trace_span!("lm_head").entered();
        self.lm_head.forward(&x)
    }

    /// Runs layers `[lo, hi)` on the residual stream `x` (T, hidden) f32; with `hidden_states` and
    /// `head` it reproduces [`Model::forward`] bit for bit. Errors: [`ModelError::Input`],
    /// [`ModelError::Candle`]. On error the cache is unchanged.
    pub fn forward_layers(
        &self,
        x: &Tensor,
        layers: std::ops::Range<usize>,
        cache: &mut KvCache,
        mask: &AttentionMask,
    ) -> Result<Tensor, ModelError> {
        let n = self.layers.len();
        if layers.start > layers.end || layers.end > n {
            return Err(ModelError::Input(format!(
                "layer range {layers:?} not within {n} decoder layers"
            )));
        }
        let hidden = self.config.hidden_size;
        match x.dims() {
            &[t, d] if t >= 1 && d == hidden && x.dtype() == DType::F32 => {}
            dims => {
                return Err(ModelError::Input(format!(
                    "hidden states of shape {dims:?} {:?}, expected (T ≥ 1, {hidden}) F32",
                    x.dtype()
                )));
            }
        }
        let held = cache.layers();
        if !layers.is_empty() && (layers.start < held.start || layers.end > held.end) {
            return Err(ModelError::Input(format!(
                "layers {layers:?} not all in the cache (layers {held:?})"
            )));
        }
        let t = x.dim(0)?;
        let _span =
            tracing::debug_span!("forward_layers", lo = layers.start, hi = layers.end, t).entered();
        let pass = self.prepare(t, cache, mask)?;
        let mut x = x.clone();
        for li in layers {
            let _span = tracing::trace_span!("layer", index = li).entered();
            x = self.layer_forward(
                li,
                &self.layers[li],
                &x,
                &pass,
                cache,
                &mut crate::NoAdapter,
            )?;
        }
        cache.set_len(pass.start + t);
        Ok(x)
    }

    /// Checks that T positions fit the cache and mask; builds RoPE tables and each row's keys.
    pub(crate) fn prepare(
        &self,
        t: usize,
        cache: &KvCache,
        mask: &AttentionMask,
    ) -> Result<Pass, ModelError> {
        let start = cache.len();
        if start + t > cache.capacity() {
            return Err(ModelError::Input(format!(
                "cache full: {start} + {t} positions > capacity {}",
                cache.capacity()
            )));
        }
        let depths_in_tree = mask.depths(t)?;
        let cached = mask.cached_nodes();
        if cached > start {
            return Err(ModelError::Input(format!(
                "tree extends {cached} cached nodes but the cache holds {start} positions"
            )));
        }
        let positions: Vec<usize> = depths_in_tree.iter().map(|d| start - cached + d).collect();
        let dev = Device::Cpu;
        let (cos, sin) = rope::tables(
            &positions,
            self.config.head_dim,
            self.config.rope_theta,
            &dev,
        )?;
        Ok(Pass {
            start,
            cos,
            sin,
            seen: mask.seen_keys(start, t),
        })
    }

    /// The token embedding table (vocab_size, hidden) f32.
    pub fn embedding(&self) -> &Tensor {
        &self.embed
    }

    /// Errors: [`ModelError::Input`] when `tokens` is empty or holds an id ≥ vocab_size.
    pub(crate) fn check_tokens(&self, tokens: &[u32]) -> Result<(), ModelError> {
        if tokens.is_empty() {
            return Err(ModelError::Input("no tokens".into()));
        }
        if let Some(&bad) = tokens
            .iter()
            .find(|&&id| id as usize >= self.config.vocab_size)
        {
            return Err(ModelError::Input(format!(
                "token id {bad} ≥ vocab size {}",
                self.config.vocab_size
            )));
        }
        Ok(())
    }

    /// Validates, embeds and runs layers `[0, max(depths))`, returning the stream at each depth.
    pub(crate) fn run_layers(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        mask: &AttentionMask,
        hook: &mut dyn DeltaHook,
        depths: &[usize],
    ) -> Result<Vec<Tensor>, ModelError> {
        self.check_tokens(tokens)?;
        let t = tokens.len();
        let pass = self.prepare(t, cache, mask)?;
        let dev = Device::Cpu;
        let ids = Tensor::new(tokens, &dev)?;
        let mut x = self.embed.index_select(&ids, 0)?;
        let last = depths.iter().copied().max().unwrap_or(0);
        let mut out: Vec<Option<Tensor>> = vec![None; depths.len()];
        let mut keep = |done: usize, x: &Tensor| {
            for (slot, &d) in out.iter_mut().zip(depths) {
                if d == done {
                    *slot = Some(x.clone());
                }
            }
        };
        keep(0, &x);
        for (li, layer) in self.layers[..last].iter().enumerate() {
            let _span = tracing::trace_span!("layer", index = li).entered();
            x = self.layer_forward(li, layer, &x, &pass, cache, hook)?;
            keep(li + 1, &x);
        }
        cache.set_len(pass.start + t);
        Ok(out
            .into_iter()
            .map(|s| s.expect("every depth ≤ last was kept"))
            .collect())
    }

    /// Runs the projections of `group` on `x` and adds the hook's deltas.
    fn project(
        &self,
        li: usize,
        layer: &Layer,
        group: ProjGroup,
        x: &Tensor,
        hook: &mut dyn DeltaHook,
    ) -> Result<Vec<Tensor>, ModelError> {
        let mut outs = Self::base_outputs(layer, group, x)?;
        if hook.wants(li, group) {
            let deltas = hook.deltas(li, group, x)?;
            self.add_deltas(li, group, x.dim(0)?, &mut outs, &deltas)?;
        }
        Ok(outs)
    }

    /// The unadapted outputs `W x` of `group`'s projections on `x` (T, d_in), in
    /// [`ProjGroup::projs`] order.
    pub(crate) fn base_outputs(
        layer: &Layer,
        group: ProjGroup,
        x: &Tensor,
    ) -> Result<Vec<Tensor>, ModelError> {
        group
            .projs()
            .iter()
            .map(|&p| layer.linear(p).forward(x))
            .collect()
    }

    /// Adds `deltas` (one (t, d_out) F32 tensor per adapted projection of `group`) to `outs`.
    /// Errors: [`ModelError::Hook`] for a projection outside the group or a wrong shape.
    pub(crate) fn add_deltas(
        &self,
        li: usize,
        group: ProjGroup,
        t: usize,
        outs: &mut [Tensor],
        deltas: &GroupDeltas,
    ) -> Result<(), ModelError> {
        for (p, d) in deltas.iter() {
            let Some(slot) = group.projs().iter().position(|&q| q == p) else {
                return Err(ModelError::Hook {
                    layer: li,
                    proj: p,
                    reason: format!("delta returned for group {group:?}, which lacks it"),
                });
            };
            let want = [t, self.config.proj_out_dim(p)];
            if d.dims() != want || d.dtype() != DType::F32 {
                return Err(ModelError::Hook {
                    layer: li,
                    proj: p,
                    reason: format!(
                        "delta has shape {:?} {:?}, expected {want:?} F32",
                        d.dims(),
                        d.dtype()
                    ),
                });
            }
            outs[slot] = (&outs[slot] + d)?;
        }
        Ok(())
    }

    fn layer_forward(
        &self,
        li: usize,
        layer: &Layer,
        x: &Tensor,
        pass: &Pass,
        cache: &KvCache,
        hook: &mut dyn DeltaHook,
    ) -> Result<Tensor, ModelError> {
        let eps = self.config.rms_norm_eps as f32;
        let n = candle_nn::ops::rms_norm(x, &layer.attn_norm, eps)?;
        let qkv = self.project(li, layer, ProjGroup::Qkv, &n, hook)?;
        let attn = self.attention(li, &qkv, pass, cache)?;
        let o = self.project(li, layer, ProjGroup::O, &attn, hook)?;
        let h = (x + &o[0])?;

        let m = candle_nn::ops::rms_norm(&h, &layer.ffn_norm, eps)?;
        let gu = self.project(li, layer, ProjGroup::GateUp, &m, hook)?;
        let act = (candle_nn::ops::silu(&gu[0])? * &gu[1])?;
        let down = self.project(li, layer, ProjGroup::Down, &act, hook)?;
        Ok((h + &down[0])?)
    }

    /// Attention of layer `li` for `pass`'s T positions from their q, k, v projections (T, ·):
    /// writes k and v to `cache` at `pass.start` and returns the heads' output (T, num_heads ·
    /// head_dim), the o group's input.
    pub(crate) fn attention(
        &self,
        li: usize,
        qkv: &[Tensor],
        pass: &Pass,
        cache: &KvCache,
    ) -> Result<Tensor, ModelError> {
        let (start, cos, sin) = (pass.start, &pass.cos, &pass.sin);
        let c = &self.config;
        let t = qkv[0].dim(0)?;
        let (nh, nkv, hd) = (c.num_heads, c.num_kv_heads, c.head_dim);
        let heads = |y: &Tensor, h: usize| -> Result<Tensor, ModelError> {
            Ok(y.reshape((1, t, h, hd))?.transpose(1, 2)?.contiguous()?)
        };
        let q = rope::apply(&heads(&qkv[0], nh)?, cos, sin, c.rope_style)?;
        let k = rope::apply(&heads(&qkv[1], nkv)?, cos, sin, c.rope_style)?;
        let v = heads(&qkv[2], nkv)?;
        cache.write(li, start, &k.squeeze(0)?, &v.squeeze(0)?)?;
        let (keys, values) = cache.layer(li)?;
        let scale = (1.0 / (hd as f64).sqrt()) as f32;
        batch_invariant::attention(&q.squeeze(0)?, keys, values, &pass.seen, scale)
    }

    /// Argmax of each row of `logits` (T, vocab). Errors: [`ModelError::Candle`] if not 2-D.
    pub fn argmax_rows(logits: &Tensor) -> Result<Vec<u32>, ModelError> {
        Ok(logits.argmax(D::Minus1)?.to_vec1::<u32>()?)
    }
}

//! A causal pass run as a wavefront of row chunks. At each adapted group every chunk's input
//! leaves as soon as that chunk has reached the group, and the client runs the next chunk's
//! layers while earlier chunks' requests are on the link or at the server. A pass then pays about
//! one latency per group plus its busiest resource, instead of one latency, the whole group's
//! transfers and the client's whole forward per group. Rationale: docs/design/schedules.md,
//! "Wavefront prefill".
//!
//! Chunk c at layer l needs the keys and values of chunks before it at layer l, which the loop
//! below writes first: groups run in forward order, and inside a group the chunks in row order.

use std::collections::HashMap;

use candle_core::Tensor;

use crate::hook::{
    DeltaHook, DeltaStream, GroupDeltas, GroupInput, KeepDeltas, PassDeltas, ProjGroup, TripId,
    Wavefront,
};
use crate::model::Pass;
use crate::{AttentionMask, KvCache, Model, ModelError};

/// One chunk of rows between two groups.
struct Chunk {
    /// Its trip on the hook's stream.
    trip: TripId,
    /// Its RoPE tables and attention bias (rows of the whole pass's).
    pass: Pass,
    /// The residual stream at the current layer's start (rows, hidden).
    x: Tensor,
    /// The residual stream after the current layer's attention block.
    h: Option<Tensor>,
    /// The outputs of the group it reached (unadapted until its deltas arrive).
    outs: Vec<Tensor>,
}

impl Model {
    /// [`Model::forward`] with [`AttentionMask::Causal`], run as a wavefront of row chunks when
    /// `hook` offers one for `tokens.len()` positions ([`DeltaHook::wavefront`]), else as one
    /// pass. Returns the residual stream after the last layer, (T, hidden) f32, to which
    /// [`Model::head`] gives the logits of the rows wanted (a prompt's pass wants its last), and
    /// the deltas added, (T, d_out) per adapted projection by (layer, group). Errors: as
    /// [`Model::forward`], and the stream's. On error the cache's length is unchanged.
    pub fn forward_wavefront(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        hook: &mut dyn DeltaHook,
    ) -> Result<(Tensor, PassDeltas), ModelError> {
        self.check_tokens(tokens)?;
        let t = tokens.len();
        let stages: Vec<(usize, ProjGroup)> = (0..self.layers.len())
            .flat_map(|l| ProjGroup::ALL.map(|g| (l, g)))
            .collect();
        let wanted: Vec<bool> = stages.iter().map(|&(l, g)| hook.wants(l, g)).collect();
        // Bad input is refused before the hook commits to a wavefront.
        let whole = self.prepare(t, cache, &AttentionMask::Causal)?;
        let offered = hook.wavefront(t).filter(|w| w.rows >= 1);
        let Some(Wavefront { rows, stream }) = offered else {
            let mut keeping = KeepDeltas::new(hook);
            let depth = self.layers.len();
            let mut states = self.run_layers(
                tokens,
                cache,
                &AttentionMask::Causal,
                &mut keeping,
                &[depth],
            )?;
            let x = states.pop().ok_or_else(no_layers)?;
            return Ok((x, keeping.added));
        };
        let ids = Tensor::new(tokens, &candle_core::Device::Cpu)?;
        let x = self.embed.index_select(&ids, 0)?;
        let mut chunks = Vec::with_capacity(t.div_ceil(rows));
        for off in (0..t).step_by(rows) {
            let n = rows.min(t - off);
            let narrow = |m: &Tensor| -> Result<Tensor, ModelError> {
                Ok(m.narrow(0, off, n)?.contiguous()?)
            };
            chunks.push(Chunk {
                trip: stream.open_trip(None)?,
                pass: Pass {
                    start: whole.start + off,
                    cos: narrow(&whole.cos)?,
                    sin: narrow(&whole.sin)?,
                    seen: whole.seen[off..off + n].to_vec(),
                },
                x: x.narrow(0, off, n)?,
                h: None,
                outs: Vec::new(),
            });
        }
        let mut added: HashMap<(usize, ProjGroup), Vec<GroupDeltas>> = HashMap::new();
        for (i, &(li, group)) in stages.iter().enumerate() {
            let previous = i.checked_sub(1).map(|p| (stages[p], wanted[p]));
            for chunk in &mut chunks {
                if let Some((at, true)) = previous {
                    self.take_deltas(stream, chunk, at, &mut added)?;
                }
                let input = self.group_input(li, group, chunk, cache)?;
                if wanted[i] {
                    let sent = GroupInput {
                        layer: li,
                        group,
                        x: input.clone(),
                    };
                    stream.send(chunk.trip, &sent)?;
                }
                chunk.outs = Self::base_outputs(&self.layers[li], group, &input)?;
            }
        }
        let last = stages
            .last()
            .map(|&s| (s, *wanted.last().unwrap_or(&false)));
        let mut rows_out = Vec::with_capacity(chunks.len());
        for chunk in &mut chunks {
            if let Some((at, true)) = last {
                self.take_deltas(stream, chunk, at, &mut added)?;
            }
            let h = chunk.h.take().ok_or_else(no_layers)?;
            rows_out.push((h + &chunk.outs[0])?);
        }
        cache.set_len(whole.start + t);
        let x = Tensor::cat(&rows_out, 0)?;
        let mut deltas = PassDeltas::new();
        for (key, parts) in added {
            deltas.insert(key, concat_rows(&parts)?);
        }
        Ok((x, deltas))
    }

    /// Receives `chunk`'s deltas of group `at` and adds them to its outputs.
    fn take_deltas(
        &self,
        stream: &mut dyn DeltaStream,
        chunk: &mut Chunk,
        (li, group): (usize, ProjGroup),
        added: &mut HashMap<(usize, ProjGroup), Vec<GroupDeltas>>,
    ) -> Result<(), ModelError> {
        let rows = chunk.x.dim(0)?;
        let deltas = stream.receive(chunk.trip, li, group)?;
        self.add_deltas(li, group, rows, &mut chunk.outs, &deltas)?;
        added.entry((li, group)).or_default().push(deltas);
        Ok(())
    }

    /// The input of (`li`, `group`) for `chunk`, whose `outs` are the previous group's final
    /// outputs (none before layer 0's q, k, v): the same steps as [`Model::forward`]'s layer.
    fn group_input(
        &self,
        li: usize,
        group: ProjGroup,
        chunk: &mut Chunk,
        cache: &KvCache,
    ) -> Result<Tensor, ModelError> {
        let layer = &self.layers[li];
        let eps = self.config.rms_norm_eps as f32;
        Ok(match group {
            ProjGroup::Qkv => {
                if let Some(h) = chunk.h.take() {
                    chunk.x = (h + &chunk.outs[0])?;
                }
                candle_nn::ops::rms_norm(&chunk.x, &layer.attn_norm, eps)?
            }
            ProjGroup::O => self.attention(li, &chunk.outs, &chunk.pass, cache)?,
            ProjGroup::GateUp => {
                let h = (&chunk.x + &chunk.outs[0])?;
                let m = candle_nn::ops::rms_norm(&h, &layer.ffn_norm, eps)?;
                chunk.h = Some(h);
                m
            }
            ProjGroup::Down => (candle_nn::ops::silu(&chunk.outs[0])? * &chunk.outs[1])?,
        })
    }
}

/// A chunk left the loop before its attention block (no layers).
fn no_layers() -> ModelError {
    ModelError::Input("a wavefront pass needs at least one decoder layer".into())
}

/// The chunks' deltas of one group stacked by rows, per projection.
fn concat_rows(parts: &[GroupDeltas]) -> Result<GroupDeltas, ModelError> {
    let mut out = GroupDeltas::none();
    let Some(first) = parts.first() else {
        return Ok(out);
    };
    for (p, _) in first.iter() {
        let pieces: Vec<&Tensor> = parts.iter().filter_map(|g| g.get(p)).collect();
        if pieces.len() == parts.len() {
            out.push(p, Tensor::cat(&pieces, 0)?);
        }
    }
    Ok(out)
}

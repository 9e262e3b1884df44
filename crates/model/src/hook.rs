//! The delta-hook contract: at each adapted projection the forward pass hands the input `x` (T ×
//! d_in, f32) to the hook and adds its result, `y = W x (+ b) + delta`.

use std::collections::HashMap;

use candle_core::Tensor;

use crate::ModelError;

/// A linear projection inside a decoder layer (HF names in parentheses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proj {
    /// Query (`self_attn.q_proj`, GGUF `attn_q`).
    Q,
    /// Key (`self_attn.k_proj`, GGUF `attn_k`).
    K,
    /// Value (`self_attn.v_proj`, GGUF `attn_v`).
    V,
    /// Attention output (`self_attn.o_proj`, GGUF `attn_output`).
    O,
    /// SwiGLU gate (`mlp.gate_proj`, GGUF `ffn_gate`).
    Gate,
    /// SwiGLU up (`mlp.up_proj`, GGUF `ffn_up`).
    Up,
    /// SwiGLU down (`mlp.down_proj`, GGUF `ffn_down`).
    Down,
}

impl Proj {
    /// All seven projections in forward order.
    pub const ALL: [Proj; 7] = [
        Proj::Q,
        Proj::K,
        Proj::V,
        Proj::O,
        Proj::Gate,
        Proj::Up,
        Proj::Down,
    ];

    /// The PEFT `target_modules` name (`q_proj`, …, `down_proj`).
    pub fn peft_name(self) -> &'static str {
        match self {
            Proj::Q => "q_proj",
            Proj::K => "k_proj",
            Proj::V => "v_proj",
            Proj::O => "o_proj",
            Proj::Gate => "gate_proj",
            Proj::Up => "up_proj",
            Proj::Down => "down_proj",
        }
    }

    /// Parses a PEFT module name.
    pub fn from_peft_name(name: &str) -> Option<Proj> {
        Proj::ALL.into_iter().find(|p| p.peft_name() == name)
    }

    /// The group whose shared input this projection reads.
    pub fn group(self) -> ProjGroup {
        match self {
            Proj::Q | Proj::K | Proj::V => ProjGroup::Qkv,
            Proj::O => ProjGroup::O,
            Proj::Gate | Proj::Up => ProjGroup::GateUp,
            Proj::Down => ProjGroup::Down,
        }
    }
}

/// Projections that share one input; one hook call (one encrypted round trip) each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProjGroup {
    /// q, k, v: input is the attention-normed hidden state (T × hidden_size).
    Qkv,
    /// o: input is the attention output (T × num_heads·head_dim).
    O,
    /// gate, up: input is the MLP-normed hidden state (T × hidden_size).
    GateUp,
    /// down: input is silu(gate)·up (T × intermediate_size).
    Down,
}

impl ProjGroup {
    /// The four groups in forward order.
    pub const ALL: [ProjGroup; 4] = [
        ProjGroup::Qkv,
        ProjGroup::O,
        ProjGroup::GateUp,
        ProjGroup::Down,
    ];

    /// The projections of the group.
    pub fn projs(self) -> &'static [Proj] {
        match self {
            ProjGroup::Qkv => &[Proj::Q, Proj::K, Proj::V],
            ProjGroup::O => &[Proj::O],
            ProjGroup::GateUp => &[Proj::Gate, Proj::Up],
            ProjGroup::Down => &[Proj::Down],
        }
    }
}

/// What a hook returns for one group: at most one (T, d_out) f32 delta per projection.
#[derive(Debug, Clone, Default)]
pub struct GroupDeltas {
    deltas: Vec<(Proj, Tensor)>,
}

impl GroupDeltas {
    /// No deltas: the projections run unadapted.
    pub fn none() -> Self {
        Self::default()
    }

    /// Adds the delta of `proj` (replacing an earlier one).
    pub fn push(&mut self, proj: Proj, delta: Tensor) {
        self.deltas.retain(|(p, _)| *p != proj);
        self.deltas.push((proj, delta));
    }

    /// Builder form of [`GroupDeltas::push`].
    pub fn with(mut self, proj: Proj, delta: Tensor) -> Self {
        self.push(proj, delta);
        self
    }

    /// The delta for `proj`, if any.
    pub fn get(&self, proj: Proj) -> Option<&Tensor> {
        self.deltas.iter().find(|(p, _)| *p == proj).map(|(_, t)| t)
    }

    /// Iterates over (projection, delta).
    pub fn iter(&self) -> impl Iterator<Item = (Proj, &Tensor)> {
        self.deltas.iter().map(|(p, t)| (*p, t))
    }

    /// Whether there are no deltas.
    pub fn is_empty(&self) -> bool {
        self.deltas.is_empty()
    }
}

/// One group's input in a batch of [`DeltaHook::deltas_many`].
#[derive(Debug, Clone)]
pub struct GroupInput {
    /// Decoder layer.
    pub layer: usize,
    /// Projection group.
    pub group: ProjGroup,
    /// The group's input, (T, d_in) f32.
    pub x: Tensor,
}

/// Computes adapter deltas for the forward pass; see the module docs.
pub trait DeltaHook {
    /// `x`: the group's input at `layer`, (T, d_in) f32; returns one (T, d_out) delta per targeted
    /// projection. Errors: whatever the hook raises; the forward pass stops with it.
    fn deltas(
        &mut self,
        layer: usize,
        group: ProjGroup,
        x: &Tensor,
    ) -> Result<GroupDeltas, ModelError>;

    /// Whether the hook may return deltas for `group` (false: the call is skipped).
    fn wants(&self, _layer: usize, _group: ProjGroup) -> bool {
        true
    }

    /// The deltas of many groups with known inputs, in order (one round trip remotely).
    fn deltas_many(&mut self, inputs: &[GroupInput]) -> Result<Vec<GroupDeltas>, ModelError> {
        inputs
            .iter()
            .map(|g| self.deltas(g.layer, g.group, &g.x))
            .collect()
    }

    /// [`DeltaHook::deltas_many`] allowing error `tolerance` relative to the group's largest delta.
    fn deltas_many_within(
        &mut self,
        inputs: &[GroupInput],
        tolerance: f64,
    ) -> Result<Vec<GroupDeltas>, ModelError> {
        let _ = tolerance;
        self.deltas_many(inputs)
    }

    /// The hook's streaming side for `t`-position passes, if any.
    fn stream(&mut self, t: usize) -> Option<&mut dyn DeltaStream> {
        let _ = t;
        None
    }

    /// The hook's side for a causal pass of `t` positions run as a wavefront of row chunks
    /// ([`crate::Model::forward_wavefront`]), if it has one.
    fn wavefront(&mut self, t: usize) -> Option<Wavefront<'_>> {
        let _ = t;
        None
    }

    /// Called when the prompt's passes are done (counting hooks leave them out).
    fn prefill_done(&mut self) {}
}

/// A hook's side for a wavefront pass: the pass's rows are cut into chunks of `rows` (the last
/// may be shorter) and each chunk is one trip of `stream`, its groups sent in forward order.
pub struct Wavefront<'a> {
    /// Rows per chunk (≥ 1).
    pub rows: usize,
    /// Carries every chunk's trip.
    pub stream: &'a mut dyn DeltaStream,
}

impl std::fmt::Debug for Wavefront<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wavefront")
            .field("rows", &self.rows)
            .finish_non_exhaustive()
    }
}

/// Names one trip of a [`DeltaStream`] (unique per stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TripId(pub u64);

/// The streaming side of a remote [`DeltaHook`]: a fixed point's trips as a wavefront.
pub trait DeltaStream {
    /// Starts a trip with deltas within relative `tolerance` (`None`: exact).
    fn open_trip(&mut self, tolerance: Option<f64>) -> Result<TripId, ModelError>;

    /// Sends one group's input of `trip` (forward order) without waiting.
    fn send(&mut self, trip: TripId, input: &GroupInput) -> Result<(), ModelError>;

    /// The deltas of (`layer`, `group`) in `trip`, waiting if needed. Errors: [`ModelError::Hook`]
    /// when not sent; whatever the hook raises.
    fn receive(
        &mut self,
        trip: TripId,
        layer: usize,
        group: ProjGroup,
    ) -> Result<GroupDeltas, ModelError>;
}

impl<H: DeltaHook + ?Sized> DeltaHook for &mut H {
    fn deltas(
        &mut self,
        layer: usize,
        group: ProjGroup,
        x: &Tensor,
    ) -> Result<GroupDeltas, ModelError> {
        (**self).deltas(layer, group, x)
    }

    fn wants(&self, layer: usize, group: ProjGroup) -> bool {
        (**self).wants(layer, group)
    }

    fn deltas_many(&mut self, inputs: &[GroupInput]) -> Result<Vec<GroupDeltas>, ModelError> {
        (**self).deltas_many(inputs)
    }

    fn deltas_many_within(
        &mut self,
        inputs: &[GroupInput],
        tolerance: f64,
    ) -> Result<Vec<GroupDeltas>, ModelError> {
        (**self).deltas_many_within(inputs, tolerance)
    }

    fn stream(&mut self, t: usize) -> Option<&mut dyn DeltaStream> {
        (**self).stream(t)
    }

    fn wavefront(&mut self, t: usize) -> Option<Wavefront<'_>> {
        (**self).wavefront(t)
    }

    fn prefill_done(&mut self) {
        (**self).prefill_done();
    }
}

/// The unadapted base model: the drafter of speculative decoding.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoAdapter;

impl DeltaHook for NoAdapter {
    fn deltas(&mut self, _: usize, _: ProjGroup, _: &Tensor) -> Result<GroupDeltas, ModelError> {
        Ok(GroupDeltas::none())
    }

    fn wants(&self, _: usize, _: ProjGroup) -> bool {
        false
    }
}

/// The deltas one pass added, by (layer, group): (T, d_out) per adapted projection of the group.
pub type PassDeltas = HashMap<(usize, ProjGroup), GroupDeltas>;

/// A hook answering with `inner` that keeps the latest delta per (layer, group).
#[derive(Debug)]
pub struct KeepDeltas<H> {
    /// The hook that computes the deltas.
    pub inner: H,
    /// What the pass added so far.
    pub added: PassDeltas,
}

impl<H> KeepDeltas<H> {
    /// Wraps `inner`, nothing kept yet.
    pub fn new(inner: H) -> Self {
        Self {
            inner,
            added: PassDeltas::new(),
        }
    }
}

impl<H: DeltaHook> DeltaHook for KeepDeltas<H> {
    fn deltas(
        &mut self,
        layer: usize,
        group: ProjGroup,
        x: &Tensor,
    ) -> Result<GroupDeltas, ModelError> {
        let deltas = self.inner.deltas(layer, group, x)?;
        // Tensors share their storage: keeping them costs no copy.
        self.added.insert((layer, group), deltas.clone());
        Ok(deltas)
    }

    fn wants(&self, layer: usize, group: ProjGroup) -> bool {
        self.inner.wants(layer, group)
    }
}

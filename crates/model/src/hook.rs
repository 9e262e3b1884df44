//! The delta-hook contract between the plaintext forward pass and whatever
//! computes the adapter's contribution (plaintext LoRA, encrypted LoRA, nothing).
//!
//! At every adapted projection `y = W x (+ b)`, the forward pass hands the
//! projection's input `x` (T × d_in, f32, one row per position of the pass) to
//! the hook and adds what it returns: `y = W x (+ b) + delta`. Projections that
//! read the same input form a [`ProjGroup`], so a hook serving several of them
//! (q, k and v; gate and up) sees the input once, which is one round trip for a
//! remote hook.
//!
//! Layout: deltas are in the *loaded model's* row layout. For llama-family GGUF
//! files, whose q/k rows llama.cpp's converter permuted, [`crate::LoraAdapter`]
//! permutes lora_B rows at load time, so hooks built on it need not care.

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

/// What a hook returns for one group: at most one delta per projection of the
/// group, each of shape (T, d_out) f32, to be added to the projection output.
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
    /// `x`: the group's input for decoder layer `layer`, shape (T, d_in), f32, row
    /// t being position t of the pass. Returns one (T, d_out) delta per projection
    /// of `group` that the adapter targets (or none).
    ///
    /// # Errors
    /// Whatever the hook's computation raises; the forward pass stops with it.
    fn deltas(
        &mut self,
        layer: usize,
        group: ProjGroup,
        x: &Tensor,
    ) -> Result<GroupDeltas, ModelError>;

    /// Whether the hook may return deltas for `group` at all. The forward pass
    /// skips the call (and any copy of `x`) when this is false.
    fn wants(&self, _layer: usize, _group: ProjGroup) -> bool {
        true
    }

    /// The deltas of many groups whose inputs are all known (one round trip
    /// for a remote hook: the fixed-point schedule of
    /// [`crate::FixedPointPass`]). Returns one [`GroupDeltas`] per input, in
    /// order. The default answers them one by one with
    /// [`DeltaHook::deltas`], which is exact for any hook.
    ///
    /// # Errors
    /// As [`DeltaHook::deltas`].
    fn deltas_many(&mut self, inputs: &[GroupInput]) -> Result<Vec<GroupDeltas>, ModelError> {
        inputs
            .iter()
            .map(|g| self.deltas(g.layer, g.group, &g.x))
            .collect()
    }

    /// [`DeltaHook::deltas_many`] for inputs that are still estimates (the
    /// first trips of a [`crate::FixedPointPass`]): a delta may be off by
    /// `tolerance` relative to the largest delta its group can return, and
    /// a remote hook may ask for that much less precision (fewer bytes).
    /// The default answers exactly, with [`DeltaHook::deltas_many`].
    ///
    /// # Errors
    /// As [`DeltaHook::deltas`].
    fn deltas_many_within(
        &mut self,
        inputs: &[GroupInput],
        tolerance: f64,
    ) -> Result<Vec<GroupDeltas>, ModelError> {
        let _ = tolerance;
        self.deltas_many(inputs)
    }
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

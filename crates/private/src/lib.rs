//! Private generation: what connects the plaintext model to the HE-LoRA
//! halves.
//!
//! - [`HeAdapter`] (server side): a PEFT adapter split into fused layer
//!   groups (q,k,v; o; gate,up; down), the plans it offers for a verify width
//!   T, and [`ServerSession`]s, each holding one client's Galois keys and the
//!   pre-encoded plaintext diagonals, answering one [`GroupRequest`] per layer
//!   group per round. It never sees a secret key or a plaintext activation.
//! - [`HeHook`] (client side): a [`cipherlora_model::DeltaHook`] that encrypts
//!   each group's input (FFA: `A·X`, computed locally with the public lora_A;
//!   standard: X itself), sends it through a [`Transport`], decrypts the
//!   returned deltas and maps them into the client model's row layout.
//! - [`ByWidth`]: several sessions of different widths behind one hook
//!   (narrow verify passes, wide prefill passes).
//! - [`Transport`]: one round trip per layer group, or one per batch of
//!   groups ([`Transport::rounds`], the fixed-point schedule of
//!   `cipherlora_spec::schedule`). [`InProcess`] calls a session directly
//!   (the demo and tests); [`GrpcTransport`] (module [`remote`]) carries the
//!   same requests over the gRPC adapter service, a batch pipelined on the
//!   session's stream.
//! - [`choose_schedule`]: per-group or fixed-point verify passes, from the
//!   link and a model of the pass's costs ([`PassModel`]).
//!
//! Design choice: the server keeps its adapter in the PEFT (Hugging Face)
//! row layout whatever model file the client runs; a client whose GGUF file
//! has llama.cpp's permuted q/k rows permutes the decrypted q/k deltas itself
//! (a public permutation applied after decryption, so nothing about it goes
//! back to the server).

pub mod client;
mod error;
pub mod remote;
pub mod server;

pub use client::{
    ByWidth, HeHook, HeTimings, InProcess, PassModel, Reply, ScheduleChoice, Transport,
    choose_for_session, choose_schedule,
};
pub use client::{schedule_plan, width_plan};
pub use error::PrivateError;
pub use remote::{
    EmbeddedServer, GrpcTransport, HeBackend, connect_chosen_width, connect_remote, connect_widths,
};
pub use server::cost_cache;
pub use server::{
    AdapterGroups, Grouping, HeAdapter, LoraKind, OfferedGroup, ServerSession, SessionMemory,
    SessionOffer, adapter_id,
};

pub use cipherlora_helora::Rerandomization;
pub use cipherlora_helora::wire::{GroupRequest, GroupResponse};

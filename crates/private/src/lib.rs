//! Private generation: connects the plaintext model to the HE-LoRA halves.
//!
//! The server side ([`HeAdapter`], [`ServerSession`], module [`server`])
//! answers one [`GroupRequest`] per layer group and never sees a secret key
//! or a plaintext activation. The client side (module [`client`], start with
//! [`HeHook`]) encrypts each group's input, sends it through a [`Transport`]
//! ([`InProcess`], or [`GrpcTransport`] over gRPC) and decrypts the deltas;
//! [`choose_schedule`] and [`width_plan`] plan its passes. The server keeps
//! the PEFT row layout; a GGUF client permutes its decrypted q/k deltas.

pub mod client;
mod error;
pub mod protocol;
pub mod remote;
pub mod server;

pub use client::{
    ByWidth, ConnectOptions, DraftLength, HeHook, HeTimings, InProcess, InProcessOpener, PassModel,
    PrefillWidth, PrivateSession, Reply, ScheduleChoice, SessionOpener, TimeSplit, Transport,
    WireDensity, choose_for_session, choose_schedule, connect_with, summary,
};
pub use client::{schedule_plan, width_plan};
pub use error::{PrivateError, ProtocolFault};
pub use protocol::{Grouping, LoraKind, OfferedGroup, SessionOffer};
pub use remote::{
    EmbeddedServer, GrpcOpener, GrpcTransport, HeBackend, connect, connect_remote, connect_widths,
};
pub use server::cost_cache;
pub use server::{
    AdapterGroups, HeAdapter, LayerGroup, Room, ServerSession, SessionMemory, adapter_id,
};

pub use cipherlora_helora::Rerandomization;
pub use cipherlora_proto::v1::{GroupRequest, GroupResponse};

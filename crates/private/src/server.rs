//! The server side: what the adapter server runs, with no secret key and no
//! plaintext activation in reach.
//!
//! - [`HeAdapter`]: a PEFT adapter split into fused layer groups, the plans
//!   it offers for a verify width, and the [`ServerSession`]s answering one
//!   [`crate::GroupRequest`] per layer group per round;
//! - [`AdapterGroups`]: the adapter's fused groups and LoRA kind;
//! - [`SessionMemory`]: the budget the shared plaintext diagonals reserve
//!   from;
//! - [`cost_cache`]: op costs measured once per machine, so a restarted
//!   server offers the same plans.
//!
//! The gRPC face of this side is [`crate::remote::HeBackend`].

mod adapter_groups;
pub mod cost_cache;
mod he_adapter;
mod session_memory;

pub use adapter_groups::*;
pub use he_adapter::*;
pub use session_memory::*;

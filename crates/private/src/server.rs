//! The server side, with no secret key or plaintext activation in reach: [`HeAdapter`] (an
//! adapter's groups, offers and [`ServerSession`]s), [`AdapterGroups`], the [`SessionMemory`]
//! budget and the op-cost [`cost_cache`]. Its gRPC face is [`crate::remote::HeBackend`].

mod adapter_groups;
pub mod cost_cache;
mod he_adapter;
pub mod masked;
mod session_memory;

pub use adapter_groups::*;
pub use he_adapter::*;
pub use session_memory::*;

//! HE-LoRA: the LoRA delta `s·B·(A·x)` of every projection of a layer group, for all K+1 verify
//! positions at once, on CKKS ciphertexts. This crate owns the adapter fusion ([`adapter`]), the
//! slot layout and BSGS plans ([`plan`], [`counts`], [`planner`]), the HE interface ([`he_traits`],
//! [`sim`], [`ckks_backend`]) and the two halves, which exchange only serialised ciphertexts and
//! public keys (the envelope is the protocol's, `cipherlora_proto::v1::GroupRequest`). [`ring`]
//! holds the fixed point and online arithmetic of masked ring values (Delphi-style
//! preprocessing), [`bfv_backend`] their offline phase on batched BFV (docs/design/wire.md).
//!
//! Start reading at [`GroupClient::encrypt`] → [`PreparedGroup::handle`] → [`GroupClient::deltas`];
//! one round's flow, the strategies and the security argument are in docs/design/code-notes.md,
//! "helora".

pub mod adapter;
pub mod bfv_backend;
pub mod ckks_backend;
pub mod counts;
pub mod error;
pub mod group_client;
pub mod group_server;
pub mod he_traits;
pub mod masks;
pub mod measure;
pub mod packing;
pub mod plan;
pub mod planner;
pub mod ring;
pub mod shapes;
pub mod sim;

pub use adapter::{FusedGroup, GroupAdapter, GroupShape, ProjectionAdapter};
pub use bfv_backend::{BfvClient, BfvServer};
pub use ckks_backend::{CkksClient, CkksServer, Rerandomization, ResponseCompression};
pub use counts::OpCounts;
pub use error::{HeloraError, Result};
pub use group_client::{GroupClient, InputScales, SlotDeltas, SlotValues};
pub use group_server::PreparedGroup;
pub use he_traits::{HeClient, HeServer, ProductSum};
pub use plan::{BabySteps, GroupPlan, Mode, PositionPacking, Reach, StageAPlan, StageBPlan};
pub use planner::{Estimate, Link, OpCosts};
pub use sim::SlotSimulator;

//! The client side: what runs beside the plaintext model and holds the
//! only secret key.
//!
//! - [`HeHook`]: the model's delta hook that encrypts each group's input,
//!   sends it through a [`Transport`] and decrypts the deltas;
//! - [`ByWidth`]: one hook per pass width (a narrow verify session and a
//!   wide prefill session);
//! - [`Transport`] and [`InProcess`]: how a group request reaches a server
//!   (the gRPC transport is [`crate::remote::GrpcTransport`]);
//! - [`schedule_plan`]: choosing the per-group or fixed-point schedule from
//!   the link and the session's costs;
//! - [`width_plan`]: choosing the verify width K + 1 from the link, the
//!   plans' step-wise costs and an acceptance prior.

mod by_width;
mod hook;
mod response_bits;
pub mod schedule_plan;
mod transport;
pub mod width_plan;

pub use by_width::*;
pub use hook::*;
pub use schedule_plan::*;
pub use transport::*;

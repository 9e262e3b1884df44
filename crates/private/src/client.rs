//! The client side, which holds the only secret key: [`HeHook`] (the
//! model's delta hook), [`ByWidth`] (one hook per pass width), [`Transport`]
//! and [`InProcess`], and the planners [`schedule_plan`] and [`width_plan`].

mod by_width;
mod connect;
mod hook;
pub mod masked;
mod prefill_width;
mod response_bits;
pub mod schedule_plan;
mod time_split;
mod transport;
pub mod width_plan;
mod wire_density;

pub use by_width::*;
pub use connect::*;
pub use hook::*;
pub use prefill_width::*;
pub use schedule_plan::*;
pub use time_split::{TimeSplit, summary};
pub use transport::*;
pub use wire_density::WireDensity;

//! The session protocol's vocabulary, shared by the client and the server halves, each type beside
//! its protobuf form in `cipherlora-proto`: what a server offers for a verify width
//! ([`SessionOffer`], its groups' [`GroupPlan`](cipherlora_helora::GroupPlan)s), what a client asks
//! for ([`PlanRequest`]) and an FFA adapter's public lora_A ([`PublicA`]). Neither half's types
//! appear here.

mod codes;
pub mod masked;
mod offer;
mod plan;
mod public_a;
mod wire;

pub use codes::{preset_from_name, preset_name};
pub use offer::*;
pub use plan::{decode_plan, encode_plan};
pub use public_a::*;
pub use wire::*;

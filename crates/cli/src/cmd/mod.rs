//! One module per subcommand.

pub mod acceptance_arg;
pub mod api;
pub mod attack;
pub mod bench;
pub mod demo;
pub mod devcert;
pub mod draft_model;
pub mod fetch;
pub mod generate;
pub mod generate_split;
pub mod remote;
pub mod sampling_arg;
pub mod schedule_arg;
pub mod serve;
pub mod serve_limits;
pub mod serve_split;

//! One module per subcommand.

pub mod bench;

//! `cipherlora fetch`: download (if needed) and verify the default model.

use clap::Args;

/// Arguments of `cipherlora fetch` (none).
#[derive(Debug, Args)]
pub struct FetchArgs {}

impl FetchArgs {
    /// Ensures the default model is cached and prints its path.
    pub fn run(self) -> anyhow::Result<()> {
        let path = cipherlora_model::fetch::ensure_default_model()?;
        println!("{}", path.display());
        Ok(())
    }
}

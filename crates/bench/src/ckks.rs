//! `cipherlora bench ckks`: per-operation medians of the CKKS engine.

use std::path::PathBuf;

/// Options of `cipherlora bench ckks`.
#[derive(Debug, Clone)]
pub struct CkksBenchOptions {
    /// Where the JSON report goes.
    pub json: PathBuf,
    /// Where the Markdown table goes (default: the JSON path with `.md`).
    pub markdown: Option<PathBuf>,
    /// Timed repetitions per operation (the median is reported).
    pub reps: usize,
}

/// Runs the benchmark and writes the reports.
///
/// # Errors
/// Fails when the report files cannot be written.
pub fn run(_opts: &CkksBenchOptions) -> anyhow::Result<()> {
    anyhow::bail!("bench ckks: not implemented yet")
}

//! `cipherlora bench …`

use std::path::PathBuf;

use clap::Subcommand;

/// Which benchmark to run.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Per-operation medians of the CKKS engine (N=8192 and N=16384, one thread).
    Ckks {
        /// Where to write the JSON report.
        #[arg(long, default_value = "reports/bench-ckks.json")]
        json: PathBuf,
        /// Where to write the Markdown table (default: JSON path with .md).
        #[arg(long)]
        markdown: Option<PathBuf>,
        /// Timed repetitions per operation; the median is reported.
        #[arg(long, default_value_t = 50)]
        reps: usize,
    },
}

impl BenchCommand {
    /// Runs the chosen benchmark.
    pub fn run(self) -> anyhow::Result<()> {
        match self {
            BenchCommand::Ckks { json, markdown, reps } => {
                cipherlora_bench::ckks::run(&cipherlora_bench::ckks::CkksBenchOptions {
                    json,
                    markdown,
                    reps,
                })
            }
        }
    }
}

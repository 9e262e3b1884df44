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
    /// HE-LoRA: one verify round over all layers per shape × mode × T × strategy, vs the ct×pt floor.
    Helora {
        /// Where to write the JSON report.
        #[arg(long, default_value = "reports/bench-helora.json")]
        json: PathBuf,
        /// Where to write the Markdown table (default: JSON path with .md).
        #[arg(long)]
        markdown: Option<PathBuf>,
        /// Timed repetitions per CKKS operation; the median is used.
        #[arg(long, default_value_t = 30)]
        reps: usize,
        /// Use the 60,40,40 + 60 chain instead of the IFMA-friendly 50,40,40 + 50.
        #[arg(long)]
        no_fast: bool,
        /// Link bandwidth in Mbit/s (planner input).
        #[arg(long, default_value_t = 100.0)]
        bandwidth_mbit_s: f64,
        /// Link round-trip time in ms (planner input).
        #[arg(long, default_value_t = 20.0)]
        rtt_ms: f64,
        /// Skip the end-to-end CKKS runs (modelled figures only).
        #[arg(long)]
        no_e2e: bool,
    },
    /// Plaintext model: decode tok/s and a 9-position verify pass vs one decode step, 1 and 2 threads.
    Model(ModelBenchArgs),
}

/// Options of `cipherlora bench model`.
#[derive(Debug, clap::Args)]
pub struct ModelBenchArgs {
    /// Where to write the JSON report.
    #[arg(long, default_value = "reports/bench-model.json")]
    json: PathBuf,
    /// Where to write the Markdown table (default: JSON path with .md).
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// GGUF file or HF folder (default: the fetched default model).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Thread counts to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    threads: Vec<usize>,
    /// Tokens generated per decode measurement.
    #[arg(long, default_value_t = 64)]
    decode_tokens: usize,
    /// Timed repetitions (medians are reported).
    #[arg(long, default_value_t = 20)]
    reps: usize,
    /// Internal: measure in this process (thread count from the environment).
    #[arg(long, hide = true)]
    worker: bool,
}

impl BenchCommand {
    /// Runs the chosen benchmark.
    pub fn run(self) -> anyhow::Result<()> {
        match self {
            BenchCommand::Model(a) => {
                cipherlora_bench::model::run(&cipherlora_bench::model::ModelBenchOptions {
                    json: a.json,
                    markdown: a.markdown,
                    model: a.model,
                    threads: a.threads,
                    decode_tokens: a.decode_tokens,
                    reps: a.reps,
                    worker: a.worker,
                })
            }
            BenchCommand::Ckks {
                json,
                markdown,
                reps,
            } => cipherlora_bench::ckks::run(&cipherlora_bench::ckks::CkksBenchOptions {
                json,
                markdown,
                reps,
            }),
            BenchCommand::Helora {
                json,
                markdown,
                reps,
                no_fast,
                bandwidth_mbit_s,
                rtt_ms,
                no_e2e,
            } => cipherlora_bench::helora::run(&cipherlora_bench::helora::HeloraBenchOptions {
                json,
                markdown,
                reps,
                fast: !no_fast,
                bandwidth_mbit_s,
                rtt_ms,
                no_e2e,
            }),
        }
    }
}

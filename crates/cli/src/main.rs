//! `cipherlora`: the one binary. A thin layer of argument parsing over the
//! library crates; each subcommand lives in its own module under `cmd/`.

mod cmd;

use clap::{Parser, Subcommand};

/// Private LLM inference with an encrypted LoRA adapter.
#[derive(Debug, Parser)]
#[command(name = "cipherlora", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Measure the engine and write JSON + Markdown reports.
    #[command(subcommand)]
    Bench(cmd::bench::BenchCommand),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Bench(b) => b.run(),
    }
}

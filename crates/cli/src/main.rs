//! `cipherlora`: the one binary. A thin layer of argument parsing over the library crates; each
//! subcommand lives in its own module under `cmd/`.

mod cmd;

// Allocator: the system's (glibc); jemalloc slowed a long-running HE server
// (docs/design/code-notes.md, "cli").

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
    /// Download (if needed) and verify the default model; print its path.
    Fetch(cmd::fetch::FetchArgs),
    /// Private speculative generation with the default model and a committed adapter, printed next
    /// to the plaintext reference.
    Demo(cmd::demo::DemoArgs),
    /// Plaintext generation with the base model (optionally a PEFT adapter).
    Generate(cmd::generate::GenerateArgs),
    /// A local OpenAI-compatible endpoint (`/v1/chat/completions`, …) for private generation, with
    /// warm sessions on an adapter server.
    Api(cmd::api::ApiArgs),
    /// Serve PEFT adapters under HE over gRPC (TLS, bearer tokens).
    Serve(cmd::serve::ServeArgs),
    /// Serve the middle decoder layers of a base model for split inference over gRPC (TLS, bearer
    /// tokens).
    ServeSplit(cmd::serve_split::ServeSplitArgs),
    /// Greedy generation with a split server running the middle layers; tokens and logits stay
    /// local, hidden states travel.
    GenerateSplit(cmd::generate_split::GenerateSplitArgs),
    /// Write a development CA and a localhost server certificate.
    DevCert(cmd::devcert::DevCertArgs),
    /// Inversion attacks on split-inference activations and on HE-LoRA ciphertexts; writes JSON +
    /// Markdown reports.
    Attack(cmd::attack::AttackArgs),
}

/// Gives candle no more threads than the CPUs this process may run on; must run before any thread
/// starts.
#[allow(unsafe_code)]
fn cap_threads_to_allowed_cpus() {
    if let Some(n) = cipherlora_model::threads_for_allowed_cpus() {
        // SAFETY: called first thing in `main`, before this process starts
        // any thread, so nothing reads the environment concurrently.
        unsafe {
            std::env::set_var("RAYON_NUM_THREADS", n.to_string());
            std::env::set_var("CANDLE_NUM_THREADS", n.to_string());
        }
    }
}

fn main() -> anyhow::Result<()> {
    cap_threads_to_allowed_cpus();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Api(a) => a.run(),
        Command::Attack(a) => a.run(),
        Command::Bench(b) => b.run(),
        Command::Demo(a) => a.run(),
        Command::Fetch(a) => a.run(),
        Command::Generate(a) => a.run(),
        Command::Serve(a) => a.run(),
        Command::ServeSplit(a) => a.run(),
        Command::GenerateSplit(a) => a.run(),
        Command::DevCert(a) => a.run(),
    }
}

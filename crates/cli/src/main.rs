//! `cipherlora`: the one binary. A thin layer of argument parsing over the
//! library crates; each subcommand lives in its own module under `cmd/`.

mod cmd;

// The HE path allocates and frees many 64 kB–2 MB polynomial and message
// buffers per group round. glibc serves blocks of that size with fresh
// mmaps, each coming back as page faults and kernel page zeroing; jemalloc
// keeps freed pages for seconds (decay-based purging) and reuses them.
// Measured side by side on `demo --adapter adapters/code-ffa-r16
// --max-tokens 16`: draft, server and network time each 20–30 % lower.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's start-up options (read once, before the first allocation).
/// `tcache_max:1048576`: freed blocks of up to 1 MiB stay in the thread's
/// cache instead of going back to the shared arena (default: 32 KiB). Every
/// ciphertext, digit and key buffer of the HE path is 64 kB–1 MB, and
/// without this each one takes the arena's slow path: measured with `bench
/// helora` in one run, encrypt 0.45–0.60 → 0.16 ms, parsing an upload
/// 0.23–0.29 → 0.06 ms, a level-1 rotation 0.50–0.65 → 0.23 ms (the same
/// as under glibc's allocator; see BENCHMARKS.md, "HE-LoRA").
///
/// `unsafe`: exporting a symbol is unsafe in Rust 2024 because the linker
/// cannot check its type; this is the documented `malloc_conf` hook (a
/// NUL-terminated C string) of the `_rjem_`-prefixed jemalloc that
/// tikv-jemalloc-sys builds.
#[allow(unsafe_code)]
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: &u8 = &b"tcache_max:1048576\0"[0];

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
    /// Private speculative generation with the default model and a committed
    /// adapter, printed next to the plaintext reference.
    Demo(cmd::demo::DemoArgs),
    /// Plaintext generation with the base model (optionally a PEFT adapter).
    Generate(cmd::generate::GenerateArgs),
    /// Serve PEFT adapters under HE over gRPC (TLS, bearer tokens).
    Serve(cmd::serve::ServeArgs),
    /// Write a development CA and a localhost server certificate.
    DevCert(cmd::devcert::DevCertArgs),
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
        Command::Demo(a) => a.run(),
        Command::Fetch(a) => a.run(),
        Command::Generate(a) => a.run(),
        Command::Serve(a) => a.run(),
        Command::DevCert(a) => a.run(),
    }
}

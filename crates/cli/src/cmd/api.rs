//! `cipherlora api`: a local OpenAI-compatible endpoint for private
//! generation, with warm HE sessions (crate `cipherlora-api`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use cipherlora_api::{DraftLength, Engine, EngineConfig, MaskedSettings, SessionSettings};

/// Positions per offline batch of masks (the `bench masked-ring` measurements' width).
const MASKED_BATCH: usize = 32;
use cipherlora_model::{WeightMode, fetch};
use cipherlora_private::PrefillWidth;
use cipherlora_service::LinkProfile;
use clap::Args;

use crate::cmd::generate::{KArg, WeightsArg, reexec_with_threads};

/// Arguments of `cipherlora api`.
#[derive(Debug, Args)]
pub struct ApiArgs {
    /// Address to serve the OpenAI API on (keep it on loopback: the
    /// endpoint has no authentication, and what it returns is plaintext).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Adapter server URL (`https://host:port`); its adapters are listed as
    /// models. Without, only the base model is served.
    #[arg(long)]
    server: Option<String>,
    /// Bearer token file for --server (first non-empty line).
    #[arg(long, requires = "server")]
    token_file: Option<PathBuf>,
    /// CA certificate (PEM) that signed --server's certificate.
    #[arg(long, requires = "server")]
    ca_cert: Option<PathBuf>,
    /// Simulated link to --server (`loopback`, `wan20`, `wan80`, …).
    #[arg(long, requires = "server")]
    link: Option<LinkProfile>,
    /// GGUF file or HF folder (default: the fetched SmolLM2-135M-Instruct Q4_1).
    #[arg(long)]
    model: Option<PathBuf>,
    /// The id the base model is listed under (default: the file name).
    #[arg(long)]
    model_id: Option<String>,
    /// How to hold GGUF weights.
    #[arg(long, value_enum, default_value = "auto")]
    weights: WeightsArg,
    /// Drafted tokens per verify round (K; the verify sessions have width
    /// K+1), or `auto` (K ≤ 16) / `autoN` (K ≤ N): chosen once per adapter
    /// when its sessions open, from the link (--link, or the measured TCP
    /// round trip), the server's plans and --acceptance-prior; never from
    /// a request's text.
    #[arg(long, default_value = "auto")]
    k: KArg,
    /// The per-token acceptance rate `--k auto` assumes (default: the
    /// adapter's published hint, else 0.83); from 0.85 on, `--schedule
    /// auto` runs two shadowed fixed-point trips per round, below it three.
    #[arg(long, value_parser = crate::cmd::acceptance_arg::parse_acceptance_prior)]
    acceptance_prior: Option<f64>,
    /// Positions per prefill request (a second session of this width), or `auto`: chosen from
    /// the adapter's shapes so that long prompts fill the ciphertexts' slots (32, 64 or 128;
    /// narrower where the server has no room for the wider session's diagonals).
    #[arg(long, default_value = "auto")]
    prefill_width: PrefillWidth,
    /// Positions per prefill pass: a prompt's pass is split into pipelined
    /// requests, so its uploads, the server's compute and the downloads
    /// overlap and it pays one latency per layer group. `auto`: as many as
    /// fit 1 GiB of the pass's per-row state (deltas, attention,
    /// activations), `auto:<MiB>` another budget, or a number of positions;
    /// at most `--prefill-width`: one padded request per pass.
    #[arg(long, default_value = "auto")]
    prefill_span: cipherlora_speculative::decode::PrefillSpan,
    /// Verify schedule: `auto`, `per-group`, `fixed-point[:N]`.
    #[arg(long, default_value = "auto")]
    schedule: String,
    /// Requests that may wait or run per adapter; more get 429.
    #[arg(long, default_value_t = 4)]
    max_queue: usize,
    /// Memory for each adapter's prefix cache, MiB: the adapted keys and
    /// values of recent conversations, so that a request repeating an
    /// earlier one's tokens (a chat's next turn) prefills only the new
    /// ones; least recently used contexts are evicted first.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..))]
    prompt_cache_mib: u64,
    /// Prefill every request's whole prompt (no prefix cache).
    #[arg(long)]
    no_prompt_cache: bool,
    /// Masked ring values for prompts: while the endpoint idles, it makes one-time masks with
    /// the adapter server (batched BFV, several MB and up to 0.5 s of server time per position),
    /// and a prompt pass finding masks for all its positions runs on them: 60 bits up and 32
    /// down per value, no HE on the server. The pools' memory, MiB (off by default).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    masked_pool_mib: Option<u64>,
    /// Positions of masks to keep ready per adapted group (with --masked-pool-mib).
    #[arg(long, default_value_t = 256, requires = "masked_pool_mib")]
    masked_positions: usize,
    /// Largest max_tokens (also the default of chat requests).
    #[arg(long, default_value_t = 1024)]
    max_tokens: usize,
    /// Open sessions at the first request instead of at start.
    #[arg(long)]
    lazy: bool,
    /// CPU threads (default: candle's choice, or RAYON_NUM_THREADS).
    #[arg(long)]
    threads: Option<usize>,
}

impl ApiArgs {
    /// Loads the model, lists the adapters, opens their sessions in the
    /// background and serves until Ctrl-C or SIGTERM; then closes the
    /// sessions.
    pub fn run(self) -> anyhow::Result<()> {
        if let Some(code) = reexec_with_threads(self.threads)? {
            std::process::exit(code);
        }
        anyhow::ensure!(
            self.listen.ip().is_loopback(),
            "--listen {}: the endpoint returns plaintext and has no authentication; serve it on loopback",
            self.listen
        );
        let model_path = match &self.model {
            Some(p) => p.clone(),
            None => fetch::ensure_default_model()?,
        };
        let sessions = match &self.server {
            Some(url) => Some(SessionSettings {
                masked: self.masked_pool_mib.map(|mib| MaskedSettings {
                    pool_bytes: usize::try_from(mib << 20).unwrap_or(usize::MAX),
                    positions: self.masked_positions,
                    batch: MASKED_BATCH,
                }),
                client: crate::cmd::remote::client_config(
                    url,
                    self.ca_cert.as_deref(),
                    self.token_file.as_deref(),
                    self.link,
                )?,
                k: match self.k {
                    KArg::Fixed(k) => DraftLength::Fixed(k),
                    KArg::Auto(k_max) => DraftLength::Auto { k_max, trees: None },
                },
                acceptance_prior: self.acceptance_prior,
                prefill_width: self.prefill_width,
                schedule: self.schedule.clone(),
                planning_link: self.link,
                max_queue: self.max_queue,
                prefill_span: self.prefill_span,
                prefix_cache_bytes: (!self.no_prompt_cache)
                    .then(|| usize::try_from(self.prompt_cache_mib << 20).unwrap_or(usize::MAX)),
            }),
            None => None,
        };
        let engine = Arc::new(
            Engine::new(EngineConfig {
                model_path,
                weights: WeightMode::from(self.weights),
                base_id: self.model_id.clone(),
                sessions,
                max_tokens_cap: self.max_tokens,
                max_queue: self.max_queue,
            })
            .context("starting the endpoint")?,
        );
        let names: Vec<&str> = std::iter::once(engine.base_id())
            .chain(engine.adapters().iter().map(|a| a.id()))
            .collect();
        eprintln!("models: {}", names.join(", "));
        if !self.lazy {
            let e = engine.clone();
            std::thread::spawn(move || e.warm_up());
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .context("starting the runtime")?;
        rt.block_on(async {
            let listener = tokio::net::TcpListener::bind(self.listen)
                .await
                .with_context(|| format!("binding {}", self.listen))?;
            eprintln!(
                "OpenAI-compatible API on http://{}/v1",
                listener.local_addr()?
            );
            cipherlora_api::serve(listener, engine, async {
                crate::cmd::serve::shutdown_signal().await;
                eprintln!("shutting down");
            })
            .await?;
            anyhow::Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        api: ApiArgs,
    }

    #[test]
    fn k_defaults_to_auto_and_takes_a_number_or_a_bound() {
        let parse = |extra: &[&str]| {
            let mut args = vec!["x", "--server", "https://localhost:1"];
            args.extend_from_slice(extra);
            Wrap::try_parse_from(args).unwrap().api
        };
        let a = parse(&[]);
        assert_eq!(a.k, KArg::Auto(16));
        assert_eq!(a.acceptance_prior, None);
        assert_eq!(parse(&["--k", "4"]).k, KArg::Fixed(4));
        assert_eq!(parse(&["--k", "auto8"]).k, KArg::Auto(8));
        assert!(Wrap::try_parse_from(["x", "--k", "auto0"]).is_err());
    }
}

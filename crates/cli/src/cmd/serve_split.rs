//! `cipherlora serve-split`: the split-inference server. Runs the public base model's middle layers
//! `[a, L − b)` on clients' plaintext hidden states (privacy only empirical), with `serve`'s TLS,
//! tokens, limits and metrics; KV caches count against the key-byte limits.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use cipherlora_model::{Model, fetch};
use cipherlora_service::SplitBackend;
use cipherlora_split::ModelBackend;
use clap::Args;

use super::serve::{ServerSecurity, shutdown_signal};
use super::serve_limits::{LimitArgs, ServeFile};

/// Arguments of `cipherlora serve-split`.
#[derive(Debug, Args)]
pub struct ServeSplitArgs {
    /// GGUF file or HF folder (default: the fetched SmolLM2-135M-Instruct Q4_1).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:50052")]
    listen: SocketAddr,
    #[command(flatten)]
    security: ServerSecurity,
    /// Largest KV capacity (positions) one session may ask for.
    #[arg(long, default_value_t = 4096)]
    max_capacity: u32,
    /// TOML file with a `[limits]` table (as `serve --config`); flags win.
    #[arg(long)]
    config: Option<PathBuf>,
    #[command(flatten)]
    limits: LimitArgs,
}

impl ServeSplitArgs {
    /// Loads the model and serves until Ctrl-C or SIGTERM.
    pub fn run(self) -> anyhow::Result<()> {
        self.security.check()?;
        let (_, limits) = ServeFile::with_limits(self.config.as_deref(), &self.limits)?;
        let path = match &self.model {
            Some(p) => p.clone(),
            None => fetch::ensure_default_model()?,
        };
        let model =
            Model::load(&path).with_context(|| format!("loading model {}", path.display()))?;
        let backend = ModelBackend::new(Arc::new(model), self.max_capacity);
        let info = backend.info();
        eprintln!(
            "split model {}: {} layers, hidden {}, sessions up to {} positions",
            info.model, info.num_layers, info.hidden_size, info.max_capacity
        );
        let mut config = self.security.config(self.listen)?;
        config.limits = limits;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("starting the runtime")?;
        eprintln!("listening on {}", self.listen);
        let split: Arc<dyn SplitBackend> = Arc::new(backend);
        rt.block_on(async {
            cipherlora_service::AdapterServer::bind_with_split(config, Vec::new(), Some(split))
                .await?
                .run(async {
                    shutdown_signal().await;
                    eprintln!("shutting down");
                })
                .await
        })?;
        Ok(())
    }
}

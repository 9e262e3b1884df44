//! `cipherlora serve`: the adapter server. Holds PEFT adapters and computes their LoRA deltas on
//! the clients' ciphertexts (never a secret key or a plaintext activation); see docs/security.md.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use cipherlora_model::{Model, fetch};
use cipherlora_private::width_plan::{ClientCosts, time_client};
use cipherlora_private::{HeBackend, SessionMemory};
use cipherlora_service::auth::TokenSet;
use cipherlora_service::{AdapterBackend, LinkProfile, ServeConfig, TlsConfig};
use clap::Args;

use super::generate::AUTO_K_MAX;
use super::serve_limits::{LimitArgs, ServeFile};

/// Arguments of `cipherlora serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// PEFT adapter folder to serve (repeatable); its id is the folder name.
    #[arg(long = "adapter", required = true)]
    adapters: Vec<PathBuf>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:50051")]
    listen: SocketAddr,
    #[command(flatten)]
    security: ServerSecurity,
    /// Base model file whose shapes the adapters fit (default: the fetched default model).
    #[arg(long)]
    base_model: Option<PathBuf>,
    /// MiB of pre-encoded adapter diagonals all open sessions may hold together (default: 60 % of
    /// physical memory or of the container's cgroup memory limit, whichever is lower); beyond it
    /// sessions are refused.
    #[arg(long)]
    max_session_memory_mib: Option<u64>,
    /// Circuit privacy: rerandomise every returned ciphertext under the client's public key with
    /// flooding noise (2^-20 slot units); one encryption of zero each.
    #[arg(long)]
    circuit_privacy: bool,
    /// Do not encode diagonals at start. By default each adapter's are encoded in the background
    /// for the prefill width a client with `--prefill-width auto` opens and, where free memory
    /// allows, for the verify width a client with `--k auto` on this machine's CPU and a 20 ms,
    /// 100 Mbit/s link would choose (a guess: other clients may choose another), and kept within
    /// the session memory budget, so those sessions open without waiting for them.
    #[arg(long)]
    no_prewarm: bool,
    /// TOML file with a `[limits]` table (any limit flag's name, with `_`) and
    /// `max_session_memory_mib`; flags win over it.
    #[arg(long)]
    config: Option<PathBuf>,
    #[command(flatten)]
    limits: LimitArgs,
}

impl ServeArgs {
    /// Loads the adapters and serves until Ctrl-C or SIGTERM, then shuts down gracefully.
    pub fn run(self) -> anyhow::Result<()> {
        self.check_security()?;
        let (file, limits) = ServeFile::with_limits(self.config.as_deref(), &self.limits)?;
        let base = match &self.base_model {
            Some(p) => p.clone(),
            None => fetch::ensure_default_model()?,
        };
        let model =
            Model::load(&base).with_context(|| format!("loading base model {}", base.display()))?;
        let memory = match self.max_session_memory_mib.or(file.max_session_memory_mib) {
            Some(mib) => SessionMemory::new(mib.saturating_mul(1 << 20)),
            None => SessionMemory::default(),
        };
        eprintln!(
            "session memory budget: {} MiB (all adapters)",
            memory.limit() >> 20
        );
        let mut backends: Vec<Arc<dyn AdapterBackend>> = Vec::new();
        let mut prewarm = Vec::new();
        for dir in &self.adapters {
            let id = cipherlora_private::adapter_id(dir)?;
            let mut b = HeBackend::load(&id, dir, model.config())
                .with_context(|| format!("loading adapter {}", dir.display()))?
                .with_session_memory(memory.clone());
            if self.circuit_privacy {
                b = b.with_circuit_privacy(cipherlora_private::Rerandomization::default());
            }
            eprintln!(
                "adapter {id}: {} groups, preset {}",
                b.server().groups().groups.len(),
                b.info().ckks_presets.join(",")
            );
            let b = Arc::new(b);
            if !self.no_prewarm {
                prewarm.push((id, b.clone()));
            }
            backends.push(b);
        }
        if prewarm.is_empty() {
            drop(model);
        } else {
            prewarm_in_background(prewarm, model);
        }
        let mut config = self.security.config(self.listen)?;
        config.limits = limits;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("starting the runtime")?;
        eprintln!("listening on {}", self.listen);
        rt.block_on(cipherlora_service::serve(config, backends, async {
            shutdown_signal().await;
            eprintln!("shutting down");
        }))?;
        Ok(())
    }
}

/// Encodes the adapters' diagonals on threads of their own: the verify width a client like this
/// machine would choose ([`HeBackend::prewarm_verify`], on `model`'s passes timed first, before any
/// encoding competes for the cores), then the prefill width ([`HeBackend::prewarm_prefill`]). A
/// failure (no room in the budget) only means the first client encodes them.
fn prewarm_in_background(backends: Vec<(String, Arc<HeBackend>)>, model: Model) {
    std::thread::spawn(move || {
        let client = time_client(&model, &model, AUTO_K_MAX + 1)
            .inspect_err(|e| tracing::warn!(error = %e, "client passes not timed: no verify width encoded at start"))
            .ok();
        drop(model);
        for (id, backend) in backends {
            let client = client.clone();
            std::thread::spawn(move || prewarm(&id, &backend, client.as_ref()));
        }
    });
}

/// One adapter's encoding at start ([`prewarm_in_background`]).
fn prewarm(id: &str, backend: &HeBackend, client: Option<&ClientCosts>) {
    if let Some(client) = client {
        report(id, "verify", || {
            let guessed = backend.prewarm_verify(client, &LinkProfile::WAN20, AUTO_K_MAX)?;
            Ok(guessed.map(|(w, g, bytes)| (format!("{w} ({g:?})"), bytes)))
        });
    }
    report(id, "prefill", || {
        let (w, bytes) = backend.prewarm_prefill()?;
        Ok(Some((w.to_string(), bytes)))
    });
}

/// Runs one encoding at start and logs its width, time and bytes, or why it did not run.
fn report(
    id: &str,
    session: &str,
    encode: impl FnOnce() -> Result<Option<(String, u64)>, cipherlora_private::PrivateError>,
) {
    let t0 = std::time::Instant::now();
    match encode() {
        Ok(Some((width, bytes))) => eprintln!(
            "adapter {id}: {session} width {width} encoded in {:.1} s ({} MiB, kept warm)",
            t0.elapsed().as_secs_f64(),
            bytes >> 20
        ),
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(adapter = %id, error = %e, "{session} diagonals not encoded at start");
            eprintln!("adapter {id}: {session} diagonals not encoded at start ({e})");
        }
    }
}

impl ServeArgs {
    /// Refuses to serve without TLS or tokens unless `--insecure`, before loading anything. Errors:
    /// what is missing, and the flag that allows it.
    pub fn check_security(&self) -> anyhow::Result<()> {
        self.security.check()
    }
}

/// The flags `serve` and `serve-split` share: TLS, bearer tokens, metrics, and the explicit opt-out
/// of the first two.
#[derive(Debug, Args)]
pub struct ServerSecurity {
    /// PEM server certificate (with --tls-key); without, plaintext HTTP/2 (refused unless
    /// --insecure).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// File of accepted bearer tokens, one per line; without, no auth (refused unless --insecure).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Where to serve Prometheus `GET /metrics`, if anywhere.
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// Serve without TLS or without bearer tokens: for tests on a trusted host only.
    #[arg(long)]
    insecure: bool,
}

impl ServerSecurity {
    /// Refuses to serve without TLS or bearer tokens unless `--insecure`. Errors: what is missing,
    /// and the flag that allows it.
    pub fn check(&self) -> anyhow::Result<()> {
        if self.insecure {
            return Ok(());
        }
        let mut missing = Vec::new();
        if self.tls_cert.is_none() {
            missing.push("TLS (--tls-cert/--tls-key)");
        }
        if self.token_file.is_none() {
            missing.push("bearer tokens (--token-file)");
        }
        if missing.is_empty() {
            return Ok(());
        }
        anyhow::bail!(
            "refusing to serve without {}: pass --insecure to allow it (tests on a trusted host only)",
            missing.join(" and ")
        )
    }

    /// A server configuration on `listen` with this TLS, tokens and metrics address (default
    /// limits). Errors: unreadable certificate, key or token files.
    pub fn config(&self, listen: SocketAddr) -> anyhow::Result<ServeConfig> {
        let mut config = ServeConfig::new(listen);
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            config.tls = Some(TlsConfig::from_files(cert, key)?);
        }
        if let Some(f) = &self.token_file {
            config.tokens = Some(TokenSet::from_file(f)?);
        }
        config.metrics_listen = self.metrics_listen;
        Ok(config)
    }
}

/// Ctrl-C, or SIGTERM on Unix (what service managers send).
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

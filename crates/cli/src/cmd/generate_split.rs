//! `cipherlora generate-split`: generation (greedy or exactly sampled) with a split server running
//! the middle layers; tokens and logits stay here, hidden states travel in plaintext under TLS.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use cipherlora_model::{GenerateOptions, Model, NoAdapter, SamplingParams, TextStream, Tokenizer};
use cipherlora_service::{LinkProfile, SplitClient};
use cipherlora_speculative::ngram::{AdaptiveLookup, PromptLookup};
use cipherlora_split::{DraftMethod, Lookahead, ReplayingClient, SplitConfig};
use clap::{Args, ValueEnum};

use super::remote::client_config;
use super::sampling_arg::SamplingArgs;

/// How the split client drafts.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum SplitDraftArg {
    /// Prompt lookup: copy the continuation of an earlier n-gram.
    PromptLookup,
    /// Prompt lookup drafting by the match length: up to 2K after a 3-token match, fewer after a
    /// shorter one.
    AdaptivePromptLookup,
    /// Lookahead decoding (Fu et al. 2024): a Jacobi window and an n-gram pool verified as a token
    /// tree, prompt lookup among the candidates (settings: --lookahead).
    Lookahead,
    /// No draft: one token per round trip.
    None,
}

/// Arguments of `cipherlora generate-split`.
#[derive(Debug, Args)]
pub struct GenerateSplitArgs {
    /// GGUF file or HF folder: the same weights the server runs (default: the fetched
    /// SmolLM2-135M-Instruct Q4_1).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Raw prompt to continue.
    #[arg(long, conflicts_with = "chat", required_unless_present = "chat")]
    prompt: Option<String>,
    /// User message, wrapped in the model's ChatML template.
    #[arg(long)]
    chat: Option<String>,
    /// Maximum number of new tokens.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Split server URL (`https://host:port`; `http://` only against `serve-split --insecure`).
    #[arg(long)]
    split_server: String,
    /// Decoder layers kept locally before and after the server's: `a,b`.
    #[arg(long, default_value = "2,2", value_parser = parse_pair)]
    local_layers: (u32, u32),
    /// Drafted tokens verified per round trip (K; adaptive prompt lookup drafts up to 2K).
    #[arg(long, default_value_t = 4)]
    k: usize,
    /// DraftMethod.
    #[arg(long, value_enum, default_value = "prompt-lookup")]
    draft: SplitDraftArg,
    /// Lookahead decoding's `W,N,G` with `--draft lookahead`: window (Jacobi columns), n-gram size,
    /// pool n-grams verified per step.
    #[arg(long, default_value = "3,3,3")]
    lookahead: Lookahead,
    /// Bearer token file (first non-empty line).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// CA certificate (PEM) that signed the server's certificate.
    #[arg(long)]
    ca_cert: Option<PathBuf>,
    /// Simulated link (`loopback`, `lan`, `wan20`, `wan80`, `home80`, `rtt=MS,mbps=N`).
    #[arg(long)]
    link: Option<LinkProfile>,
    /// Also run the whole model locally and fail unless the outputs are token-identical (greedy
    /// only).
    #[arg(long)]
    check_local: bool,
}

fn parse_pair(s: &str) -> Result<(u32, u32), String> {
    let (a, b) = s
        .split_once(',')
        .ok_or_else(|| format!("expected a,b, got {s:?}"))?;
    let p = |v: &str| v.trim().parse::<u32>().map_err(|e| format!("{v:?}: {e}"));
    Ok((p(a)?, p(b)?))
}

impl GenerateSplitArgs {
    /// Connects, opens a session, generates and streams the text to stdout; a summary goes to
    /// stderr.
    pub fn run(self) -> anyhow::Result<()> {
        let path = match &self.model {
            Some(p) => p.clone(),
            None => cipherlora_model::fetch::ensure_default_model()?,
        };
        let model =
            Arc::new(Model::load(&path).with_context(|| format!("loading {}", path.display()))?);
        let tokenizer = Tokenizer::for_model(&path)?;
        let text = match (&self.prompt, &self.chat) {
            (_, Some(msg)) => tokenizer.chat_prompt(msg)?,
            (Some(p), None) => p.clone(),
            (None, None) => anyhow::bail!("--prompt or --chat is required"),
        };
        let prompt = tokenizer.encode(&text)?;
        anyhow::ensure!(
            !self.check_local || self.sampling.is_greedy(),
            "--check-local compares greedy outputs: use --temperature 0"
        );
        let (a, b) = self.local_layers;
        let config = SplitConfig {
            head_layers: a as usize,
            tail_layers: b as usize,
            k: self.k,
            max_tokens: self.max_tokens,
            eos: tokenizer.eos_tokens().to_vec(),
            drafter: match self.draft {
                SplitDraftArg::PromptLookup => DraftMethod::PromptLookup(PromptLookup::default()),
                SplitDraftArg::AdaptivePromptLookup => {
                    DraftMethod::AdaptivePromptLookup(AdaptiveLookup::default())
                }
                SplitDraftArg::Lookahead => DraftMethod::Lookahead(self.lookahead),
                SplitDraftArg::None => DraftMethod::None,
            },
            sampling: self.sampling.params(),
        };
        let cc = client_config(
            &self.split_server,
            self.ca_cert.as_deref(),
            self.token_file.as_deref(),
            self.link,
        )?;
        let mut client = SplitClient::connect(&cc)?;
        let info = client.describe()?;
        anyhow::ensure!(
            info.num_layers as usize == model.config().num_layers
                && info.hidden_size as usize == model.config().hidden_size,
            "the server's model ({}: {} layers, hidden {}) is not this one",
            info.model,
            info.num_layers,
            info.hidden_size
        );
        let capacity = u32::try_from(config.capacity(prompt.len()))?;
        // A session lost mid-generation (server restart, eviction) is reopened and its prefix
        // replayed once.
        let mut middle = ReplayingClient::open(cc, client, (a, b), capacity)?;
        let session = middle.session().clone();
        let mut stream = TextStream::new(&tokenizer);
        let mut stdout = std::io::stdout().lock();
        if self.prompt.is_some() {
            write!(stdout, "{text}")?;
        }
        let out = cipherlora_split::generate(&model, &prompt, &config, &mut middle, &mut |id| {
            if let Ok(Some(piece)) = stream.push(id) {
                let _ = write!(stdout, "{piece}");
                let _ = stdout.flush();
            }
        })?;
        writeln!(stdout)?;
        let replays = middle.replays();
        middle.close()?;
        eprintln!(
            "{} tokens in {:.2} s ({:.1} tok/s); server layers {}..{}; {} steps (one round trip each), {:.2} tokens per step, {:.0} bytes per token{}",
            out.tokens.len(),
            out.elapsed.as_secs_f64(),
            out.tokens_per_second(),
            session.first_layer,
            session.end_layer,
            out.steps.len(),
            out.tokens_per_step(),
            out.bytes_per_token(),
            if replays > 0 {
                format!("; the session was lost and replayed {replays} time(s)")
            } else {
                String::new()
            }
        );
        if self.check_local {
            let opts = GenerateOptions {
                max_tokens: self.max_tokens,
                sampling: SamplingParams::greedy(),
                eos: config.eos.clone(),
            };
            let local = cipherlora_model::generate(
                &model,
                &prompt,
                &opts,
                &mut NoAdapter,
                &mut |_| Ok(()),
            )?;
            anyhow::ensure!(
                local.tokens == out.tokens,
                "split output differs from the local model's greedy output"
            );
            eprintln!("check: identical to the local model's greedy output");
        }
        Ok(())
    }
}

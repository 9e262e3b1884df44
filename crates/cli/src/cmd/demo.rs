//! `cipherlora demo`: a private speculative generation with the default
//! model and a committed adapter, next to the plaintext reference.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use cipherlora_model::{
    GenerateOptions, LoraAdapter, Model, PlainLora, SamplingParams, TextStream, Tokenizer, fetch,
    generate,
};
use cipherlora_private::{AdapterServer, HeHook, InProcess};
use cipherlora_spec::decode::{self, DrafterKind, SpecConfig};
use clap::{Args, ValueEnum};

/// Drafter choice on the command line.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum DraftArg {
    /// The plaintext base model.
    Base,
    /// Prompt lookup (n-gram).
    Ngram,
    /// Prompt lookup when it has a full draft, the base model otherwise.
    Hybrid,
    /// No speculation.
    None,
}

impl From<DraftArg> for DrafterKind {
    fn from(d: DraftArg) -> Self {
        match d {
            DraftArg::Base => DrafterKind::Base,
            DraftArg::Ngram => DrafterKind::Ngram,
            DraftArg::Hybrid => DrafterKind::Hybrid,
            DraftArg::None => DrafterKind::None,
        }
    }
}

/// Arguments of `cipherlora demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// PEFT adapter folder served by the embedded adapter server.
    #[arg(long)]
    adapter: Option<PathBuf>,
    /// Prompt to continue.
    #[arg(
        long,
        default_value = "def is_palindrome(s: str) -> bool:\n    \"\"\"Return True if s reads the same backwards.\"\"\""
    )]
    prompt: String,
    /// New tokens to generate.
    #[arg(long, default_value_t = 48)]
    max_tokens: usize,
    /// Drafted tokens per round (K); the server always sees K+1 positions.
    #[arg(long, default_value_t = 4)]
    k: usize,
    /// Drafter.
    #[arg(long, value_enum, default_value = "base")]
    draft: DraftArg,
}

/// The committed adapter: `adapters/NAME` under the working directory, or
/// under the source tree this binary was built from.
pub fn committed_adapter(name: &str) -> PathBuf {
    let local = PathBuf::from("adapters").join(name);
    if local.is_dir() {
        return local;
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../adapters")
        .join(name)
}

impl DemoArgs {
    /// Runs the demo; fails (non-zero exit) if the outputs differ.
    pub fn run(self) -> anyhow::Result<()> {
        let path = fetch::ensure_default_model().context("fetching the default model")?;
        let model = Model::load(&path).with_context(|| format!("loading {}", path.display()))?;
        let tok = Tokenizer::for_model(&path)?;
        let dir = self
            .adapter
            .clone()
            .unwrap_or_else(|| committed_adapter("code-lora-r16"));
        let prompt = tok.encode(&self.prompt)?;
        let drafter = DrafterKind::from(self.draft);
        let width = if drafter == DrafterKind::None {
            1
        } else {
            self.k + 1
        };

        eprintln!("model:   {}", path.display());
        eprintln!(
            "adapter: {} (embedded adapter server, in-process transport)",
            dir.display()
        );
        let server = AdapterServer::load(&dir, model.config())?;
        let offer = server.offer(width)?;
        let t_keys = Instant::now();
        let mut hook = HeHook::connect(&offer, model.config(), |keys| {
            eprintln!("session: {} Galois key bytes uploaded", keys.len());
            Ok(InProcess::new(Arc::new(server.open_session(&offer, keys)?)))
        })?;
        eprintln!(
            "session opened in {:.1} s ({:?} LoRA, {} positions per verify pass)\n",
            t_keys.elapsed().as_secs_f64(),
            server.groups().kind,
            width
        );

        let cfg = SpecConfig {
            drafter,
            k: self.k,
            adaptive: false,
            pad_to_k: true,
            max_tokens: self.max_tokens,
            sampling: SamplingParams::greedy(),
            eos: tok.eos_tokens().to_vec(),
        };
        println!("--- private (CKKS, speculative) ---");
        print!("{}", self.prompt);
        let mut stream = TextStream::new(&tok);
        let t0 = Instant::now();
        let private = decode::generate(&model, &prompt, &cfg, &mut hook, &mut |toks| {
            for &t in toks {
                if let Some(s) = stream.push(t)? {
                    print!("{s}");
                }
            }
            std::io::stdout().flush().ok();
            Ok(())
        })?;
        let secs = t0.elapsed().as_secs_f64();
        println!();

        let plain_adapter = LoraAdapter::load(&dir, model.config())?;
        let opts = GenerateOptions {
            max_tokens: self.max_tokens,
            sampling: SamplingParams::greedy(),
            eos: tok.eos_tokens().to_vec(),
        };
        let t1 = Instant::now();
        let reference = generate(
            &model,
            &prompt,
            &opts,
            &mut PlainLora::new(&plain_adapter),
            &mut |_| Ok(()),
        )?;
        let plain_secs = t1.elapsed().as_secs_f64();
        println!("--- plaintext reference (adapter merged in plaintext) ---");
        println!("{}{}", self.prompt, tok.decode(&reference.tokens)?);

        let n = private.tokens.len();
        let s = &private.stats;
        let h = hook.timings();
        println!("--- summary ---");
        println!(
            "tokens {n}, private {:.2} tok/s, plaintext {:.2} tok/s, rounds {}, mean accepted length {:.2}",
            n as f64 / secs,
            reference.tokens.len() as f64 / plain_secs,
            s.rounds,
            s.mean_accepted_length(n)
        );
        let he_ms = h.encrypt_ms + h.server_ms + h.network_ms + h.decrypt_ms;
        println!(
            "time: draft {:.0} ms; verify and prefill passes {:.0} ms = plaintext forward {:.0} + encrypt {:.0} + server {:.0} + transport {:.0} + decrypt {:.0} ({} verify rounds, {} prefill passes, {} group round trips)",
            s.draft_secs * 1e3,
            (s.verify_secs + s.prefill_secs) * 1e3,
            (s.verify_secs + s.prefill_secs) * 1e3 - he_ms,
            h.encrypt_ms,
            h.server_ms,
            h.network_ms,
            h.decrypt_ms,
            s.rounds,
            s.prefill_passes,
            h.rounds
        );
        println!(
            "bytes: up {:.1} MB, down {:.1} MB ({:.0} KB per token)",
            h.bytes_up as f64 / 1e6,
            h.bytes_down as f64 / 1e6,
            (h.bytes_up + h.bytes_down) as f64 / 1e3 / n.max(1) as f64
        );
        if private.tokens == reference.tokens {
            println!("MATCH: the private output equals the plaintext reference token for token");
            Ok(())
        } else {
            let first = private
                .tokens
                .iter()
                .zip(&reference.tokens)
                .position(|(a, b)| a != b)
                .unwrap_or(n.min(reference.tokens.len()));
            anyhow::bail!("MISMATCH: outputs differ from generated token {first}")
        }
    }
}

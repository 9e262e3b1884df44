//! `cipherlora demo`: a private speculative generation with the default model and a committed
//! adapter, next to the plaintext reference. The adapter server is embedded but reached over gRPC
//! with TLS and a token ([`EmbeddedServer`]), so the demo exercises the real protocol.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use cipherlora_model::{
    GenerateOptions, LoraAdapter, Model, PlainLora, SamplingParams, TextStream, Tokenizer, fetch,
    generate,
};
use cipherlora_private::{
    ConnectOptions, DraftLength, EmbeddedServer, Grouping, PrefillWidth, summary,
};
use cipherlora_service::LinkProfile;
use cipherlora_speculative::decode::{self, ChainDrafter, Drafting, SpecConfig};
use cipherlora_speculative::schedule::Schedule;
use clap::{Args, ValueEnum};

use crate::cmd::schedule_arg::schedule_report;

/// Drafter choice on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
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

/// Default of `--draft-stop-below` (see BENCHMARKS.md, "Draft length").
pub const DEFAULT_DRAFT_STOP: f32 = 0.0;

/// How the base drafter holds its weights.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum DraftWeightsArg {
    /// The target model itself (same weights).
    Same,
    /// An f16 copy of the projection and output weights (drafts are still verified).
    F16,
    /// Quantized weights (`Model::fast_drafter`; an f16 copy for HF folders): the fastest
    /// single-position step. Drafts are still verified.
    Quantized,
}

impl DraftWeightsArg {
    /// The drafter's model: `model`, its f16 copy, or its quantized file. Errors: a failed weight
    /// conversion or load.
    pub fn drafter(self, model: &Model) -> anyhow::Result<std::borrow::Cow<'_, Model>> {
        Ok(match self {
            DraftWeightsArg::Same => std::borrow::Cow::Borrowed(model),
            DraftWeightsArg::F16 => std::borrow::Cow::Owned(model.to_f16_weights()?),
            DraftWeightsArg::Quantized => model.fast_drafter()?,
        })
    }
}

impl DraftArg {
    /// Chains of `k` drafts from this drafter, or none.
    pub fn drafting(self, k: usize) -> Drafting {
        let chain = |drafter| Drafting::chain(drafter, k);
        match self {
            DraftArg::Base => chain(ChainDrafter::Base),
            DraftArg::Ngram => chain(ChainDrafter::Ngram),
            DraftArg::Hybrid => chain(ChainDrafter::Hybrid),
            DraftArg::None => Drafting::None,
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
    /// Positions per prefill request (a second session of this width), or `auto` (chosen from
    /// the adapter's shapes).
    #[arg(long, default_value = "16")]
    prefill_width: PrefillWidth,
    /// How the base drafter holds its weights.
    #[arg(long, value_enum, default_value = "quantized")]
    draft_weights: DraftWeightsArg,
    /// Greedy base drafts stop after a token below this drafter probability (0: always K).
    #[arg(long, default_value_t = DEFAULT_DRAFT_STOP)]
    draft_stop_below: f32,
    /// Draft with the plain base model, without the latest decrypted adapter deltas.
    #[arg(long)]
    plain_drafter: bool,
    /// Simulated link between the client and the embedded server (`loopback`, `wan20`, `wan80`,
    /// `home80`, `rtt=MS,mbps=N`).
    #[arg(long, default_value = "loopback")]
    link: LinkProfile,
    /// Verify schedule: `auto` (modelled on --link), `per-group`, `fixed-point[:N]`.
    #[arg(long, default_value = "auto")]
    schedule: String,
}

/// `Ok` if the private greedy output equals the plaintext reference. Errors: the mismatch: the
/// first differing generated-token index and both tokens there (`None` where one output ended).
pub fn check_equal(private: &[u32], reference: &[u32]) -> anyhow::Result<()> {
    if private == reference {
        return Ok(());
    }
    let first = private
        .iter()
        .zip(reference)
        .position(|(a, b)| a != b)
        .unwrap_or(private.len().min(reference.len()));
    anyhow::bail!(
        "MISMATCH: the private output differs from the plaintext reference at generated token {first} (private {:?}, plaintext {:?})",
        private.get(first),
        reference.get(first)
    )
}

/// The committed adapter: `adapters/NAME` under the working directory, or under the source tree
/// this binary was built from.
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
        // The target verifies drafts: f32 (`WeightMode::for_private_verify`).
        let weights = cipherlora_model::WeightMode::Auto.for_private_verify();
        let model = Model::load_with(&path, &cipherlora_model::LoadOptions { weights })
            .with_context(|| format!("loading {}", path.display()))?;
        let tok = Tokenizer::for_model(&path)?;
        let dir = self
            .adapter
            .clone()
            .unwrap_or_else(|| committed_adapter("code-lora-r16"));
        let prompt = tok.encode(&self.prompt)?;
        let drafting = self.draft.drafting(self.k);
        let width = drafting.k() + 1;

        eprintln!("model:   {}", path.display());
        let id = cipherlora_private::adapter_id(&dir)?;
        let server = EmbeddedServer::start(&id, &dir, model.config(), None)?;
        eprintln!(
            "adapter: {} (embedded adapter server on {}, gRPC over TLS with a bearer token)",
            dir.display(),
            server.addr()
        );
        let t_keys = Instant::now();
        let drafter_model = self.draft_weights.drafter(&model)?;
        let options = ConnectOptions {
            draft: DraftLength::Fixed(width - 1),
            acceptance_prior: None,
            prefill_width: self.prefill_width,
            schedule: match self.schedule.as_str() {
                "auto" => None,
                s => Some(s.parse::<Schedule>()?),
            },
            grouping: Some(Grouping::ByInput),
            planning_link: Some(self.link),
        };
        let session = cipherlora_private::connect(
            server.client_config(self.link),
            &id,
            &options,
            (&model, &drafter_model),
        )?;
        if let Some(choice) = &session.schedule_choice {
            eprintln!("{}", schedule_report(choice, true, &self.link));
        }
        eprintln!(
            "sessions opened in {:.1} s (keys made and uploaded; {} positions per verify pass, {} per prefill pass)\n",
            t_keys.elapsed().as_secs_f64(),
            width,
            session.prefill_width
        );
        let prefill_width = session.prefill_width;
        let mut hook = session.hook;
        let cfg = SpecConfig {
            drafting,
            pad_to_k: true,
            prefill_width: Some(prefill_width),
            optimistic: false,
            draft_stop_below: self.draft_stop_below,
            delta_guided: !self.plain_drafter,
            max_tokens: self.max_tokens,
            sampling: SamplingParams::greedy(),
            eos: tok.eos_tokens().to_vec(),
            first_token_from_prefill: true,
            prefill_span: cipherlora_speculative::decode::PrefillSpan::default(),
            schedule: session.schedule,
        };
        println!("--- private (CKKS, speculative) ---");
        print!("{}", self.prompt);
        let mut stream = TextStream::new(&tok);
        let t0 = Instant::now();
        let private = decode::generate_drafted(
            &model,
            &*drafter_model,
            &prompt,
            &cfg,
            &mut hook,
            &mut |toks| {
                for &t in toks {
                    if let Some(s) = stream.push(t)? {
                        print!("{s}");
                    }
                }
                std::io::stdout().flush().ok();
                Ok(())
            },
        )?;
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
        println!("--- summary ---");
        println!(
            "private: {}",
            summary(
                n,
                secs,
                &private.stats,
                &hook.timings(),
                &hook.timings_since_prefill()
            )
        );
        println!(
            "plaintext reference: {:.2} tok/s",
            reference.tokens.len() as f64 / plain_secs
        );
        check_equal(&private.tokens, &reference.tokens)?;
        println!("MATCH: the private output equals the plaintext reference token for token");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::check_equal;

    #[test]
    fn equal_outputs_pass() {
        assert!(check_equal(&[1, 2, 3], &[1, 2, 3]).is_ok());
    }

    #[test]
    fn the_first_differing_position_is_named() {
        let e = check_equal(&[1, 2, 9, 4], &[1, 2, 3, 4])
            .unwrap_err()
            .to_string();
        assert!(e.contains("generated token 2"), "{e}");
        assert!(e.contains("Some(9)") && e.contains("Some(3)"), "{e}");
    }

    #[test]
    fn an_output_that_stops_early_differs_where_it_ends() {
        let e = check_equal(&[1, 2], &[1, 2, 3]).unwrap_err().to_string();
        assert!(e.contains("generated token 2"), "{e}");
        assert!(e.contains("None"), "{e}");
    }
}

//! `cipherlora generate`: plaintext generation, streamed to stdout.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use cipherlora_model::{
    DeltaHook, GenerateOptions, LoadOptions, LoraAdapter, Model, NoAdapter, PlainLora, TextStream,
    Tokenizer, WeightMode,
};
use cipherlora_private::{ConnectOptions, DraftLength, PrefillWidth, summary};
use cipherlora_service::LinkProfile;
use cipherlora_speculative::decode::{self, Drafting, SpecConfig};
use cipherlora_speculative::schedule::Schedule;
use cipherlora_speculative::tree_draft::TreeParams;
use clap::{Args, ValueEnum};

use crate::cmd::demo::{DraftArg, DraftWeightsArg, check_equal};
use crate::cmd::draft_model::DrafterModel;
use crate::cmd::sampling_arg::SamplingArgs;
use crate::cmd::schedule_arg::schedule_report;

/// How to hold GGUF weights.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum WeightsArg {
    /// Private mode: f32. Otherwise quantized for Q4_0/Q4_1/Q8_0, else f32 up to 2 GiB.
    Auto,
    /// Keep quantized tensors quantized (16-bit activations; logits close to f32's). In private
    /// mode the verify schedule is then per group, exact on any weights.
    Quantized,
    /// Dequantize to f32.
    F32,
    /// Dequantize, then hold projection and output weights as f16.
    F16,
}

impl From<WeightsArg> for WeightMode {
    fn from(w: WeightsArg) -> Self {
        match w {
            WeightsArg::Auto => WeightMode::Auto,
            WeightsArg::Quantized => WeightMode::Quantized,
            WeightsArg::F32 => WeightMode::F32,
            WeightsArg::F16 => WeightMode::F16,
        }
    }
}

/// Arguments of `cipherlora generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// GGUF file or HF folder (default: the fetched SmolLM2-135M-Instruct Q4_1).
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
    /// PEFT LoRA adapter folder, applied in plaintext (with --server: the --check-plaintext
    /// reference).
    #[arg(long)]
    adapter: Option<PathBuf>,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// CPU threads (default: candle's choice, or RAYON_NUM_THREADS).
    #[arg(long)]
    threads: Option<usize>,
    /// How to hold GGUF weights.
    #[arg(long, value_enum, default_value = "auto")]
    weights: WeightsArg,
    /// Private mode: adapter server URL (`https://host:port`); deltas come back under CKKS.
    #[arg(long, requires = "adapter_id")]
    server: Option<String>,
    /// Private mode: adapter id on --server.
    #[arg(long, requires = "server")]
    adapter_id: Option<String>,
    /// Private mode: bearer token file (first non-empty line).
    #[arg(long, requires = "server")]
    token_file: Option<PathBuf>,
    /// Private mode: CA certificate (PEM) that signed --server's certificate.
    #[arg(long, requires = "server")]
    ca_cert: Option<PathBuf>,
    /// Private mode: simulated link (`loopback`, `lan`, `wan20`, `wan80`, `home80`,
    /// `rtt=MS,mbps=N[,up=N,down=N]`).
    #[arg(long, requires = "server")]
    link: Option<LinkProfile>,
    /// Private mode: drafter.
    #[arg(long, value_enum, default_value = "base")]
    draft: DraftArg,
    /// Private mode: drafted tokens per round (K), or `auto` (K ≤ 16) / `autoN` (K ≤ N), chosen
    /// from the link, plans and --acceptance-prior (never from the text).
    #[arg(long, default_value = "auto")]
    k: KArg,
    /// Private mode: the acceptance rate `--k auto` assumes (default: the adapter's hint, else
    /// 0.83).
    #[arg(long, requires = "server", value_parser = crate::cmd::acceptance_arg::parse_acceptance_prior)]
    acceptance_prior: Option<f64>,
    /// Private mode: draft trees of K nodes (`BxD`, `default`: 4x8), or `auto[:BxD]` with `--k
    /// auto`.
    #[arg(long, requires = "server", value_parser = parse_tree_arg)]
    tree: Option<TreeArg>,
    /// Private mode: how the base drafter holds its weights.
    #[arg(long, value_enum, default_value = "quantized", requires = "server")]
    draft_weights: DraftWeightsArg,
    /// Private mode: draft with this smaller model instead (GGUF file or HF folder with the
    /// target's tokenizer, e.g. a 1B model drafting for an 8B target); chains only, no
    /// delta-guided drafting.
    #[arg(long, requires = "server", conflicts_with = "tree")]
    draft_model: Option<PathBuf>,
    /// Greedy base drafts stop after a token below this drafter probability (0: always K).
    #[arg(long, default_value_t = crate::cmd::demo::DEFAULT_DRAFT_STOP, requires = "server")]
    draft_stop_below: f32,
    /// Draft with the plain base model, without the latest decrypted adapter deltas.
    #[arg(long, requires = "server")]
    plain_drafter: bool,
    /// Private mode: positions per prefill request (a second session of this width), or `auto`:
    /// chosen from the adapter's shapes for long prompts (32, 64 or 128; narrower where the
    /// server has no room).
    #[arg(long, default_value = "16", requires = "server")]
    prefill_width: PrefillWidth,
    /// Private mode: positions per prefill pass, split into pipelined requests:
    /// `auto` (as many as fit 1 GiB of the pass's per-row state), `auto:<MiB>`,
    /// or a number (at most `--prefill-width`: one padded request per pass).
    #[arg(long, default_value = "auto", requires = "server")]
    prefill_span: cipherlora_speculative::decode::PrefillSpan,
    /// Private mode: draft the next round while waiting for the server (greedy, base drafter).
    #[arg(long, requires = "server")]
    optimistic: bool,
    /// Private mode: how a verify pass gets its deltas: `auto`, `per-group` or `fixed-point[:N]`
    /// with suffixes as `cipherlora_speculative::schedule::Schedule` parses them. Same output.
    #[arg(long, default_value = "auto", requires = "server")]
    schedule: String,
    /// Private mode: also run the plaintext adapted model; fail at the first differing position.
    #[arg(long, requires_all = ["server", "adapter"])]
    check_plaintext: bool,
}

/// The adapter hook for this run: the one place a hook is chosen.
fn build_hook<'a>(adapter: Option<&'a LoraAdapter>) -> Box<dyn DeltaHook + 'a> {
    match adapter {
        Some(a) => Box::new(PlainLora::new(a)),
        None => Box::new(NoAdapter),
    }
}

impl GenerateArgs {
    /// Loads the model, generates, streams the text to stdout.
    pub fn run(self) -> anyhow::Result<()> {
        if let Some(code) = reexec_with_threads(self.threads)? {
            std::process::exit(code);
        }
        let path = match &self.model {
            Some(p) => p.clone(),
            None => cipherlora_model::fetch::ensure_default_model()?,
        };
        // A private client's target verifies drafts: f32 unless asked otherwise.
        let weights = match &self.server {
            Some(_) => WeightMode::from(self.weights).for_private_verify(),
            None => WeightMode::from(self.weights),
        };
        let model = Model::load_with(&path, &LoadOptions { weights })
            .with_context(|| format!("loading {}", path.display()))?;
        let tokenizer = Tokenizer::for_model(&path)?;
        let adapter = match &self.adapter {
            Some(dir) => Some(LoraAdapter::load(dir, model.config())?),
            None => None,
        };
        let text = match (&self.prompt, &self.chat) {
            (_, Some(msg)) => tokenizer.chat_prompt(msg)?,
            (Some(p), None) => p.clone(),
            (None, None) => anyhow::bail!("--prompt or --chat is required"),
        };
        let prompt = tokenizer.encode(&text)?;
        let opts = GenerateOptions {
            max_tokens: self.max_tokens,
            sampling: self.sampling.params(),
            eos: tokenizer.eos_tokens().to_vec(),
        };
        if let Some(url) = &self.server {
            anyhow::ensure!(
                adapter.is_none() || self.check_plaintext,
                "with --server the adapter stays on the server: --adapter is only the reference of --check-plaintext"
            );
            if self.check_plaintext {
                anyhow::ensure!(
                    self.sampling.is_greedy(),
                    "--check-plaintext compares greedy outputs: use --temperature 0"
                );
            }
            return self.run_private(
                url,
                &model,
                &tokenizer,
                &text,
                &prompt,
                opts,
                adapter.as_ref(),
            );
        }
        let mut hook = build_hook(adapter.as_ref());
        let mut stream = TextStream::new(&tokenizer);
        let mut stdout = std::io::stdout().lock();
        if self.prompt.is_some() {
            write!(stdout, "{text}")?;
        }
        let out = cipherlora_model::generate(&model, &prompt, &opts, hook.as_mut(), &mut |id| {
            if let Some(piece) = stream.push(id)? {
                let _ = write!(stdout, "{piece}");
                let _ = stdout.flush();
            }
            Ok(())
        })?;
        writeln!(stdout)?;
        let n = out.tokens.len();
        tracing::info!(
            prompt_tokens = prompt.len(),
            new_tokens = n,
            prefill_s = out.prefill_secs,
            decode_tok_s = n as f64 / out.decode_secs.max(1e-9),
            "done"
        );
        Ok(())
    }
}

impl GenerateArgs {
    /// Private mode: speculative generation over gRPC, checked against `reference` if given.
    #[allow(clippy::too_many_arguments)]
    fn run_private(
        &self,
        url: &str,
        model: &Model,
        tok: &Tokenizer,
        text: &str,
        prompt: &[u32],
        opts: GenerateOptions,
        reference: Option<&LoraAdapter>,
    ) -> anyhow::Result<()> {
        let config = crate::cmd::remote::client_config(
            url,
            self.ca_cert.as_deref(),
            self.token_file.as_deref(),
            self.link,
        )?;
        let id = self.adapter_id.as_deref().unwrap_or_default();
        let drafter_model =
            DrafterModel::new(model, self.draft_weights, self.draft_model.as_deref(), tok)?;
        let schedule = match self.schedule.as_str() {
            "auto" => None,
            s => Some(s.parse::<Schedule>()?),
        };
        anyhow::ensure!(
            self.tree.is_none() || self.draft == DraftArg::Base,
            "--tree needs --draft base"
        );
        anyhow::ensure!(
            !matches!(self.tree, Some(TreeArg::Auto(_))) || matches!(self.k, KArg::Auto(_)),
            "--tree auto chooses a chain or a tree together with K: it needs --k auto"
        );
        let draft = match (self.draft, self.k) {
            // No drafts: one position per round.
            (DraftArg::None, _) => DraftLength::Fixed(0),
            (_, KArg::Fixed(k)) => DraftLength::Fixed(k),
            (_, KArg::Auto(k_max)) => DraftLength::Auto {
                k_max,
                trees: match self.tree {
                    Some(TreeArg::Auto(limits)) => Some(limits),
                    _ => None,
                },
            },
        };
        let options = ConnectOptions {
            draft,
            acceptance_prior: self.acceptance_prior,
            prefill_width: self.prefill_width,
            schedule,
            grouping: None,
            planning_link: self.link,
        };
        let opening = std::time::Instant::now();
        let session =
            cipherlora_private::connect(config, id, &options, (model, drafter_model.model()))
                .with_context(|| format!("opening a session on {url}"))?;
        eprintln!(
            "sessions open in {:.2} s (offer, width model, keys, the server's plans)",
            opening.elapsed().as_secs_f64()
        );
        if let Some(choice) = &session.width_choice {
            let shape = choice
                .best
                .tree
                .map_or_else(|| "a chain".to_string(), |t| format!("a tree, {t}"));
            eprintln!(
                "verify width: K = {}, {shape}, requests grouped {:?} (modelled {:.2} tok/s at acceptance {:.2})",
                choice.best.k, choice.best.grouping, choice.best.tok_per_s, choice.alpha
            );
        }
        let greedy = self.sampling.is_greedy();
        if let (Some(choice), Some(link)) = (&session.schedule_choice, &session.link) {
            eprintln!("{}", schedule_report(choice, greedy, link));
        }
        let tree = match self.tree {
            Some(TreeArg::Fixed(shape)) => Some(shape),
            Some(TreeArg::Auto(_)) => session.tree,
            None => None,
        };
        let (width, schedule) = (session.verify_width, session.schedule_for(greedy));
        let mut hook = session.hook;
        let drafting = match tree {
            Some(shape) => Drafting::tree(shape, width - 1),
            None => self.draft.drafting(width - 1),
        };
        let cfg = SpecConfig {
            drafting,
            pad_to_k: true,
            prefill_width: Some(session.prefill_width),
            optimistic: self.optimistic,
            draft_stop_below: self.draft_stop_below,
            delta_guided: !self.plain_drafter,
            max_tokens: opts.max_tokens,
            sampling: opts.sampling.clone(),
            eos: opts.eos.clone(),
            first_token_from_prefill: true,
            prefill_span: self.prefill_span,
            schedule,
        };
        let mut stream = TextStream::new(tok);
        let mut stdout = std::io::stdout().lock();
        if self.prompt.is_some() {
            write!(stdout, "{text}")?;
        }
        let t0 = std::time::Instant::now();
        let out = decode::generate_drafted(
            model,
            drafter_model.draft_model(),
            prompt,
            &cfg,
            &mut hook,
            &mut |toks| {
                for &t in toks {
                    if let Some(piece) = stream.push(t)? {
                        let _ = write!(stdout, "{piece}");
                    }
                }
                let _ = stdout.flush();
                Ok(())
            },
        )?;
        writeln!(stdout)?;
        let secs = t0.elapsed().as_secs_f64();
        eprintln!(
            "{}",
            summary(
                out.tokens.len(),
                secs,
                &out.stats,
                &hook.timings(),
                &hook.timings_since_prefill()
            )
        );
        if let Some(adapter) = reference {
            let want = cipherlora_model::generate(
                model,
                prompt,
                &opts,
                &mut PlainLora::new(adapter),
                &mut |_| Ok(()),
            )?;
            check_equal(&out.tokens, &want.tokens)?;
            eprintln!(
                "check-plaintext: the private output equals the plaintext adapted model's ({} tokens)",
                out.tokens.len()
            );
        }
        Ok(())
    }
}

/// Re-runs this command line with `threads` set (candle sizes its pools once per process): on Unix
/// in place of this process (it does not return unless that fails), elsewhere as a child whose exit
/// code it returns; `None`: nothing to re-run.
pub fn reexec_with_threads(threads: Option<usize>) -> anyhow::Result<Option<i32>> {
    let Some(n) = threads else { return Ok(None) };
    anyhow::ensure!(n >= 1, "--threads must be at least 1");
    let want = n.to_string();
    let current = std::env::var("RAYON_NUM_THREADS").ok();
    if current.as_deref() == Some(want.as_str())
        && std::env::var("CANDLE_NUM_THREADS").ok().as_deref() == Some(want.as_str())
    {
        return Ok(None);
    }
    let mut again = std::process::Command::new(std::env::current_exe()?);
    again
        .args(std::env::args_os().skip(1))
        .env("RAYON_NUM_THREADS", &want)
        .env("CANDLE_NUM_THREADS", &want);
    // Unix: replace this process (same pid), so a signal to it reaches the run itself.
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        let e = again.exec();
        Err(e.into())
    }
    #[cfg(not(unix))]
    {
        let status = again.status()?;
        Ok(Some(status.code().unwrap_or(1)))
    }
}

/// The largest K `--k auto` considers.
pub const AUTO_K_MAX: usize = 16;

/// `--k`: a fixed K, or `auto` / `autoN` (the verify-width model picks K ≤ 16 / ≤ N).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KArg {
    /// Draft exactly this many tokens per round.
    Fixed(usize),
    /// Let the client choose K up to this bound.
    Auto(usize),
}

impl std::str::FromStr for KArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |_| format!("{s:?}: expected a number, `auto` or `autoN`");
        match s.strip_prefix("auto") {
            Some("") => Ok(KArg::Auto(AUTO_K_MAX)),
            Some(n) => match n.parse::<usize>().map_err(bad)? {
                0 => Err("auto0: K must be at least 1".into()),
                n => Ok(KArg::Auto(n)),
            },
            None => s.parse().map(KArg::Fixed).map_err(bad),
        }
    }
}

/// What `--tree` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TreeArg {
    /// Trees of this shape every round.
    Fixed(TreeParams),
    /// A chain or a tree within these limits, as the width model prefers (`auto`, `auto:BxD`).
    Auto(TreeParams),
}

/// `default`, `BxD` (branch, depth), `auto` or `auto:BxD`, as `--tree` takes them.
fn parse_tree_arg(s: &str) -> Result<TreeArg, String> {
    let shape = |s: &str| -> Result<TreeParams, String> {
        if s == "default" {
            return Ok(TreeParams::default());
        }
        format!("tree:{s}").parse().map_err(|e| format!("{e}"))
    };
    match s.strip_prefix("auto") {
        Some("") => Ok(TreeArg::Auto(TreeParams::default())),
        Some(rest) => match rest.strip_prefix(':') {
            Some(limits) => shape(limits).map(TreeArg::Auto),
            None => Err(format!("{s}: expected auto or auto:BxD")),
        },
        None => shape(s).map(TreeArg::Fixed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_arguments_parse_to_fixed_shapes_or_auto_limits() {
        let shape = |s: &str| -> TreeParams { format!("tree:{s}").parse().unwrap() };
        assert_eq!(
            parse_tree_arg("default"),
            Ok(TreeArg::Fixed(TreeParams::default()))
        );
        assert_eq!(parse_tree_arg("3x8"), Ok(TreeArg::Fixed(shape("3x8"))));
        assert_eq!(
            parse_tree_arg("auto"),
            Ok(TreeArg::Auto(TreeParams::default()))
        );
        assert_eq!(
            parse_tree_arg("auto:2x16"),
            Ok(TreeArg::Auto(shape("2x16")))
        );
        for bad in ["autox", "auto:", "auto:2y3", "0x3", "tree"] {
            assert!(parse_tree_arg(bad).is_err(), "{bad} was accepted");
        }
    }
}

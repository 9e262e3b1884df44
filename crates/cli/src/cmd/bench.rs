//! `cipherlora bench …`

use std::path::PathBuf;

use cipherlora_bench::e2e::{DecodeConfig, DrafterChoice, DrafterWeights, PrivateRuns};
use cipherlora_speculative::tree_draft::TreeParams;
use clap::Subcommand;

/// Which benchmark to run.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Per-operation medians of the CKKS engine (N=8192 and N=16384, one thread).
    Ckks {
        /// Where to write the JSON report.
        #[arg(long, default_value = "reports/bench-ckks.json")]
        json: PathBuf,
        /// Where to write the Markdown table (default: JSON path with .md).
        #[arg(long)]
        markdown: Option<PathBuf>,
        /// Timed repetitions per operation; the median is reported.
        #[arg(long, default_value_t = 50)]
        reps: usize,
    },
    /// HE-LoRA: one verify round over all layers per shape × mode × T × strategy, vs the ct×pt floor.
    Helora {
        /// Where to write the JSON report.
        #[arg(long, default_value = "reports/bench-helora.json")]
        json: PathBuf,
        /// Where to write the Markdown table (default: JSON path with .md).
        #[arg(long)]
        markdown: Option<PathBuf>,
        /// Timed repetitions per CKKS operation; the median is used.
        #[arg(long, default_value_t = 30)]
        reps: usize,
        /// Use the 60,40,40 + 60 chain instead of the IFMA-friendly 50,40,40 + 50.
        #[arg(long)]
        no_fast: bool,
        /// Link bandwidth in Mbit/s (planner input).
        #[arg(long, default_value_t = 100.0)]
        bandwidth_mbit_s: f64,
        /// Link round-trip time in ms (planner input).
        #[arg(long, default_value_t = 20.0)]
        rtt_ms: f64,
        /// Skip the end-to-end CKKS runs (modelled figures only).
        #[arg(long)]
        no_e2e: bool,
        /// Full repeats, op costs measured afresh each time (median and range).
        #[arg(long, default_value_t = 5)]
        runs: usize,
    },
    /// Masked ring values (Delphi-style preprocessing) on the default model's shapes: the BFV offline phase and the online exchange, per group and per prefilled position, one thread.
    MaskedRing {
        /// Where to write the JSON report.
        #[arg(long, default_value = "reports/bench-masked-ring.json")]
        json: PathBuf,
        /// Where to write the Markdown table (default: JSON path with .md).
        #[arg(long)]
        markdown: Option<PathBuf>,
        /// Positions per offline request.
        #[arg(long, default_value_t = 32)]
        t: usize,
    },
    /// Private generation end to end over gRPC on loopback and a simulated WAN, vs the plaintext reference.
    E2e(E2eBenchArgs),
    /// Split inference end to end over gRPC on loopback and simulated WANs, vs the local whole model, with an RTT decomposition model.
    Split(SplitBenchArgs),
    /// The OpenAI endpoint's engine: time to first token on warm sessions, loopback.
    Api(ApiBenchArgs),
    /// A multi-turn chat through the OpenAI endpoint over simulated links: time to first token, tok/s and bytes per turn, with and without the prefix cache.
    Chat(ChatBenchArgs),
    /// One session's fixed-point trip (every adapted group at once): the server's wall time on 1, 2, … threads, alternating.
    Trip(TripBenchArgs),
    /// Plaintext model: decode tok/s and 9-/17-position verify passes vs one decode step, per weight mode, 1 and 2 threads.
    Model(ModelBenchArgs),
    /// Write a GGUF file of random quantized weights in a real model's shape, with the default model's tokenizer (so `generate`, `api` and `bench e2e` run on it) or none.
    SyntheticModel {
        /// The shape: llama-3.2-1b, qwen2.5-1.5b, qwen2.5-3b, llama-3.1-8b or test-d1024.
        #[arg(long, default_value = "qwen2.5-1.5b")]
        shape: String,
        /// GGUF whose tokenizer to copy (the vocabulary size follows it; default: the fetched default model).
        #[arg(long, conflicts_with = "no_tokenizer")]
        tokenizer_from: Option<PathBuf>,
        /// Write no vocabulary (the shape's own vocabulary size; for `bench model` and llama.cpp).
        #[arg(long)]
        no_tokenizer: bool,
        /// Weight format of every matrix: q4_0, q4_1, q8_0 (our kernels) or q4_k (candle's).
        #[arg(long, default_value = "q4_1")]
        qtype: String,
        /// Seed of the weights.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// The GGUF file to write (replaced if present).
        #[arg(long)]
        out: PathBuf,
    },
    /// Write a PEFT LoRA adapter of random weights for a model file (e.g. a synthetic one): lora_A uniform in ±1/√d_in, lora_B normal.
    SyntheticAdapter {
        /// The base model (GGUF or HF folder) whose shapes the adapter fits.
        #[arg(long)]
        model: PathBuf,
        /// PEFT target_modules, comma-separated (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj).
        #[arg(long, value_delimiter = ',', default_value = "q_proj,v_proj")]
        targets: Vec<String>,
        /// Rank r.
        #[arg(long, default_value_t = 16)]
        rank: usize,
        /// lora_alpha.
        #[arg(long, default_value_t = 32.0)]
        alpha: f64,
        /// Standard deviation of lora_B's entries.
        #[arg(long, default_value_t = 0.02)]
        b_std: f64,
        /// Mark it FFA-LoRA (lora_A public).
        #[arg(long)]
        ffa: bool,
        /// Seed of the weights.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// The adapter folder to write.
        #[arg(long)]
        out: PathBuf,
    },
}

/// Options of `cipherlora bench split`.
#[derive(Debug, clap::Args)]
pub struct SplitBenchArgs {
    /// Where to write the JSON report (Markdown beside it).
    #[arg(long, default_value = "reports/bench-split.json")]
    json: PathBuf,
    /// Where to write the Markdown table (default: JSON path with .md).
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// GGUF file or HF folder (default: the fetched default model).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Link profiles, `;`-separated (`loopback`, `lan`, `wan20`, `wan80`, `home80`, `rtt=MS,mbps=N`).
    #[arg(long, value_delimiter = ';', default_value = "loopback;wan20;wan80")]
    links: Vec<String>,
    /// Splits `a,b` (local layers before and after the server's), `;`-separated.
    #[arg(long, value_delimiter = ';', default_value = "2,2")]
    splits: Vec<String>,
    /// Drafted tokens per round trip of the prompt-lookup runs (0: none only).
    #[arg(long, default_value_t = 4)]
    k: usize,
    /// Skip the no-draft baseline (one token per round trip).
    #[arg(long)]
    no_baseline: bool,
    /// Also run lookahead decoding (Fu et al. 2024), per --lookahead-params setting.
    #[arg(long)]
    lookahead: bool,
    /// Lookahead settings `W,N,G` (window, n-gram size, pool n-grams per token), `;`-separated.
    #[arg(long, value_delimiter = ';', default_value = "3,3,3")]
    lookahead_params: Vec<cipherlora_split::Lookahead>,
    /// Also run adaptive prompt lookup (draft length by match length, up to 2K).
    #[arg(long)]
    adaptive_k: bool,
    /// Held-out prompts, JSON lines with a "prompt" field (default: committed HumanEval).
    #[arg(long)]
    prompts_file: Option<PathBuf>,
    /// Number of prompts.
    #[arg(long, default_value_t = 3)]
    prompts: usize,
    /// New tokens per prompt.
    #[arg(long, default_value_t = 32)]
    max_tokens: usize,
    /// RTTs (ms) to project tok/s to, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "5,40,150")]
    project_rtts: Vec<f64>,
    /// Do not pin client and server to different cores.
    #[arg(long)]
    no_pin: bool,
    /// Skip the HE-LoRA rows (split rows only: a quick run).
    #[arg(long)]
    no_he: bool,
    /// HE-LoRA rows: PEFT adapter folders (default: the committed code adapters).
    #[arg(long = "he-adapter")]
    he_adapters: Vec<PathBuf>,
    /// HE-LoRA rows: configurations as `bench e2e --configs` (default: `generate --server`'s).
    #[arg(long, value_delimiter = ',', default_value = "base:auto")]
    he_configs: Vec<String>,
    /// HE-LoRA rows: verify schedules as `bench e2e --schedules` takes them.
    #[arg(long, value_delimiter = ';', default_value = "auto")]
    he_schedules: Vec<String>,
}

impl SplitBenchArgs {
    fn run(self) -> anyhow::Result<()> {
        // Candle sizes its pool once per process: one thread.
        if let Some(code) = crate::cmd::generate::reexec_with_threads(Some(1))? {
            std::process::exit(code);
        }
        let model = match self.model {
            Some(p) => p,
            None => cipherlora_model::fetch::ensure_default_model()?,
        };
        let splits = self
            .splits
            .iter()
            .map(|s| {
                let (a, b) = s
                    .split_once(',')
                    .ok_or_else(|| anyhow::anyhow!("split {s:?}: expected a,b"))?;
                Ok((a.trim().parse()?, b.trim().parse()?))
            })
            .collect::<anyhow::Result<Vec<(usize, usize)>>>()?;
        let prompts_file = self.prompts_file.unwrap_or_else(|| {
            crate::cmd::demo::committed_adapter("eval").join("humaneval_0_19.jsonl")
        });
        let prompts = cipherlora_bench::e2e::read_prompts(&prompts_file, self.prompts)?;
        // `generate --server`'s defaults.
        let he = if self.no_he {
            None
        } else {
            let (_, adapters) = model_and_adapters(Some(model.clone()), self.he_adapters)?;
            Some(PrivateRuns {
                adapters,
                links: Vec::new(),
                configs: self
                    .he_configs
                    .iter()
                    .map(|c| parse_config(c, crate::cmd::demo::DraftWeightsArg::Quantized))
                    .collect::<anyhow::Result<_>>()?,
                schedules: self.he_schedules,
                max_tokens: self.max_tokens,
                prefill_width: 16,
                optimistic: false,
                draft_stop_below: crate::cmd::demo::DEFAULT_DRAFT_STOP,
                acceptance_prior: None,
                temperature: 0.0,
                replay_acceptance: 0.78,
                draft_model: None,
            })
        };
        cipherlora_bench::split_inference::run(
            &cipherlora_bench::split_inference::SplitBenchOptions {
                json: self.json,
                markdown: self.markdown,
                model,
                links: self.links,
                splits,
                k: self.k,
                no_draft_baseline: !self.no_baseline,
                lookahead: if self.lookahead {
                    self.lookahead_params
                } else {
                    Vec::new()
                },
                adaptive_k: self.adaptive_k,
                prompts,
                max_tokens: self.max_tokens,
                pin: !self.no_pin,
                project_rtts_ms: self.project_rtts,
                he,
            },
        )?;
        Ok(())
    }
}

/// Options of `cipherlora bench api`.
#[derive(Debug, clap::Args)]
pub struct ApiBenchArgs {
    /// Where to write the JSON report (Markdown beside it).
    #[arg(long, default_value = "reports/bench-api.json")]
    json: PathBuf,
    /// GGUF file or HF folder (default: the fetched default model).
    #[arg(long)]
    model: Option<PathBuf>,
    /// PEFT adapter folders (default: the committed FFA and standard ones).
    #[arg(long = "adapter")]
    adapters: Vec<PathBuf>,
    /// Drafted tokens per verify round.
    #[arg(long, default_value_t = 4)]
    k: usize,
    /// Prefill widths to compare, `;`-separated.
    #[arg(long, default_value = "32", value_delimiter = ';')]
    prefill_widths: Vec<usize>,
    /// Verify schedule of the sessions (`auto`, `per-group`, `fixed-point[:N]`).
    #[arg(long, default_value = "auto")]
    schedule: String,
    /// New tokens per request.
    #[arg(long, default_value_t = 16)]
    max_tokens: usize,
    /// Requests per prompt.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Do not pin client and server to different cores.
    #[arg(long)]
    no_pin: bool,
}

impl ApiBenchArgs {
    fn run(self) -> anyhow::Result<()> {
        if let Some(code) = crate::cmd::generate::reexec_with_threads(Some(1))? {
            std::process::exit(code);
        }
        let (model, adapters) = model_and_adapters(self.model, self.adapters)?;
        let md = cipherlora_bench::api::run(&cipherlora_bench::api::ApiBenchOptions {
            json: self.json,
            model,
            adapters,
            k: self.k,
            prefill_widths: self.prefill_widths,
            schedule: self.schedule,
            max_tokens: self.max_tokens,
            repeats: self.repeats,
            pin: !self.no_pin,
        })?;
        println!("{md}");
        Ok(())
    }
}

/// Options of `cipherlora bench chat`.
#[derive(Debug, clap::Args)]
pub struct ChatBenchArgs {
    /// Where to write the JSON report (Markdown beside it).
    #[arg(long, default_value = "reports/bench-chat.json")]
    json: PathBuf,
    /// GGUF file or HF folder (default: the fetched default model).
    #[arg(long)]
    model: Option<PathBuf>,
    /// PEFT adapter folders (default: the committed FFA and standard ones).
    #[arg(long = "adapter")]
    adapters: Vec<PathBuf>,
    /// Links between the endpoint and the adapter server, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "loopback,wan20,wan80")]
    links: Vec<String>,
    /// New tokens per answer.
    #[arg(long, default_value_t = 48)]
    max_tokens: usize,
    /// Prefix-cache budgets, MiB, comma-separated (`off`: no cache).
    #[arg(long, value_delimiter = ',', default_value = "off,1024")]
    caches: Vec<String>,
    /// Prefill spans to compare, comma-separated: `auto` (the endpoint's
    /// default, sized from 1 GiB), `auto:<MiB>` or positions (32, the
    /// prefill width: one padded request per prefill pass, no pipelining).
    #[arg(long, value_delimiter = ',', default_value = "auto")]
    spans: Vec<cipherlora_speculative::decode::PrefillSpan>,
    /// Prefill widths to compare (positions per prefill request, or `auto`: the endpoint's
    /// default, chosen from the adapter's shapes), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "auto")]
    prefill_widths: Vec<cipherlora_private::PrefillWidth>,
    /// After the chat, time one cold prompt of about this many tokens (0: none).
    #[arg(long, default_value_t = 0)]
    cold_tokens: usize,
    /// Verify schedules to compare, `;`-separated (`auto`, `per-group`,
    /// `fixed-point:N[/shadow…]`; `generate --help` lists the options).
    #[arg(long, value_delimiter = ';', default_value = "auto")]
    schedules: Vec<String>,
    /// Do not pin the endpoint and the adapter server to different cores.
    #[arg(long)]
    no_pin: bool,
    /// Masked-ring pool budgets to compare, MiB, comma-separated (`off`: CKKS only).
    #[arg(long, value_delimiter = ',', default_value = "off")]
    masked: Vec<String>,
    /// Positions of masks a masked endpoint keeps ready per adapted group.
    #[arg(long, default_value_t = 256)]
    masked_positions: usize,
    /// Most seconds between an answer and the next turn (reading and typing) while a masked
    /// endpoint makes masks; the turn goes as soon as its pools hold --masked-positions.
    #[arg(long, default_value_t = 0.0)]
    think_secs: f64,
}

/// `off` or a positive number of MiB, per entry of `values` (`flag` names them in errors).
fn mib_or_off(flag: &str, values: &[String]) -> anyhow::Result<Vec<Option<usize>>> {
    values
        .iter()
        .map(|c| match c.as_str() {
            "off" => Ok(None),
            mib => match mib.parse::<usize>() {
                Ok(m) if m > 0 => Ok(Some(m)),
                _ => anyhow::bail!("{flag} {mib}: a number of MiB above 0, or off"),
            },
        })
        .collect()
}

impl ChatBenchArgs {
    fn run(self) -> anyhow::Result<()> {
        if let Some(code) = crate::cmd::generate::reexec_with_threads(Some(1))? {
            std::process::exit(code);
        }
        let (model, adapters) = model_and_adapters(self.model, self.adapters)?;
        let links = self
            .links
            .iter()
            .map(|l| Ok((l.clone(), l.parse()?)))
            .collect::<anyhow::Result<_>>()?;
        let caches = mib_or_off("--caches", &self.caches)?;
        let masked = mib_or_off("--masked", &self.masked)?;
        let md = cipherlora_bench::chat::run(&cipherlora_bench::chat::ChatBenchOptions {
            json: self.json,
            model,
            adapters,
            links,
            max_tokens: self.max_tokens,
            caches,
            spans: self.spans,
            prefill_widths: self.prefill_widths,
            cold_tokens: self.cold_tokens,
            schedules: self.schedules,
            pin: !self.no_pin,
            masked,
            masked_positions: self.masked_positions,
            think_secs: self.think_secs,
        })?;
        println!("{md}");
        Ok(())
    }
}

/// Options of `cipherlora bench model`.
#[derive(Debug, clap::Args)]
pub struct ModelBenchArgs {
    /// Where to write the JSON report.
    #[arg(long, default_value = "reports/bench-model.json")]
    json: PathBuf,
    /// Where to write the Markdown table (default: JSON path with .md).
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// GGUF file or HF folder (default: the fetched default model).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Thread counts to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    threads: Vec<usize>,
    /// Tokens generated per decode measurement.
    #[arg(long, default_value_t = 64)]
    decode_tokens: usize,
    /// Timed repetitions per round (medians over all rounds are reported).
    #[arg(long, default_value_t = 10)]
    reps: usize,
    /// Rounds of one worker process per thread count, alternating.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Weight modes to measure, comma-separated (f32, f16, quantized).
    #[arg(long, value_delimiter = ',', default_value = "f32,f16,quantized")]
    weights: Vec<String>,
    /// Internal: measure in this process (thread count from the environment).
    #[arg(long, hide = true)]
    worker: bool,
}

/// Options of `cipherlora bench e2e`.
#[derive(Debug, clap::Args)]
pub struct E2eBenchArgs {
    /// Where to write the JSON report.
    #[arg(long, default_value = "reports/bench-e2e.json")]
    json: PathBuf,
    /// Where to write the Markdown table (default: JSON path with .md).
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// GGUF file or HF folder (default: the fetched default model).
    #[arg(long)]
    model: Option<PathBuf>,
    /// PEFT adapter folders (default: the committed FFA and standard adapters).
    #[arg(long = "adapter")]
    adapters: Vec<PathBuf>,
    /// Link profiles, `;`-separated (`loopback`, `lan`, `wan20`, `wan80`, `home80`, `rtt=MS,mbps=N[,up=N,down=N]`).
    #[arg(long, value_delimiter = ';', default_value = "loopback;wan20;wan80")]
    links: Vec<String>,
    /// Verify schedules, `;`-separated (`auto`, `per-group`, `fixed-point[:N]`),
    /// each run per configuration; `@by-input`, `@by-layer` or `@by-layers:N`
    /// fixes the grouping.
    #[arg(long, value_delimiter = ';', default_value = "per-group;fixed-point")]
    schedules: Vec<String>,
    /// Decoding configurations, comma-separated: `none`, `DRAFTER:K[:f16|:f32]`
    /// (base, ngram, hybrid) or `tree:K[:BxD]`; K may be `auto` or `autoN`
    /// (K ≤ N, chosen by the width model). A `plain-` prefix turns delta
    /// guidance off.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "none,base:4,base:8,base:12,ngram:4,hybrid:4"
    )]
    configs: Vec<String>,
    /// Held-out prompts, one JSON object with a "prompt" field per line.
    #[arg(long)]
    prompts_file: Option<PathBuf>,
    /// Number of prompts.
    #[arg(long, default_value_t = 2)]
    prompts: usize,
    /// New tokens per prompt.
    #[arg(long, default_value_t = 32)]
    max_tokens: usize,
    /// Positions per prefill pass (a second session of this width).
    #[arg(long, default_value_t = 16)]
    prefill_width: usize,
    /// Do not pin client and server to different cores.
    #[arg(long)]
    no_pin: bool,
    /// Cores the pinned server computes on (2 or more: the client's core too, so one session's
    /// fixed-point trip spreads its groups while the client waits).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    server_cores: u16,
    /// Optimistic drafting during verify passes (base drafter).
    #[arg(long)]
    optimistic: bool,
    /// How the base drafter holds its weights unless a configuration says.
    #[arg(long, value_enum, default_value = "quantized")]
    draft_weights: crate::cmd::demo::DraftWeightsArg,
    /// Greedy base drafts stop below this drafter probability (0: always K); output unchanged.
    #[arg(long, default_value_t = crate::cmd::demo::DEFAULT_DRAFT_STOP)]
    draft_stop_below: f32,
    /// Per-token acceptance prior for `auto` K (default: the adapter's hint, else 0.83).
    #[arg(long, value_parser = crate::cmd::acceptance_arg::parse_acceptance_prior)]
    acceptance_prior: Option<f64>,
    /// Sampling temperature (0: greedy, compared with the reference; sampled runs are not).
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Client weight modes, comma-separated (`auto`: f32), each with its own reference.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "auto")]
    weights: Vec<crate::cmd::generate::WeightsArg>,
    /// Per-token acceptance of the `replay` drafter, which drafts the plaintext reference's own
    /// tokens (synthetic models; default: the base drafter's measured agreement on the prose
    /// adapter general-lora-r16, adapters/acceptance-general.json).
    #[arg(long, default_value_t = 0.78)]
    replay_acceptance: f64,
    /// A smaller model (GGUF file or HF folder with the target's tokenizer) the base and hybrid
    /// drafters run instead of the target's weights, e.g. a 1B model drafting for an 8B target.
    #[arg(long)]
    draft_model: Option<PathBuf>,
}

impl E2eBenchArgs {
    fn run(self) -> anyhow::Result<()> {
        // Candle sizes its pool once per process: one thread for the client.
        if let Some(code) = crate::cmd::generate::reexec_with_threads(Some(1))? {
            std::process::exit(code);
        }
        let (model, adapters) = model_and_adapters(self.model, self.adapters)?;
        let configs = self
            .configs
            .iter()
            .map(|c| parse_config(c, self.draft_weights))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let prompts_file = self.prompts_file.unwrap_or_else(|| {
            crate::cmd::demo::committed_adapter("eval").join("humaneval_0_19.jsonl")
        });
        cipherlora_bench::e2e::run(&cipherlora_bench::e2e::E2eBenchOptions {
            json: self.json,
            markdown: self.markdown,
            model,
            prompts_file,
            prompts: self.prompts,
            pin: !self.no_pin,
            server_cores: usize::from(self.server_cores),
            weights: self.weights.into_iter().map(Into::into).collect(),
            private: PrivateRuns {
                adapters,
                links: self.links,
                configs,
                schedules: self.schedules,
                max_tokens: self.max_tokens,
                prefill_width: self.prefill_width,
                optimistic: self.optimistic,
                draft_stop_below: self.draft_stop_below,
                acceptance_prior: self.acceptance_prior,
                temperature: self.temperature,
                replay_acceptance: self.replay_acceptance,
                draft_model: self.draft_model,
            },
        })?;
        Ok(())
    }
}

/// Options of `cipherlora bench trip`.
#[derive(Debug, clap::Args)]
pub struct TripBenchArgs {
    /// Where to write the JSON report (Markdown beside it).
    #[arg(long, default_value = "reports/bench-trip.json")]
    json: PathBuf,
    /// Where to write the Markdown table (default: JSON path with .md).
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// GGUF file or HF folder whose shape the adapters fit (default: the fetched default model).
    #[arg(long)]
    model: Option<PathBuf>,
    /// PEFT adapter folders (default: the committed FFA and standard code adapters).
    #[arg(long = "adapter")]
    adapters: Vec<PathBuf>,
    /// Rows per group request (the verify width K + 1).
    #[arg(long, default_value_t = 5)]
    width: usize,
    /// Server thread counts, comma-separated, alternated.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    threads: Vec<usize>,
    /// Timed trips per thread count (after one warm-up).
    #[arg(long, default_value_t = 5)]
    reps: usize,
}

impl TripBenchArgs {
    fn run(self) -> anyhow::Result<()> {
        let (model, adapters) = model_and_adapters(self.model, self.adapters)?;
        cipherlora_bench::trip::run(&cipherlora_bench::trip::TripBenchOptions {
            json: self.json,
            markdown: self.markdown,
            model,
            adapters,
            width: self.width,
            threads: self.threads,
            reps: self.reps,
        })?;
        Ok(())
    }
}

/// `--model` or the default model; `--adapter`s or the two committed code adapters.
fn model_and_adapters(
    model: Option<PathBuf>,
    adapters: Vec<PathBuf>,
) -> anyhow::Result<(PathBuf, Vec<PathBuf>)> {
    let model = match model {
        Some(p) => p,
        None => cipherlora_model::fetch::ensure_default_model()?,
    };
    let adapters = if adapters.is_empty() {
        vec![
            crate::cmd::demo::committed_adapter("code-ffa-r16"),
            crate::cmd::demo::committed_adapter("code-lora-r16"),
        ]
    } else {
        adapters
    };
    Ok((model, adapters))
}

/// `none`, `DRAFTER:K[:WEIGHTS]` (`f16`, `f32`, `q`) or
/// `tree:K[:BxD][:WEIGHTS]` (default [`TreeParams::default`]); `auto[N]` for
/// K from the width model; `plain-` turns off [`cipherlora_speculative::draft_bias`].
fn parse_config(
    s: &str,
    default_weights: crate::cmd::demo::DraftWeightsArg,
) -> anyhow::Result<DecodeConfig> {
    let mut parts = s.split(':').peekable();
    let name = parts.next().unwrap_or_default();
    // `plain-…`: the base drafter without delta guidance.
    let (name, guided) = match name.strip_prefix("plain-") {
        Some(rest) => (rest, false),
        None => (name, true),
    };
    // `auto` (K ≤ 16) or `autoN` (K ≤ N): the verify-width model picks K.
    let draft_len = |k: &str| {
        k.parse::<usize>().map_err(|_| {
            anyhow::anyhow!(
                "{s}: the draft length {k:?} is not a number (configs are DRAFTER:K[:WEIGHTS], \
                 separated by commas, e.g. base:7,base:auto)"
            )
        })
    };
    let (k, auto_k) = match parts.next() {
        Some("auto") => (16, true),
        Some(k) if k.starts_with("auto") => (draft_len(&k["auto".len()..])?, true),
        Some(k) => (draft_len(k)?, false),
        None => (0, false),
    };
    anyhow::ensure!(
        !auto_k || matches!(name, "base" | "hybrid" | "ngram" | "tree"),
        "{s}: auto K is for the base, ngram, hybrid and tree drafters"
    );
    let tree = match (name, parts.peek()) {
        ("tree", Some(shape)) if shape.contains('x') => {
            let shape = format!("tree:{}", parts.next().unwrap_or_default());
            Some(
                shape
                    .parse::<TreeParams>()
                    .map_err(|e| anyhow::anyhow!("{s}: {e}"))?,
            )
        }
        ("tree", _) => Some(TreeParams::default()),
        _ => None,
    };
    let drafter_weights = match parts.next() {
        Some("f16") => DrafterWeights::F16,
        Some("f32") => DrafterWeights::F32,
        Some("q") => DrafterWeights::Quantized,
        Some(other) => anyhow::bail!("{s}: unknown drafter weights {other:?} (f16, f32, q)"),
        None => match default_weights {
            crate::cmd::demo::DraftWeightsArg::Same => DrafterWeights::F32,
            crate::cmd::demo::DraftWeightsArg::F16 => DrafterWeights::F16,
            crate::cmd::demo::DraftWeightsArg::Quantized => DrafterWeights::Quantized,
        },
    };
    anyhow::ensure!(parts.next().is_none(), "{s}: expected DRAFTER:K[:WEIGHTS]");
    let drafter = match name {
        "none" => DrafterChoice::None,
        "base" | "tree" => DrafterChoice::Base,
        "ngram" => DrafterChoice::Ngram,
        "hybrid" => DrafterChoice::Hybrid,
        "replay" => DrafterChoice::Replay,
        other => {
            anyhow::bail!("unknown drafter {other:?} (none, base, ngram, hybrid, tree, replay)")
        }
    };
    anyhow::ensure!(
        drafter == DrafterChoice::None || k >= 1,
        "{s}: a drafter needs K ≥ 1 (e.g. base:4)"
    );
    Ok(DecodeConfig {
        drafter,
        k,
        auto_k,
        drafter_weights,
        tree,
        guided,
    })
}

impl BenchCommand {
    /// Runs the chosen benchmark.
    pub fn run(self) -> anyhow::Result<()> {
        match self {
            BenchCommand::E2e(a) => a.run(),
            BenchCommand::Split(a) => a.run(),
            BenchCommand::Api(a) => a.run(),
            BenchCommand::Chat(a) => a.run(),
            BenchCommand::Trip(a) => a.run(),
            BenchCommand::Model(a) => {
                cipherlora_bench::model::run(&cipherlora_bench::model::ModelBenchOptions {
                    json: a.json,
                    markdown: a.markdown,
                    model: a.model,
                    threads: a.threads,
                    decode_tokens: a.decode_tokens,
                    reps: a.reps,
                    rounds: a.rounds,
                    weights: a.weights,
                    worker: a.worker,
                })
            }
            BenchCommand::SyntheticModel {
                shape,
                tokenizer_from,
                no_tokenizer,
                qtype,
                seed,
                out,
            } => {
                let config = cipherlora_model::synthetic_shape(&shape).ok_or_else(|| {
                    anyhow::anyhow!(
                        "unknown shape `{shape}` (one of {})",
                        cipherlora_model::SYNTHETIC_SHAPES.join(", ")
                    )
                })?;
                let quant = cipherlora_model::SyntheticQuant::parse(&qtype).ok_or_else(|| {
                    anyhow::anyhow!("unknown qtype `{qtype}` (q4_0, q4_1, q8_0 or q4_k)")
                })?;
                if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir)?;
                }
                if no_tokenizer {
                    cipherlora_model::write_synthetic_gguf(&out, &config, quant, seed)?;
                } else {
                    let from = match tokenizer_from {
                        Some(p) => p,
                        None => cipherlora_model::fetch::ensure_default_model()?,
                    };
                    cipherlora_model::write_synthetic_gguf_with_tokenizer(
                        &out, &config, quant, seed, &from,
                    )?;
                }
                eprintln!("wrote {}", out.display());
                Ok(())
            }
            BenchCommand::SyntheticAdapter {
                model,
                targets,
                rank,
                alpha,
                b_std,
                ffa,
                seed,
                out,
            } => {
                let targets = targets
                    .iter()
                    .map(|t| {
                        cipherlora_model::Proj::from_peft_name(t)
                            .ok_or_else(|| anyhow::anyhow!("unknown target module `{t}`"))
                    })
                    .collect::<anyhow::Result<Vec<_>>>()?;
                let config = cipherlora_model::ModelConfig::read(&model)?;
                let spec = cipherlora_model::RandomAdapterSpec {
                    targets,
                    rank,
                    alpha,
                    b_std,
                    ffa,
                    seed,
                };
                cipherlora_model::write_random_adapter(&out, &config, &spec)?;
                eprintln!("wrote {}", out.display());
                Ok(())
            }
            BenchCommand::Ckks {
                json,
                markdown,
                reps,
            } => cipherlora_bench::ckks::run(&cipherlora_bench::ckks::CkksBenchOptions {
                json,
                markdown,
                reps,
            }),
            BenchCommand::MaskedRing { json, markdown, t } => cipherlora_bench::masked_ring::run(
                &cipherlora_bench::masked_ring::MaskedRingBenchOptions { json, markdown, t },
            ),
            BenchCommand::Helora {
                json,
                markdown,
                reps,
                no_fast,
                bandwidth_mbit_s,
                rtt_ms,
                no_e2e,
                runs,
            } => cipherlora_bench::helora::run(&cipherlora_bench::helora::HeloraBenchOptions {
                json,
                markdown,
                reps,
                fast: !no_fast,
                bandwidth_mbit_s,
                rtt_ms,
                no_e2e,
                runs,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::demo::DraftWeightsArg;

    /// Regression: `--configs "base:7;base:9"` failed with a bare parse error.
    #[test]
    fn a_bad_draft_length_names_the_config_and_the_separator() {
        let e = parse_config("base:7;base:9", DraftWeightsArg::F16)
            .unwrap_err()
            .to_string();
        assert!(e.contains("base:7;base:9") && e.contains("commas"), "{e}");
    }

    #[test]
    fn configs_parse_drafter_k_and_weights() {
        let c = parse_config("base:8", DraftWeightsArg::F16).unwrap();
        assert_eq!(
            c,
            DecodeConfig {
                drafter: DrafterChoice::Base,
                k: 8,
                auto_k: false,
                drafter_weights: DrafterWeights::F16,
                tree: None,
                guided: true,
            }
        );
        let p = parse_config("plain-base:8", DraftWeightsArg::F16).unwrap();
        assert_eq!((p.drafter, p.k, p.guided), (DrafterChoice::Base, 8, false));
        let p = parse_config("plain-tree:8:3x8", DraftWeightsArg::F16).unwrap();
        assert_eq!((p.tree.is_some(), p.guided), (true, false));
        assert!(
            !parse_config("plain-none", DraftWeightsArg::F16)
                .unwrap()
                .guided
        );
        let a = parse_config("base:auto", DraftWeightsArg::F16).unwrap();
        assert_eq!((a.k, a.auto_k), (16, true));
        let a = parse_config("base:auto12:f32", DraftWeightsArg::F16).unwrap();
        assert_eq!(
            (a.k, a.auto_k, a.drafter_weights),
            (12, true, DrafterWeights::F32)
        );
        // `tree:auto`: chain or tree from the width model within the limits.
        let t = parse_config("tree:auto", DraftWeightsArg::F16).unwrap();
        assert_eq!(
            (t.k, t.auto_k, t.tree),
            (16, true, Some(TreeParams::default()))
        );
        let t = parse_config("tree:auto24:3x12", DraftWeightsArg::F16).unwrap();
        assert_eq!((t.k, t.auto_k), (24, true));
        assert_eq!(t.tree, Some("tree:3x12".parse().unwrap()));
        assert!(parse_config("base:autox", DraftWeightsArg::F16).is_err());
        let t = parse_config("tree:16:3x12:f32", DraftWeightsArg::F16).unwrap();
        assert_eq!(
            (t.drafter, t.k, t.drafter_weights),
            (DrafterChoice::Base, 16, DrafterWeights::F32)
        );
        assert_eq!(t.tree, Some("tree:3x12".parse().unwrap()));
        let t = parse_config("tree:8", DraftWeightsArg::F16).unwrap();
        assert_eq!(
            (t.tree, t.drafter_weights),
            (Some(TreeParams::default()), DrafterWeights::F16)
        );
        assert!(parse_config("tree:8:0x3", DraftWeightsArg::F16).is_err());
        assert_eq!(c.draft_weights(), "f16");
        let c = parse_config("base:4:f32", DraftWeightsArg::F16).unwrap();
        assert_eq!(c.drafter_weights, DrafterWeights::F32);
        assert_eq!(c.draft_weights(), "f32");
        let c = parse_config("base:4:q", DraftWeightsArg::F16).unwrap();
        assert_eq!(c.draft_weights(), "quantized");
        let c = parse_config("hybrid:4", DraftWeightsArg::Quantized).unwrap();
        assert_eq!(c.draft_weights(), "quantized");
        let c = parse_config("ngram:4:f16", DraftWeightsArg::Same).unwrap();
        assert_eq!(c.draft_weights(), "-", "n-gram drafts without a model");
        let c = parse_config("none", DraftWeightsArg::Same).unwrap();
        assert_eq!((c.drafter, c.k), (DrafterChoice::None, 0));
    }

    #[test]
    fn bad_configs_are_errors() {
        for bad in [
            "base",
            "base:0",
            "base:4:f8",
            "base:4:f16:x",
            "forest:4",
            "tree:8:2y3",
            "tree",
            "base:x",
        ] {
            assert!(
                parse_config(bad, DraftWeightsArg::F16).is_err(),
                "{bad} was accepted"
            );
        }
    }
}

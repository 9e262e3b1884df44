//! `cipherlora bench api`: time to first and last token of the endpoint's
//! engine ([`cipherlora_api::Engine`]) on warm sessions, answers checked
//! against the plaintext adapted model.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use cipherlora_api::{DraftLength, Engine, EngineConfig, Job, SessionSettings};
use cipherlora_model::{
    GenerateOptions, LoraAdapter, Model, PlainLora, SamplingParams, Tokenizer, WeightMode, generate,
};
use cipherlora_private::EmbeddedServer;
use cipherlora_service::LinkProfile;
use serde::{Deserialize, Serialize};

/// Prompts of 29–31 tokens, general English and code (not training data).
pub const PROMPTS: [&str; 4] = [
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined movable metal type with an oil-based ink and a wooden press to",
    "def merge_sorted(a, b):\n    \"\"\"Merge two sorted lists.\"\"\"\n    result = []\n    i = j = 0\n",
    "Photosynthesis is the process by which green plants use sunlight, water and carbon dioxide to make glucose and oxygen. In the first stage of this process,",
    "import json\n\ndef load_config(path):\n    \"\"\"Read a JSON file as a dict.\"\"\"\n    with open(path) as f:\n",
];

/// Options of the benchmark.
#[derive(Debug, Clone)]
pub struct ApiBenchOptions {
    /// Where the JSON report goes.
    pub json: PathBuf,
    /// The base model.
    pub model: PathBuf,
    /// PEFT adapter folders.
    pub adapters: Vec<PathBuf>,
    /// Drafted tokens per verify round.
    pub k: usize,
    /// Prefill widths to compare.
    pub prefill_widths: Vec<usize>,
    /// Verify schedule of the sessions.
    pub schedule: String,
    /// New tokens per request.
    pub max_tokens: usize,
    /// Requests per prompt (the first one included).
    pub repeats: usize,
    /// Pin client and server to different cores.
    pub pin: bool,
}

/// One request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ApiRun {
    /// Adapter id.
    pub adapter: String,
    /// Prefill width of the sessions.
    pub prefill_width: usize,
    /// Prompt index in [`PROMPTS`].
    pub prompt: usize,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Request to first token, ms.
    pub ttft_ms: f64,
    /// Request to last token, ms.
    pub total_ms: f64,
    /// Generated tokens.
    pub tokens: usize,
    /// Round trips of the request.
    pub round_trips: u64,
    /// Whether the text equals the plaintext adapted model's.
    pub matches_plaintext: bool,
}

/// The report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ApiReport {
    /// The command's options, in words.
    pub settings: String,
    /// How client and server were placed.
    pub pinning: String,
    /// Session opening, seconds, per adapter and prefill width.
    pub session_open_secs: Vec<(String, usize, f64)>,
    /// Every request.
    pub runs: Vec<ApiRun>,
}

/// Runs the benchmark and writes the reports; returns the Markdown.
/// Errors: model, adapter or server failures.
pub fn run(opts: &ApiBenchOptions) -> anyhow::Result<String> {
    let (server_placement, pinning) = crate::e2e::place(opts.pin);
    let model = Model::load(&opts.model)?;
    let tokenizer = Tokenizer::for_model(&opts.model)?;
    let mut report = ApiReport {
        settings: format!(
            "K = {}, schedule {}, {} new tokens, {} requests per prompt, greedy, loopback",
            opts.k, opts.schedule, opts.max_tokens, opts.repeats
        ),
        pinning,
        session_open_secs: Vec::new(),
        runs: Vec::new(),
    };
    for dir in &opts.adapters {
        let id = cipherlora_private::adapter_id(dir)?;
        let adapter = LoraAdapter::load(dir, model.config())?;
        let server = EmbeddedServer::start(&id, dir, model.config(), server_placement.clone())
            .with_context(|| format!("serving {}", dir.display()))?;
        let references: Vec<String> = PROMPTS
            .iter()
            .map(|p| reference(&model, &tokenizer, &adapter, p, opts.max_tokens))
            .collect::<anyhow::Result<_>>()?;
        for &width in &opts.prefill_widths {
            let engine = Engine::new(EngineConfig {
                model_path: opts.model.clone(),
                weights: WeightMode::Auto,
                base_id: None,
                sessions: Some(SessionSettings {
                    masked: None,
                    client: server.client_config(LinkProfile::LOOPBACK),
                    k: DraftLength::Fixed(opts.k),
                    acceptance_prior: None,
                    prefill_width: cipherlora_private::PrefillWidth::Fixed(width),
                    schedule: opts.schedule.clone(),
                    planning_link: Some(LinkProfile::LOOPBACK),
                    max_queue: 4,
                    // Every prompt is prefilled: the report measures prefill.
                    prefix_cache_bytes: None,
                    prefill_span: cipherlora_speculative::decode::PrefillSpan::default(),
                }),
                max_tokens_cap: opts.max_tokens,
                max_queue: 4,
            })?;
            let t0 = Instant::now();
            engine.warm_up();
            report
                .session_open_secs
                .push((id.clone(), width, t0.elapsed().as_secs_f64()));
            for (i, prompt) in PROMPTS.iter().enumerate() {
                for _ in 0..opts.repeats {
                    let received = Instant::now();
                    let job = Job {
                        model: id.clone(),
                        prompt: engine.encode(prompt)?,
                        max_tokens: opts.max_tokens,
                        sampling: SamplingParams::greedy(),
                        stops: Vec::new(),
                        received,
                    };
                    let mut text = String::new();
                    let done = engine.run(&job, &mut |t| {
                        text.push_str(&t);
                        true
                    })?;
                    report.runs.push(ApiRun {
                        adapter: id.clone(),
                        prefill_width: width,
                        prompt: i,
                        prompt_tokens: job.prompt.len(),
                        ttft_ms: done.cost.ttft_ms,
                        total_ms: done.cost.total_ms,
                        tokens: done.usage.completion_tokens as usize,
                        round_trips: done.cost.round_trips,
                        matches_plaintext: text == references[i],
                    });
                    eprintln!(
                        "{id} width {width} prompt {i}: TTFT {:.0} ms, {} tokens in {:.0} ms (client HE {:.0}, server {:.0}, network {:.0} ms), {}",
                        done.cost.ttft_ms,
                        done.usage.completion_tokens,
                        done.cost.total_ms,
                        done.cost.client_he_ms,
                        done.cost.server_ms,
                        done.cost.network_ms,
                        if text == references[i] {
                            "= plaintext"
                        } else {
                            "DIFFERS from plaintext"
                        }
                    );
                }
            }
        }
    }
    let md = markdown(&report);
    crate::write_report(&opts.json, None, &report, &md)?;
    Ok(md)
}

/// The plaintext adapted model's greedy text for `prompt`.
fn reference(
    model: &Model,
    tokenizer: &Tokenizer,
    adapter: &LoraAdapter,
    prompt: &str,
    max_tokens: usize,
) -> anyhow::Result<String> {
    let ids = tokenizer.encode(prompt)?;
    let opts = GenerateOptions {
        max_tokens,
        sampling: SamplingParams::greedy(),
        eos: tokenizer.eos_tokens().to_vec(),
    };
    let out = generate(
        model,
        &ids,
        &opts,
        &mut PlainLora::new(adapter),
        &mut |_| Ok(()),
    )?;
    Ok(tokenizer.decode(&out.tokens)?)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() { 0.0 } else { v[v.len() / 2] }
}

/// One row per (adapter, prefill width): median warm TTFT and the first's.
fn markdown(r: &ApiReport) -> String {
    let mut md = format!(
        "Time to first token on warm sessions ({}; {}).\n\n\
         | adapter | prefill width | sessions opened in | prompt tokens | TTFT, first request | TTFT, median | tokens/s after the first | all equal plaintext |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- |\n",
        r.settings, r.pinning
    );
    for (id, width, open) in &r.session_open_secs {
        let runs: Vec<&ApiRun> = r
            .runs
            .iter()
            .filter(|x| &x.adapter == id && x.prefill_width == *width)
            .collect();
        let Some(first) = runs.first() else { continue };
        let ttft = median(runs.iter().map(|x| x.ttft_ms).collect());
        let rate = median(
            runs.iter()
                .map(|x| {
                    (x.tokens.saturating_sub(1)) as f64 / ((x.total_ms - x.ttft_ms) / 1e3).max(1e-9)
                })
                .collect(),
        );
        let lens: Vec<usize> = runs.iter().map(|x| x.prompt_tokens).collect();
        let (lo, hi) = (
            lens.iter().min().copied().unwrap_or(0),
            lens.iter().max().copied().unwrap_or(0),
        );
        md.push_str(&format!(
            "| {id} | {width} | {open:.1} s | {lo}–{hi} | {:.0} ms | {ttft:.0} ms | {rate:.1} | {} |\n",
            first.ttft_ms,
            if runs.iter().all(|x| x.matches_plaintext) { "yes" } else { "**no**" }
        ));
    }
    md
}

//! `cipherlora bench model`: plaintext decode speed of the base model and the
//! cost of a 9-position verify pass (K = 8 drafts + 1) against one decode step,
//! at several thread counts and both GGUF weight modes (f32, quantized).
//!
//! Candle sizes its thread pools once per process from `RAYON_NUM_THREADS` /
//! `CANDLE_NUM_THREADS`, so each thread count runs in a child process (this
//! binary re-invoked as `bench model --worker`), which prints one JSON record
//! per weight mode on stdout.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::Context;
use cipherlora_model::{
    AttentionMask, GenerateOptions, LoadOptions, Model, NoAdapter, SamplingParams, Tokenizer,
    WeightMode,
};
use serde::{Deserialize, Serialize};

/// Options of `cipherlora bench model`.
#[derive(Debug, Clone)]
pub struct ModelBenchOptions {
    /// Where the JSON report goes.
    pub json: PathBuf,
    /// Where the Markdown table goes (default: the JSON path with `.md`).
    pub markdown: Option<PathBuf>,
    /// GGUF file or HF folder (default: the fetched default model).
    pub model: Option<PathBuf>,
    /// Thread counts to measure (one child process each).
    pub threads: Vec<usize>,
    /// Tokens generated per decode measurement.
    pub decode_tokens: usize,
    /// Timed repetitions (the median is reported).
    pub reps: usize,
    /// Internal: measure in this process and print records (set by the parent).
    pub worker: bool,
}

/// One measured configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelRecord {
    /// GGUF weight mode ("f32" or "quantized").
    pub weights: String,
    /// CPU threads candle used.
    pub threads: usize,
    /// Greedy decode speed over `decode_tokens` tokens, median of reps (tokens/s).
    pub decode_tok_s: f64,
    /// One 1-position forward at context `context_len`, median (ms).
    pub step_ms: f64,
    /// One 9-position causal forward at context `context_len`, median (ms).
    pub verify9_ms: f64,
    /// verify9_ms / step_ms.
    pub verify9_over_step: f64,
    /// Cached positions before the timed passes.
    pub context_len: usize,
}

/// The whole report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelReport {
    /// The model measured.
    pub model: String,
    /// Tokens generated per decode measurement.
    pub decode_tokens: usize,
    /// Repetitions per figure.
    pub reps: usize,
    /// The records.
    pub records: Vec<ModelRecord>,
}

const PROMPT: &str = "Once upon a time, there was a little";

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn measure(
    path: &Path,
    weights: WeightMode,
    label: &str,
    opts: &ModelBenchOptions,
) -> anyhow::Result<ModelRecord> {
    let model = Model::load_with(path, &LoadOptions { weights })?;
    let tok = Tokenizer::for_model(path)?;
    let prompt = tok.encode(PROMPT)?;
    let gen_opts = GenerateOptions {
        max_tokens: opts.decode_tokens,
        sampling: SamplingParams::greedy(),
        eos: vec![],
    };
    // Warm-up, then timed decodes.
    cipherlora_model::generate(&model, &prompt, &gen_opts, &mut NoAdapter, &mut |_| Ok(()))?;
    let mut speeds = Vec::new();
    for _ in 0..opts.reps.clamp(1, 5) {
        let out = cipherlora_model::generate(
            &model,
            &prompt,
            &gen_opts,
            &mut NoAdapter,
            &mut |_| Ok(()),
        )?;
        speeds.push(out.tokens.len() as f64 / out.decode_secs);
    }
    // Verify pass vs decode step at a context of prompt + 32 tokens.
    let mut cache = model.new_cache(prompt.len() + 64)?;
    let mut ctx = prompt.clone();
    ctx.extend((0..32u32).map(|i| 100 + i));
    model.forward(&ctx, &mut cache, &AttentionMask::Causal, &mut NoAdapter)?;
    let base = cache.len();
    let drafts: Vec<u32> = (0..9u32).map(|i| 200 + i).collect();
    let mut time = |tokens: &[u32]| -> anyhow::Result<f64> {
        let mut xs = Vec::new();
        for i in 0..opts.reps + 2 {
            let t0 = Instant::now();
            model.forward(tokens, &mut cache, &AttentionMask::Causal, &mut NoAdapter)?;
            let dt = t0.elapsed().as_secs_f64() * 1e3;
            cache.truncate(base);
            if i >= 2 {
                xs.push(dt);
            }
        }
        Ok(median(xs))
    };
    let step_ms = time(&drafts[..1])?;
    let verify9_ms = time(&drafts)?;
    Ok(ModelRecord {
        weights: label.into(),
        threads: cipherlora_model::num_threads(),
        decode_tok_s: median(speeds),
        step_ms,
        verify9_ms,
        verify9_over_step: verify9_ms / step_ms,
        context_len: base,
    })
}

fn markdown(r: &ModelReport) -> String {
    let mut s = format!(
        "Model: `{}`; greedy decode of {} tokens after a {}-word prompt; passes timed at a context of {} positions; medians of {} runs.\n\n",
        r.model,
        r.decode_tokens,
        PROMPT.split_whitespace().count(),
        r.records.first().map_or(0, |x| x.context_len),
        r.reps
    );
    s.push_str("| weights | threads | decode tok/s | 1-position step (ms) | 9-position verify (ms) | verify / step |\n");
    s.push_str("| --- | ---: | ---: | ---: | ---: | ---: |\n");
    for x in &r.records {
        s.push_str(&format!(
            "| {} | {} | {:.1} | {:.2} | {:.2} | {:.2} |\n",
            x.weights, x.threads, x.decode_tok_s, x.step_ms, x.verify9_ms, x.verify9_over_step
        ));
    }
    s
}

/// Runs the benchmark and writes the reports (or, as a worker, prints records).
///
/// # Errors
/// Model loading, a failed child process, or unwritable report files.
pub fn run(opts: &ModelBenchOptions) -> anyhow::Result<()> {
    let path = match &opts.model {
        Some(p) => p.clone(),
        None => cipherlora_model::fetch::ensure_default_model()?,
    };
    if opts.worker {
        let mut records = Vec::new();
        for (mode, label) in [
            (WeightMode::F32, "f32"),
            (WeightMode::F16, "f16"),
            (WeightMode::Quantized, "quantized"),
        ] {
            records.push(measure(&path, mode, label, opts)?);
        }
        println!("{}", serde_json::to_string(&records)?);
        return Ok(());
    }
    let mut records: Vec<ModelRecord> = Vec::new();
    for &n in &opts.threads {
        eprintln!("bench model: {n} thread(s)…");
        let out = Command::new(std::env::current_exe()?)
            .args(["bench", "model", "--worker", "--json"])
            .arg(&opts.json)
            .arg("--model")
            .arg(&path)
            .args(["--decode-tokens", &opts.decode_tokens.to_string()])
            .args(["--reps", &opts.reps.to_string()])
            .env("RAYON_NUM_THREADS", n.to_string())
            .env("CANDLE_NUM_THREADS", n.to_string())
            .output()
            .context("running the bench worker")?;
        anyhow::ensure!(
            out.status.success(),
            "bench worker ({n} threads) failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout)?;
        let line = text.lines().last().unwrap_or_default();
        records.extend(serde_json::from_str::<Vec<ModelRecord>>(line)?);
    }
    records.sort_by(|a, b| a.weights.cmp(&b.weights).then(a.threads.cmp(&b.threads)));
    let report = ModelReport {
        model: path.display().to_string(),
        decode_tokens: opts.decode_tokens,
        reps: opts.reps,
        records,
    };
    let md = markdown(&report);
    crate::write_report(&opts.json, opts.markdown.as_deref(), &report, &md)?;
    print!("{md}");
    Ok(())
}

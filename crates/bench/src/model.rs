//! `cipherlora bench model`: plaintext decode speed and 9-/17-position verify
//! passes against one decode step, per thread count (a child process each:
//! candle sizes its pools once) and GGUF weight mode; medians over rounds.

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
    /// Timed repetitions per round (medians over all rounds are reported).
    pub reps: usize,
    /// Rounds of one child process per thread count, alternating.
    pub rounds: usize,
    /// Weight modes by label (`f32`, `f16`, `quantized`; empty: all).
    pub weights: Vec<String>,
    /// Internal: measure in this process and print records (set by the parent).
    pub worker: bool,
}

/// One measured configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelRecord {
    /// GGUF weight mode ("f32", "f16" or "quantized").
    pub weights: String,
    /// CPU threads candle used.
    pub threads: usize,
    /// Greedy decode speed over `decode_tokens` tokens, median (tokens/s).
    pub decode_tok_s: f64,
    /// One 1-position forward at context `context_len`, median (ms).
    pub step_ms: f64,
    /// One 9-position causal forward at context `context_len`, median (ms).
    pub verify9_ms: f64,
    /// One 17-position causal forward at context `context_len`, median (ms).
    pub verify17_ms: f64,
    /// verify9_ms / step_ms.
    pub verify9_over_step: f64,
    /// verify17_ms / step_ms.
    pub verify17_over_step: f64,
    /// Cached positions before the timed passes.
    pub context_len: usize,
    /// Samples behind each median.
    pub samples: usize,
}

/// Raw samples of one configuration, as a worker reports them.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Samples {
    weights: String,
    threads: usize,
    context_len: usize,
    decode_tok_s: Vec<f64>,
    step_ms: Vec<f64>,
    verify9_ms: Vec<f64>,
    verify17_ms: Vec<f64>,
}

impl Samples {
    fn record(&self) -> ModelRecord {
        let (step, v9, v17) = (
            median(self.step_ms.clone()),
            median(self.verify9_ms.clone()),
            median(self.verify17_ms.clone()),
        );
        ModelRecord {
            weights: self.weights.clone(),
            threads: self.threads,
            decode_tok_s: median(self.decode_tok_s.clone()),
            step_ms: step,
            verify9_ms: v9,
            verify17_ms: v17,
            verify9_over_step: v9 / step,
            verify17_over_step: v17 / step,
            context_len: self.context_len,
            samples: self.step_ms.len(),
        }
    }
}

/// The whole report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelReport {
    /// The model measured.
    pub model: String,
    /// Tokens generated per decode measurement.
    pub decode_tokens: usize,
    /// Repetitions per round.
    pub reps: usize,
    /// Rounds (child processes per thread count).
    pub rounds: usize,
    /// The records.
    pub records: Vec<ModelRecord>,
}

const PROMPT: &str = "Once upon a time, there was a little";

/// Token ids appended after the prompt before the timed passes.
const CONTEXT_EXTRA: u32 = 32;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// The weight modes measured, with their report labels.
const MODES: [(WeightMode, &str); 3] = [
    (WeightMode::F32, "f32"),
    (WeightMode::F16, "f16"),
    (WeightMode::Quantized, "quantized"),
];

/// A synthetic model's prompt: fixed ids, as many as [`PROMPT`] makes.
const SYNTHETIC_PROMPT: [u32; 9] = [
    1_000, 1_037, 1_074, 1_111, 1_148, 1_185, 1_222, 1_259, 1_296,
];

/// The weight modes selected by `labels` (all when empty). Errors: an unknown label.
fn selected_modes(labels: &[String]) -> anyhow::Result<Vec<(WeightMode, &'static str)>> {
    for l in labels {
        anyhow::ensure!(
            MODES.iter().any(|(_, m)| m == l),
            "unknown weight mode `{l}` (f32, f16 or quantized)"
        );
    }
    Ok(MODES
        .into_iter()
        .filter(|(_, m)| labels.is_empty() || labels.iter().any(|l| l == m))
        .collect())
}

/// [`PROMPT`] tokenized, or [`SYNTHETIC_PROMPT`] for a synthetic GGUF file.
fn prompt_ids(path: &Path) -> anyhow::Result<Vec<u32>> {
    if path.is_file() && cipherlora_model::is_synthetic_gguf(path)? {
        return Ok(SYNTHETIC_PROMPT.to_vec());
    }
    Ok(Tokenizer::for_model(path)?.encode(PROMPT)?)
}

/// Measures every selected weight mode here, repetitions interleaved.
fn measure_all(path: &Path, opts: &ModelBenchOptions) -> anyhow::Result<Vec<Samples>> {
    let prompt = prompt_ids(path)?;
    let gen_opts = GenerateOptions {
        max_tokens: opts.decode_tokens,
        sampling: SamplingParams::greedy(),
        eos: vec![],
    };
    let mut models = Vec::new();
    let mut samples = Vec::new();
    for (weights, label) in selected_modes(&opts.weights)? {
        let model = Model::load_with(path, &LoadOptions { weights })?;
        cipherlora_model::generate(&model, &prompt, &gen_opts, &mut NoAdapter, &mut |_| Ok(()))?;
        // Passes are timed after the prompt and 32 more tokens.
        let mut cache = model.new_cache(prompt.len() + 64)?;
        let mut ctx = prompt.clone();
        ctx.extend((0..CONTEXT_EXTRA).map(|i| 100 + i));
        model.forward(&ctx, &mut cache, &AttentionMask::Causal, &mut NoAdapter)?;
        samples.push(Samples {
            weights: label.into(),
            threads: cipherlora_model::num_threads(),
            context_len: cache.len(),
            ..Samples::default()
        });
        models.push((model, cache));
    }
    let drafts: Vec<u32> = (0..17u32).map(|i| 200 + i).collect();
    for _ in 0..opts.reps.max(1) {
        for ((model, cache), s) in models.iter_mut().zip(&mut samples) {
            let out =
                cipherlora_model::generate(model, &prompt, &gen_opts, &mut NoAdapter, &mut |_| {
                    Ok(())
                })?;
            s.decode_tok_s
                .push(out.tokens.len() as f64 / out.decode_secs);
            let base = cache.len();
            for (t, xs) in [
                (1, &mut s.step_ms),
                (9, &mut s.verify9_ms),
                (17, &mut s.verify17_ms),
            ] {
                let t0 = Instant::now();
                model.forward(&drafts[..t], cache, &AttentionMask::Causal, &mut NoAdapter)?;
                xs.push(t0.elapsed().as_secs_f64() * 1e3);
                cache.truncate(base);
            }
        }
    }
    Ok(samples)
}

fn markdown(r: &ModelReport) -> String {
    let mut s = format!(
        "Model: `{}`; greedy decode of {} tokens after a {}-token prompt; passes timed at a context of {} positions; medians of {} runs ({} rounds × {} interleaved repetitions).\n\n",
        r.model,
        r.decode_tokens,
        r.records
            .first()
            .map_or(0, |x| x.context_len.saturating_sub(CONTEXT_EXTRA as usize)),
        r.records.first().map_or(0, |x| x.context_len),
        r.records.first().map_or(0, |x| x.samples),
        r.rounds,
        r.reps
    );
    s.push_str("| weights | threads | decode tok/s | 1-position step (ms) | 9-position pass (ms) | 17-position pass (ms) | 9 / step | 17 / step |\n");
    s.push_str("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for x in &r.records {
        s.push_str(&format!(
            "| {} | {} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |\n",
            x.weights,
            x.threads,
            x.decode_tok_s,
            x.step_ms,
            x.verify9_ms,
            x.verify17_ms,
            x.verify9_over_step,
            x.verify17_over_step
        ));
    }
    s
}

/// Runs the benchmark (or, as a worker, prints records). Errors: model, child or I/O.
pub fn run(opts: &ModelBenchOptions) -> anyhow::Result<()> {
    let path = match &opts.model {
        Some(p) => p.clone(),
        None => cipherlora_model::fetch::ensure_default_model()?,
    };
    selected_modes(&opts.weights)?;
    if opts.worker {
        println!("{}", serde_json::to_string(&measure_all(&path, opts)?)?);
        return Ok(());
    }
    let mut merged: Vec<Samples> = Vec::new();
    for round in 0..opts.rounds.max(1) {
        for &n in &opts.threads {
            eprintln!("bench model: round {}, {n} thread(s)…", round + 1);
            let mut cmd = Command::new(std::env::current_exe()?);
            cmd.args(["bench", "model", "--worker", "--json"])
                .arg(&opts.json);
            if !opts.weights.is_empty() {
                cmd.args(["--weights", &opts.weights.join(",")]);
            }
            let out = cmd
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
            for s in serde_json::from_str::<Vec<Samples>>(line)? {
                match merged
                    .iter_mut()
                    .find(|m| m.weights == s.weights && m.threads == s.threads)
                {
                    Some(m) => {
                        m.decode_tok_s.extend(s.decode_tok_s);
                        m.step_ms.extend(s.step_ms);
                        m.verify9_ms.extend(s.verify9_ms);
                        m.verify17_ms.extend(s.verify17_ms);
                    }
                    None => merged.push(s),
                }
            }
        }
    }
    let mut records: Vec<ModelRecord> = merged.iter().map(Samples::record).collect();
    records.sort_by(|a, b| a.weights.cmp(&b.weights).then(a.threads.cmp(&b.threads)));
    let report = ModelReport {
        model: path.display().to_string(),
        decode_tokens: opts.decode_tokens,
        reps: opts.reps,
        rounds: opts.rounds,
        records,
    };
    let md = markdown(&report);
    crate::write_report(&opts.json, opts.markdown.as_deref(), &report, &md)?;
    print!("{md}");
    Ok(())
}

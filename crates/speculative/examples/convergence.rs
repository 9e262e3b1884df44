//! How fast the fixed-point schedule converges on real adapters, in
//! plaintext with the project's own engine (the convergence table of
//! BENCHMARKS.md, "Fewer round trips").
//!
//! For each adapter and prompt, greedy plaintext decoding (adapter merged)
//! gives a continuation; verify windows of T positions are cut from it (the
//! drafts are the right tokens, so every row of the window is used: the
//! hardest case for certification). Each window is run
//! - exactly: one forward pass, the adapter applied group by group;
//! - as a fixed point ([`FixedPointPass`]) with up to `--max-trips` round
//!   trips, recording after each trip the largest relative error of any
//!   group's input against the exact pass, whether every row's argmax is the
//!   exact one, how many leading rows the margin rule certifies, and whether
//!   a certified row was ever wrong.
//!
//! ```text
//! cargo run --release -p cipherlora-speculative --example convergence -- \
//!     [--json reports/convergence.json] [--windows 4] [--t 9] [--max-trips 8]
//! ```
//!
//! Adapters: the committed code adapters (FFA, standard; q,k,v,o) and seeded
//! random ones (`cipherlora_model::write_random_adapter`) on all seven
//! projections and on q,k,v,o at 4× the trained lora_B magnitude. Prompts:
//! five code prompts and five general-English ones.

use std::path::PathBuf;

use cipherlora_model::{
    AttentionMask, DeltaHook, FixedPointPass, GenerateOptions, GroupDeltas, GroupInput, KeepDeltas,
    LoadOptions, LoraAdapter, Model, ModelError, PassDeltas, PlainLora, Proj, ProjGroup,
    RandomAdapterSpec, SamplingParams, Tensor, Tokenizer, WeightMode, fetch, generate,
    write_random_adapter,
};
use serde::Serialize;

const CODE_PROMPTS: [&str; 5] = [
    "def is_palindrome(s: str) -> bool:\n    \"\"\"Return True if s reads the same backwards.\"\"\"\n",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "import os\n\ndef list_python_files(root):\n",
    "class Stack:\n    def __init__(self):\n",
    "def count_words(text):\n    \"\"\"Count how often each word occurs.\"\"\"\n",
];
const TEXT_PROMPTS: [&str; 5] = [
    "The old lighthouse keeper climbed the stairs every evening, and",
    "In the spring of that year, the village council decided to",
    "Rivers shape the land around them in several ways. First,",
    "She opened the letter slowly, unsure of what it would say. The",
    "A good bread needs only four ingredients: flour, water, salt and",
];

/// Records every group input and delegates to the exact plaintext hook.
struct Recording<'a> {
    inner: PlainLora<'a>,
    inputs: Vec<GroupInput>,
}

impl DeltaHook for Recording<'_> {
    fn deltas(
        &mut self,
        layer: usize,
        group: ProjGroup,
        x: &Tensor,
    ) -> Result<GroupDeltas, ModelError> {
        self.inputs.push(GroupInput {
            layer,
            group,
            x: x.clone(),
        });
        self.inner.deltas(layer, group, x)
    }
    fn wants(&self, layer: usize, group: ProjGroup) -> bool {
        self.inner.wants(layer, group)
    }
}

/// The first estimate of a window's deltas (`--guess`).
#[derive(Debug, Clone, Copy)]
enum Guess {
    /// None: pass 0 is the base model (the schedule's default).
    None,
    /// Every row gets the mean delta of the last `m` cached rows.
    Mean(usize),
}

impl Guess {
    fn parse(s: &str) -> anyhow::Result<Self> {
        match s {
            "none" => Ok(Guess::None),
            "last" => Ok(Guess::Mean(1)),
            _ => match s.strip_prefix("mean:") {
                Some(m) => Ok(Guess::Mean(m.parse()?)),
                None => anyhow::bail!("--guess: none, last or mean:M"),
            },
        }
    }

    /// The guessed (t, d_out) deltas from the latest cached rows' deltas.
    fn table(self, latest: &PassDeltas, t: usize) -> anyhow::Result<PassDeltas> {
        let Guess::Mean(m) = self else {
            return Ok(PassDeltas::new());
        };
        let mut out = PassDeltas::new();
        for (&key, deltas) in latest {
            let mut guess = GroupDeltas::none();
            for (proj, d) in deltas.iter() {
                let rows = d.dim(0)?;
                let m = m.clamp(1, rows);
                let mean = d.narrow(0, rows - m, m)?.mean_keepdim(0)?;
                let width = mean.dim(1)?;
                guess.push(proj, mean.broadcast_as((t, width))?.contiguous()?);
            }
            out.insert(key, guess);
        }
        Ok(out)
    }
}

#[derive(Debug, Serialize, Default)]
struct AdapterRow {
    adapter: String,
    windows: usize,
    /// Relative size of the deltas: max|delta| / max|W·x| over the exact pass.
    delta_ratio_median: f64,
    /// Median over windows of the input error after trip i (i = 1..).
    input_error_median: Vec<f64>,
    input_error_max: Vec<f64>,
    trips_to_argmax_median: f64,
    trips_to_argmax_max: usize,
    trips_to_row0_certified_median: f64,
    trips_to_row0_certified_max: usize,
    trips_to_all_certified_median: f64,
    trips_to_all_certified_max: usize,
    trips_to_1e5_median: f64,
    trips_to_1e5_max: usize,
    trips_to_1e6_median: f64,
    trips_to_1e6_max: usize,
    /// Mean rows certified (of T) after 2 trips.
    certified_rows_after_2: f64,
    /// Certified rows whose argmax differed from the exact pass (must be 0).
    certified_wrong: usize,
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn max_abs(t: &Tensor) -> f32 {
    t.abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str, default: &str| -> String {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
            .unwrap_or_else(|| default.to_string())
    };
    let json = PathBuf::from(arg("--json", "reports/convergence.json"));
    let windows: usize = arg("--windows", "4").parse()?;
    let t: usize = arg("--t", "9").parse()?;
    let max_trips: usize = arg("--max-trips", "8").parse()?;
    let margin: f32 = arg("--margin", "1").parse()?;
    let guess = Guess::parse(&arg("--guess", "none"))?;

    let path = fetch::ensure_default_model()?;
    // f32 weights, what a private client verifies with (`WeightMode::for_private_verify`): the
    // default loader keeps Q4_1 quantized, whose batched and single-position passes differ in the
    // last bits and may flip a near-tie against the sequential reference.
    let model = Model::load_with(
        &path,
        &LoadOptions {
            weights: WeightMode::F32,
        },
    )?;
    let tok = Tokenizer::for_model(&path)?;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../adapters");

    // The trained standard adapter's lora_B scale, for the random ones.
    let trained = LoraAdapter::load(&root.join("code-lora-r16"), model.config())?;
    let mut b_sq = (0.0f64, 0usize);
    for l in 0..model.config().num_layers {
        for p in [Proj::Q, Proj::K, Proj::V, Proj::O] {
            if let Some(w) = trained.get(l, p) {
                let v = w.b.flatten_all()?.to_vec1::<f32>()?;
                b_sq.0 += v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>();
                b_sq.1 += v.len();
            }
        }
    }
    let b_std = (b_sq.0 / b_sq.1.max(1) as f64).sqrt();
    eprintln!("trained lora_B std: {b_std:.4}");
    let tmp = std::env::temp_dir().join(format!("cipherlora-convergence-{}", std::process::id()));
    let mut adapters: Vec<(String, PathBuf)> = vec![
        ("code-ffa-r16".into(), root.join("code-ffa-r16")),
        ("code-lora-r16".into(), root.join("code-lora-r16")),
    ];
    for (name, targets, scale) in [
        ("random-all-linear-r16", Proj::ALL.to_vec(), 1.0),
        (
            "random-qkvo-r16-x4",
            vec![Proj::Q, Proj::K, Proj::V, Proj::O],
            4.0,
        ),
    ] {
        let dir = tmp.join(name);
        write_random_adapter(
            &dir,
            model.config(),
            &RandomAdapterSpec {
                targets,
                rank: 16,
                alpha: 32.0,
                b_std: b_std * scale,
                ffa: false,
                seed: 7,
            },
        )?;
        adapters.push((name.into(), dir));
    }

    let prompts: Vec<Vec<u32>> = CODE_PROMPTS
        .iter()
        .chain(&TEXT_PROMPTS)
        .map(|p| tok.encode(p))
        .collect::<Result<_, _>>()?;
    let mut rows = Vec::new();
    for (name, dir) in &adapters {
        let adapter = LoraAdapter::load(dir, model.config())?;
        let mut row = AdapterRow {
            adapter: name.clone(),
            ..AdapterRow::default()
        };
        let mut per_trip: Vec<Vec<f64>> = vec![Vec::new(); max_trips];
        let (mut to_arg, mut to_r0, mut to_all, mut to5, mut to6, mut ratios) =
            (vec![], vec![], vec![], vec![], vec![], vec![]);
        let mut cert2 = Vec::new();
        for prompt in &prompts {
            let opts = GenerateOptions {
                max_tokens: windows * (t - 1) + 1,
                sampling: SamplingParams::greedy(),
                eos: Vec::new(),
            };
            let cont = generate(
                &model,
                prompt,
                &opts,
                &mut PlainLora::new(&adapter),
                &mut |_| Ok(()),
            )?
            .tokens;
            let mut context = prompt.clone();
            let mut cache = model.new_cache(prompt.len() + cont.len() + t + 1)?;
            // Keeps the deltas of the latest rows the cache took, which a client has decrypted (the
            // source of `--guess`).
            let mut log = KeepDeltas::new(PlainLora::new(&adapter));
            model.forward(
                &context[..context.len() - 1],
                &mut cache,
                &AttentionMask::Causal,
                &mut log,
            )?;
            for w in 0..windows {
                let drafts = &cont[w * (t - 1)..(w + 1) * (t - 1)];
                let mut window = vec![*context.last().unwrap()];
                window.extend(drafts);
                // Exact pass.
                let mut exact_cache = cache.fork()?;
                let mut rec = Recording {
                    inner: PlainLora::new(&adapter),
                    inputs: Vec::new(),
                };
                let exact =
                    model.forward(&window, &mut exact_cache, &AttentionMask::Causal, &mut rec)?;
                let exact_arg = Model::argmax_rows(&exact)?;
                // Delta size relative to the projection output, over the exact inputs.
                let mut ratio = 0f64;
                for g in &rec.inputs {
                    for (_, d) in rec.inner.deltas(g.layer, g.group, &g.x)?.iter() {
                        ratio = ratio.max(f64::from(max_abs(d)));
                    }
                }
                let x_scale = rec
                    .inputs
                    .iter()
                    .map(|g| f64::from(max_abs(&g.x)))
                    .fold(0.0, f64::max);
                ratios.push(ratio / x_scale.max(1e-9));
                // Fixed point.
                let mut fp_cache = cache.fork()?;
                let mut pass = FixedPointPass::start_guessed(
                    &model,
                    &window,
                    &mut fp_cache,
                    &AttentionMask::Causal,
                    &PlainLora::new(&adapter),
                    guess.table(&log.added, t)?,
                )?;
                let (mut got_arg, mut got_r0, mut got_all, mut got5, mut got6) =
                    (None, None, None, None, None);
                let mut hook = PlainLora::new(&adapter);
                let mut previous: Option<Vec<f32>> = None;
                for trip in 1..=max_trips {
                    let step = pass.iterate(&mut fp_cache, &mut hook)?.clone();
                    let mut err = 0f64;
                    for (a, b) in pass.inputs().iter().zip(&rec.inputs) {
                        let d = f64::from(max_abs(&(&a.x - &b.x)?));
                        err = err.max(d / f64::from(max_abs(&b.x)).max(1e-30));
                    }
                    per_trip[trip - 1].push(err);
                    let logits = pass
                        .logits()
                        .ok_or_else(|| anyhow::anyhow!("a pass after a trip has logits"))?;
                    let arg = Model::argmax_rows(logits)?;
                    if got_arg.is_none() && arg == exact_arg {
                        got_arg = Some(trip);
                    }
                    let rows_now = logits.to_vec2::<f32>()?;
                    let cert = cipherlora_speculative::schedule::certify_greedy(
                        &rows_now,
                        &step.logit_change,
                        previous.as_deref(),
                        drafts,
                        margin,
                    );
                    previous = Some(step.logit_change.clone());
                    row.certified_wrong += (0..cert).filter(|&j| arg[j] != exact_arg[j]).count();
                    if trip == 2 {
                        cert2.push(cert as f64);
                    }
                    if got_r0.is_none() && cert > 0 {
                        got_r0 = Some(trip);
                    }
                    if got_all.is_none() && cert == t {
                        got_all = Some(trip);
                    }
                    if got5.is_none() && err < 1e-5 {
                        got5 = Some(trip);
                    }
                    if got6.is_none() && err < 1e-6 {
                        got6 = Some(trip);
                    }
                }
                let or_max = |v: Option<usize>| v.unwrap_or(max_trips + 1) as f64;
                to_arg.push(or_max(got_arg));
                to_r0.push(or_max(got_r0));
                to_all.push(or_max(got_all));
                to5.push(or_max(got5));
                to6.push(or_max(got6));
                row.windows += 1;
                // Advance the exact cache by the window's first t − 1 positions.
                model.forward(
                    &window[..t - 1],
                    &mut cache,
                    &AttentionMask::Causal,
                    &mut log,
                )?;
                context.extend(drafts);
            }
        }
        let mx = |v: &[f64]| v.iter().copied().fold(0.0, f64::max) as usize;
        row.delta_ratio_median = median(&mut ratios);
        row.input_error_median = per_trip.iter_mut().map(|v| median(v)).collect();
        row.input_error_max = per_trip
            .iter()
            .map(|v| v.iter().copied().fold(0.0, f64::max))
            .collect();
        row.trips_to_argmax_max = mx(&to_arg);
        row.trips_to_argmax_median = median(&mut to_arg);
        row.trips_to_row0_certified_max = mx(&to_r0);
        row.trips_to_row0_certified_median = median(&mut to_r0);
        row.trips_to_all_certified_max = mx(&to_all);
        row.trips_to_all_certified_median = median(&mut to_all);
        row.trips_to_1e5_max = mx(&to5);
        row.trips_to_1e5_median = median(&mut to5);
        row.trips_to_1e6_max = mx(&to6);
        row.trips_to_1e6_median = median(&mut to6);
        row.certified_rows_after_2 = cert2.iter().sum::<f64>() / cert2.len().max(1) as f64;
        eprintln!("{row:?}");
        rows.push(row);
    }
    let _ = std::fs::remove_dir_all(&tmp);

    let mut md = format!(
        "Fixed-point convergence, T = {t}, {} prompts (5 code, 5 general English) × {windows} windows, margin rule {margin}×, first estimate {guess:?} (trips counted up to {max_trips}; {} = not reached).\n\n\
         | adapter | windows | max|Δ|/max|x| | input error after trip 1 / 2 / 3 / 4 (median; max) | trips to exact argmax (median / max) | row 0 certified | all T rows certified | rows certified after 2 trips (mean of {t}) | trips to input error < 1e-5 | < 1e-6 | certified but wrong |\n\
         | --- | ---: | ---: | --- | --- | --- | --- | ---: | --- | --- | ---: |\n",
        prompts.len(),
        max_trips + 1
    );
    for r in &rows {
        let errs: Vec<String> = (0..4.min(max_trips))
            .map(|i| format!("{:.1e}", r.input_error_median[i]))
            .collect();
        let errs_max: Vec<String> = (0..4.min(max_trips))
            .map(|i| format!("{:.1e}", r.input_error_max[i]))
            .collect();
        md.push_str(&format!(
            "| {} | {} | {:.3} | {}; {} | {} / {} | {} / {} | {} / {} | {:.2} | {} / {} | {} / {} | {} |\n",
            r.adapter,
            r.windows,
            r.delta_ratio_median,
            errs.join(" / "),
            errs_max.join(" / "),
            r.trips_to_argmax_median,
            r.trips_to_argmax_max,
            r.trips_to_row0_certified_median,
            r.trips_to_row0_certified_max,
            r.trips_to_all_certified_median,
            r.trips_to_all_certified_max,
            r.certified_rows_after_2,
            r.trips_to_1e5_median,
            r.trips_to_1e5_max,
            r.trips_to_1e6_median,
            r.trips_to_1e6_max,
            r.certified_wrong,
        ));
    }
    if let Some(parent) = json.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&json, serde_json::to_string_pretty(&rows)?)?;
    std::fs::write(json.with_extension("md"), &md)?;
    println!("{md}");
    Ok(())
}

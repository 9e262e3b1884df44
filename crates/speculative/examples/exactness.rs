//! How often the fixed-point verify schedule changes the greedy output,
//! measured with the plaintext engine (the delta hook is the plaintext
//! LoRA, so only the schedule is tested; CKKS noise is not).
//!
//! For each adapter and held-out prompt: the adapted model's sequential
//! greedy trajectory (up to 64 tokens), then speculative generation with
//! the f16 base drafter at each verify width and each number of round trips
//! per round, prefilled in passes of 16 positions (`--prefill N`: N batched
//! trips each, or `per-group`); a run *diverges* when its tokens differ
//! from the trajectory.
//! `--coarse NOISE` simulates coarse trips: every trip of a round but its
//! last (the ones that ask for fewer response bits) gets its deltas off by
//! up to NOISE × tolerance × max |delta| of the group, uniformly at random
//! (a client-side stand-in for the compression error, whose bound is the
//! tolerance times the group's output bound, 2²–2⁴ above its largest
//! delta: NOISE = 4 is that bound for FFA).
//! `--settle N` spends N more trips per round after its tokens are decided,
//! refining only the keys and values the round keeps (a diagnostic: it
//! separates the kept rows' residual from the certification of the decided
//! rows). `--guided false` drafts with the plain base model. `--shadow
//! true` certifies against the shadow cache (`FixedPoint::shadow`: the
//! kept rows' residual counts too). Each row also reports tokens per
//! round (continuations counted as rounds), continuations and rows left
//! uncertified. `--guess false` starts each verify pass from the base
//! model instead of the last kept rows' deltas (`FixedPoint::guessed_start`).
//! The schedule is exact when no run diverges; the module docs of
//! `cipherlora_speculative::schedule` say why it may not be (the residual the last
//! trip leaves in the kept keys and values).
//!
//! `--drafted-start true` starts each verify pass from the inputs the
//! drafter computed (`FixedPoint::drafted_start`), `--drafter-weights
//! f16|quantized` picks the drafter's weights (f16 by default; the private
//! CLI drafts quantized), `--drafter-estimates true` runs the estimate
//! passes on a quantized drafter (`FixedPoint::drafter_estimates`).
//! `--skip N` leaves out the first N prompts of each adapter; `--tokens N`
//! generates N new tokens per prompt instead of 64.
//! `--temperature t` (t > 0) samples (seeded by the prompt's index)
//! instead: nothing is compared, the row counts the rounds and the
//! batched round trips per generated token that sampled certification
//! takes (certified draws, `cipherlora_speculative::draw_bounds`, for chains;
//! `FixedPoint::sampling_tolerance` for trees).
//! `--ahead false` switches off drafting the next round during a round's
//! last trip (`FixedPoint::draft_ahead`; on by default, as in the CLI):
//! tokens per round then show what drafting ahead costs in acceptance.
//! `--tree tree:BxD` drafts trees of width − 1 nodes instead of chains
//! (each tree configuration carries its acceptance estimate from prompt
//! to prompt, as a long-running client would).
//! `--weights quantized` verifies (and computes the sequential reference)
//! with the GGUF's weights kept quantized (`--weights quantized` of the
//! CLI) instead of f32; the drafter stays f16.
//!
//! Run (defaults shown):
//! `cargo run --release -p cipherlora-speculative --example exactness -- \
//!   --adapters code-lora-r16,code-ffa-r16,general-lora-r16,general-all-r8 \
//!   --widths 9,17 --trips 2,3 --prefill 5 --out reports/exactness.json`

use std::path::{Path, PathBuf};

use cipherlora_model::{
    GenerateOptions, LoadOptions, LoraAdapter, Model, PlainLora, SamplingParams, Tokenizer,
    WeightMode, fetch, generate,
};
use cipherlora_speculative::decode::{self, ChainDrafter, Drafting, SpecConfig};
use cipherlora_speculative::schedule::{FixedPoint, PREFILL_ROUND_TRIPS, Prefill, Schedule};
use cipherlora_speculative::tree_draft::{Calibration, TreeDrafts, TreeParams};

#[path = "../tests/common/coarse.rs"]
mod coarse;
use coarse::Coarse;
#[path = "common/eval_prompts.rs"]
mod eval_prompts;
use eval_prompts::prompts;

/// New tokens per prompt unless `--tokens N` says otherwise.
const NEW_TOKENS: usize = 64;
const PREFILL_WIDTH: usize = 16;

struct Args {
    adapters: Vec<String>,
    widths: Vec<usize>,
    trips: Vec<usize>,
    prefill: Prefill,
    limit: usize,
    /// `--tokens N`: new tokens per prompt (default [`NEW_TOKENS`]).
    tokens: usize,
    skip: usize,
    out: PathBuf,
    coarse: Option<f64>,
    settle: usize,
    guided: bool,
    shadow: bool,
    guess: bool,
    weights: WeightMode,
    /// `--drafted-start true`: the drafter's inputs replace pass 0 (`FixedPoint::drafted_start`).
    drafted_start: bool,
    /// `--drafter-estimates true`: the estimate passes run on a quantized drafter
    /// (`FixedPoint::drafter_estimates`).
    drafter_estimates: bool,
    /// `--drafter-weights f16|quantized` (f16 by default; the private CLI drafts with the GGUF's
    /// quantized weights).
    drafter_weights: WeightMode,
    /// `--temperature t` (t > 0): sample (seed = the prompt's index) instead of decoding greedily;
    /// the outputs then differ from the greedy trajectory by design and are not compared (the χ²
    /// tests check the distributions), only the rounds are counted.
    temperature: f32,
    /// `--ahead false`: no drafting during a round's last trip.
    ahead: bool,
    /// `--tree tree:BxD`: tree drafts of that shape instead of chains.
    tree: Option<TreeParams>,
}

fn args(root: &Path) -> Result<Args, Box<dyn std::error::Error>> {
    let mut a = Args {
        adapters: [
            "code-lora-r16",
            "code-ffa-r16",
            "general-lora-r16",
            "general-all-r8",
        ]
        .map(String::from)
        .to_vec(),
        widths: vec![9, 17],
        trips: vec![2, 3],
        prefill: Prefill::FixedPoint(PREFILL_ROUND_TRIPS),
        limit: usize::MAX,
        tokens: NEW_TOKENS,
        skip: 0,
        out: root.join("reports/exactness.json"),
        coarse: None,
        settle: 0,
        guided: true,
        shadow: false,
        guess: true,
        weights: WeightMode::F32,
        drafted_start: false,
        drafter_estimates: false,
        drafter_weights: WeightMode::F16,
        temperature: 0.0,
        ahead: true,
        tree: None,
    };
    let list = |v: &str| v.split(',').map(str::to_string).collect::<Vec<_>>();
    let nums = |v: &str| -> Result<Vec<usize>, std::num::ParseIntError> {
        v.split(',').map(str::parse).collect()
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--adapters" => a.adapters = list(&v),
            "--widths" => a.widths = nums(&v)?,
            "--trips" => a.trips = nums(&v)?,
            "--prefill" => {
                a.prefill = match v.as_str() {
                    "per-group" => Prefill::PerGroup,
                    n => Prefill::FixedPoint(n.parse()?),
                }
            }
            "--limit" => a.limit = v.parse()?,
            "--tokens" => a.tokens = v.parse()?,
            "--skip" => a.skip = v.parse()?,
            "--out" => a.out = root.join(v),
            "--coarse" => a.coarse = Some(v.parse()?),
            "--settle" => a.settle = v.parse()?,
            "--guided" => a.guided = v.parse()?,
            "--shadow" => a.shadow = v.parse()?,
            "--guess" => a.guess = v.parse()?,
            "--drafted-start" => a.drafted_start = v.parse()?,
            "--drafter-estimates" => a.drafter_estimates = v.parse()?,
            "--temperature" => a.temperature = v.parse()?,
            "--ahead" => a.ahead = v.parse()?,
            "--tree" => a.tree = Some(v.parse()?),
            "--weights" | "--drafter-weights" => {
                let w = match v.as_str() {
                    "f32" => WeightMode::F32,
                    "f16" => WeightMode::F16,
                    "quantized" => WeightMode::Quantized,
                    other => {
                        return Err(format!("{flag} f32|f16|quantized, not {other}").into());
                    }
                };
                if flag == "--weights" {
                    a.weights = w;
                } else {
                    a.drafter_weights = w;
                }
            }
            _ => return Err(format!("unknown option {flag}").into()),
        }
    }
    Ok(a)
}

/// Greedy at `temperature` 0, else sampling seeded by the prompt's index.
fn sampling(temperature: f32, index: usize) -> SamplingParams {
    if temperature > 0.0 {
        SamplingParams {
            temperature,
            seed: index as u64,
            ..SamplingParams::default()
        }
    } else {
        SamplingParams::greedy()
    }
}

/// The held-out prompts of an adapter: prose for the general-English ones, HumanEval for the code
/// ones.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let args = args(&root)?;
    let path = fetch::ensure_default_model()?;
    // f32 weights, what a private client verifies with (`WeightMode::for_private_verify`): the
    // default loader keeps Q4_1 quantized, whose batched and single-position passes differ in the
    // last bits and may flip a near-tie against the sequential reference.
    let model = Model::load_with(
        &path,
        &LoadOptions {
            weights: args.weights,
        },
    )?;
    let drafter = Model::load_with(
        &path,
        &LoadOptions {
            weights: args.drafter_weights,
        },
    )?;
    let tok = Tokenizer::for_model(&path)?;
    let eos = tok.eos_tokens().to_vec();
    let mut report = Vec::new();
    println!(
        "| adapter | T | trips per round | prompts | diverged | first divergence (token index) | tokens / round | continuations | uncertified rows | settles | batched trips / token |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |");
    for name in &args.adapters {
        let adapter = LoraAdapter::load(&root.join("adapters").join(name), model.config())?;
        let prompts = prompts(&root, name)?;
        let first = args.skip.min(prompts.len());
        let n = (prompts.len() - first).min(args.limit);
        // (width, trips) → first divergence per prompt.
        let mut diverged: Vec<Vec<Option<usize>>> =
            vec![Vec::new(); args.widths.len() * args.trips.len()];
        // (width, trips) → (tokens, rounds, continuations, uncertified rows, settles, verify round
        // trips, rounds drafted ahead and used).
        let mut counts = vec![[0usize; 7]; args.widths.len() * args.trips.len()];
        let mut calibration = vec![Calibration::default(); args.widths.len() * args.trips.len()];
        for (index, text) in prompts[first..first + n].iter().enumerate() {
            let prompt = tok.encode(text)?;
            let opts = GenerateOptions {
                max_tokens: args.tokens,
                sampling: SamplingParams::greedy(),
                eos: eos.clone(),
            };
            let traj = generate(
                &model,
                &prompt,
                &opts,
                &mut PlainLora::new(&adapter),
                &mut |_| Ok(()),
            )?
            .tokens;
            for (w, &width) in args.widths.iter().enumerate() {
                for (r, &trips) in args.trips.iter().enumerate() {
                    let cfg = SpecConfig {
                        drafting: match args.tree {
                            Some(shape) => Drafting::tree(
                                TreeDrafts {
                                    shape,
                                    calibration: calibration[w * args.trips.len() + r].clone(),
                                },
                                width - 1,
                            ),
                            None => Drafting::chain(ChainDrafter::Base, width - 1),
                        },
                        pad_to_k: true,
                        prefill_width: Some(PREFILL_WIDTH),
                        optimistic: false,
                        draft_stop_below: 0.0,
                        delta_guided: args.guided,
                        max_tokens: traj.len(),
                        sampling: sampling(args.temperature, index),
                        eos: eos.clone(),
                        first_token_from_prefill: false,
                        prefill_span: cipherlora_speculative::decode::PrefillSpan::default(),
                        schedule: Schedule::FixedPoint(FixedPoint {
                            round_trips: trips,
                            prefill: args.prefill,
                            settle_trips: args.settle,
                            shadow: args.shadow,
                            guessed_start: args.guess,
                            drafted_start: args.drafted_start,
                            drafter_estimates: args.drafter_estimates,
                            draft_ahead: args.ahead,
                            ..FixedPoint::default()
                        }),
                    };
                    let mut hook = Coarse::new(&adapter, args.coarse.unwrap_or(0.0), 7);
                    let out = decode::generate_drafted(
                        &model,
                        &drafter,
                        &prompt,
                        &cfg,
                        &mut hook,
                        &mut |_| Ok(()),
                    )?;
                    if let Some(c) = out.calibration.clone() {
                        calibration[w * args.trips.len() + r] = c;
                    }
                    let first = (args.temperature == 0.0)
                        .then(|| {
                            traj.iter()
                                .zip(&out.tokens)
                                .position(|(a, b)| a != b)
                                .or((out.tokens.len() != traj.len())
                                    .then(|| out.tokens.len().min(traj.len())))
                        })
                        .flatten();
                    diverged[w * args.trips.len() + r].push(first);
                    let c = &mut counts[w * args.trips.len() + r];
                    let st = &out.stats;
                    for (i, v) in [
                        out.tokens.len(),
                        st.rounds,
                        st.continuations,
                        st.uncertified_rows,
                        st.settles,
                        st.round_trips,
                        st.ahead_hits,
                    ]
                    .into_iter()
                    .enumerate()
                    {
                        c[i] += v;
                    }
                    if let Some(at) = first {
                        let head: String = text.chars().take(40).collect();
                        eprintln!(
                            "{name} T={width} trips={trips}: {head:?}… diverges at token {at}"
                        );
                    }
                }
            }
        }
        for (w, &width) in args.widths.iter().enumerate() {
            for (r, &trips) in args.trips.iter().enumerate() {
                let d = &diverged[w * args.trips.len() + r];
                let at: Vec<usize> = d.iter().flatten().copied().collect();
                let [
                    tokens,
                    rounds,
                    continuations,
                    uncertified,
                    settles,
                    round_trips,
                    ahead_hits,
                ] = counts[w * args.trips.len() + r];
                println!(
                    "| {name} | {width} | {trips} | {} | {} | {at:?} | {:.2} | {continuations} | {uncertified} | {settles} | {:.2} |",
                    d.len(),
                    at.len(),
                    tokens as f64 / rounds.max(1) as f64,
                    round_trips as f64 / tokens.max(1) as f64,
                );
                report.push(serde_json::json!({
                    "adapter": name, "verify_width": width, "round_trips": trips,
                    "prefill": args.prefill.to_string(), "prompts": d.len(),
                    "coarse_noise": args.coarse, "settle_trips": args.settle, "delta_guided": args.guided,
                    "shadow": args.shadow, "guessed_start": args.guess, "new_tokens": args.tokens, "diverged": at.len(),
                    "first_divergence": at, "tokens": tokens, "rounds": rounds,
                    "continuations": continuations, "uncertified_rows": uncertified,
                    "settles": settles, "verify_round_trips": round_trips, "ahead_hits": ahead_hits, "temperature": args.temperature, "weights": format!("{:?}", args.weights),
                    "drafted_start": args.drafted_start, "drafter_estimates": args.drafter_estimates, "drafter_weights": format!("{:?}", args.drafter_weights),
                    "draft_ahead": args.ahead, "tree": args.tree.map(|t| format!("tree:{}x{}", t.branch, t.max_depth)),
                }));
            }
        }
    }
    std::fs::create_dir_all(args.out.parent().ok_or("no parent")?)?;
    std::fs::write(&args.out, serde_json::to_string_pretty(&report)?)?;
    eprintln!("wrote {}", args.out.display());
    Ok(())
}

//! Acceptance statistics of speculative decoding, measured with the
//! plaintext engine on the committed adapters: tokens per verify round of
//! chain drafts and tree drafts at the same verify width T (the positions
//! the adapter server sees), greedy.
//!
//! For each adapter and each held-out prompt: the adapted model's greedy
//! trajectory of up to 64 tokens; per-token agreement of the base model's
//! argmax with it (teacher-forced on the trajectory); then speculative
//! generation with the f16 base drafter, a chain of K = T − 1 tokens and
//! trees of K nodes of several shapes, each checked to reproduce the
//! trajectory exactly.
//!
//! Run (defaults shown):
//! `cargo run --release -p cipherlora-speculative --example acceptance -- \
//!   --adapters code-lora-r16,code-ffa-r16 --prompts adapters/eval/humaneval_0_19.jsonl \
//!   --widths 9,17 --shapes tree:2x8,tree:3x8,tree:4x8 --out reports/acceptance-trees.json \
//!   --guided true`
//!
//! `--temperature t` (t > 0) samples instead: each prompt's chain and
//! trees draw from one seed (the prompt's index) up to 64 tokens, verified
//! by exact (multi-draft) speculative sampling, so the outputs differ
//! between shapes and are not checked here (the χ² tests of
//! `tests/speculative_sampling_chi2.rs` check the distributions).
//!
//! `--guided false` drafts with the plain base model instead of
//! delta-guided drafting (`cipherlora_speculative::draft_bias`);
//! `--drafter-weights q` drafts with the GGUF's quantized weights (the
//! private CLI's default) instead of f16.

use std::path::PathBuf;

use cipherlora_model::{
    AttentionMask, GenerateOptions, LoadOptions, LoraAdapter, Model, NoAdapter, PlainLora,
    SamplingParams, Tokenizer, WeightMode, fetch, generate,
};
use cipherlora_speculative::decode::{self, ChainDrafter, Drafting, SpecConfig};
use cipherlora_speculative::tree_draft::{Calibration, TreeDrafts, TreeParams};

const NEW_TOKENS: usize = 64;

/// Command-line options (`--name value` pairs).
struct Args {
    adapters: Vec<String>,
    prompts: PathBuf,
    widths: Vec<usize>,
    shapes: Vec<TreeParams>,
    limit: usize,
    out: PathBuf,
    guided: bool,
    /// The drafter's weights: `f16` (default) or `q` (the GGUF's own quantized weights, the private
    /// CLI's default).
    drafter_weights: String,
    /// Sampling temperature (0: greedy, checked against the trajectory).
    temperature: f32,
}

fn args(root: &std::path::Path) -> Result<Args, Box<dyn std::error::Error>> {
    let mut a = Args {
        adapters: vec!["code-lora-r16".into(), "code-ffa-r16".into()],
        prompts: root.join("adapters/eval/humaneval_0_19.jsonl"),
        widths: vec![9, 17],
        shapes: vec![
            "tree:2x8".parse()?,
            "tree:3x8".parse()?,
            "tree:4x8".parse()?,
        ],
        limit: usize::MAX,
        out: root.join("reports/acceptance-trees.json"),
        guided: true,
        drafter_weights: "f16".into(),
        temperature: 0.0,
    };
    let list = |v: &str| v.split(',').map(str::to_string).collect::<Vec<_>>();
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--adapters" => a.adapters = list(&v),
            "--prompts" => a.prompts = root.join(v),
            "--widths" => {
                a.widths = list(&v)
                    .iter()
                    .map(|w| w.parse())
                    .collect::<Result<_, _>>()?
            }
            // `--shapes ""`: chains only.
            "--shapes" => {
                a.shapes = list(&v)
                    .iter()
                    .filter(|s| !s.is_empty())
                    .map(|s| s.parse())
                    .collect::<Result<_, _>>()?
            }
            "--limit" => a.limit = v.parse()?,
            "--out" => a.out = root.join(v),
            // `--guided false`: the plain base drafter (no delta guidance).
            "--guided" => a.guided = v.parse()?,
            "--drafter-weights" => a.drafter_weights = v,
            "--temperature" => a.temperature = v.parse()?,
            _ => return Err(format!("unknown option {flag}").into()),
        }
    }
    Ok(a)
}

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
            weights: WeightMode::F32,
        },
    )?;
    let drafter = match args.drafter_weights.as_str() {
        "f16" => model.to_f16_weights()?,
        "q" => Model::load_with(
            &path,
            &LoadOptions {
                weights: WeightMode::Quantized,
            },
        )?,
        other => return Err(format!("--drafter-weights {other}: f16 or q").into()),
    };
    let tok = Tokenizer::for_model(&path)?;
    let prompts: Vec<String> = std::fs::read_to_string(&args.prompts)?
        .lines()
        .take(args.limit)
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .map(|v| v["prompt"].as_str().unwrap_or_default().to_string())
        })
        .collect::<Result<_, _>>()?;
    let eos = tok.eos_tokens().to_vec();
    let sampled = args.temperature > 0.0;
    let mut shapes: Vec<Option<TreeParams>> = vec![None];
    shapes.extend(args.shapes.iter().copied().map(Some));
    let label = |s: &Option<TreeParams>| s.map_or("chain".to_string(), |t| t.to_string());
    let mut report = Vec::new();
    println!(
        "| adapter | agreement | T | {} |",
        shapes.iter().map(label).collect::<Vec<_>>().join(" | ")
    );
    println!("| --- | ---: | ---: |{}", " ---: |".repeat(shapes.len()));
    for name in &args.adapters {
        let adapter = LoraAdapter::load(&root.join("adapters").join(name), model.config())?;
        let (mut agree, mut total) = (0usize, 0usize);
        // Rank of the adapted model's token under the base model: 1, 2, 3, 4, 5+.
        let mut ranks = [0usize; 5];
        // [width][shape]: (tokens, rounds, draft seconds)
        let mut acc = vec![vec![(0usize, 0usize, 0f64); shapes.len()]; args.widths.len()];
        // Each tree configuration carries its acceptance estimate from prompt to prompt, as a
        // long-running client would.
        let mut calibration = vec![vec![Calibration::default(); shapes.len()]; args.widths.len()];
        for (index, text) in prompts.iter().enumerate() {
            let prompt = tok.encode(text)?;
            let opts = GenerateOptions {
                max_tokens: NEW_TOKENS,
                sampling: SamplingParams::greedy(),
                eos: eos.clone(),
            };
            let mut lora = PlainLora::new(&adapter);
            let traj = generate(&model, &prompt, &opts, &mut lora, &mut |_| Ok(()))?.tokens;
            if traj.is_empty() {
                continue;
            }
            // Teacher-forced base argmax along the adapted trajectory.
            let mut seq = prompt.clone();
            seq.extend(&traj[..traj.len() - 1]);
            let mut cache = model.new_cache(seq.len())?;
            let logits = model.forward(&seq, &mut cache, &AttentionMask::Causal, &mut NoAdapter)?;
            let rows = logits.to_vec2::<f32>()?;
            for (i, &t) in traj.iter().enumerate() {
                let row = &rows[prompt.len() - 1 + i];
                let rank = row.iter().filter(|&&l| l > row[t as usize]).count();
                ranks[rank.min(ranks.len() - 1)] += 1;
                agree += usize::from(rank == 0);
                total += 1;
            }
            for (w, &width) in args.widths.iter().enumerate() {
                for (s, shape) in shapes.iter().enumerate() {
                    let cfg = SpecConfig {
                        drafting: match shape {
                            Some(shape) => Drafting::tree(
                                TreeDrafts {
                                    shape: *shape,
                                    calibration: calibration[w][s].clone(),
                                },
                                width - 1,
                            ),
                            None => Drafting::chain(ChainDrafter::Base, width - 1),
                        },
                        pad_to_k: true,
                        prefill_width: None,
                        optimistic: false,
                        draft_stop_below: 0.0,
                        delta_guided: args.guided,
                        max_tokens: if sampled { NEW_TOKENS } else { traj.len() },
                        sampling: if sampled {
                            SamplingParams {
                                temperature: args.temperature,
                                seed: index as u64,
                                ..SamplingParams::greedy()
                            }
                        } else {
                            SamplingParams::greedy()
                        },
                        eos: eos.clone(),
                        first_token_from_prefill: false,
                        prefill_span: cipherlora_speculative::decode::PrefillSpan::default(),
                        schedule: Default::default(),
                    };
                    let mut lora = PlainLora::new(&adapter);
                    let out = decode::generate_drafted(
                        &model,
                        &drafter,
                        &prompt,
                        &cfg,
                        &mut lora,
                        &mut |_| Ok(()),
                    )?;
                    assert!(
                        sampled || out.tokens == traj,
                        "{name} T={width} {}: output differs",
                        label(shape)
                    );
                    let a = &mut acc[w][s];
                    a.0 += out.tokens.len();
                    a.1 += out.stats.rounds;
                    a.2 += out.stats.draft_secs;
                    if let Some(c) = out.calibration {
                        calibration[w][s] = c;
                    }
                }
            }
        }
        eprintln!("{name}: rank of the adapted token under the base model (1..5+): {ranks:?}");
        if std::env::var_os("CAL").is_some() {
            eprintln!("{:#?}", calibration[0].last());
        }
        let agreement = agree as f64 / total.max(1) as f64;
        for (w, &width) in args.widths.iter().enumerate() {
            let per_round: Vec<f64> = acc[w]
                .iter()
                .map(|a| a.0 as f64 / a.1.max(1) as f64)
                .collect();
            println!(
                "| {name} | {agreement:.3} | {width} | {} |",
                per_round
                    .iter()
                    .map(|x| format!("{x:.2}"))
                    .collect::<Vec<_>>()
                    .join(" | ")
            );
            for (s, shape) in shapes.iter().enumerate() {
                let a = acc[w][s];
                report.push(serde_json::json!({
                    "adapter": name, "prompts": prompts.len(), "trajectory_tokens": total,
                    "per_token_agreement": agreement, "verify_width": width,
                    "draft": label(shape), "tokens": a.0, "rounds": a.1,
                    "tokens_per_round": per_round[s], "delta_guided": args.guided, "drafter_weights": args.drafter_weights,
                    "temperature": args.temperature,
                    "draft_ms_per_round": 1e3 * a.2 / a.1.max(1) as f64,
                }));
            }
        }
    }
    std::fs::create_dir_all(args.out.parent().expect("has a parent"))?;
    std::fs::write(&args.out, serde_json::to_string_pretty(&report)?)?;
    eprintln!("wrote {}", args.out.display());
    Ok(())
}

//! Probe: does adding a guess of the adapter's deltas to the base drafter
//! (the deltas the client decrypted at earlier positions, averaged) make
//! its greedy token agree with the adapted model's more often?
//!
//! Teacher-forced on each prompt's adapted greedy trajectory, drafting over
//! the adapted prefix (as the real drafter does): for every position p, the
//! cache holds the adapted model's keys and values for positions < p and
//! position p runs with the variant's deltas.
//!
//! `cargo run --release -p cipherlora-speculative --example drafter_probe -- \
//!   --adapters general-lora-r16 --prompts adapters/eval/general_prompts.jsonl --limit 10`

use std::path::PathBuf;

use cipherlora_model::{
    AttentionMask, GenerateOptions, GroupDeltas, KeepDeltas, LoadOptions, LoraAdapter, Model,
    NoAdapter, PassDeltas, PlainLora, SamplingParams, Tokenizer, WeightMode, fetch, generate,
};
use cipherlora_speculative::draft_bias::DraftBias;

fn main() -> anyhow::Result<()> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let argv: Vec<String> = std::env::args().collect();
    let arg = |name: &str, default: &str| -> String {
        argv.iter()
            .position(|a| a == name)
            .and_then(|i| argv.get(i + 1).cloned())
            .unwrap_or_else(|| default.to_string())
    };
    let adapters: Vec<String> = arg("--adapters", "general-lora-r16")
        .split(',')
        .map(String::from)
        .collect();
    let prompts_file = root.join(arg("--prompts", "adapters/eval/general_prompts.jsonl"));
    let limit: usize = arg("--limit", "10").parse()?;
    let new_tokens: usize = arg("--tokens", "64").parse()?;
    let betas: Vec<f32> = arg("--betas", "0,0.5,0.8,0.95")
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let path = fetch::ensure_default_model()?;
    let model = Model::load_with(
        &path,
        &LoadOptions {
            weights: WeightMode::F32,
        },
    )?;
    let tok = Tokenizer::for_model(&path)?;
    let eos = tok.eos_tokens().to_vec();
    let prompts: Vec<String> = std::fs::read_to_string(&prompts_file)?
        .lines()
        .take(limit)
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .map(|v| v["prompt"].as_str().unwrap_or_default().to_string())
        })
        .collect::<Result<_, _>>()?;
    for name in &adapters {
        let adapter = LoraAdapter::load(&root.join("adapters").join(name), model.config())?;
        // [0]: base; then one per beta.
        let mut agree = vec![0usize; 1 + betas.len()];
        let mut total = 0usize;
        for text in &prompts {
            let prompt = tok.encode(text)?;
            let opts = GenerateOptions {
                max_tokens: new_tokens,
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
            if traj.is_empty() {
                continue;
            }
            let mut seq = prompt.clone();
            seq.extend(&traj[..traj.len() - 1]);
            let mut adapted = model.new_cache(seq.len() + 1)?;
            let mut rec = KeepDeltas::new(PlainLora::new(&adapter));
            model.forward(&seq, &mut adapted, &AttentionMask::Causal, &mut rec)?;
            // Running averages of the deltas over positions < p, per beta:
            // (1, d_out) per projection.
            let mut ema: Vec<PassDeltas> = vec![PassDeltas::new(); betas.len()];
            for p in 0..seq.len() {
                if p + 1 >= prompt.len() {
                    let t = traj[p + 1 - prompt.len()] as usize;
                    let mut variants: Vec<Option<&PassDeltas>> = vec![None];
                    variants.extend(ema.iter().map(Some));
                    for (v, table) in variants.into_iter().enumerate() {
                        let mut c = adapted.fork()?;
                        c.truncate(p);
                        let logits = match table {
                            None => model.forward(
                                &seq[p..=p],
                                &mut c,
                                &AttentionMask::Causal,
                                &mut NoAdapter,
                            )?,
                            Some(tb) => model.forward(
                                &seq[p..=p],
                                &mut c,
                                &AttentionMask::Causal,
                                &mut DraftBias::from_row(tb, 0)?,
                            )?,
                        };
                        let row = logits.to_vec2::<f32>()?.pop().expect("one row");
                        let arg = (0..row.len())
                            .max_by(|&a, &b| row[a].total_cmp(&row[b]))
                            .expect("non-empty");
                        agree[v] += usize::from(arg == t);
                    }
                    total += 1;
                }
                // Fold position p's exact deltas into the averages.
                for (b, &beta) in betas.iter().enumerate() {
                    for (key, group) in &rec.added {
                        let mut folded = GroupDeltas::none();
                        for (proj, d) in group.iter() {
                            let now = d.narrow(0, p, 1)?;
                            let avg = match ema[b].get(key).and_then(|g| g.get(proj)) {
                                Some(old) => {
                                    ((old * f64::from(beta))? + (&now * f64::from(1.0 - beta))?)?
                                }
                                None => now,
                            };
                            folded.push(proj, avg);
                        }
                        ema[b].insert(*key, folded);
                    }
                }
            }
        }
        let pct: Vec<String> = agree
            .iter()
            .map(|a| format!("{:.3}", *a as f64 / total.max(1) as f64))
            .collect();
        println!("{name}: {total} positions; agreement base / EMA betas {betas:?}: {pct:?}");
    }
    Ok(())
}

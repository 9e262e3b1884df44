//! Acceptance statistics of speculative decoding, measured with the
//! plaintext engine on the committed adapters (issue: "the honest
//! replacement for the 85–95 % the papers assume").
//!
//! For each adapter and each of the 20 held-out HumanEval prompts
//! (adapters/eval/humaneval_0_19.jsonl): the adapted model's greedy
//! trajectory of up to 64 tokens; per-token agreement of the base model's
//! argmax with it (teacher-forced on the trajectory); and tokens per verify
//! round when drafting K = 4 and K = 8 with the base model or by prompt
//! lookup, verified against the adapted model (accepted drafts + bonus).
//!
//! Run: `cargo run --release -p cipherlora-spec --example acceptance`

use std::path::PathBuf;

use cipherlora_model::{
    AttentionMask, GenerateOptions, LoraAdapter, Model, NoAdapter, PlainLora, SamplingParams,
    Tokenizer, fetch, generate,
};
use cipherlora_spec::decode::{self, DrafterKind, SpecConfig};

const NEW_TOKENS: usize = 64;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let path = fetch::ensure_default_model()?;
    let model = Model::load(&path)?;
    let tok = Tokenizer::for_model(&path)?;
    let prompts: Vec<String> =
        std::fs::read_to_string(root.join("adapters/eval/humaneval_0_19.jsonl"))?
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l)
                    .map(|v| v["prompt"].as_str().unwrap_or_default().to_string())
            })
            .collect::<Result<_, _>>()?;
    let eos = tok.eos_tokens().to_vec();
    let mut report = Vec::new();
    println!("| adapter | agreement | base K=4 | base K=8 | n-gram K=4 | n-gram K=8 |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    for name in ["code-lora-r16", "code-ffa-r16"] {
        let adapter = LoraAdapter::load(&root.join("adapters").join(name), model.config())?;
        let (mut agree, mut total) = (0usize, 0usize);
        let runs = [
            (DrafterKind::Base, 4),
            (DrafterKind::Base, 8),
            (DrafterKind::Ngram, 4),
            (DrafterKind::Ngram, 8),
        ];
        let mut tokens = [0usize; 4];
        let mut rounds = [0usize; 4];
        for text in &prompts {
            let prompt = tok.encode(text)?;
            let opts = GenerateOptions {
                max_tokens: NEW_TOKENS,
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
            // Teacher-forced base argmax along the adapted trajectory.
            let mut seq = prompt.clone();
            seq.extend(&traj[..traj.len() - 1]);
            let mut cache = model.new_cache(seq.len())?;
            let logits = model.forward(&seq, &mut cache, &AttentionMask::Causal, &mut NoAdapter)?;
            let argmax = Model::argmax_rows(&logits)?;
            for (i, &t) in traj.iter().enumerate() {
                agree += usize::from(argmax[prompt.len() - 1 + i] == t);
                total += 1;
            }
            for (j, &(drafter, k)) in runs.iter().enumerate() {
                let cfg = SpecConfig {
                    drafter,
                    k,
                    adaptive: false,
                    pad_to_k: false,
                    prefill_width: None,
                    optimistic: false,
                    draft_stop_below: 0.0,
                    max_tokens: traj.len(),
                    sampling: SamplingParams::greedy(),
                    eos: eos.clone(),
                    first_token_from_prefill: false,
                    schedule: Default::default(),
                };
                let out = decode::generate(
                    &model,
                    &prompt,
                    &cfg,
                    &mut PlainLora::new(&adapter),
                    &mut |_| Ok(()),
                )?;
                assert_eq!(
                    out.tokens, traj,
                    "speculative output differs from the trajectory"
                );
                tokens[j] += out.tokens.len();
                rounds[j] += out.stats.rounds;
            }
        }
        let per_round: Vec<f64> = (0..4)
            .map(|j| tokens[j] as f64 / rounds[j].max(1) as f64)
            .collect();
        let agreement = agree as f64 / total.max(1) as f64;
        println!(
            "| {name} | {agreement:.3} | {:.2} | {:.2} | {:.2} | {:.2} |",
            per_round[0], per_round[1], per_round[2], per_round[3]
        );
        report.push(serde_json::json!({
            "adapter": name, "prompts": prompts.len(), "trajectory_tokens": total,
            "per_token_agreement": agreement,
            "tokens_per_round": {"base_k4": per_round[0], "base_k8": per_round[1], "ngram_k4": per_round[2], "ngram_k8": per_round[3]},
        }));
    }
    let out = root.join("reports/acceptance-rust.json");
    std::fs::create_dir_all(out.parent().expect("has a parent"))?;
    std::fs::write(&out, serde_json::to_string_pretty(&report)?)?;
    eprintln!("wrote {}", out.display());
    Ok(())
}

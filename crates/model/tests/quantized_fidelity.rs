//! Fidelity of the quantized weight path (GGUF weights kept quantized, 8-bit activations;
//! `WeightMode::Quantized`) against the f32 path (`WeightMode::F32`, the exact reference) on the
//! real default model: teacher-forced over held-out prompts, the greedy next token (argmax of the
//! logits) must agree at ≥ 99 % of positions.
//!
//! Prompts: `adapters/eval/general_prompts.jsonl` (English prose from Gutenberg works held out of
//! the adapters' corpus) and `adapters/eval/humaneval_0_19.jsonl` (code); see
//! `adapters/eval/README.md`.

use std::path::Path;
use std::sync::OnceLock;

use cipherlora_model::{
    AttentionMask, LoadOptions, Model, NoAdapter, Tokenizer, WeightMode, argmax, fetch,
};

/// Minimum share of positions whose argmax agrees.
const MIN_AGREEMENT: f64 = 0.99;

struct Models {
    f32: Model,
    quantized: Model,
    tok: Tokenizer,
}

fn models() -> &'static Models {
    static M: OnceLock<Models> = OnceLock::new();
    M.get_or_init(|| {
        let path = fetch::ensure_default_model().expect("default model");
        let load = |weights| Model::load_with(&path, &LoadOptions { weights }).expect("load");
        Models {
            f32: load(WeightMode::F32),
            quantized: load(WeightMode::Quantized),
            tok: Tokenizer::for_model(&path).expect("tokenizer"),
        }
    })
}

/// The `prompt` fields of a JSONL file under `adapters/eval/`.
fn prompts(file: &str) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../adapters/eval")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    text.lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).expect("JSON line");
            v["prompt"].as_str().expect("prompt field").to_string()
        })
        .collect()
}

/// The argmax at every position of one causal pass over `tokens`.
fn argmaxes(model: &Model, tokens: &[u32]) -> Vec<usize> {
    let mut cache = model.new_cache(tokens.len()).unwrap();
    let logits = model
        .forward(tokens, &mut cache, &AttentionMask::Causal, &mut NoAdapter)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    logits.iter().map(|row| argmax(row)).collect()
}

/// (agreeing positions, positions) over the prompts.
fn agreement(prompts: &[String]) -> (usize, usize) {
    let m = models();
    let (mut agree, mut total) = (0, 0);
    for p in prompts {
        let tokens = m.tok.encode(p).unwrap();
        let a = argmaxes(&m.f32, &tokens);
        let b = argmaxes(&m.quantized, &tokens);
        agree += a.iter().zip(&b).filter(|(x, y)| x == y).count();
        total += a.len();
    }
    (agree, total)
}

fn check(prompts: &[String]) {
    let (agree, total) = agreement(prompts);
    let share = agree as f64 / total as f64;
    eprintln!(
        "argmax agreement, quantized vs f32: {agree}/{total} = {:.2} % over {} prompts",
        100.0 * share,
        prompts.len()
    );
    assert!(
        share >= MIN_AGREEMENT,
        "quantized path agrees with f32 at {:.2} % of positions (< {:.0} %)",
        100.0 * share,
        100.0 * MIN_AGREEMENT
    );
}

/// CI variant: the first 3 prompts of each set (a few hundred positions).
#[test]
fn quantized_argmax_agrees_with_f32_on_a_few_prompts() {
    let mut ps: Vec<String> = prompts("general_prompts.jsonl")
        .into_iter()
        .take(3)
        .collect();
    ps.extend(prompts("humaneval_0_19.jsonl").into_iter().take(3));
    check(&ps);
}

/// All 40 prompts.
#[test]
#[ignore = "minutes in a test build; run with --ignored (see BENCHMARKS.md)"]
fn quantized_argmax_agrees_with_f32_on_all_heldout_prompts() {
    let mut ps = prompts("general_prompts.jsonl");
    ps.extend(prompts("humaneval_0_19.jsonl"));
    check(&ps);
}

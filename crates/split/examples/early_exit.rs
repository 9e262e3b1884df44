//! Does an early-exit drafter pay in split mode? The split client holds the embedding, the first
//! `a` and the last `b` decoder layers and the head, so it could draft without the server by
//! skipping the middle: `head(layers[L−b..L](layers[0..a](x)))`. This measures how often that
//! drafter's next-token argmax equals the whole model's, teacher-forced on held-out text (the first
//! 10 general prose prompts and the first 10 HumanEval prompts), for several splits — the per-token
//! acceptance a greedy chain drafted that way would see (Leviathan et al., ICML 2023: a chain of K
//! accepted with per-token rate α yields (1 − α^(K+1)) / (1 − α) tokens per step).
//!
//! `cargo run --release -p cipherlora-split --example early_exit -- [--splits 1,1;2,2;4,4] [--limit
//! 10]`

use std::path::PathBuf;

use cipherlora_model::{AttentionMask, Model, NoAdapter, Tokenizer, fetch};

fn argmax_rows(
    logits: &cipherlora_model::Tensor,
) -> Result<Vec<Vec<f32>>, Box<dyn std::error::Error>> {
    Ok(logits.to_vec2::<f32>()?)
}

fn top(row: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..row.len()).collect();
    idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
    idx.truncate(k);
    idx
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut splits = vec![(1usize, 1usize), (2, 2), (4, 4)];
    let mut limit = 10usize;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--splits" => {
                splits = v
                    .split(';')
                    .map(|s| {
                        let (a, b) = s.split_once(',').ok_or("a split is a,b")?;
                        Ok::<_, Box<dyn std::error::Error>>((a.parse()?, b.parse()?))
                    })
                    .collect::<Result<_, _>>()?
            }
            "--limit" => limit = v.parse()?,
            _ => return Err(format!("unknown option {flag}").into()),
        }
    }
    let path = fetch::ensure_default_model()?;
    let model = Model::load(&path)?;
    let tok = Tokenizer::for_model(&path)?;
    let n = model.config().num_layers;
    println!(
        "| text | split (a,b) | positions | top-1 agreement | full model's token in the drafter's top 4 |"
    );
    println!("| --- | --- | ---: | ---: | ---: |");
    for (label, file) in [
        ("general prose", "adapters/eval/general_prompts.jsonl"),
        ("HumanEval", "adapters/eval/humaneval_0_19.jsonl"),
    ] {
        let texts: Vec<String> = std::fs::read_to_string(root.join(file))?
            .lines()
            .take(limit)
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l)
                    .map(|v| v["prompt"].as_str().unwrap_or_default().to_string())
            })
            .collect::<Result<_, _>>()?;
        for &(a, b) in &splits {
            let (mut agree, mut in_top, mut total) = (0usize, 0usize, 0usize);
            for text in &texts {
                let mut ids = tok.encode(text)?;
                ids.truncate(256);
                let causal = AttentionMask::Causal;
                let mut full_cache = model.new_cache(ids.len())?;
                let full =
                    argmax_rows(&model.forward(&ids, &mut full_cache, &causal, &mut NoAdapter)?)?;
                let mut cache = model.new_cache(ids.len())?;
                let x = model.hidden_states(&ids, &mut cache, &causal, a)?;
                let mut tail = model.new_cache(ids.len())?;
                let z = model.forward_layers(&x, n - b..n, &mut tail, &causal)?;
                let early = argmax_rows(&model.head(&z)?)?;
                for (f, e) in full.iter().zip(&early) {
                    let want = top(f, 1)[0];
                    let got = top(e, 4);
                    agree += usize::from(got[0] == want);
                    in_top += usize::from(got.contains(&want));
                    total += 1;
                }
            }
            println!(
                "| {label} | ({a},{b}) | {total} | {:.3} | {:.3} |",
                agree as f64 / total as f64,
                in_top as f64 / total as f64
            );
        }
    }
    Ok(())
}

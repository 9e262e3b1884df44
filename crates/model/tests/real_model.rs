//! Tests on the real default model (SmolLM2-135M-Instruct Q4_1), fetched and sha256-checked by
//! `cipherlora_model::fetch::ensure_default_model`.

use std::sync::OnceLock;

use cipherlora_model::{
    AttentionMask, GenerateOptions, KvCache, LoadOptions, Model, NoAdapter, SamplingParams,
    Tokenizer, WeightMode, fetch, generate,
};

/// The default model as loaded by default (its Q4_1/Q8_0 weights kept quantized, through our
/// kernels).
fn model() -> &'static (Model, Tokenizer) {
    static M: OnceLock<(Model, Tokenizer)> = OnceLock::new();
    M.get_or_init(|| {
        let path = fetch::ensure_default_model().expect("default model");
        (
            Model::load(&path).expect("load"),
            Tokenizer::for_model(&path).expect("tokenizer"),
        )
    })
}

/// The default model with its weights dequantized to f32 (the exact reference).
fn f32_model() -> Model {
    let path = fetch::ensure_default_model().unwrap();
    let weights = WeightMode::F32;
    Model::load_with(&path, &LoadOptions { weights }).unwrap()
}

fn greedy(m: &Model, prompt: &[u32], n: usize, eos: Vec<u32>) -> Vec<u32> {
    let opts = GenerateOptions {
        max_tokens: n,
        sampling: SamplingParams::greedy(),
        eos,
    };
    generate(m, prompt, &opts, &mut NoAdapter, &mut |_| Ok(()))
        .unwrap()
        .tokens
}

const GOLDEN_PROMPT: &str = "Once upon a time, there was a little";
/// Greedy continuation (32 tokens) from an independent NumPy implementation on the same GGUF
/// (weights dequantized to f32).
const GOLDEN: &str = " girl named Emma who loved to play in the sun. She would often go to the beach and play with her friends. One day, she decided to go to";

/// The f32 path (weights dequantized at load: the exact reference).
#[test]
fn golden_greedy_continuation_matches_numpy_reference() {
    let (_, tok) = model();
    let f32_model = f32_model();
    assert_eq!(f32_model.weights_held(), "f32");
    let prompt = tok.encode(GOLDEN_PROMPT).unwrap();
    let out = greedy(&f32_model, &prompt, 32, vec![]);
    assert_eq!(out.len(), 32);
    assert_eq!(tok.decode(&out).unwrap(), GOLDEN);
}

/// With weights kept quantized, activations are quantized to 16 bits per block of 32 before the
/// integer dot products (`crates/model/src/qmatmul.rs`): the greedy continuation is still the NumPy
/// reference's. (Candle's and llama.cpp's 8-bit activations flipped the argmax at token 13.) These
/// are the default weights (`WeightMode::Auto`).
#[test]
fn golden_greedy_continuation_with_quantized_weights() {
    let (q, tok) = model();
    assert_eq!(q.weights_held(), "quantized");
    let prompt = tok.encode(GOLDEN_PROMPT).unwrap();
    let out = greedy(q, &prompt, 32, vec![]);
    assert_eq!(tok.decode(&out).unwrap(), GOLDEN);
}

#[test]
fn chat_capital_of_france_answers_paris() {
    let (m, tok) = model();
    let prompt = tok
        .encode(&tok.chat_prompt("What is the capital of France?").unwrap())
        .unwrap();
    let out = greedy(m, &prompt, 40, tok.eos_tokens().to_vec());
    let text = tok.decode(&out).unwrap();
    assert!(text.contains("Paris"), "{text}");
}

fn run(m: &Model, ids: &[u32], cache: &mut KvCache, mask: &AttentionMask) -> Vec<Vec<f32>> {
    m.forward(ids, cache, mask, &mut NoAdapter)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap()
}

/// One causal pass over a sentence, the same sentence as one step per token, and as passes of
/// 3 positions: every row's logits bit for bit the same ([`cipherlora_model`]'s projections and
/// attention compute a row the same way whatever the pass), so the greedy tokens are too.
fn check_batched_against_steps(m: &Model, tok: &Tokenizer) {
    let ids = tok
        .encode("The quick brown fox jumps over the lazy dog")
        .unwrap();
    let bits = |rows: Vec<Vec<f32>>| -> Vec<Vec<u32>> {
        rows.iter()
            .map(|r| r.iter().map(|x| x.to_bits()).collect())
            .collect()
    };
    let mut c1 = m.new_cache(64).unwrap();
    let batched = bits(run(m, &ids, &mut c1, &AttentionMask::Causal));
    for width in [1, 3] {
        let mut c2 = m.new_cache(64).unwrap();
        let mut rows = Vec::new();
        for chunk in ids.chunks(width) {
            rows.extend(bits(run(m, chunk, &mut c2, &AttentionMask::Causal)));
        }
        for (i, (a, b)) in batched.iter().zip(&rows).enumerate() {
            assert!(a == b, "position {i}, passes of {width}: logits differ");
        }
        assert_eq!(c2.len(), ids.len());
    }
    assert_eq!(c1.len(), ids.len());
}

/// f32 weights.
#[test]
fn batched_forward_matches_sequential_steps() {
    let (_, tok) = model();
    check_batched_against_steps(&f32_model(), tok);
}

/// The default quantized weights: activations are quantized per row, so a row's 16-bit levels
/// are the same in a pass as in a step.
#[test]
fn batched_forward_matches_sequential_steps_with_quantized_weights() {
    let (m, tok) = model();
    check_batched_against_steps(m, tok);
}

#[test]
fn truncate_and_rerun_is_bit_identical() {
    let (m, tok) = model();
    let ids = tok.encode("Speculative decoding verifies drafts").unwrap();
    let mut c = m.new_cache(64).unwrap();
    run(m, &ids[..3], &mut c, &AttentionMask::Causal);
    let first = run(m, &ids[3..], &mut c, &AttentionMask::Causal);
    // Overwrite the tail with other tokens, roll back, re-run.
    c.truncate(3);
    run(m, &[1, 2, 3, 4], &mut c, &AttentionMask::Causal);
    c.truncate(3);
    let again = run(m, &ids[3..], &mut c, &AttentionMask::Causal);
    assert_eq!(first, again);
}

#[test]
fn chain_tree_mask_equals_causal_mask() {
    let (m, tok) = model();
    let ids = tok.encode("One two three four five").unwrap();
    let mut c1 = m.new_cache(32).unwrap();
    let mut c2 = m.new_cache(32).unwrap();
    run(m, &ids[..2], &mut c1, &AttentionMask::Causal);
    run(m, &ids[..2], &mut c2, &AttentionMask::Causal);
    let causal = run(m, &ids[2..], &mut c1, &AttentionMask::Causal);
    let chain: Vec<Option<usize>> = (0..ids.len() - 2).map(|i| i.checked_sub(1)).collect();
    let tree = run(m, &ids[2..], &mut c2, &AttentionMask::tree(chain));
    assert_eq!(causal, tree);
}

/// Each tree node's logits equal, bit for bit, a causal run of its root-to-node path, and
/// compacting the cache to an accepted path continues like that path.
#[test]
fn tree_nodes_match_their_paths_and_compact_keeps_a_path() {
    let (m, tok) = model();
    let prefix = tok.encode("The capital of France").unwrap();
    let (a, b, c, d, e) = (
        tok.encode(" is").unwrap()[0],
        tok.encode(" Paris").unwrap()[0],
        tok.encode(" was").unwrap()[0],
        tok.encode(".").unwrap()[0],
        tok.encode(" It").unwrap()[0],
    );
    // a -> {b, c}, b -> d
    let parents = vec![None, Some(0), Some(0), Some(1)];
    let mut tc = m.new_cache(32).unwrap();
    run(m, &prefix, &mut tc, &AttentionMask::Causal);
    let tree = run(m, &[a, b, c, d], &mut tc, &AttentionMask::tree(parents));
    let path_last = |path: &[u32]| {
        let mut pc = m.new_cache(32).unwrap();
        let mut ids = prefix.clone();
        ids.extend_from_slice(path);
        run(m, &ids, &mut pc, &AttentionMask::Causal).pop().unwrap()
    };
    for (node, path) in [
        (0, vec![a]),
        (1, vec![a, b]),
        (2, vec![a, c]),
        (3, vec![a, b, d]),
    ] {
        assert!(path_last(&path) == tree[node], "node {node}: logits differ");
    }
    // Accept a, b, d; then the next step must continue that path.
    tc.compact(prefix.len(), &[0, 1, 3]).unwrap();
    assert_eq!(tc.len(), prefix.len() + 3);
    let next = run(m, &[e], &mut tc, &AttentionMask::Causal).pop().unwrap();
    assert!(
        path_last(&[a, b, d, e]) == next,
        "after compact: logits differ"
    );
    // A fork is independent of the original.
    let mut f = tc.fork().unwrap();
    run(m, &[a], &mut f, &AttentionMask::Causal);
    assert_eq!(f.len(), tc.len() + 1);
}

/// A tree grown level by level (each level one pass that extends the cached nodes, as the tree
/// drafter does) gives the same logits as the whole tree in one pass, bit for bit.
#[test]
fn tree_grown_level_by_level_equals_the_whole_tree() {
    let (m, tok) = model();
    let prefix = tok.encode("The capital of France").unwrap();
    let ids: Vec<u32> = [" is", " Paris", " was", ".", " It", " in"]
        .iter()
        .map(|w| tok.encode(w).unwrap()[0])
        .collect();
    // 0 -> {1, 2}, 1 -> {3, 4}, 2 -> 5
    let parents = vec![None, Some(0), Some(0), Some(1), Some(1), Some(2)];
    let mut whole_cache = m.new_cache(32).unwrap();
    run(m, &prefix, &mut whole_cache, &AttentionMask::Causal);
    let whole = run(
        m,
        &ids,
        &mut whole_cache,
        &AttentionMask::tree(parents.clone()),
    );
    let mut grown_cache = m.new_cache(32).unwrap();
    run(m, &prefix, &mut grown_cache, &AttentionMask::Causal);
    let mut grown = Vec::new();
    for (from, to) in [(0, 1), (1, 3), (3, 6)] {
        let mask = AttentionMask::tree_extension(parents[..to].to_vec(), from);
        grown.extend(run(m, &ids[from..to], &mut grown_cache, &mask));
    }
    for (node, (w, g)) in whole.iter().zip(&grown).enumerate() {
        assert!(w == g, "node {node}: logits differ");
    }
    // More cached nodes than the cache holds is an input error.
    let bad = AttentionMask::tree_extension(vec![None; 40], 39);
    assert!(
        m.forward(&[ids[0]], &mut grown_cache, &bad, &mut NoAdapter)
            .is_err()
    );
}

#[test]
fn gguf_tokenizer_matches_known_ids() {
    let (_, tok) = model();
    // SmolLM2 splits digits individually; ChatML markers are single tokens.
    let ids = tok.encode("<|im_start|>user\n2024").unwrap();
    assert_eq!(ids[0], 1);
    assert_eq!(ids.len(), 1 + tok.encode("user\n").unwrap().len() + 4);
    assert_eq!(tok.eos_tokens(), &[2]);
    assert_eq!(
        tok.decode(&tok.encode("héllo wörld").unwrap()).unwrap(),
        "héllo wörld"
    );
}

#[test]
fn seeded_sampling_is_reproducible_and_seed_dependent() {
    let (m, tok) = model();
    let prompt = tok.encode(GOLDEN_PROMPT).unwrap();
    let run = |seed| {
        let opts = GenerateOptions {
            max_tokens: 12,
            sampling: SamplingParams {
                temperature: 1.0,
                top_k: Some(50),
                top_p: Some(0.95),
                repetition_penalty: 1.1,
                seed,
            },
            eos: vec![],
        };
        generate(m, &prompt, &opts, &mut NoAdapter, &mut |_| Ok(()))
            .unwrap()
            .tokens
    };
    assert_eq!(run(1), run(1));
    assert_ne!(run(1), run(2));
}

/// The hidden states after all layers, through [`Model::head`], are `forward`'s logits; after 0
/// layers they are the embedding rows (checked against the raw table, an independent path:
/// `index_select` vs row reads).
#[test]
fn hidden_states_compose_to_forward_and_start_at_the_embedding() {
    let (m, tok) = model();
    let ids = tok.encode(GOLDEN_PROMPT).unwrap();
    let n = m.config().num_layers;
    let mut c1 = m.new_cache(32).unwrap();
    let logits = m
        .forward(&ids, &mut c1, &AttentionMask::Causal, &mut NoAdapter)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    let mut c2 = m.new_cache(32).unwrap();
    let h = m
        .hidden_states(&ids, &mut c2, &AttentionMask::Causal, n)
        .unwrap();
    assert_eq!(c2.len(), ids.len());
    let via = m.head(&h).unwrap().to_vec2::<f32>().unwrap();
    for (a, b) in logits.iter().zip(&via) {
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= 1e-4 * (1.0 + x.abs()), "{x} vs {y}");
        }
    }
    let mut c3 = m.new_cache(32).unwrap();
    let h0 = m
        .hidden_states(&ids, &mut c3, &AttentionMask::Causal, 0)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    let table = m.embedding();
    for (row, &id) in h0.iter().zip(&ids) {
        let want = table.get(id as usize).unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(row, &want);
    }
    // Several depths in one pass equal separate passes; a continuation from a depth-2 cache equals
    // the full pass's last row.
    let mut c4 = m.new_cache(32).unwrap();
    let both = m
        .hidden_states_at(&ids, &mut c4, &AttentionMask::Causal, &[2, 1])
        .unwrap();
    let mut c5 = m.new_cache(32).unwrap();
    let one = m
        .hidden_states(&ids, &mut c5, &AttentionMask::Causal, 1)
        .unwrap();
    let diff = (&both[1] - &one)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(diff < 1e-4, "{diff}");
    let mut c6 = m.new_cache(32).unwrap();
    let k = ids.len() - 1;
    m.hidden_states(&ids[..k], &mut c6, &AttentionMask::Causal, 2)
        .unwrap();
    let last = m
        .hidden_states(&ids[k..], &mut c6, &AttentionMask::Causal, 2)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    let full = both[0].to_vec2::<f32>().unwrap();
    for (x, y) in last[0].iter().zip(&full[k]) {
        assert!((x - y).abs() <= 1e-4 * (1.0 + y.abs()), "{x} vs {y}");
    }
}

#[test]
fn hidden_states_reject_a_depth_beyond_the_model() {
    let (m, _) = model();
    let n = m.config().num_layers;
    let mut c = m.new_cache(4).unwrap();
    let err = m
        .hidden_states(&[1, 2], &mut c, &AttentionMask::Causal, n + 1)
        .unwrap_err();
    assert!(
        matches!(err, cipherlora_model::ModelError::Input(_)),
        "{err}"
    );
    assert_eq!(c.len(), 0);
    assert!(
        m.hidden_states_at(&[1], &mut c, &AttentionMask::Causal, &[])
            .is_err()
    );
}

/// Split inference's three pieces — layers `[0, a)` from tokens, `[a, L−b)` and `[L−b, L)` on
/// hidden states, each with a cache of its layers only — give `forward`'s logits bit for bit, over
/// a prefill and a continuation; a cache lacking a layer of the range is refused without growing.
#[test]
fn layer_ranges_compose_to_forward_bit_for_bit() {
    let (m, tok) = model();
    let ids = tok.encode(GOLDEN_PROMPT).unwrap();
    let n = m.config().num_layers;
    let (a, b) = (2, 3);
    let causal = AttentionMask::Causal;
    let mut full = m.new_cache(32).unwrap();
    let mut head = KvCache::for_layers(m.config(), 32, 0..a).unwrap();
    let mut mid = KvCache::for_layers(m.config(), 32, a..n - b).unwrap();
    let mut tail = KvCache::for_layers(m.config(), 32, n - b..n).unwrap();
    let k = ids.len() - 2;
    for chunk in [&ids[..k], &ids[k..]] {
        let want = m
            .forward(chunk, &mut full, &causal, &mut NoAdapter)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        let x = m.hidden_states(chunk, &mut head, &causal, a).unwrap();
        let y = m.forward_layers(&x, a..n - b, &mut mid, &causal).unwrap();
        let z = m.forward_layers(&y, n - b..n, &mut tail, &causal).unwrap();
        let got = m.head(&z).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(got, want);
    }
    assert_eq!(
        (head.len(), mid.len(), tail.len()),
        (ids.len(), ids.len(), ids.len())
    );
    let x = m.hidden_states(&ids[..1], &mut full, &causal, a).unwrap();
    let err = m.forward_layers(&x, 0..n, &mut mid, &causal).unwrap_err();
    assert!(
        matches!(err, cipherlora_model::ModelError::Input(_)),
        "{err}"
    );
    assert_eq!(mid.len(), ids.len());
    let bad = cipherlora_model::Tensor::zeros(
        (1, m.config().hidden_size - 1),
        candle_core::DType::F32,
        &candle_core::Device::Cpu,
    )
    .unwrap();
    assert!(m.forward_layers(&bad, a..n - b, &mut mid, &causal).is_err());
    assert_eq!(mid.len(), ids.len());
}

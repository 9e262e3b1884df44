//! Tree drafts on the real default model with the committed adapters, the
//! plaintext LoRA hook standing in for the adapter server.
//!
//! 1. Greedy: with tree drafts of several shapes and budgets, on the code
//!    adapters and the general-English all-linear adapter, on the
//!    per-group and the fixed-point schedule, the output equals sequential
//!    greedy decoding of the adapted model token for token (how many
//!    tokens a round yields, trees against chains, is measured by the
//!    acceptance example, not tested).
//! 2. Sampling: on the real model's distributions, the first token of a
//!    tree round (the base model's top tokens as the root's children)
//!    follows the adapted softmax (χ²), and a rule that does not
//!    renormalise after a rejected child fails; a sampled tree generation
//!    runs end to end and is reproducible from its seed.

mod common;

use cipherlora_model::{NoAdapter, PlainLora, Sampler, SamplingParams};
use cipherlora_speculative::decode::{self, Drafting, SpecConfig};
use cipherlora_speculative::schedule::{FixedPoint, Schedule};
use cipherlora_speculative::tree::{DraftTree, accept_tree_sampled};
use cipherlora_speculative::tree_draft::{TreeDrafts, TreeParams};
use common::{Fixture, PROMPTS, chi2_p_value, fixture, last_probs, load_adapter, reference_with};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha20Rng;

fn config(
    f: &Fixture,
    k: usize,
    tree: Option<TreeParams>,
    schedule: Schedule,
    n: usize,
) -> SpecConfig {
    let mut cfg = SpecConfig {
        schedule,
        ..SpecConfig::greedy(k, n, f.tokenizer.eos_tokens().to_vec())
    };
    if let Some(shape) = tree {
        cfg.drafting = Drafting::tree(shape, k);
    }
    cfg
}

#[test]
fn tree_greedy_output_equals_sequential_adapted_decoding() {
    let f = fixture();
    let half = f.model.to_f16_weights().unwrap();
    let n = 16;
    // Draws the next tree during each round's last trip (the default).
    let fixed = Schedule::FixedPoint(FixedPoint::default());
    let mut ahead_hits = 0;
    let wide = TreeParams {
        branch: 3,
        max_depth: 6,
    };
    let narrow = TreeParams {
        branch: 2,
        max_depth: 4,
    };
    for (name, runs) in [
        (
            "code-lora-r16",
            [
                (8, TreeParams::default(), Schedule::PerGroup),
                (15, wide, Schedule::PerGroup),
            ],
        ),
        (
            "code-ffa-r16",
            [
                (8, TreeParams::default(), Schedule::PerGroup),
                (8, narrow, fixed),
            ],
        ),
        // General English, adapted on all seven linear projections.
        (
            "general-all-r8",
            [
                (8, TreeParams::default(), Schedule::PerGroup),
                (8, narrow, fixed),
            ],
        ),
    ] {
        let adapter = load_adapter(name, &f.model);
        for text in PROMPTS {
            let prompt = f.tokenizer.encode(text).unwrap();
            let want = reference_with(f, &adapter, &prompt, n);
            for (k, tree, schedule) in runs {
                let cfg = config(f, k, Some(tree), schedule, n);
                let mut hook = PlainLora::new(&adapter);
                let mut streamed = Vec::new();
                let out =
                    decode::generate_drafted(&f.model, &half, &prompt, &cfg, &mut hook, &mut |t| {
                        streamed.extend_from_slice(t);
                        Ok(())
                    })
                    .unwrap();
                let label = format!("{name} K={k} {tree} {schedule} on {text:?}");
                assert_eq!(out.tokens, want, "{label}");
                assert_eq!(streamed, out.tokens, "{label}: streamed tokens differ");
                assert!(out.stats.rounds < n, "{label}: no tree node accepted");
                ahead_hits += out.stats.ahead_hits;
            }
        }
    }
    assert!(
        ahead_hits > 0,
        "no tree grown during a last trip was ever used"
    );
}

#[test]
fn tree_sampling_follows_the_adapted_softmax_on_the_real_model() {
    let f = fixture();
    let sampler = Sampler::new(SamplingParams {
        temperature: 1.0,
        top_k: Some(40),
        seed: 7,
        ..SamplingParams::default()
    })
    .unwrap();
    const DRAWS: usize = 10_000;
    for (ctx_i, text) in PROMPTS.iter().enumerate() {
        let prompt = f.tokenizer.encode(text).unwrap();
        let p_full = last_probs(f, &prompt, &mut PlainLora::new(&f.adapter), &sampler);
        let q_full = last_probs(f, &prompt, &mut NoAdapter, &sampler);
        // Restricted to the union of the supports (as the chain test).
        let support: Vec<usize> = (0..p_full.len())
            .filter(|&t| p_full[t] > 0.0 || q_full[t] > 0.0)
            .collect();
        let p: Vec<f32> = support.iter().map(|&t| p_full[t]).collect();
        let q: Vec<f32> = support.iter().map(|&t| q_full[t]).collect();
        // The root's children: the base model's 4 most likely tokens.
        let mut ids: Vec<u32> = (0..q.len() as u32).collect();
        ids.sort_by(|&a, &b| q[b as usize].total_cmp(&q[a as usize]));
        let tree = DraftTree {
            tokens: ids[..4].to_vec(),
            parents: vec![None; 4],
        };
        let covered: f32 = tree.tokens.iter().map(|&t| p[t as usize]).sum();
        assert!(
            covered > 0.2 && covered < 0.98,
            "context {ctx_i}: children cover {covered}"
        );
        // Children rows stand in with p; only the first token is tested.
        let rows = vec![p.clone(); 5];
        let mut rng = ChaCha20Rng::seed_from_u64(200 + ctx_i as u64);
        let (mut right, mut wrong) = (vec![0usize; p.len()], vec![0usize; p.len()]);
        for _ in 0..DRAWS {
            let out = accept_tree_sampled(&tree, &rows, &mut rng).unwrap();
            right[out.tokens[0] as usize] += 1;
            // Wrong rule: each child with its plain p(x), no renormalisation.
            let tok = tree
                .tokens
                .iter()
                .copied()
                .find(|&x| rng.random::<f64>() < f64::from(p[x as usize]))
                .unwrap_or_else(|| {
                    let rest: Vec<f32> = (0..p.len() as u32)
                        .map(|t| {
                            if tree.tokens.contains(&t) {
                                0.0
                            } else {
                                p[t as usize]
                            }
                        })
                        .collect();
                    let total: f32 = rest.iter().sum();
                    let rest: Vec<f32> = rest.iter().map(|x| x / total).collect();
                    cipherlora_speculative::acceptance::sample(&rest, &mut rng)
                });
            wrong[tok as usize] += 1;
        }
        let pv = chi2_p_value(&p, &right, DRAWS);
        assert!(pv > 1e-3, "context {ctx_i}: exact rule rejected, p = {pv}");
        let pw = chi2_p_value(&p, &wrong, DRAWS);
        assert!(pw < 1e-4, "context {ctx_i}: wrong rule passed, p = {pw}");
    }
}

#[test]
fn sampled_tree_generation_runs_and_repeats_from_its_seed() {
    let f = fixture();
    let prompt = f.tokenizer.encode(PROMPTS[0]).unwrap();
    let mut cfg = config(f, 8, Some(TreeParams::default()), Schedule::PerGroup, 20);
    cfg.sampling = SamplingParams {
        temperature: 0.8,
        top_p: Some(0.95),
        seed: 11,
        ..SamplingParams::default()
    };
    let run = || {
        let mut hook = PlainLora::new(&f.adapter);
        decode::generate(&f.model, &prompt, &cfg, &mut hook, &mut |_| Ok(())).unwrap()
    };
    let (a, b) = (run(), run());
    assert_eq!(a.tokens, b.tokens);
    assert!(!a.tokens.is_empty());
    assert!(
        a.stats.rounds < a.tokens.len(),
        "no tree node was ever accepted"
    );
    // A tree of no nodes is a configuration error (trees from prompt lookup or with adaptive K
    // cannot be written).
    cfg.drafting = Drafting::tree(TreeDrafts::default(), 0);
    let mut hook = PlainLora::new(&f.adapter);
    assert!(matches!(
        decode::generate(&f.model, &prompt, &cfg, &mut hook, &mut |_| Ok(())),
        Err(cipherlora_speculative::SpecError::Config(
            cipherlora_speculative::ConfigError::ZeroK
        ))
    ));
}

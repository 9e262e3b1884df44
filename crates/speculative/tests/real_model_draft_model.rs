//! A separate draft model ([`DraftModel::Separate`]) on the real default model with the committed
//! code adapter, the plaintext LoRA hook standing in for the adapter server: greedy output equals
//! sequential adapted decoding whatever the drafter proposes, on the per-group schedule and on a
//! fixed point that drafts ahead, drafts with its own estimates and starts from drafted inputs
//! (all of which a separate drafter must leave alone). The base model loaded as a separate drafter
//! of the unadapted target keeps nearly all its drafts, which it cannot if its own KV cache falls
//! out of step with the context; a random model with the target's tokenizer keeps output exact;
//! another vocabulary and trees are refused.

mod common;

use std::path::Path;

use cipherlora_model::{
    LoadOptions, Model, NoAdapter, PlainLora, SyntheticQuant, WeightMode, fetch, synthetic_shape,
    write_synthetic_gguf, write_synthetic_gguf_with_tokenizer,
};
use cipherlora_speculative::decode::{self, DraftModel, Drafting, SpecConfig};
use cipherlora_speculative::schedule::{FixedPoint, Schedule};
use cipherlora_speculative::tree_draft::TreeDrafts;
use cipherlora_speculative::{ConfigError, SpecError};
use common::{PROMPTS, fixture, reference};

fn quantized(path: &Path) -> Model {
    let weights = WeightMode::Quantized;
    Model::load_with(path, &LoadOptions { weights }).expect("load the draft model")
}

fn schedules() -> [Schedule; 2] {
    [
        Schedule::PerGroup,
        Schedule::FixedPoint(FixedPoint {
            draft_ahead: true,
            shadow: true,
            drafted_start: true,
            drafter_estimates: true,
            ..FixedPoint::default()
        }),
    ]
}

/// Greedy output with `drafter` over the code prompts and schedules; (accepted, drafted).
fn exact_with(drafter: &Model, k: usize, n: usize) -> (usize, usize) {
    let f = fixture();
    let eos = f.tokenizer.eos_tokens().to_vec();
    let (mut accepted, mut drafted) = (0, 0);
    for text in PROMPTS {
        let prompt = f.tokenizer.encode(text).unwrap();
        let want = reference(f, &prompt, n);
        for schedule in schedules() {
            let cfg = SpecConfig {
                schedule,
                ..SpecConfig::greedy(k, n, eos.clone())
            };
            let mut hook = PlainLora::new(&f.adapter);
            let out = decode::generate_drafted(
                &f.model,
                DraftModel::Separate(drafter),
                &prompt,
                &cfg,
                &mut hook,
                &mut |_| Ok(()),
            )
            .unwrap();
            assert_eq!(out.tokens, want, "{text:?}, {schedule}: output differs");
            accepted += out.stats.accepted;
            drafted += out.stats.drafted;
        }
    }
    (accepted, drafted)
}

#[test]
fn the_base_model_as_a_separate_drafter_keeps_output_exact_and_its_cache_in_step() {
    let f = fixture();
    let path = fetch::ensure_default_model().expect("default model");
    let drafter = quantized(&path);
    exact_with(&drafter, 4, 24);
    // Without an adapter the target is the drafter's own network (f32 against quantized
    // weights): it keeps nearly every draft, which it cannot if its cache falls out of step
    // with the context. (With the code adapter it keeps ≈ 0.4 of them against ≈ 0.6 for a copy
    // whose cache holds the adapted rows.)
    let eos = f.tokenizer.eos_tokens().to_vec();
    let (mut accepted, mut drafted) = (0, 0);
    for text in PROMPTS {
        let prompt = f.tokenizer.encode(text).unwrap();
        let cfg = SpecConfig {
            delta_guided: false,
            ..SpecConfig::greedy(4, 24, eos.clone())
        };
        let out = decode::generate_drafted(
            &f.model,
            DraftModel::Separate(&drafter),
            &prompt,
            &cfg,
            &mut NoAdapter,
            &mut |_| Ok(()),
        )
        .unwrap();
        accepted += out.stats.accepted;
        drafted += out.stats.drafted;
    }
    let rate = accepted as f64 / drafted as f64;
    assert!(rate > 0.9, "acceptance {rate:.2} ({accepted}/{drafted})");
}

#[test]
fn a_random_drafter_with_the_targets_tokenizer_keeps_output_exact() {
    let dir = std::env::temp_dir().join(format!("cipherlora-draft-model-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("test-d1024.gguf");
    let from = fetch::ensure_default_model().expect("default model");
    let shape = synthetic_shape("test-d1024").unwrap();
    write_synthetic_gguf_with_tokenizer(&path, &shape, SyntheticQuant::Q4_1, 7, &from).unwrap();
    let drafter = quantized(&path);
    assert_ne!(
        drafter.config().num_layers,
        fixture().model.config().num_layers
    );
    let (accepted, drafted) = exact_with(&drafter, 3, 12);
    assert!(drafted > 0 && accepted < drafted, "{accepted}/{drafted}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_separate_drafter_needs_the_targets_vocabulary_and_drafts_chains_only() {
    let f = fixture();
    let dir = std::env::temp_dir().join(format!("cipherlora-draft-vocab-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("small-vocab.gguf");
    let mut shape = synthetic_shape("test-d1024").unwrap();
    shape.vocab_size = 1000;
    write_synthetic_gguf(&path, &shape, SyntheticQuant::Q4_1, 1).unwrap();
    let other = quantized(&path);
    let prompt = f.tokenizer.encode(PROMPTS[0]).unwrap();
    let eos = f.tokenizer.eos_tokens().to_vec();
    let run = |drafter: DraftModel<'_>, cfg: &SpecConfig| {
        let mut hook = PlainLora::new(&f.adapter);
        decode::generate_drafted(&f.model, drafter, &prompt, cfg, &mut hook, &mut |_| Ok(()))
    };
    let chain = SpecConfig::greedy(4, 8, eos.clone());
    match run(DraftModel::Separate(&other), &chain) {
        Err(SpecError::Config(ConfigError::DraftVocabulary { draft, target })) => {
            assert_ne!(draft, target)
        }
        other => panic!(
            "another vocabulary was accepted: {:?}",
            other.map(|o| o.tokens)
        ),
    }
    let tree = SpecConfig {
        drafting: Drafting::tree(TreeDrafts::default(), 8),
        ..SpecConfig::greedy(8, 8, eos)
    };
    match run(DraftModel::Separate(&f.model), &tree) {
        Err(SpecError::Config(ConfigError::TreeWithSeparateDrafter)) => {}
        other => panic!(
            "trees from a separate drafter: {:?}",
            other.map(|o| o.tokens)
        ),
    }
    // The same tree from a copy of the target's weights runs.
    assert!(run(DraftModel::Copy(&f.model), &tree).is_ok());
    std::fs::remove_dir_all(&dir).ok();
}

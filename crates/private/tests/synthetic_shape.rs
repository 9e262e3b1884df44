//! Private generation at a wider shape than the default model's: a synthetic
//! two-layer Llama of hidden size 1024 (random quantized weights, the
//! default model's tokenizer) with random adapters, standard LoRA on q,v and
//! FFA on q,k,v,o. Greedy private output equals the plaintext adapted
//! model's, under the per-group schedule and the fixed point.

// Shared helpers; this test needs no committed adapter.
#[allow(dead_code)]
mod common;

use std::path::Path;
use std::sync::Arc;

use cipherlora_model::{
    GenerateOptions, LoadOptions, LoraAdapter, Model, NoAdapter, Proj, RandomAdapterSpec,
    SamplingParams, SyntheticQuant, Tokenizer, WeightMode, fetch, generate, synthetic_shape,
    write_random_adapter, write_synthetic_gguf_with_tokenizer,
};
use cipherlora_private::{ConnectOptions, DraftLength, HeAdapter, InProcessOpener, connect_with};
use cipherlora_service::LinkProfile;
use cipherlora_speculative::decode::{self, ChainDrafter, Drafting, SpecConfig};
use cipherlora_speculative::replay::ReplayDrafts;
use cipherlora_speculative::schedule::Schedule;

use common::{assert_matches, plaintext_reference};

const TOKENS: usize = 10;

fn synthetic_model(dir: &Path) -> (Model, Tokenizer) {
    let path = dir.join("test-d1024.gguf");
    let shape = synthetic_shape("test-d1024").unwrap();
    let from = fetch::ensure_default_model().expect("default model");
    let written =
        write_synthetic_gguf_with_tokenizer(&path, &shape, SyntheticQuant::Q4_1, 3, &from).unwrap();
    let model = Model::load_with(
        &path,
        &LoadOptions {
            weights: WeightMode::F32,
        },
    )
    .unwrap();
    assert_eq!(model.config().vocab_size, written.vocab_size);
    assert_eq!(model.config().hidden_size, 1024);
    let tok = Tokenizer::for_model(&path).unwrap();
    assert_eq!(
        tok.encode("The river").unwrap(),
        Tokenizer::for_model(&from)
            .unwrap()
            .encode("The river")
            .unwrap(),
        "the default model's tokenizer"
    );
    (model, tok)
}

#[test]
fn private_greedy_equals_plaintext_at_hidden_size_1024() {
    let dir = std::env::temp_dir().join(format!("cipherlora-d1024-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (model, tok) = synthetic_model(&dir);
    let prompt = tok
        .encode("Once upon a time, in a quiet town by the sea,")
        .unwrap();
    let opts = GenerateOptions {
        max_tokens: TOKENS,
        sampling: SamplingParams::greedy(),
        eos: tok.eos_tokens().to_vec(),
    };
    let base = generate(&model, &prompt, &opts, &mut NoAdapter, &mut |_| Ok(()))
        .unwrap()
        .tokens;
    for (name, targets, ffa) in [
        ("standard-qv", vec![Proj::Q, Proj::V], false),
        ("ffa-qkvo", vec![Proj::Q, Proj::K, Proj::V, Proj::O], true),
    ] {
        let adir = dir.join(name);
        let spec = RandomAdapterSpec {
            targets,
            rank: 16,
            alpha: 32.0,
            b_std: 0.2,
            ffa,
            seed: 5,
        };
        write_random_adapter(&adir, model.config(), &spec).unwrap();
        let plain = LoraAdapter::load(&adir, model.config()).unwrap();
        let want = plaintext_reference(&model, &tok, &plain, &prompt, TOKENS);
        assert_ne!(want, base, "{name}: the adapter must change the output");
        let server = Arc::new(HeAdapter::load(&adir, model.config()).unwrap());
        for schedule in [Schedule::PerGroup, Schedule::FixedPoint(Default::default())] {
            let mut opener = InProcessOpener {
                server: server.clone(),
                link: LinkProfile::LOOPBACK,
            };
            let options = ConnectOptions {
                draft: DraftLength::Fixed(3),
                acceptance_prior: None,
                prefill_width: cipherlora_private::PrefillWidth::Fixed(8),
                schedule: Some(schedule),
                grouping: None,
                planning_link: None,
            };
            let session = connect_with(&mut opener, &options, (&model, &model)).unwrap();
            let mut hook = session.hook;
            let cfg = SpecConfig {
                prefill_width: Some(8),
                schedule,
                ..common::greedy_spec(3, TOKENS, &tok)
            };
            let got = decode::generate(&model, &prompt, &cfg, &mut hook, &mut |_| Ok(())).unwrap();
            assert_matches(&got, &want, &tok, &format!("{name}, {schedule:?}"));
            // Drafts of a set acceptance (random weights draft nothing useful): still exact,
            // and right drafts are kept.
            let replay = SpecConfig {
                drafting: Drafting::chain(
                    ChainDrafter::Replay(ReplayDrafts {
                        prompt_len: prompt.len(),
                        continuation: want.clone(),
                        acceptance: 0.7,
                        seed: 1,
                        vocab_size: model.config().vocab_size,
                    }),
                    3,
                ),
                ..cfg.clone()
            };
            let got =
                decode::generate(&model, &prompt, &replay, &mut hook, &mut |_| Ok(())).unwrap();
            assert_matches(&got, &want, &tok, &format!("{name}, {schedule:?}, replay"));
            assert!(got.stats.rounds < TOKENS, "{:?}", got.stats);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

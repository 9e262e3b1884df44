//! Verify rounds certified against the residual the cached rows carry
//! ([`cipherlora_speculative::schedule::FixedPoint::shadow`]), on the real default model with the
//! committed general-English adapter (q,k,v,o, r = 16), the plaintext LoRA hook standing in for the
//! adapter server.
//!
//! The regression this pins: on the second held-out general prompt, the all-linear adapter
//! (`general-all-r8`) and the default three trips per round changed the greedy output at token 9, a
//! near-tie 4e-4 logits wide that the cached rows' residual flipped (`cargo run --release -p
//! cipherlora-speculative --example exactness -- --adapters general-all-r8 --widths 8 --trips 3 --skip 1
//! --limit 1`). With the shadow the round stalls there, the cached rows (the prompt's too) are
//! settled, and the output equals sequential adapted decoding.

mod common;

use cipherlora_model::PlainLora;
use cipherlora_speculative::decode::SpecConfig;
use common::{drafted, fixture, load_adapter, reference_with};

/// Prompt `i` of `adapters/eval/general_prompts.jsonl`.
fn general_prompt(i: usize) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../adapters/eval/general_prompts.jsonl");
    let text = std::fs::read_to_string(path).expect("general prompts");
    let line = text.lines().nth(i).expect("a prompt");
    let v: serde_json::Value = serde_json::from_str(line).expect("json");
    v["prompt"].as_str().expect("prompt").to_string()
}

#[test]
fn a_shadow_cache_keeps_the_near_tie_three_trips_flipped_at_token_9() {
    let f = fixture();
    let adapter = load_adapter("general-all-r8", &f.model);
    // The exactness example's setting: f16 drafter, T = 8, prefill in passes of 16 positions.
    let drafter = f.model.to_f16_weights().expect("f16 drafter");
    let prompt = f.tokenizer.encode(&general_prompt(1)).unwrap();
    let n = 12;
    let want = reference_with(f, &adapter, &prompt, n);
    let cfg = SpecConfig {
        prefill_width: Some(16),
        schedule: "fixed-point/shadow".parse().unwrap(),
        ..SpecConfig::greedy(7, n, f.tokenizer.eos_tokens().to_vec())
    };
    let mut hook = PlainLora::new(&adapter);
    let got = drafted(f, &drafter, &prompt, &cfg, &mut hook);
    assert_eq!(got.tokens, want, "{:?}", got.stats);
    assert!(got.stats.settles >= 1, "{:?}", got.stats);
    // Every round, settling included, is three trips.
    assert_eq!(
        got.stats.round_trips,
        3 * got.stats.rounds,
        "{:?}",
        got.stats
    );
}

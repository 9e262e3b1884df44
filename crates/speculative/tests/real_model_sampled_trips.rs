//! Sampled generations under the fixed-point schedule run the fixed point a sampled row can be
//! certified with ([`cipherlora_speculative::schedule::FixedPoint::for_sampling`]), on the real default
//! model with the committed code adapter, the plaintext LoRA hook standing in for the adapter
//! server.
//!
//! The regressions this pins: a sampled row is certified only when its logits' remaining error is
//! at most 10⁻⁴. With coarse trips (the default of every fixed point) each batch's last change
//! measured the coarse trip's rounding, and rounds continued until the pass ran out of coarse
//! trips: 9.7 batched trips per generated token at T = 12 with two trips per round, against 1.1
//! with exact trips (`cargo run --release -p cipherlora-speculative --example exactness -- --adapters
//! code-lora-r16 --widths 12 --trips 2 --shadow true --prefill per-group --coarse 4 --temperature
//! 1.0 --limit 6`). With exact trips but the shadow cache of two shadowed trips (`auto`'s schedule
//! for a high-agreement adapter) this test's generation took 166 trips for 16 tokens (70
//! continuations and 4 settlings, the shadow's rows far less converged than the kept ones); it
//! takes 32 now.

mod common;

use cipherlora_model::SamplingParams;
use cipherlora_speculative::decode::SpecConfig;
use common::{PROMPTS, Recording, drafted, fixture};

/// Batched trips (coarse, exact) of a 16-token generation of `PROMPTS[0]` at `temperature` under
/// two shadowed trips per round (the `auto` schedule of a high-agreement adapter), K = 7.
fn trips(temperature: f32) -> (usize, usize, usize) {
    let f = fixture();
    let prompt = f.tokenizer.encode(PROMPTS[0]).unwrap();
    let n = 16;
    let cfg = SpecConfig {
        prefill_width: Some(16),
        schedule: "fixed-point:2/shadow".parse().unwrap(),
        sampling: SamplingParams {
            temperature,
            seed: 3,
            ..SamplingParams::default()
        },
        ..SpecConfig::greedy(7, n, f.tokenizer.eos_tokens().to_vec())
    };
    let mut hook = Recording::new(&f.adapter);
    let out = drafted(f, &f.model, &prompt, &cfg, &mut hook);
    assert_eq!(out.tokens.len(), n, "{:?}", out.stats);
    (hook.coarse, hook.trips.len(), out.stats.round_trips)
}

#[test]
fn sampled_rounds_ask_exact_trips_without_the_shadow_where_greedy_rounds_ask_coarse_ones() {
    let (coarse, exact, verify_trips) = trips(1.0);
    assert_eq!(
        coarse, 0,
        "a sampled generation asked {coarse} coarse trips"
    );
    assert!(exact >= verify_trips && verify_trips > 0);
    // 32 now; 166 with the shadow, about 155 with coarse trips.
    assert!(
        verify_trips <= 4 * 16,
        "{verify_trips} verify trips for 16 sampled tokens"
    );
    // Greedy generations keep their coarse trips.
    let (coarse, _, _) = trips(0.0);
    assert!(coarse > 0);
}

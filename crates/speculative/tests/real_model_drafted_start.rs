//! The drafter's share of a fixed-point round on the real default model with the committed code
//! adapter, the plaintext LoRA hook standing in for the adapter server: the first trip sent from
//! the inputs the drafter recorded ([`cipherlora_speculative::schedule::FixedPoint::drafted_start`]) and
//! the estimate passes run on the drafter's quantized weights
//! ([`cipherlora_speculative::schedule::FixedPoint::drafter_estimates`]).

mod common;

use cipherlora_model::{GroupInput, LoadOptions, Model, PlainLora, WeightMode, fetch};
use cipherlora_speculative::decode::SpecConfig;
use cipherlora_speculative::schedule::Schedule;
use common::{PROMPTS, Recording, drafted, fixture, reference};

fn config(schedule: &str, guided: bool, n: usize, eos: Vec<u32>) -> SpecConfig {
    SpecConfig {
        delta_guided: guided,
        schedule: schedule.parse::<Schedule>().unwrap(),
        ..SpecConfig::greedy(7, n, eos)
    }
}

fn max_relative_difference(a: &[GroupInput], b: &[GroupInput]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            assert_eq!((x.layer, x.group), (y.layer, y.group));
            let d = (&x.x - &y.x).unwrap().abs().unwrap().max_all().unwrap();
            let s = y.x.abs().unwrap().max_all().unwrap();
            d.to_scalar::<f32>().unwrap() / s.to_scalar::<f32>().unwrap()
        })
        .fold(0.0, f32::max)
}

/// With the target as its own drafter, no guide and no guess, the inputs the drafter records for
/// the first round are the ones pass 0 computes (up to the float error of one position at a time
/// against eight): the recorded rows are the window's positions, in order, the last draft's
/// included.
#[test]
fn the_drafter_records_the_inputs_pass_zero_would_send() {
    let f = fixture();
    let prompt = f.tokenizer.encode(PROMPTS[0]).unwrap();
    let eos = f.tokenizer.eos_tokens().to_vec();
    let mut first_trips = Vec::new();
    for schedule in [
        "fixed-point/base-start/drafted-start/exact-trips/batched",
        "fixed-point/base-start/exact-trips/batched",
    ] {
        let cfg = config(schedule, false, 8, eos.clone());
        let mut hook = Recording::new(&f.adapter);
        let got = drafted(f, &f.model, &prompt, &cfg, &mut hook);
        assert_eq!(got.tokens, reference(f, &prompt, 8), "{schedule}");
        // Every verify pass (continuations are more trips of the same pass) starts from the drafter
        // when asked to.
        let passes = got.stats.rounds - got.stats.continuations;
        assert_eq!(
            got.stats.drafted_starts,
            usize::from(schedule.contains("drafted")) * passes,
            "{schedule}: {:?}",
            got.stats
        );
        // The prompt's prefill trips come first.
        first_trips.push(hook.trips[got.stats.prefill_round_trips].clone());
    }
    let diff = max_relative_difference(&first_trips[0], &first_trips[1]);
    assert!(diff < 1e-4, "drafted and pass-0 inputs differ by {diff}");
}

/// Two shadowed trips and the default three, each round started from the quantized drafter's inputs
/// and its estimate passes run on the quantized weights: greedy output equals sequential adapted
/// decoding with f32 weights, and every round is the schedule's trips.
#[test]
fn drafted_starts_and_drafter_estimates_keep_greedy_output() {
    let f = fixture();
    let path = fetch::ensure_default_model().unwrap();
    let quantized = Model::load_with(
        &path,
        &LoadOptions {
            weights: WeightMode::Quantized,
        },
    )
    .unwrap();
    let eos = f.tokenizer.eos_tokens().to_vec();
    let n = 16;
    for (schedule, trips) in [
        ("fixed-point:2/shadow/drafted-start/drafter-estimates", 2),
        ("fixed-point/drafted-start/drafter-estimates", 3),
    ] {
        let mut starts = 0;
        for text in &PROMPTS[..2] {
            let prompt = f.tokenizer.encode(text).unwrap();
            let cfg = config(schedule, true, n, eos.clone());
            let mut hook = PlainLora::new(&f.adapter);
            let got = drafted(f, &quantized, &prompt, &cfg, &mut hook);
            assert_eq!(
                got.tokens,
                reference(f, &prompt, n),
                "{schedule}, {text:?}: output differs"
            );
            assert_eq!(
                got.stats.round_trips,
                trips * got.stats.rounds,
                "{schedule}"
            );
            starts += got.stats.drafted_starts;
        }
        assert!(starts > 0, "{schedule}: no round started from the drafter");
    }
}

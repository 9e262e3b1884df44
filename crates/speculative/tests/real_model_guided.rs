//! Delta-guided drafting ([`cipherlora_speculative::draft_bias`]) on the real default model with the
//! committed general-English adapter (q,k,v,o, r = 16), the plaintext LoRA hook standing in for the
//! adapter server: greedy output equals sequential adapted decoding with and without the guidance,
//! on the per-group and the fixed-point schedule (whose drafting ahead takes its guide from the
//! pass before the last trip), and the guided drafter needs fewer verify rounds for the same
//! tokens.

mod common;

use cipherlora_model::PlainLora;
use cipherlora_speculative::decode::SpecConfig;
use cipherlora_speculative::schedule::{FixedPoint, Schedule};
use common::{drafted, fixture, load_adapter, reference_with};

/// Prose prompts (those of the `convergence` example), not from the adapter's training text.
const PROSE: [&str; 2] = [
    "The old lighthouse keeper climbed the stairs every evening, and",
    "Rivers shape the land around them in several ways. First,",
];

fn config(guided: bool, schedule: Schedule, k: usize, n: usize, eos: Vec<u32>) -> SpecConfig {
    SpecConfig {
        delta_guided: guided,
        schedule,
        ..SpecConfig::greedy(k, n, eos)
    }
}

#[test]
fn delta_guided_drafts_keep_greedy_output_and_need_fewer_rounds() {
    let f = fixture();
    let adapter = load_adapter("general-lora-r16", &f.model);
    let (k, n) = (12, 32);
    let eos = f.tokenizer.eos_tokens().to_vec();
    // The fixed point starts each pass from the base model here: a guessed start (the default)
    // certifies more rows for both drafters, which on these two prompts evens out their round
    // counts (11 and 11) and would hide what this test measures, the drafts.
    let schedules = [
        Schedule::PerGroup,
        Schedule::FixedPoint(FixedPoint {
            guessed_start: false,
            ..FixedPoint::default()
        }),
    ];
    let mut rounds = [[0usize; 2]; 2];
    for text in PROSE {
        let prompt = f.tokenizer.encode(text).unwrap();
        let want = reference_with(f, &adapter, &prompt, n);
        for (s, schedule) in schedules.iter().enumerate() {
            for (g, guided) in [false, true].into_iter().enumerate() {
                let cfg = config(guided, *schedule, k, n, eos.clone());
                let mut hook = PlainLora::new(&adapter);
                let got = drafted(f, &f.model, &prompt, &cfg, &mut hook);
                assert_eq!(
                    got.tokens, want,
                    "{text:?}, {schedule}, guided {guided}: output differs"
                );
                rounds[s][g] += got.stats.rounds;
            }
        }
    }
    for (s, schedule) in schedules.iter().enumerate() {
        let [plain, guided] = rounds[s];
        assert!(
            guided < plain,
            "{schedule}: delta-guided drafting took {guided} rounds, the plain drafter {plain}"
        );
    }
}

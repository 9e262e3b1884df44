//! The `bench chat` conversation (prose, a pasted document) through the prefix cache with the
//! fixed point `auto` runs, the plaintext LoRA standing in for the adapter server: every answer
//! equals sequential decoding of the adapted model over the whole conversation, and a stall
//! settles the answer's own rows before the rows since the last settling
//! (docs/design/schedules.md, "The inherited residual").

use std::path::PathBuf;

use cipherlora_bench::chat::{SYSTEM, TURNS, user_turn};
use cipherlora_model::{
    ChatMessage, GenerateOptions, LoadOptions, LoraAdapter, Model, PlainLora, SamplingParams,
    Tokenizer, WeightMode, fetch, generate,
};
use cipherlora_speculative::decode::{self, PrefillSpan, SpecConfig, SpecStats};
use cipherlora_speculative::prefix_cache::PrefixCache;
use cipherlora_speculative::schedule::{FixedPoint, Prefill, Schedule};

const TOKENS: usize = 48;

/// Each turn's stats; panics when an answer differs from sequential adapted decoding.
/// `first_from_prefill`: the endpoint's setting ([`SpecConfig::first_token_from_prefill`]).
fn chat(adapter: &str, fixed: FixedPoint, k: usize, first_from_prefill: bool) -> Vec<SpecStats> {
    let path = fetch::ensure_default_model().unwrap();
    let model = Model::load_with(
        &path,
        &LoadOptions {
            weights: WeightMode::F32,
        },
    )
    .unwrap();
    let tokenizer = Tokenizer::for_model(&path).unwrap();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../adapters")
        .join(adapter);
    let adapter = LoraAdapter::load(&dir, model.config()).unwrap();
    let eos = tokenizer.eos_tokens().to_vec();
    let cfg = SpecConfig {
        prefill_width: Some(32),
        first_token_from_prefill: first_from_prefill,
        prefill_span: PrefillSpan::default(),
        schedule: Schedule::FixedPoint(FixedPoint {
            prefill: Prefill::PerGroup,
            ..fixed
        }),
        ..SpecConfig::greedy(k, TOKENS, eos.clone())
    };
    let mut cache = PrefixCache::new(256 << 20).unwrap();
    let mut messages = vec![ChatMessage::new("system", SYSTEM)];
    let mut stats = Vec::new();
    for turn in 0..TURNS.len() {
        messages.push(ChatMessage::new("user", user_turn(turn)));
        let text = tokenizer.render_chat(&messages, true).unwrap();
        let prompt = tokenizer.encode(&text).unwrap();
        let want = generate(
            &model,
            &prompt,
            &GenerateOptions {
                max_tokens: TOKENS,
                sampling: SamplingParams::greedy(),
                eos: eos.clone(),
            },
            &mut PlainLora::new(&adapter),
            &mut |_| Ok(()),
        )
        .unwrap()
        .tokens;
        let hit = cache.take(&prompt, &cfg.effective_schedule()).unwrap();
        let (out, kept) = decode::generate_cached(
            &model,
            &model,
            &prompt,
            &cfg,
            &mut PlainLora::new(&adapter),
            &mut |_| Ok(()),
            hit.map(|h| h.context),
        )
        .unwrap();
        assert_eq!(out.tokens, want, "turn {turn}");
        stats.push(out.stats.clone());
        cache.put(kept).unwrap();
        let answer = tokenizer.decode(&out.tokens).unwrap();
        messages.push(ChatMessage::new("assistant", answer));
    }
    stats
}

/// `auto`'s fixed point for a hintless adapter at K = 5, the first token of each answer taken
/// from the first verify pass (as `bench e2e` runs): the document turn stalls on the prompt's
/// last row.
#[test]
fn a_prose_chat_with_a_document_stays_exact_through_its_settlings() {
    let three = FixedPoint {
        shadow: true,
        ..FixedPoint::default()
    };
    let stats = chat("general-lora-r16", three, 5, false);
    // A settling of every row since the last one reruns the whole conversation (about 70
    // rounds of width 6 at the document turn); the answer's own rows take a few.
    for (turn, s) in stats.iter().enumerate() {
        assert!(s.rounds <= TOKENS / 2, "turn {turn}: {} rounds", s.rounds);
    }
    assert!(
        stats.iter().any(|s| s.settles > 0),
        "the conversation no longer stalls: find one that does"
    );
}

/// `auto`'s two shadowed trips for an adapter with a high acceptance hint (the FFA code adapter)
/// on the same prose chat: it stalls and settles in several turns, and stays exact.
#[test]
fn two_shadowed_trips_stay_exact_through_the_settlings_of_a_prose_chat() {
    let two = FixedPoint {
        round_trips: 2,
        shadow: true,
        drafter_estimates: true,
        ..FixedPoint::default()
    };
    let stats = chat("code-ffa-r16", two, 7, true);
    assert!(
        stats.iter().filter(|s| s.settles > 0).count() > 1,
        "the conversation no longer stalls: find one that does"
    );
}

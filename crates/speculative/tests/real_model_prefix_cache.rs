//! Prefix caching across a chat's requests ([`cipherlora_speculative::prefix_cache`]) on the real default
//! model with the committed standard LoRA adapter, the plaintext LoRA hook standing in for the
//! adapter server: every turn's greedy answer equals sequential decoding of the adapted model over
//! the whole conversation, while only the tokens after the cached prefix are prefilled.

use cipherlora_model::{ChatMessage, PlainLora};
use cipherlora_speculative::decode::{self, SpecConfig, SpecOutput};
use cipherlora_speculative::prefix_cache::{CachedContext, PrefixCache};
use cipherlora_speculative::schedule::{FixedPoint, Prefill, Schedule};

mod common;
use common::{Fixture, fixture, reference};

const TOKENS: usize = 12;

fn config(f: &Fixture, schedule: Schedule) -> SpecConfig {
    SpecConfig {
        prefill_width: Some(16),
        first_token_from_prefill: true,
        prefill_span: cipherlora_speculative::decode::PrefillSpan::default(),
        schedule,
        ..SpecConfig::greedy(6, TOKENS, f.tokenizer.eos_tokens().to_vec())
    }
}

fn run(
    f: &Fixture,
    cfg: &SpecConfig,
    prompt: &[u32],
    cached: Option<CachedContext>,
) -> (SpecOutput, CachedContext) {
    let mut hook = PlainLora::new(&f.adapter);
    decode::generate_cached(
        &f.model,
        &f.model,
        prompt,
        cfg,
        &mut hook,
        &mut |_| Ok(()),
        cached,
    )
    .unwrap()
}

fn chat_prompt(f: &Fixture, messages: &[ChatMessage]) -> Vec<u32> {
    let text = f.tokenizer.render_chat(messages, true).unwrap();
    f.tokenizer.encode(&text).unwrap()
}

const TURNS: [&str; 3] = [
    "Write a Python function that reverses a string.",
    "Now make it skip whitespace.",
    "Add a docstring and a test.",
];

fn schedules() -> [Schedule; 4] {
    [
        Schedule::PerGroup,
        Schedule::FixedPoint(FixedPoint::default()),
        Schedule::FixedPoint(FixedPoint {
            prefill: Prefill::PerGroup,
            ..FixedPoint::default()
        }),
        // `auto`'s schedule for a hintless adapter: reused rows keep their shadow and settling.
        Schedule::FixedPoint(FixedPoint {
            prefill: Prefill::PerGroup,
            shadow: true,
            ..FixedPoint::default()
        }),
    ]
}

#[test]
fn a_chat_reusing_its_prefix_answers_as_sequential_adapted_decoding() {
    let f = fixture();
    for schedule in schedules() {
        let cfg = config(f, schedule);
        let mut messages = vec![ChatMessage::new(
            "system",
            "You are a helpful coding assistant.",
        )];
        let mut cache = PrefixCache::new(256 << 20).unwrap();
        for (turn, text) in TURNS.iter().enumerate() {
            messages.push(ChatMessage::new("user", *text));
            let prompt = chat_prompt(f, &messages);
            let hit = cache.take(&prompt, &cfg.effective_schedule()).unwrap();
            let (out, kept) = run(f, &cfg, &prompt, hit.map(|h| h.context));
            assert_eq!(
                out.tokens,
                reference(f, &prompt, TOKENS),
                "{schedule}, turn {turn}"
            );
            let stats = &out.stats;
            // A prefill group by group covers the last prompt token too (the first token comes
            // from its row); otherwise that token opens the first verify pass.
            assert_eq!(
                stats.cached_tokens
                    + stats.prefilled_tokens
                    + usize::from(!schedule.prefills_per_group()),
                prompt.len(),
                "{schedule}, turn {turn}: every prompt token is cached or prefilled"
            );
            if turn == 0 {
                assert_eq!(stats.cached_tokens, 0);
            } else {
                // The previous prompt at least, and the answer's tokens as
                // far as the template re-tokenizes them alike.
                assert!(
                    stats.cached_tokens > prompt.len() / 2,
                    "{schedule}, turn {turn}: {} of {} cached",
                    stats.cached_tokens,
                    prompt.len()
                );
            }
            assert_eq!(
                kept.tokens(),
                &[prompt.as_slice(), &out.tokens].concat()[..kept.tokens().len()]
            );
            cache.put(kept).unwrap();
            let answer = f.tokenizer.decode(&out.tokens).unwrap();
            messages.push(ChatMessage::new("assistant", answer));
        }
    }
}

#[test]
fn an_edited_earlier_turn_is_prefilled_from_its_first_difference() {
    let f = fixture();
    for schedule in schedules() {
        let cfg = config(f, schedule);
        let messages = vec![
            ChatMessage::new("system", "You are a helpful coding assistant."),
            ChatMessage::new("user", TURNS[0]),
        ];
        let prompt = chat_prompt(f, &messages);
        let (_, kept) = run(f, &cfg, &prompt, None);
        // Same length, one token changed in the user's turn.
        let mut edited = prompt.clone();
        let at = prompt.len() - 8;
        edited[at] = if edited[at] == 1000 { 1001 } else { 1000 };
        let mut cache = PrefixCache::new(256 << 20).unwrap();
        cache.put(kept).unwrap();
        let hit = cache
            .take(&edited, &cfg.effective_schedule())
            .unwrap()
            .expect("the system prompt is shared");
        assert_eq!(hit.reused, at, "{schedule}");
        assert_eq!(
            cache.len(),
            1,
            "{schedule}: the unedited conversation stays cached"
        );
        let (out, _) = run(f, &cfg, &edited, Some(hit.context));
        assert_eq!(out.stats.cached_tokens, at, "{schedule}");
        assert_eq!(out.tokens, reference(f, &edited, TOKENS), "{schedule}");
    }
}

#[test]
fn eviction_under_the_budget_keeps_answers_exact() {
    let f = fixture();
    let cfg = config(f, Schedule::PerGroup);
    let chat = |text: &str| {
        chat_prompt(
            f,
            &[
                ChatMessage::new("system", "You answer briefly."),
                ChatMessage::new("user", text),
            ],
        )
    };
    let (a, b) = (chat(TURNS[0]), chat(TURNS[1]));
    let (out_a, kept_a) = run(f, &cfg, &a, None);
    // A budget that holds one context of this size (as stored), not two.
    let mut probe = PrefixCache::new(1 << 30).unwrap();
    probe.put(kept_a).unwrap();
    let budget = probe.bytes() * 3 / 2;
    let whole = [a.as_slice(), &out_a.tokens].concat();
    let kept_a = probe
        .take(&whole, &Schedule::PerGroup)
        .unwrap()
        .unwrap()
        .context;
    let mut cache = PrefixCache::new(budget).unwrap();
    assert_eq!(cache.put(kept_a).unwrap(), 0);
    let (_, kept_b) = run(f, &cfg, &b, None);
    assert_eq!(cache.put(kept_b).unwrap(), 1, "a is evicted");
    assert_eq!(cache.len(), 1);
    assert!(cache.bytes() <= budget);
    // `a` again: only the system prompt is shared now (with b's entry).
    let hit = cache.take(&a, &cfg.effective_schedule()).unwrap();
    let reused = hit.as_ref().map_or(0, |h| h.reused);
    assert!(reused < a.len() - 8, "a's own rows were evicted");
    assert!(reused > 0, "the system prompt is shared");
    assert_eq!(cache.len(), 1, "b's entry keeps its rows for b's next turn");
    let (out, _) = run(f, &cfg, &a, hit.map(|h| h.context));
    assert_eq!(out.stats.cached_tokens, reused);
    assert_eq!(out.tokens, reference(f, &a, TOKENS));
}

#[test]
fn a_budget_of_zero_is_refused_and_other_schedules_do_not_share_contexts() {
    let f = fixture();
    assert!(PrefixCache::new(0).is_err());
    let cfg = config(f, Schedule::PerGroup);
    let prompt = chat_prompt(f, &[ChatMessage::new("user", TURNS[0])]);
    let (_, kept) = run(f, &cfg, &prompt, None);
    let mut cache = PrefixCache::new(64 << 20).unwrap();
    cache.put(kept).unwrap();
    let other = Schedule::FixedPoint(FixedPoint::default());
    assert!(cache.take(&prompt, &other).unwrap().is_none());
    let hit = cache.take(&prompt, &Schedule::PerGroup).unwrap().unwrap();
    // The whole prompt is cached, yet its last token is prefilled again:
    // its row gives the first token.
    let (out, _) = run(f, &cfg, &prompt, Some(hit.context));
    assert_eq!(out.stats.cached_tokens, prompt.len() - 1);
    assert_eq!(out.tokens, reference(f, &prompt, TOKENS));
}

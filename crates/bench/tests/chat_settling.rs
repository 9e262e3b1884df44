//! The `bench chat` conversation (prose, a pasted document) through the prefix cache with the
//! fixed point `auto` runs for a hintless adapter (`fixed-point:3/shadow`, group-by-group
//! prefill), the plaintext LoRA standing in for the adapter server: every answer equals
//! sequential decoding of the adapted model over the whole conversation, and a stall settles
//! the answer's own rows before the rows since the last settling
//! (docs/design/schedules.md, "The inherited residual").

use std::path::PathBuf;

use cipherlora_bench::chat::{SYSTEM, TURNS, user_turn};
use cipherlora_model::{
    ChatMessage, GenerateOptions, LoadOptions, LoraAdapter, Model, PlainLora, SamplingParams,
    Tokenizer, WeightMode, fetch, generate,
};
use cipherlora_speculative::decode::{self, PREFILL_SPAN, SpecConfig};
use cipherlora_speculative::prefix_cache::PrefixCache;
use cipherlora_speculative::schedule::{FixedPoint, Prefill, Schedule};

const TOKENS: usize = 48;

#[test]
fn a_prose_chat_with_a_document_stays_exact_through_its_settlings() {
    let path = fetch::ensure_default_model().unwrap();
    let model = Model::load_with(
        &path,
        &LoadOptions {
            weights: WeightMode::F32,
        },
    )
    .unwrap();
    let tokenizer = Tokenizer::for_model(&path).unwrap();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../adapters/general-lora-r16");
    let adapter = LoraAdapter::load(&dir, model.config()).unwrap();
    let eos = tokenizer.eos_tokens().to_vec();
    let cfg = SpecConfig {
        prefill_width: Some(32),
        first_token_from_prefill: true,
        prefill_span: PREFILL_SPAN,
        schedule: Schedule::FixedPoint(FixedPoint {
            prefill: Prefill::PerGroup,
            shadow: true,
            ..FixedPoint::default()
        }),
        ..SpecConfig::greedy(5, TOKENS, eos.clone())
    };
    let mut cache = PrefixCache::new(256 << 20).unwrap();
    let mut messages = vec![ChatMessage::new("system", SYSTEM)];
    let mut settles = 0;
    // A settling of every row since the last one reruns the whole conversation (about 70
    // rounds of width 6 at the document turn); the answer's own rows take a few.
    let most_rounds = TOKENS / 2;
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
        assert!(
            out.stats.rounds <= most_rounds,
            "turn {turn}: {} rounds",
            out.stats.rounds
        );
        settles += out.stats.settles;
        cache.put(kept).unwrap();
        let answer = tokenizer.decode(&out.tokens).unwrap();
        messages.push(ChatMessage::new("assistant", answer));
    }
    assert!(
        settles > 0,
        "the conversation no longer stalls: find one that does"
    );
}

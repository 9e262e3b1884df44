//! End to end, in one process: the real default model, the committed
//! adapters, CKKS under the HE-LoRA plans, speculative decoding. The private
//! greedy output must equal the plaintext adapted output token for token.

mod common;

use std::sync::{Arc, OnceLock};

use cipherlora_model::{LoraAdapter, Model, Tokenizer, fetch};
use cipherlora_private::{HeAdapter, HeHook, InProcess};
use cipherlora_spec::decode::{self};

fn model() -> &'static (Model, Tokenizer) {
    static M: OnceLock<(Model, Tokenizer)> = OnceLock::new();
    M.get_or_init(|| {
        let path = fetch::ensure_default_model().expect("default model");
        (
            Model::load(&path).unwrap(),
            Tokenizer::for_model(&path).unwrap(),
        )
    })
}

use common::{PROMPTS, adapter_dir, assert_matches, plaintext_reference};

const TOKENS: usize = 32;

/// `f16_drafter`: the base drafter holds f16 weights (the CLI's default),
/// else it shares the target's f32 weights.
fn private_matches_plaintext(adapter: &str, k: usize, f16_drafter: bool) {
    let (model, tok) = model();
    let half = model.to_f16_weights().unwrap();
    let drafter_model = if f16_drafter { &half } else { model };
    let dir = adapter_dir(adapter);
    let server = HeAdapter::load(&dir, model.config()).unwrap();
    let offer = server.offer(k + 1).unwrap();
    let mut hook = HeHook::connect(&offer, model.config(), |keys, _| {
        Ok(InProcess::new(Arc::new(server.open_session(&offer, keys)?)))
    })
    .unwrap();
    let plain = LoraAdapter::load(&dir, model.config()).unwrap();
    for text in PROMPTS {
        let prompt = tok.encode(text).unwrap();
        let want = plaintext_reference(model, tok, &plain, &prompt, TOKENS);
        let cfg = common::greedy_spec(k, TOKENS, tok);
        let got =
            decode::generate_drafted(model, drafter_model, &prompt, &cfg, &mut hook, &mut |_| {
                Ok(())
            })
            .unwrap();
        assert_matches(&got, &want, tok, &format!("{adapter} on {text:?}"));
        assert!(got.stats.rounds < want.len(), "speculation saved no round");
    }
    let t = hook.timings();
    eprintln!("{adapter}: {t:?}");
    assert!(t.rounds > 0 && t.bytes_up > 0 && t.bytes_down > 0);
}

#[test]
fn private_greedy_speculative_equals_plaintext_ffa() {
    private_matches_plaintext("code-ffa-r16", 4, true);
}

/// K = 8 here (T = 9 positions, the other verify width the demo and the
/// benchmarks use): with drafts over the adapted prefix it takes fewer
/// rounds than K = 4, which keeps the slowest test of the suite shorter.
#[test]
fn private_greedy_speculative_equals_plaintext_standard() {
    private_matches_plaintext("code-lora-r16", 8, false);
}

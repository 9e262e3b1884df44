//! End to end, in one process: the real default model, the committed adapters, CKKS under the
//! HE-LoRA plans, speculative decoding. The private greedy output must equal the plaintext adapted
//! output token for token.

mod common;

use std::sync::{Arc, OnceLock};

use cipherlora_model::{LoadOptions, LoraAdapter, Model, Tokenizer, WeightMode, fetch};
use cipherlora_private::{HeAdapter, HeHook, InProcess};
use cipherlora_speculative::decode::{self};

/// The default model twice: with f32 weights (what a private client verifies with by default) and
/// with its weights kept quantized (the default drafter, and `--weights quantized`).
struct Models {
    f32: Model,
    quantized: Model,
    tok: Tokenizer,
}

fn models() -> &'static Models {
    static M: OnceLock<Models> = OnceLock::new();
    M.get_or_init(|| {
        let path = fetch::ensure_default_model().expect("default model");
        let load = |weights| Model::load_with(&path, &LoadOptions { weights }).unwrap();
        Models {
            f32: load(WeightMode::F32),
            quantized: load(WeightMode::Quantized),
            tok: Tokenizer::for_model(&path).unwrap(),
        }
    })
}

use common::{PROMPTS, adapter_dir, assert_matches, plaintext_reference};

const TOKENS: usize = 32;

/// The private output of `model` (drafts by `drafter_model`) against the plaintext adapted output
/// of `model`, on `prompts`.
fn private_matches_plaintext(
    adapter: &str,
    k: usize,
    (model, drafter_model): (&Model, &Model),
    prompts: &[&str],
) {
    let tok = &models().tok;
    let dir = adapter_dir(adapter);
    let server = HeAdapter::load(&dir, model.config()).unwrap();
    let offer = server.offer(k + 1).unwrap();
    let mut hook = HeHook::connect(&offer, model.config(), |keys, _| {
        Ok(InProcess::new(Arc::new(server.open_session(&offer, keys)?)))
    })
    .unwrap();
    let plain = LoraAdapter::load(&dir, model.config()).unwrap();
    for text in prompts {
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

/// The CLI's default: an f32 target, a quantized drafter. Three of the five prompts (CI time;
/// `fixed_point_schedule` runs all five over the fixed point, and the per-group schedule run here
/// is exact by construction).
#[test]
fn private_greedy_speculative_equals_plaintext_ffa() {
    let m = models();
    private_matches_plaintext("code-ffa-r16", 4, (&m.f32, &m.quantized), &PROMPTS[..3]);
}

/// K = 8 here (T = 9 positions, the other verify width the demo and the benchmarks use): with
/// drafts over the adapted prefix it takes fewer rounds than K = 4, which keeps the slowest test of
/// the suite shorter. Quantized target weights (`--weights quantized`), drafting on the same
/// weights: equal to the plaintext reference computed with them. Two of the five prompts: standard
/// LoRA in one process is the suite's slowest test (CI time).
#[test]
fn private_greedy_speculative_equals_plaintext_standard() {
    let m = models();
    private_matches_plaintext(
        "code-lora-r16",
        8,
        (&m.quantized, &m.quantized),
        &PROMPTS[..2],
    );
}

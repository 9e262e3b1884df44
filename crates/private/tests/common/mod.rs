//! Shared by the end-to-end tests: the committed adapters and the plaintext reference every private
//! generation is compared with.

use std::path::PathBuf;

use cipherlora_model::{
    GenerateOptions, LoraAdapter, Model, PlainLora, SamplingParams, Tokenizer, generate,
};
use cipherlora_speculative::decode::{SpecConfig, SpecOutput};

/// Held-out prompts (HumanEval-style signatures, not in the training corpus).
pub const PROMPTS: [&str; 5] = [
    "def is_palindrome(s: str) -> bool:\n    \"\"\"Return True if s reads the same backwards.\"\"\"\n",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "import os\n\ndef list_python_files(root):\n",
    "class Stack:\n    def __init__(self):\n",
    "def count_words(text):\n    \"\"\"Count how often each word occurs.\"\"\"\n",
];

/// A committed adapter folder (`adapters/NAME`).
pub fn adapter_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../adapters")
        .join(name)
}

/// Greedy decoding of `tokens` new tokens with the adapter merged in plaintext (the reference of
/// every private run).
pub fn plaintext_reference(
    model: &Model,
    tok: &Tokenizer,
    adapter: &LoraAdapter,
    prompt: &[u32],
    tokens: usize,
) -> Vec<u32> {
    let opts = GenerateOptions {
        max_tokens: tokens,
        sampling: SamplingParams::greedy(),
        eos: tok.eos_tokens().to_vec(),
    };
    generate(
        model,
        prompt,
        &opts,
        &mut PlainLora::new(adapter),
        &mut |_| Ok(()),
    )
    .unwrap()
    .tokens
}

/// Asserts that a private generation reproduced the reference, naming both texts when it did not.
pub fn assert_matches(got: &SpecOutput, want: &[u32], tok: &Tokenizer, what: &str) {
    assert_eq!(
        got.tokens,
        want,
        "{what}: private output differs:\n private: {:?}\n plain:   {:?}",
        tok.decode(&got.tokens).unwrap(),
        tok.decode(want).unwrap()
    );
}

/// The private tests' decoding: greedy, the base drafter with K drafts, constant-K padding, prefill
/// through the verify session, the per-group schedule; tests change what they exercise with
/// struct-update syntax.
pub fn greedy_spec(k: usize, tokens: usize, tok: &Tokenizer) -> SpecConfig {
    SpecConfig::greedy(k, tokens, tok.eos_tokens().to_vec())
}

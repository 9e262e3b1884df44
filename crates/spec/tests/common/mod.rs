//! The real default model, its tokenizer and the committed standard LoRA
//! adapter, shared by the real-model tests of this crate; the plaintext
//! reference they compare against.
#![allow(dead_code)] // each test binary uses its own part

use std::path::PathBuf;
use std::sync::OnceLock;

use cipherlora_model::{
    GenerateOptions, LoraAdapter, Model, PlainLora, SamplingParams, Tokenizer, fetch, generate,
};

/// A committed adapter under `adapters/`.
pub fn load_adapter(name: &str, model: &Model) -> LoraAdapter {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../adapters")
        .join(name);
    LoraAdapter::load(&dir, model.config()).expect("load adapter")
}

pub struct Fixture {
    pub model: Model,
    pub tokenizer: Tokenizer,
    pub adapter: LoraAdapter,
}

pub fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let path = fetch::ensure_default_model().expect("default model");
        let model = Model::load(&path).expect("load model");
        let tokenizer = Tokenizer::for_model(&path).expect("tokenizer");
        let adapter = load_adapter("code-lora-r16", &model);
        Fixture {
            model,
            tokenizer,
            adapter,
        }
    })
}

/// Held-out code prompts (not from the training corpus).
pub const PROMPTS: [&str; 3] = [
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "import os\n\ndef list_python_files(root):\n",
    "class Stack:\n    def __init__(self):\n",
];

/// Sequential greedy decoding of the model with the fixture's adapter
/// merged in plaintext: what speculative output must equal.
pub fn reference(f: &Fixture, prompt: &[u32], n: usize) -> Vec<u32> {
    reference_with(f, &f.adapter, prompt, n)
}

/// [`reference`] with another adapter.
pub fn reference_with(f: &Fixture, adapter: &LoraAdapter, prompt: &[u32], n: usize) -> Vec<u32> {
    let opts = GenerateOptions {
        max_tokens: n,
        sampling: SamplingParams::greedy(),
        eos: f.tokenizer.eos_tokens().to_vec(),
    };
    let mut hook = PlainLora::new(adapter);
    generate(&f.model, prompt, &opts, &mut hook, &mut |_| Ok(()))
        .unwrap()
        .tokens
}

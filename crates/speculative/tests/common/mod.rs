//! The real default model, its tokenizer and the committed standard LoRA adapter, shared by the
//! real-model tests of this crate; the plaintext reference they compare against; the χ² test of
//! sampled first tokens.
#![allow(dead_code)] // each test binary uses its own part

pub mod coarse;

use std::path::PathBuf;
use std::sync::OnceLock;

use cipherlora_model::{
    AttentionMask, DeltaHook, GenerateOptions, GroupDeltas, GroupInput, LoraAdapter, Model,
    ModelError, PlainLora, ProjGroup, Sampler, SamplingParams, Tensor, Tokenizer, fetch, generate,
};
use cipherlora_speculative::decode::{self, SpecConfig, SpecOutput};
use statrs::distribution::{ChiSquared, ContinuousCDF};

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
        // f32, as a private client verifies by default (`WeightMode::for_private_verify`): the
        // fixed-point tests' exactness assumes activations that move continuously.
        let weights = cipherlora_model::WeightMode::F32;
        let model = Model::load_with(&path, &cipherlora_model::LoadOptions { weights })
            .expect("load model");
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

/// Sequential greedy decoding of the model with the fixture's adapter merged in plaintext: what
/// speculative output must equal.
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

/// Softmax rows (after the sampling transforms) of the last position.
pub fn last_probs(
    f: &Fixture,
    prompt: &[u32],
    hook: &mut dyn DeltaHook,
    sampler: &Sampler,
) -> Vec<f32> {
    let mut cache = f.model.new_cache(prompt.len()).unwrap();
    let logits = f
        .model
        .forward(prompt, &mut cache, &AttentionMask::Causal, hook)
        .unwrap();
    let row = logits
        .get(prompt.len() - 1)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    sampler.probs(&row, prompt)
}

/// χ² p-value of first-token draws against `p`: the 12 most likely tokens are cells of their own,
/// everything else one rest bucket.
pub fn chi2_p_value(p: &[f32], counts: &[usize], draws: usize) -> f64 {
    let mut order: Vec<usize> = (0..p.len()).collect();
    order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
    let top = &order[..12];
    let (mut chi2, mut rest_o, mut rest_e) = (0.0, draws as f64, 1.0);
    for &t in top {
        let e = draws as f64 * f64::from(p[t]);
        let o = counts[t] as f64;
        chi2 += (o - e).powi(2) / e;
        rest_o -= o;
        rest_e -= f64::from(p[t]);
    }
    let rest_e = draws as f64 * rest_e;
    let cells = if rest_e >= 5.0 {
        chi2 += (rest_o - rest_e).powi(2) / rest_e;
        13
    } else {
        12
    };
    1.0 - ChiSquared::new((cells - 1) as f64).unwrap().cdf(chi2)
}

/// A speculative generation of `prompt` by the fixture's model under `cfg`, `drafter` drafting and
/// `hook` adding the deltas, the tokens streamed nowhere.
pub fn drafted(
    f: &Fixture,
    drafter: &Model,
    prompt: &[u32],
    cfg: &SpecConfig,
    hook: &mut dyn DeltaHook,
) -> SpecOutput {
    decode::generate_drafted(&f.model, drafter, prompt, cfg, hook, &mut |_| Ok(())).unwrap()
}

/// The plaintext LoRA, keeping the inputs of every batched trip asked at full precision (`trips`)
/// and counting those asked within a tolerance (`coarse`, answered exactly all the same).
pub struct Recording<'a> {
    pub lora: PlainLora<'a>,
    pub trips: Vec<Vec<GroupInput>>,
    pub coarse: usize,
}

impl<'a> Recording<'a> {
    pub fn new(adapter: &'a LoraAdapter) -> Self {
        Self {
            lora: PlainLora::new(adapter),
            trips: Vec::new(),
            coarse: 0,
        }
    }
}

impl DeltaHook for Recording<'_> {
    fn deltas(&mut self, l: usize, g: ProjGroup, x: &Tensor) -> Result<GroupDeltas, ModelError> {
        self.lora.deltas(l, g, x)
    }

    fn wants(&self, l: usize, g: ProjGroup) -> bool {
        self.lora.wants(l, g)
    }

    fn deltas_many(&mut self, inputs: &[GroupInput]) -> Result<Vec<GroupDeltas>, ModelError> {
        self.trips.push(inputs.to_vec());
        self.lora.deltas_many(inputs)
    }

    fn deltas_many_within(
        &mut self,
        inputs: &[GroupInput],
        _tolerance: f64,
    ) -> Result<Vec<GroupDeltas>, ModelError> {
        self.coarse += 1;
        self.lora.deltas_many(inputs)
    }
}

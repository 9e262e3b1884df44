//! The endpoint with masked ring values for prompts (`--masked-pool-mib`): after a request, the
//! idle filler opens the masked session and fills the pools; the next prompt that fits them is
//! prefilled on masked values (its tokens counted in `masked_tokens`), one that does not runs on
//! CKKS, and every answer is the plaintext adapted model's. Real default model, the committed
//! FFA adapter, an embedded adapter server (gRPC, TLS, token) on loopback.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use cipherlora_api::{DraftLength, Engine, EngineConfig, Job, MaskedSettings, SessionSettings};
use cipherlora_model::{
    GenerateOptions, LoraAdapter, Model, PlainLora, SamplingParams, Tokenizer, WeightMode, fetch,
    generate,
};
use cipherlora_private::EmbeddedServer;
use cipherlora_service::LinkProfile;

const ADAPTER: &str = "code-ffa-r16";
/// Positions of masks kept ready per group.
const POSITIONS: usize = 32;

fn adapter_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../adapters")
        .join(ADAPTER)
}

#[test]
fn a_prompt_the_pools_cover_runs_masked_and_every_answer_is_the_plaintext_one() {
    let path = fetch::ensure_default_model().expect("default model");
    let model = Model::load(&path).unwrap();
    let tokenizer = Tokenizer::for_model(&path).unwrap();
    let server = EmbeddedServer::start(ADAPTER, &adapter_dir(), model.config(), None).unwrap();
    let engine = Engine::new(EngineConfig {
        model_path: path.clone(),
        weights: WeightMode::Auto,
        base_id: None,
        sessions: Some(SessionSettings {
            masked: Some(MaskedSettings {
                pool_bytes: 64 << 20,
                positions: POSITIONS,
                batch: 16,
            }),
            client: server.client_config(LinkProfile::LOOPBACK),
            k: DraftLength::Fixed(3),
            acceptance_prior: None,
            prefill_width: cipherlora_private::PrefillWidth::Fixed(16),
            schedule: "per-group".into(),
            planning_link: None,
            max_queue: 4,
            prefix_cache_bytes: None,
            prefill_span: cipherlora_speculative::decode::PrefillSpan::default(),
        }),
        max_tokens_cap: 64,
        max_queue: 4,
    })
    .unwrap();
    let adapter = engine.adapters()[0].clone();
    let plain = LoraAdapter::load(&adapter_dir(), model.config()).unwrap();
    let run = |prompt: &str| {
        let job = Job {
            model: ADAPTER.to_string(),
            prompt: engine.encode(prompt).unwrap(),
            max_tokens: 12,
            sampling: SamplingParams::greedy(),
            stops: Vec::new(),
            received: Instant::now(),
        };
        let mut text = String::new();
        let done = engine
            .run(&job, &mut |t| {
                text.push_str(&t);
                true
            })
            .unwrap();
        let opts = GenerateOptions {
            max_tokens: job.max_tokens,
            sampling: SamplingParams::greedy(),
            eos: tokenizer.eos_tokens().to_vec(),
        };
        let want = generate(
            &model,
            &job.prompt,
            &opts,
            &mut PlainLora::new(&plain),
            &mut |_| Ok(()),
        )
        .unwrap();
        assert_eq!(text, tokenizer.decode(&want.tokens).unwrap(), "{prompt:?}");
        let wire = done.cost.wire_prefill;
        if done.cost.masked_tokens > 0 {
            // Masked values: 60 bits up and 32 down, plus the refs and framing.
            let up = wire.bits_up.unwrap();
            let down = wire.bits_down.unwrap();
            assert!((60.0..66.0).contains(&up), "{wire:?}");
            assert!((32.0..34.0).contains(&down), "{wire:?}");
        }
        (job.prompt.len() as u64, done.cost.masked_tokens)
    };

    // No masks yet: CKKS.
    assert_eq!(run("def fibonacci(n):\n").1, 0);
    let t0 = Instant::now();
    while adapter.masks_ready() < POSITIONS {
        assert!(
            t0.elapsed() < Duration::from_secs(300),
            "the pools did not fill"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // A prompt within the pools: masked.
    let (tokens, masked) = run("class Stack:\n    def __init__(self):\n");
    assert!(tokens as usize <= POSITIONS);
    assert_eq!(masked, tokens);
    // A prompt longer than the pools hold: CKKS, with the same answer.
    let long = "import os\n\ndef list_python_files(root):\n    \"\"\"Return every .py file under root, sorted by path, skipping hidden folders\n    and symbolic links, as paths relative to root.\"\"\"\n    found = []\n";
    let (tokens, masked) = run(long);
    assert!(tokens as usize > POSITIONS, "{tokens} tokens");
    assert_eq!(masked, 0);
}

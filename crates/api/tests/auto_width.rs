//! The endpoint's warm sessions with `--k auto` (the default): the verify
//! width and the requests' grouping come from the client's width model for
//! the planning link, and the answer stays the plaintext adapted model's.
//! Real default model, the committed FFA adapter, an embedded adapter
//! server (gRPC, TLS, token) on loopback planned as `wan80`.

use std::path::PathBuf;
use std::time::Instant;

use cipherlora_api::sessions::Warm;
use cipherlora_api::{DraftLength, Engine, EngineConfig, Job, SessionSettings};
use cipherlora_model::{
    GenerateOptions, LoraAdapter, Model, PlainLora, SamplingParams, Tokenizer, WeightMode, fetch,
    generate,
};
use cipherlora_private::{EmbeddedServer, Grouping};
use cipherlora_service::LinkProfile;
use cipherlora_speculative::schedule::Schedule;

fn adapter_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../adapters")
        .join(name)
}

/// Regression: the endpoint drafted a fixed K = 4 and, under `--schedule
/// auto`, kept an FFA adapter's requests grouped by input even when the
/// fixed point won, uploading two ciphertexts per layer and trip instead of
/// one. With `DraftLength::Auto` on a planned wan80 link the sessions must
/// come out as the width model prices them: the fixed point, with requests
/// grouped by layers.
#[test]
fn auto_k_on_a_wan_opens_a_wider_by_layer_session_and_answers_as_the_merged_model() {
    let path = fetch::ensure_default_model().expect("default model");
    let model = Model::load(&path).unwrap();
    let tokenizer = Tokenizer::for_model(&path).unwrap();
    let dir = adapter_dir("code-ffa-r16");
    let server = EmbeddedServer::start("code-ffa-r16", &dir, model.config(), None).unwrap();
    let engine = Engine::new(EngineConfig {
        model_path: path.clone(),
        weights: WeightMode::Auto,
        base_id: None,
        sessions: Some(SessionSettings {
            masked: None,
            client: server.client_config(LinkProfile::LOOPBACK),
            k: DraftLength::Auto {
                k_max: 12,
                trees: None,
            },
            acceptance_prior: Some(0.85),
            prefill_width: cipherlora_private::PrefillWidth::Fixed(16),
            schedule: "auto".into(),
            planning_link: Some(LinkProfile::WAN80),
            max_queue: 4,
            prefix_cache_bytes: None,
            prefill_span: cipherlora_speculative::decode::PrefillSpan::default(),
        }),
        max_tokens_cap: 64,
        max_queue: 4,
    })
    .unwrap();
    let adapter = engine.adapters()[0].clone();
    assert_eq!(adapter.id(), "code-ffa-r16");
    assert_eq!(adapter.max_verify_width(), 13);

    let prompt = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n";
    let job = Job {
        model: adapter.id().to_string(),
        prompt: engine.encode(prompt).unwrap(),
        max_tokens: 24,
        sampling: SamplingParams::greedy(),
        stops: Vec::new(),
        received: Instant::now(),
    };
    let mut text = String::new();
    engine
        .run(&job, &mut |t| {
            text.push_str(&t);
            true
        })
        .unwrap();

    {
        let ticket = adapter.enter().unwrap();
        let state = adapter.lock(&ticket);
        let Warm::Open(open) = &*state else {
            panic!("the sessions did not stay open");
        };
        assert!(
            (2..=13).contains(&open.verify_width),
            "verify width {} on wan80",
            open.verify_width
        );
        assert!(
            matches!(open.schedule, Schedule::FixedPoint(_)),
            "schedule {} on wan80",
            open.schedule
        );
        let verify = open
            .hook
            .session(open.verify_width)
            .expect("verify session");
        let grouping = verify.plan_space().grouping;
        assert!(
            matches!(grouping, Grouping::ByLayers(_)),
            "requests grouped {grouping}"
        );
    }

    let adapter_weights = LoraAdapter::load(&dir, model.config()).unwrap();
    let opts = GenerateOptions {
        max_tokens: job.max_tokens,
        sampling: SamplingParams::greedy(),
        eos: tokenizer.eos_tokens().to_vec(),
    };
    let want = generate(
        &model,
        &job.prompt,
        &opts,
        &mut PlainLora::new(&adapter_weights),
        &mut |_| Ok(()),
    )
    .unwrap();
    assert_eq!(text, tokenizer.decode(&want.tokens).unwrap());
}

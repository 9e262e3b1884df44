//! The routes on the real default model (base model only, no adapter
//! server): OpenAI's shapes, errors that never echo the request, SSE
//! framing, and answers equal to the model's own greedy decoding.

use std::sync::{Arc, OnceLock};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use cipherlora_api::{Engine, EngineConfig, router};
use cipherlora_model::{
    GenerateOptions, Model, NoAdapter, SamplingParams, Tokenizer, WeightMode, fetch, generate,
};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

fn engine() -> Arc<Engine> {
    static E: OnceLock<Arc<Engine>> = OnceLock::new();
    E.get_or_init(|| {
        Arc::new(
            Engine::new(EngineConfig {
                model_path: fetch::ensure_default_model().expect("default model"),
                weights: WeightMode::Auto,
                base_id: Some("base".into()),
                sessions: None,
                max_tokens_cap: 64,
                max_queue: 4,
            })
            .expect("engine"),
        )
    })
    .clone()
}

async fn call(method: &str, path: &str, body: Option<String>) -> (StatusCode, String) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(body.map_or_else(Body::empty, Body::from))
        .unwrap();
    let resp = router(engine()).oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

async fn post(path: &str, body: Value) -> (StatusCode, Value) {
    let (status, text) = call("POST", path, Some(body.to_string())).await;
    (status, serde_json::from_str(&text).expect("a JSON body"))
}

/// The base model's greedy continuation of `text`, decoded.
fn greedy_reference(text: &str, n: usize) -> String {
    let path = fetch::ensure_default_model().unwrap();
    let model = Model::load(&path).unwrap();
    let tok = Tokenizer::for_model(&path).unwrap();
    let opts = GenerateOptions {
        max_tokens: n,
        sampling: SamplingParams::greedy(),
        eos: tok.eos_tokens().to_vec(),
    };
    let out = generate(
        &model,
        &tok.encode(text).unwrap(),
        &opts,
        &mut NoAdapter,
        &mut |_| Ok(()),
    )
    .unwrap();
    tok.decode(&out.tokens).unwrap()
}

#[tokio::test]
async fn models_lists_the_base_model() {
    let (status, text) = call("GET", "/v1/models", None).await;
    assert_eq!(status, StatusCode::OK);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "base");
    assert!(v["data"][0].get("parent").is_none());
}

#[tokio::test]
async fn unknown_model_is_a_404_in_openais_error_shape() {
    let (status, v) = post(
        "/v1/chat/completions",
        json!({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(v["error"]["code"], "model_not_found");
    assert_eq!(v["error"]["param"], "model");
    assert_eq!(v["error"]["type"], "invalid_request_error");
}

#[tokio::test]
async fn a_bad_body_is_a_400_that_does_not_echo_the_request() {
    let secret = "my-secret-prompt-text";
    // Wrong type for `prompt` and invalid JSON: neither message may quote it.
    for body in [
        format!(r#"{{"model": "base", "prompt": {{"x": "{secret}"}}}}"#),
        format!(r#"{{"model": "base", "prompt": "{secret}""#),
        format!(r#"{{"model": "{secret}", "prompt": 7}}"#),
    ] {
        let (status, text) = call("POST", "/v1/completions", Some(body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
        assert!(!text.contains(secret), "echoed: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
}

#[tokio::test]
async fn unsupported_and_out_of_range_fields_are_400s_naming_the_field() {
    for (field, value) in [
        ("n", json!(2)),
        ("max_tokens", json!(0)),
        ("max_tokens", json!(100_000)),
        ("temperature", json!(3.5)),
        ("top_p", json!(0)),
    ] {
        let mut body = json!({"model": "base", "prompt": "Hello"});
        body[field] = value;
        let (status, v) = post("/v1/completions", body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{field}: {v}");
        assert_eq!(v["error"]["param"], field);
    }
}

#[tokio::test]
async fn a_completion_equals_greedy_decoding_and_reports_usage() {
    let prompt = "The capital of France is";
    let (status, v) = post(
        "/v1/completions",
        json!({"model": "base", "prompt": prompt, "max_tokens": 8, "temperature": 0}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], greedy_reference(prompt, 8));
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 8);
    assert_eq!(v["cipherlora"]["private"], false);
}

#[tokio::test]
async fn a_streamed_chat_is_sse_chunks_ending_with_done_and_equals_the_whole_answer() {
    let body = json!({
        "model": "base", "max_tokens": 12, "temperature": 0,
        "messages": [{"role": "user", "content": "Name a color."}],
    });
    let (_, whole) = post("/v1/chat/completions", body.clone()).await;
    let mut streamed_body = body;
    streamed_body["stream"] = json!(true);
    streamed_body["stream_options"] = json!({"include_usage": true});
    let (status, text) = call(
        "POST",
        "/v1/chat/completions",
        Some(streamed_body.to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let events: Vec<&str> = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let mut content = String::new();
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        if let Some(t) = c["choices"][0]["delta"]["content"].as_str() {
            content.push_str(t);
        }
    }
    assert_eq!(content, whole["choices"][0]["message"]["content"]);
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"], whole["usage"]);
}

#[tokio::test]
async fn a_stop_sequence_cuts_the_answer_before_it() {
    let prompt = "1, 2, 3, 4, 5,";
    let full = greedy_reference(prompt, 12);
    let stop = " 8";
    let cut = full.find(stop).expect("the reference counts on");
    let (_, v) = post(
        "/v1/completions",
        json!({"model": "base", "prompt": prompt, "max_tokens": 12, "temperature": 0, "stop": stop}),
    )
    .await;
    assert_eq!(v["choices"][0]["text"], &full[..cut]);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
}

#[tokio::test]
async fn a_client_that_disconnects_cancels_its_generation() {
    let engine = engine();
    let before = engine.cancelled();
    let body = json!({"model": "base", "prompt": "Once upon a time", "max_tokens": 64,
                      "temperature": 0, "stream": true});
    let req = Request::builder()
        .method("POST")
        .uri("/v1/completions")
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = router(engine.clone()).oneshot(req).await.unwrap();
    let mut body = resp.into_body();
    let first = body.frame().await.expect("a first event").unwrap();
    assert!(first.data_ref().is_some());
    drop(body);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while engine.cancelled() == before {
        assert!(
            std::time::Instant::now() < deadline,
            "the generation went on after its client left"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[test]
fn a_prompt_may_fill_the_context_but_not_pass_it() {
    let engine = engine();
    let path = fetch::ensure_default_model().unwrap();
    let context = Model::load(&path).unwrap().config().max_position_embeddings;
    let job = |prompt_len: usize| cipherlora_api::Job {
        model: "base".into(),
        prompt: vec![1; prompt_len],
        max_tokens: 8,
        sampling: SamplingParams::greedy(),
        stops: Vec::new(),
        received: std::time::Instant::now(),
    };
    // The base model drafts nothing: it needs one position past the prompt and the answer.
    engine.check(&job(context - 8 - 1)).unwrap();
    let err = engine.check(&job(context - 8)).unwrap_err();
    assert_eq!(err.status(), StatusCode::BAD_REQUEST);
    assert_eq!(err.body().error.param.as_deref(), Some("max_tokens"));
}

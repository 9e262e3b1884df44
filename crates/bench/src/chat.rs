//! `cipherlora bench chat`: a multi-turn chat through the OpenAI-compatible
//! endpoint, as a person using it would see it.
//!
//! For each adapter: an embedded adapter server (gRPC, TLS, token; pinned
//! to its own core), then for each link and each prefix-cache mode an
//! endpoint (`cipherlora_api::serve` on a loopback port, the link simulated
//! between it and the adapter server) whose sessions are opened first
//! (timed), then the chat: a system prompt and [`TURNS`], each user turn
//! appended to the history with the answer the endpoint gave, sent as a
//! streamed, greedy `/v1/chat/completions` request over HTTP. Per turn: time
//! to first token (request to the first streamed text), decode tokens/s
//! after it, bytes up and down, prompt tokens served from the prefix cache
//! and prefilled. Every answer is compared with the plaintext adapted
//! model's greedy answer to the same conversation. Both modes run in the
//! same process, one after the other, so their ratio is measured side by
//! side.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use bytes::Bytes;
use cipherlora_api::{DraftLength, Engine, EngineConfig, MaskedSettings, SessionSettings};
use cipherlora_model::{
    AttentionMask, ChatMessage, GenerateOptions, LoraAdapter, Model, PlainLora, SamplingParams,
    Tokenizer, WeightMode, generate,
};
use cipherlora_private::{EmbeddedServer, PrefillWidth, WireDensity};
use cipherlora_service::LinkProfile;
use cipherlora_speculative::decode::PrefillSpan;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The system prompt of the chat.
pub const SYSTEM: &str = "You are a helpful assistant. Answer clearly and briefly.";

/// A paragraph of about 250 tokens that the third turn pastes (original
/// text, not from any adapter's training data).
pub const DOCUMENT: &str = "The town of Alderbrook sits where two rivers meet, and for most of its history the rivers decided everything. Farmers on the eastern bank grew barley in the flood plain, trusting the spring floods to renew the soil, while millers on the western bank built weirs to drive their wheels. In the dry summer of 1911 the eastern river fell so low that the mills stopped for six weeks, and the two banks quarrelled over a new channel that would have sent more water west. A council of twelve, six from each bank, met every evening in the grain hall. They measured the flow with floats and a stopwatch, argued over the figures, and finally agreed on a sluice gate that could be opened one hand's width for every inch the eastern river stood above its summer mark. The gate still stands. Its keeper is chosen each year by lot from both banks, and the record book, now more than a century old, lists every opening, every flood and every dry week since that first summer. Historians read it as a record of weather; the townspeople read it as a record of a promise that both sides have kept.";

/// The user's turns: a question, a follow-up, a pasted document with a
/// request, and a question about it.
pub const TURNS: [&str; 4] = [
    "What is a good way to start learning to cook at home?",
    "Which three dishes would you suggest for the first week, and why?",
    "Here is a short history of a town. Summarise it in three sentences.",
    "Who keeps the sluice gate today, and how are they chosen?",
];

/// The turn that pastes [`DOCUMENT`] after its text.
pub const DOCUMENT_TURN: usize = 2;

/// Options of the benchmark.
#[derive(Debug, Clone)]
pub struct ChatBenchOptions {
    /// Where the JSON report goes (Markdown beside it).
    pub json: PathBuf,
    /// The base model.
    pub model: PathBuf,
    /// PEFT adapter folders.
    pub adapters: Vec<PathBuf>,
    /// Links between the endpoint and the adapter server.
    pub links: Vec<(String, LinkProfile)>,
    /// New tokens per answer.
    pub max_tokens: usize,
    /// Prefix-cache budgets to compare, MiB (`None`: every request
    /// prefills its whole prompt).
    pub caches: Vec<Option<usize>>,
    /// Prefill spans to compare (`SpecConfig::prefill_span`; 32, the
    /// prefill width: one padded request per pass).
    pub spans: Vec<PrefillSpan>,
    /// Prefill widths to compare (positions per prefill request, the prefill session's width).
    pub prefill_widths: Vec<PrefillWidth>,
    /// Also time one cold prompt of about this many tokens (the document
    /// repeated) after the chat; 0: none.
    pub cold_tokens: usize,
    /// Verify schedules to compare (`auto`, `per-group`, `fixed-point:…`).
    pub schedules: Vec<String>,
    /// Pin the endpoint and the adapter server to different cores.
    pub pin: bool,
    /// Masked-ring pool budgets to compare, MiB (`None`: every pass on CKKS).
    pub masked: Vec<Option<usize>>,
    /// Positions of masks the endpoint keeps ready per group when masked.
    pub masked_positions: usize,
    /// Most seconds between an answer and the next turn (a person reading and typing), during
    /// which a masked endpoint makes masks; the turn goes as soon as its pools are full.
    pub think_secs: f64,
}

/// One answered turn.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChatTurn {
    /// Adapter id.
    pub adapter: String,
    /// Link name.
    pub link: String,
    /// Prefix-cache budget, MiB (`None`: off).
    pub cache_mib: Option<usize>,
    /// Prefill span (`SpecConfig::prefill_span`: positions, or `auto:<MiB>`).
    pub span: String,
    /// Positions per prefill request (the session opened).
    #[serde(default = "default_prefill_width")]
    pub prefill_width: usize,
    /// Whether the endpoint chose the prefill width (`--prefill-width auto`).
    #[serde(default)]
    pub prefill_auto: bool,
    /// Verify schedule the endpoint ran.
    #[serde(default = "auto")]
    pub schedule: String,
    /// Masked-ring pool budget, MiB (`None`: off).
    #[serde(default)]
    pub masked_mib: Option<usize>,
    /// Masks ready per group when the turn was sent.
    #[serde(default)]
    pub masks_ready: usize,
    /// Seconds the chat idled before the turn while a masked endpoint made masks (until its
    /// pools held `masked_positions` or `think_secs` passed).
    #[serde(default)]
    pub idle_secs: f64,
    /// Prompt tokens whose passes ran on masks.
    #[serde(default)]
    pub masked_tokens: u64,
    /// Turn index (`TURNS.len()` for the cold prompt).
    pub turn: usize,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Prompt tokens from the prefix cache.
    pub cached_tokens: u64,
    /// Prompt tokens prefilled through the adapter server.
    pub prefilled_tokens: u64,
    /// Request to the first streamed text, ms.
    pub ttft_ms: f64,
    /// Request to the end of the stream, ms.
    pub total_ms: f64,
    /// Generated tokens.
    pub tokens: u64,
    /// Bytes sent to the adapter server.
    pub bytes_up: u64,
    /// Bytes received from it.
    pub bytes_down: u64,
    /// Bits per activation value of the prompt's passes, with their floor.
    #[serde(default)]
    pub wire_prefill: WireDensity,
    /// Bits per activation value of the verify passes, with their floor.
    #[serde(default)]
    pub wire_decode: WireDensity,
    /// Whether the answer equals the plaintext adapted model's.
    pub matches_plaintext: bool,
    /// Where a differing answer left the plaintext one, and how near a tie that token was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub difference: Option<Difference>,
}

/// The first token where a private answer leaves the plaintext adapted model's greedy answer.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Difference {
    /// Index of the token in the answer.
    pub token: usize,
    /// The plaintext model's top-1/top-2 logit margin there (its own incremental decoding).
    pub margin: f32,
    /// Largest difference between the plaintext model's logits there computed token by token
    /// and in one batched pass: how far its own f32 arithmetic moves them.
    pub plaintext_jitter: f32,
}

impl ChatTurn {
    /// Tokens per second after the first.
    pub fn decode_tok_s(&self) -> f64 {
        self.tokens.saturating_sub(1) as f64 / ((self.total_ms - self.ttft_ms) / 1e3).max(1e-9)
    }
}

/// Session opening of one endpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionsOpened {
    /// Adapter id.
    pub adapter: String,
    /// Link name.
    pub link: String,
    /// Prefix-cache budget, MiB.
    pub cache_mib: Option<usize>,
    /// Prefill span (positions, or `auto:<MiB>`).
    pub span: String,
    /// Positions per prefill request (the session opened).
    #[serde(default = "default_prefill_width")]
    pub prefill_width: usize,
    /// Whether the endpoint chose the prefill width (`--prefill-width auto`).
    #[serde(default)]
    pub prefill_auto: bool,
    /// Verify schedule.
    #[serde(default = "auto")]
    pub schedule: String,
    /// Masked-ring pool budget, MiB (`None`: off).
    #[serde(default)]
    pub masked_mib: Option<usize>,
    /// Seconds to open the sessions and run the warm-up request.
    pub secs: f64,
}

/// The report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChatReport {
    /// The command's options, in words.
    pub settings: String,
    /// How the endpoint and the server were placed.
    pub pinning: String,
    /// Session opening per endpoint.
    pub sessions: Vec<SessionsOpened>,
    /// Every turn.
    pub turns: Vec<ChatTurn>,
}

/// Runs the benchmark and writes JSON + Markdown; returns the Markdown.
///
/// # Errors
/// Model, adapter, server or HTTP failures; an answer that differs from
/// the plaintext reference is reported, not an error.
pub fn run(opts: &ChatBenchOptions) -> anyhow::Result<String> {
    let (server_placement, pinning) = crate::e2e::place(opts.pin);
    let model = Model::load(&opts.model)?;
    let tokenizer = Tokenizer::for_model(&opts.model)?;
    let mut report = ChatReport {
        settings: format!(
            "{} turns, {} new tokens per answer, greedy, streamed, K auto",
            TURNS.len(),
            opts.max_tokens
        ),
        pinning,
        sessions: Vec::new(),
        turns: Vec::new(),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    for dir in &opts.adapters {
        let id = cipherlora_private::adapter_id(dir)?;
        let adapter = LoraAdapter::load(dir, model.config())?;
        let server = EmbeddedServer::start(&id, dir, model.config(), server_placement.clone())
            .with_context(|| format!("serving {}", dir.display()))?;
        let reference = Reference {
            model: &model,
            tokenizer: &tokenizer,
            adapter: &adapter,
            max_tokens: opts.max_tokens,
        };
        for (link_name, link) in &opts.links {
            for mode in modes(opts) {
                let engine = Arc::new(Engine::new(EngineConfig {
                    model_path: opts.model.clone(),
                    weights: WeightMode::Auto,
                    base_id: None,
                    sessions: Some(SessionSettings {
                        masked: mode.masked_mib.map(|mib| MaskedSettings {
                            pool_bytes: mib << 20,
                            positions: opts.masked_positions,
                            batch: MASKED_BATCH,
                        }),
                        client: server.client_config(*link),
                        k: DraftLength::Auto {
                            k_max: 16,
                            trees: None,
                        },
                        acceptance_prior: None,
                        prefill_width: mode.prefill_width,
                        schedule: mode.schedule.clone(),
                        planning_link: Some(*link),
                        max_queue: 4,
                        prefix_cache_bytes: mode.cache_mib.map(|m| m << 20),
                        prefill_span: mode.span,
                    }),
                    max_tokens_cap: opts.max_tokens.max(64),
                    max_queue: 4,
                })?);
                let t0 = Instant::now();
                engine.warm_up();
                let secs = t0.elapsed().as_secs_f64();
                let prefill_width = engine
                    .adapters()
                    .iter()
                    .find_map(|a| a.opened_widths())
                    .map_or(mode.prefill_width.max_width(), |(_, prefill)| prefill);
                report.sessions.push(SessionsOpened {
                    adapter: id.clone(),
                    link: link_name.clone(),
                    cache_mib: mode.cache_mib,
                    span: mode.span.to_string(),
                    prefill_width,
                    prefill_auto: mode.prefill_width == PrefillWidth::Auto,
                    schedule: mode.schedule.clone(),
                    masked_mib: mode.masked_mib,
                    secs,
                });
                let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
                let addr = listener.local_addr()?;
                let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
                let serving = rt.spawn(cipherlora_api::serve(listener, engine.clone(), async {
                    let _ = stopped.await;
                }));
                let label = Label {
                    adapter: &id,
                    link: link_name,
                    mode: &mode,
                    prefill_width,
                };
                let turns = rt.block_on(chat(addr, &engine, &label, &reference, opts));
                let _ = stop.send(());
                rt.block_on(serving)??;
                report.turns.extend(turns?);
            }
        }
    }
    let md = markdown(&report);
    crate::write_report(&opts.json, None, &report, &md)?;
    Ok(md)
}

fn auto() -> String {
    "auto".into()
}

/// The prefill width of reports written before it was an axis.
fn default_prefill_width() -> usize {
    32
}

/// How one endpoint was configured.
struct Mode {
    cache_mib: Option<usize>,
    span: PrefillSpan,
    prefill_width: PrefillWidth,
    schedule: String,
    masked_mib: Option<usize>,
}

/// Positions per offline batch of masks.
const MASKED_BATCH: usize = 32;

/// Which endpoint a turn ran on.
struct Label<'a> {
    adapter: &'a str,
    link: &'a str,
    mode: &'a Mode,
    /// The prefill session's width, as opened.
    prefill_width: usize,
}

/// Every (prefix-cache budget, prefill span and width, schedule, mask pool) to compare.
fn modes(opts: &ChatBenchOptions) -> Vec<Mode> {
    let mut out = Vec::new();
    for &cache_mib in &opts.caches {
        for &span in &opts.spans {
            for &prefill_width in &opts.prefill_widths {
                for schedule in &opts.schedules {
                    for &masked_mib in &opts.masked {
                        out.push(Mode {
                            cache_mib,
                            span,
                            prefill_width,
                            schedule: schedule.clone(),
                            masked_mib,
                        });
                    }
                }
            }
        }
    }
    out
}

/// The plaintext adapted model, for the answers to compare with.
struct Reference<'a> {
    model: &'a Model,
    tokenizer: &'a Tokenizer,
    adapter: &'a LoraAdapter,
    max_tokens: usize,
}

impl Reference<'_> {
    /// The greedy answer to `messages`.
    fn answer(&self, messages: &[ChatMessage]) -> anyhow::Result<Greedy> {
        let prompt = (self.tokenizer).encode(&self.tokenizer.render_chat(messages, true)?)?;
        let opts = GenerateOptions {
            max_tokens: self.max_tokens,
            sampling: SamplingParams::greedy(),
            eos: self.tokenizer.eos_tokens().to_vec(),
        };
        let mut hook = PlainLora::new(self.adapter);
        let tokens = generate(self.model, &prompt, &opts, &mut hook, &mut |_| Ok(()))?.tokens;
        let text = self.tokenizer.decode(&tokens)?;
        Ok(Greedy {
            prompt,
            tokens,
            text,
        })
    }

    /// Where `private` leaves the greedy answer `want` (`None`: it does not).
    fn difference(&self, want: &Greedy, private: &str) -> anyhow::Result<Option<Difference>> {
        let (ids, want) = (&want.prompt, &want.tokens);
        let mut at = None;
        for i in 0..want.len() {
            if !private.starts_with(&self.tokenizer.decode(&want[..=i])?) {
                at = Some(i);
                break;
            }
        }
        let Some(token) = at else { return Ok(None) };
        let last_row = |logits: cipherlora_model::Tensor| -> anyhow::Result<Vec<f32>> {
            Ok(logits.get(logits.dim(0)? - 1)?.to_vec1()?)
        };
        // As the reference decodes: the prompt in one pass, then token by token.
        let mut hook = PlainLora::new(self.adapter);
        let mut cache = self.model.new_cache(ids.len() + token + 1)?;
        let causal = AttentionMask::Causal;
        let mut logits = self.model.forward(ids, &mut cache, &causal, &mut hook)?;
        for &t in &want[..token] {
            logits = self.model.forward(&[t], &mut cache, &causal, &mut hook)?;
        }
        let incremental = last_row(logits)?;
        let input = [&ids[..], &want[..token]].concat();
        let mut cache = self.model.new_cache(input.len())?;
        let batched = last_row(self.model.forward(&input, &mut cache, &causal, &mut hook)?)?;
        let plaintext_jitter = (incremental.iter().zip(&batched))
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        let mut sorted = incremental;
        sorted.sort_by(|a, b| b.total_cmp(a));
        Ok(Some(Difference {
            token,
            margin: sorted[0] - sorted[1],
            plaintext_jitter,
        }))
    }
}

/// The reference's greedy answer to a conversation.
struct Greedy {
    prompt: Vec<u32>,
    tokens: Vec<u32>,
    text: String,
}

/// Where a private answer leaves the plaintext one: the common text and both continuations.
fn first_difference(private: &str, plaintext: &str) -> String {
    let common = (private.char_indices().zip(plaintext.chars()))
        .find(|((_, a), b)| a != b)
        .map_or(private.len().min(plaintext.len()), |((i, _), _)| i);
    format!(
        "  common: {:?}\n  private: {:?}\n  plaintext: {:?}",
        &private[..common],
        &private[common..],
        &plaintext[common..]
    )
}

/// The user turn `i`'s text (the document pasted into [`DOCUMENT_TURN`]).
pub fn user_turn(i: usize) -> String {
    if i == DOCUMENT_TURN {
        format!("{}\n\n{DOCUMENT}", TURNS[i])
    } else {
        TURNS[i].to_string()
    }
}

/// The chat's turns on the endpoint at `addr`, then the cold prompt.
async fn chat(
    addr: SocketAddr,
    engine: &Engine,
    label: &Label<'_>,
    reference: &Reference<'_>,
    opts: &ChatBenchOptions,
) -> anyhow::Result<Vec<ChatTurn>> {
    let mut messages = vec![ChatMessage::new("system", SYSTEM)];
    let mut out = Vec::new();
    let cold = (opts.cold_tokens > 0).then(|| {
        let per = reference
            .tokenizer
            .encode(DOCUMENT)
            .map_or(250, |t| t.len().max(1));
        let copies = opts.cold_tokens.div_ceil(per);
        vec![ChatMessage::new(
            "user",
            format!(
                "{}\n\nSummarise the text above in one sentence.",
                vec![DOCUMENT; copies].join("\n\n")
            ),
        )]
    });
    for turn in 0..TURNS.len() + usize::from(cold.is_some()) {
        let conversation = if turn < TURNS.len() {
            messages.push(ChatMessage::new("user", user_turn(turn)));
            messages.clone()
        } else {
            cold.clone().unwrap_or_default()
        };
        let reference_answer = reference.answer(&conversation)?;
        let want = reference_answer.text.as_str();
        let idle = Instant::now();
        if turn > 0 && label.mode.masked_mib.is_some() {
            // Until the pools are full, the filler stops (a refusal, the budget) or time is up.
            while idle.elapsed().as_secs_f64() < opts.think_secs
                && engine.masks_ready(label.adapter) < opts.masked_positions
                && (engine.masks_filling(label.adapter) || idle.elapsed().as_secs_f64() < 3.0)
            {
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            }
        }
        let idle_secs = idle.elapsed().as_secs_f64();
        let masks_ready = engine.masks_ready(label.adapter);
        let mut answer = request(addr, label.adapter, &conversation, opts.max_tokens).await?;
        answer.masks_ready = masks_ready;
        answer.idle_secs = idle_secs;
        eprintln!(
            "{} {} cache {:?} span {} width {} {} masked {:?} turn {turn}: {} prompt tokens ({} cached, {} masked of {} ready after {:.0} s idle), TTFT {:.0} ms, {:.1} tok/s, {:.1}/{:.1} MB, {}",
            label.adapter,
            label.link,
            label.mode.cache_mib,
            label.mode.span,
            label.prefill_width,
            label.mode.schedule,
            label.mode.masked_mib,
            answer.prompt_tokens,
            answer.cached_tokens,
            answer.masked_tokens,
            answer.masks_ready,
            answer.idle_secs,
            answer.ttft_ms,
            answer.turn(label, turn, false).decode_tok_s(),
            answer.bytes_up as f64 / 1e6,
            answer.bytes_down as f64 / 1e6,
            if answer.text == want {
                "= plaintext"
            } else {
                "DIFFERS from plaintext"
            }
        );
        let mut difference = None;
        if answer.text != want {
            eprintln!("{}", first_difference(&answer.text, want));
            difference = reference.difference(&reference_answer, &answer.text)?;
            if let Some(d) = difference {
                eprintln!(
                    "  at answer token {}: plaintext top-1/top-2 logit margin {:.1e}, its own \
                     token-by-token vs batched logits differ by {:.1e}",
                    d.token, d.margin, d.plaintext_jitter
                );
            }
        }
        let mut turn_report = answer.turn(label, turn, answer.text == want);
        turn_report.difference = difference;
        out.push(turn_report);
        if turn < TURNS.len() {
            messages.push(ChatMessage::new("assistant", answer.text));
        }
    }
    Ok(out)
}

/// What one streamed request returned.
#[derive(Default)]
struct Answer {
    text: String,
    ttft_ms: f64,
    total_ms: f64,
    prompt_tokens: u64,
    tokens: u64,
    cached_tokens: u64,
    prefilled_tokens: u64,
    bytes_up: u64,
    bytes_down: u64,
    wire_prefill: WireDensity,
    wire_decode: WireDensity,
    masked_tokens: u64,
    masks_ready: usize,
    idle_secs: f64,
}

impl Answer {
    fn turn(&self, label: &Label<'_>, turn: usize, matches: bool) -> ChatTurn {
        ChatTurn {
            adapter: label.adapter.to_string(),
            link: label.link.to_string(),
            cache_mib: label.mode.cache_mib,
            span: label.mode.span.to_string(),
            prefill_width: label.prefill_width,
            prefill_auto: label.mode.prefill_width == PrefillWidth::Auto,
            schedule: label.mode.schedule.clone(),
            masked_mib: label.mode.masked_mib,
            masks_ready: self.masks_ready,
            masked_tokens: self.masked_tokens,
            idle_secs: self.idle_secs,
            turn,
            prompt_tokens: self.prompt_tokens,
            cached_tokens: self.cached_tokens,
            prefilled_tokens: self.prefilled_tokens,
            ttft_ms: self.ttft_ms,
            total_ms: self.total_ms,
            tokens: self.tokens,
            bytes_up: self.bytes_up,
            bytes_down: self.bytes_down,
            wire_prefill: self.wire_prefill,
            wire_decode: self.wire_decode,
            matches_plaintext: matches,
            difference: None,
        }
    }

    /// Takes one server-sent event's JSON.
    fn event(&mut self, v: &Value, start: Instant) {
        let delta = &v["choices"][0]["delta"]["content"];
        if let Some(piece) = delta.as_str().filter(|p| !p.is_empty()) {
            if self.text.is_empty() {
                self.ttft_ms = start.elapsed().as_secs_f64() * 1e3;
            }
            self.text.push_str(piece);
        }
        let usage = &v["usage"];
        if let Some(p) = usage["prompt_tokens"].as_u64() {
            self.prompt_tokens = p;
            self.tokens = usage["completion_tokens"].as_u64().unwrap_or(0);
        }
        let cost = &v["cipherlora"];
        if cost.is_object() {
            let n = |k: &str| cost[k].as_u64().unwrap_or(0);
            self.bytes_up = n("bytes_up");
            self.bytes_down = n("bytes_down");
            self.cached_tokens = n("cached_tokens");
            self.prefilled_tokens = n("prefilled_tokens");
            self.masked_tokens = n("masked_tokens");
            let wire = |k: &str| serde_json::from_value(cost[k].clone()).unwrap_or_default();
            self.wire_prefill = wire("wire_prefill");
            self.wire_decode = wire("wire_decode");
        }
    }
}

/// One streamed, greedy chat completion over HTTP.
async fn request(
    addr: SocketAddr,
    model: &str,
    messages: &[ChatMessage],
    max_tokens: usize,
) -> anyhow::Result<Answer> {
    let client: Client<_, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let body = json!({
        "model": model,
        "messages": messages.iter().map(|m| json!({"role": m.role, "content": m.content})).collect::<Vec<_>>(),
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let req = hyper::Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))?;
    let start = Instant::now();
    let resp = client.request(req).await?;
    anyhow::ensure!(
        resp.status().is_success(),
        "the endpoint answered {}",
        resp.status()
    );
    let mut body = resp.into_body();
    let mut answer = Answer::default();
    let mut pending = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame?;
        let Some(data) = frame.data_ref() else {
            continue;
        };
        pending.extend_from_slice(data);
        while let Some(end) = pending.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = pending.drain(..end + 2).collect();
            let event = String::from_utf8_lossy(&event);
            for line in event.lines() {
                let Some(payload) = line.strip_prefix("data: ") else {
                    continue;
                };
                if payload.trim() == "[DONE]" {
                    continue;
                }
                answer.event(&serde_json::from_str(payload)?, start);
            }
        }
    }
    answer.total_ms = start.elapsed().as_secs_f64() * 1e3;
    Ok(answer)
}

fn mode(s: &SessionsOpened) -> String {
    let cache = s.cache_mib.map_or("no prefix cache".into(), |m| {
        format!("prefix cache {m} MiB")
    });
    let masked = s
        .masked_mib
        .map_or(String::new(), |m| format!(", masked ring values ({m} MiB)"));
    let width = if s.prefill_auto {
        format!("auto ({})", s.prefill_width)
    } else {
        s.prefill_width.to_string()
    };
    format!(
        "{cache}, prefill span {} and width {width}, {}{masked}",
        s.span, s.schedule
    )
}

/// `290 / 190 (106 / 79)`: bits per value up and down, their floors.
fn bits(w: &WireDensity) -> String {
    let b = |v: Option<f64>| v.map_or_else(|| "–".to_string(), |v| format!("{v:.0}"));
    format!(
        "{} / {} ({} / {})",
        b(w.bits_up),
        b(w.bits_down),
        b(w.floor_up),
        b(w.floor_down)
    )
}

/// One table per adapter and link: every turn under each mode.
fn markdown(r: &ChatReport) -> String {
    let mut md = format!(
        "Chat through the OpenAI endpoint ({}; {}).\n",
        r.settings, r.pinning
    );
    let mut keys: Vec<(&str, &str)> = Vec::new();
    for t in &r.turns {
        if !keys.contains(&(t.adapter.as_str(), t.link.as_str())) {
            keys.push((&t.adapter, &t.link));
        }
    }
    for (adapter, link) in keys {
        md.push_str(&format!(
            "\n**{adapter}, {link}**\n\n\
             | mode | sessions open | turn | idle before, masks ready | prompt tokens | cached / prefilled (masked) | time to first token | decode tok/s | MB up / down | bits per value up / down, prefill (floor) | verify (floor) | = plaintext |\n\
             | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
        ));
        for s in r
            .sessions
            .iter()
            .filter(|s| s.adapter == adapter && s.link == link)
        {
            for t in r.turns.iter().filter(|t| {
                (
                    t.adapter.as_str(),
                    t.link.as_str(),
                    t.cache_mib,
                    &t.span,
                    t.prefill_width,
                    t.prefill_auto,
                    &t.schedule,
                    t.masked_mib,
                ) == (
                    adapter,
                    link,
                    s.cache_mib,
                    &s.span,
                    s.prefill_width,
                    s.prefill_auto,
                    &s.schedule,
                    s.masked_mib,
                )
            }) {
                let turn = if t.turn < TURNS.len() {
                    format!("{}", t.turn + 1)
                } else {
                    "cold".into()
                };
                md.push_str(&format!(
                    "| {} | {:.1} s | {turn} | {:.0} s, {} | {} | {} / {} ({}) | {:.1} s | {:.1} | {:.0} / {:.0} | {} | {} | {} |\n",
                    mode(s),
                    s.secs,
                    t.idle_secs,
                    t.masks_ready,
                    t.prompt_tokens,
                    t.cached_tokens,
                    t.prefilled_tokens,
                    t.masked_tokens,
                    t.ttft_ms / 1e3,
                    t.decode_tok_s(),
                    t.bytes_up as f64 / 1e6,
                    t.bytes_down as f64 / 1e6,
                    bits(&t.wire_prefill),
                    bits(&t.wire_decode),
                    match (t.matches_plaintext, &t.difference) {
                        (true, _) => "yes".to_string(),
                        (false, Some(d)) => format!(
                            "**no** (token {}: a near-tie {:.1e} logits wide; plaintext jitter {:.1e})",
                            d.token, d.margin, d.plaintext_jitter
                        ),
                        (false, None) => "**no**".to_string(),
                    }
                ));
            }
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_difference_splits_at_the_first_differing_character() {
        let d = first_difference("The first one chosen is", "The first one is the");
        assert!(d.contains(r#"common: "The first one ""#), "{d}");
        assert!(d.contains(r#"private: "chosen is""#), "{d}");
        assert!(d.contains(r#"plaintext: "is the""#), "{d}");
        // One answer a prefix of the other; characters of several bytes.
        let d = first_difference("café", "café au lait");
        assert!(d.contains(r#"private: """#) && d.contains(r#"plaintext: " au lait""#));
        let d = first_difference("naïve", "naïf");
        assert!(d.contains(r#"common: "naï""#), "{d}");
    }
}

//! The OpenAI API's request and response bodies as far as this endpoint
//! serves them (<https://platform.openai.com/docs/api-reference/chat>,
//! `/completions`, `/models`). Unknown request fields are ignored, as vLLM
//! and llama.cpp's server do; `n > 1` and several prompts are refused (400).

use serde::{Deserialize, Serialize};

use cipherlora_model::ChatMessage;
use cipherlora_private::WireDensity;

/// `GET /v1/models`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ModelList {
    /// Always `"list"`.
    pub object: String,
    /// The base model, then one entry per adapter the adapter server offers.
    pub data: Vec<ModelCard>,
}

/// One model of [`ModelList`] (vLLM's shape: an adapter's base in `parent`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ModelCard {
    /// What requests put in `model`.
    pub id: String,
    /// Always `"model"`.
    pub object: String,
    /// Unix seconds (when this endpoint started).
    pub created: u64,
    /// `"local"` for the base model, `"adapter-server"` for adapters.
    pub owned_by: String,
    /// The base model's id for adapters; absent for the base model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
}

/// Text of a message: a string or an array of `{"type": "text"}` parts.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Content parts.
    Parts(Vec<ContentPart>),
}

/// One content part.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct ContentPart {
    /// Part type; only `"text"` is supported.
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a text part.
    #[serde(default)]
    pub text: Option<String>,
}

/// One message of a chat request.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct RequestMessage {
    /// `system`, `user`, `assistant` (`developer` is read as `system`).
    pub role: String,
    /// The text.
    pub content: MessageContent,
}

impl RequestMessage {
    /// The message as the chat template takes it. Errors: a non-text part.
    pub fn to_chat(&self) -> Result<ChatMessage, String> {
        let content = match &self.content {
            MessageContent::Text(t) => t.clone(),
            MessageContent::Parts(parts) => {
                let mut s = String::new();
                for p in parts {
                    match (&*p.kind, &p.text) {
                        ("text", Some(t)) => s.push_str(t),
                        (kind, _) => {
                            return Err(format!(
                                "content parts of type {:?} are not supported (text only)",
                                truncate(kind, 32)
                            ));
                        }
                    }
                }
                s
            }
        };
        let role = if self.role == "developer" {
            "system"
        } else {
            &self.role
        };
        Ok(ChatMessage::new(role, content))
    }
}

/// `stop`: one string or several.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Stop {
    /// One stop sequence.
    One(String),
    /// Up to four.
    Many(Vec<String>),
}

impl Stop {
    /// The stop sequences.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        }
    }
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct StreamOptions {
    /// Send a last chunk with `usage` before `[DONE]`.
    #[serde(default)]
    pub include_usage: bool,
}

/// What chat and completion requests share.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct SamplingFields {
    /// Model id (`GET /v1/models`).
    pub model: String,
    /// Most new tokens (`max_completion_tokens` is the newer name).
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// Alias of `max_tokens`.
    #[serde(default)]
    pub max_completion_tokens: Option<u32>,
    /// 0 is greedy; OpenAI's default is 1.
    #[serde(default)]
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    #[serde(default)]
    pub top_p: Option<f32>,
    /// RNG seed (default 0: the same request gives the same answer).
    #[serde(default)]
    pub seed: Option<u64>,
    /// Stop sequences (not included in the output).
    #[serde(default)]
    pub stop: Option<Stop>,
    /// Number of choices; only 1.
    #[serde(default)]
    pub n: Option<u32>,
    /// Server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// Options of the stream.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Vec<RequestMessage>,
    /// Model, sampling, stream.
    #[serde(flatten)]
    pub sampling: SamplingFields,
}

/// `prompt` of a completion request: a string or a one-string array.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Prompt {
    /// One prompt.
    One(String),
    /// Several (only one is served).
    Many(Vec<String>),
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct CompletionRequest {
    /// The text to continue.
    pub prompt: Prompt,
    /// Model, sampling, stream.
    #[serde(flatten)]
    pub sampling: SamplingFields,
}

/// Token counts.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Usage {
    /// Tokens of the prompt (after the chat template).
    pub prompt_tokens: u32,
    /// Tokens generated.
    pub completion_tokens: u32,
    /// Their sum.
    pub total_tokens: u32,
    /// Of the prompt's tokens, those served from the prefix cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

/// OpenAI's breakdown of the prompt's tokens.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct PromptTokensDetails {
    /// Prompt tokens served from the prefix cache (not prefilled again).
    pub cached_tokens: u32,
}

/// What the private path cost (extension key `cipherlora`; clients ignore it).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PrivateCost {
    /// Whether the deltas came from the adapter server under CKKS.
    pub private: bool,
    /// The verify schedule (`per-group`, `fixed-point:N`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// Verify rounds.
    pub rounds: u64,
    /// Generated tokens per verify round.
    pub tokens_per_round: f64,
    /// Network round trips (prefill and verify).
    pub round_trips: u64,
    /// Bytes sent to the adapter server.
    pub bytes_up: u64,
    /// Bytes received from it.
    pub bytes_down: u64,
    /// Client HE work (packing, encryption, decryption), ms.
    pub client_he_ms: f64,
    /// Adapter server compute, as it reports it, ms.
    pub server_ms: f64,
    /// Round trips minus server compute (network, serialisation), ms.
    pub network_ms: f64,
    /// Request arrival to the first generated token, ms.
    pub ttft_ms: f64,
    /// Request arrival to the last token, ms.
    pub total_ms: f64,
    /// Prompt tokens whose rows came from the prefix cache.
    pub cached_tokens: u64,
    /// Prompt tokens prefilled through the adapter server.
    pub prefilled_tokens: u64,
    /// Of those, tokens whose passes ran on pooled masks (masked ring values) instead of CKKS.
    #[serde(default)]
    pub masked_tokens: u64,
    /// Bits per activation value of the prompt's passes, next to their floor.
    #[serde(default)]
    pub wire_prefill: WireDensity,
    /// Bits per activation value of the verify passes, next to their floor.
    #[serde(default)]
    pub wire_decode: WireDensity,
}

/// The assistant's message in a non-streamed chat response.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ResponseMessage {
    /// Always `"assistant"`.
    pub role: String,
    /// The generated text.
    pub content: String,
}

/// One choice of a chat response.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ChatChoice {
    /// Always 0 (n = 1).
    pub index: u32,
    /// The answer.
    pub message: ResponseMessage,
    /// `stop` (EOS or a stop sequence) or `length` (max_tokens).
    pub finish_reason: String,
}

/// `chat.completion`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ChatResponse {
    /// `chatcmpl-…`.
    pub id: String,
    /// Always `"chat.completion"`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// The model id of the request.
    pub model: String,
    /// One choice.
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    pub usage: Usage,
    /// What the private path cost.
    pub cipherlora: PrivateCost,
}

/// The delta of a streamed chat chunk.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ChunkDelta {
    /// `"assistant"` in the first chunk only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// New text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

/// One choice of a streamed chat chunk.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ChunkChoice {
    /// Always 0.
    pub index: u32,
    /// New text.
    pub delta: ChunkDelta,
    /// Set in the last chunk with a choice.
    pub finish_reason: Option<String>,
}

/// `chat.completion.chunk`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ChatChunk {
    /// The same id in every chunk of a response.
    pub id: String,
    /// Always `"chat.completion.chunk"`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// The model id of the request.
    pub model: String,
    /// One choice (none in the usage chunk).
    pub choices: Vec<ChunkChoice>,
    /// In the usage chunk only (`stream_options.include_usage`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// In the chunk that finishes the choice.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cipherlora: Option<PrivateCost>,
}

/// One choice of a completion (streamed or not).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CompletionChoice {
    /// Always 0.
    pub index: u32,
    /// The generated text (a streamed chunk: the new text).
    pub text: String,
    /// `null` until the last chunk.
    pub finish_reason: Option<String>,
    /// Always `null` (log probabilities are not served).
    pub logprobs: Option<()>,
}

/// `text_completion`, also the shape of each streamed completion chunk.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CompletionResponse {
    /// `cmpl-…`.
    pub id: String,
    /// Always `"text_completion"`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// The model id of the request.
    pub model: String,
    /// One choice (none in the usage chunk).
    pub choices: Vec<CompletionChoice>,
    /// Token counts (non-streamed; streamed: the usage chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// What the private path cost (non-streamed; streamed: the last chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cipherlora: Option<PrivateCost>,
}

/// OpenAI's error body: `{"error": {...}}`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// The inside of [`ErrorBody`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ErrorDetail {
    /// What went wrong, in words (never the prompt).
    pub message: String,
    /// `invalid_request_error`, `not_found_error`, `rate_limit_error`, `api_error`, …
    #[serde(rename = "type")]
    pub kind: String,
    /// The request field at fault, if any.
    pub param: Option<String>,
    /// A machine-readable code (`model_not_found`, …).
    pub code: Option<String>,
}

/// At most `max` characters of `s` (for error messages that quote input).
pub(crate) fn truncate(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

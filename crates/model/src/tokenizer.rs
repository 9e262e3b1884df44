//! Tokenizer: HF `tokenizer.json`, or rebuilt from GGUF BPE metadata as llama.cpp does; chat
//! prompts from the model's Jinja template ([`crate::chat`]).

use std::path::Path;

use serde_json::{Value, json};

use crate::ModelError;
use crate::chat::{ChatMessage, ChatTemplate};
use crate::gguf::{self, GgufHeader};

/// Text ↔ token ids, plus the model's special tokens and chat format.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    source: String,
    bos: Option<u32>,
    add_bos: bool,
    eos: Vec<u32>,
    chat: Option<ChatTemplate>,
}

fn tok_err(source: &str, e: impl std::fmt::Display) -> ModelError {
    ModelError::Tokenizer {
        source_name: source.to_string(),
        reason: e.to_string(),
    }
}

const GPT2_REGEX: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn byte_level(use_regex: bool) -> Value {
    json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex})
}

fn split(regex: &str) -> Value {
    json!({"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false})
}

/// The HF pre-tokenizer equivalent to llama.cpp's regexes for `tokenizer.ggml.pre`.
fn pre_tokenizer(pre: &str) -> Value {
    match pre {
        "smollm" | "starcoder" | "refact" | "codeshell" | "command-r" => json!({
            "type": "Sequence",
            "pretokenizers": [{"type": "Digits", "individual_digits": true}, byte_level(true)]
        }),
        "qwen2" | "stablelm2" | "deepseek-r1-qwen" => json!({
            "type": "Sequence", "pretokenizers": [split(QWEN2_REGEX), byte_level(false)]
        }),
        "llama3" | "llama-bpe" | "smaug-bpe" => json!({
            "type": "Sequence", "pretokenizers": [split(LLAMA3_REGEX), byte_level(false)]
        }),
        "gpt2" | "gpt-2" | "default" | "" => json!({
            "type": "Sequence", "pretokenizers": [split(GPT2_REGEX), byte_level(false)]
        }),
        other => {
            tracing::warn!(pre = other, "unknown GGUF pre-tokenizer; using GPT-2's");
            pre_tokenizer("gpt2")
        }
    }
}

impl Tokenizer {
    /// The tokenizer of an HF folder or GGUF file. Errors: [`ModelError::Tokenizer`]; I/O errors.
    pub fn for_model(path: &Path) -> Result<Self, ModelError> {
        if path.is_dir() {
            Self::from_hf_folder(path)
        } else {
            Self::from_gguf(path)
        }
    }

    /// From an HF folder (`tokenizer.json`, `tokenizer_config.json`, `config.json`). Errors:
    /// [`ModelError::Tokenizer`], [`ModelError::Io`].
    pub fn from_hf_folder(dir: &Path) -> Result<Self, ModelError> {
        let file = dir.join("tokenizer.json");
        let src = file.display().to_string();
        let inner = tokenizers::Tokenizer::from_file(&file).map_err(|e| tok_err(&src, e))?;
        let read_json = |name: &str| -> Option<Value> {
            let text = std::fs::read_to_string(dir.join(name)).ok()?;
            serde_json::from_str(&text).ok()
        };
        let tc = read_json("tokenizer_config.json").unwrap_or(Value::Null);
        let mc = read_json("config.json").unwrap_or(Value::Null);
        let token_id = |v: &Value| -> Option<u32> {
            match v {
                Value::String(s) => inner.token_to_id(s),
                Value::Object(o) => o
                    .get("content")
                    .and_then(|c| c.as_str())
                    .and_then(|s| inner.token_to_id(s)),
                Value::Number(n) => n.as_u64().map(|n| n as u32),
                _ => None,
            }
        };
        let mut eos: Vec<u32> = match &mc["eos_token_id"] {
            Value::Array(a) => a.iter().filter_map(token_id).collect(),
            v => token_id(v).into_iter().collect(),
        };
        if let Some(e) = token_id(&tc["eos_token"])
            && !eos.contains(&e)
        {
            eos.push(e);
        }
        let chat = match &tc["chat_template"] {
            Value::String(s) => Some(s.as_str()),
            // Named templates: [{"name": "default", "template": "…"}, …].
            Value::Array(named) => named
                .iter()
                .find(|t| t["name"] == "default")
                .and_then(|t| t["template"].as_str()),
            _ => None,
        }
        .and_then(parse_template);
        let mut t = Tokenizer {
            bos: token_id(&tc["bos_token"]),
            add_bos: false, // tokenizer.json's post-processor adds it when configured
            inner,
            source: src,
            eos,
            chat,
        };
        t.add_chat_eos();
        Ok(t)
    }

    /// From GGUF metadata (`gpt2` BPE only). Errors: [`ModelError::Tokenizer`]; GGUF read errors.
    pub fn from_gguf(path: &Path) -> Result<Self, ModelError> {
        let header = GgufHeader::read(path)?;
        let src = format!("{} (GGUF metadata)", path.display());
        let model = gguf::string_key(&header, "tokenizer.ggml.model").unwrap_or_default();
        if model != "gpt2" {
            return Err(tok_err(
                &src,
                format!(
                    "vocab type `{model}` unsupported (only byte-level BPE `gpt2`); use an HF folder with tokenizer.json"
                ),
            ));
        }
        let tokens = gguf::string_array(&header, "tokenizer.ggml.tokens")?
            .ok_or_else(|| tok_err(&src, "missing tokenizer.ggml.tokens"))?;
        let merges = gguf::string_array(&header, "tokenizer.ggml.merges")?.unwrap_or_default();
        let types = gguf::int_array(&header, "tokenizer.ggml.token_type")?
            .unwrap_or_else(|| vec![1; tokens.len()]);
        let pre = gguf::string_key(&header, "tokenizer.ggml.pre").unwrap_or_default();
        let mut vocab = serde_json::Map::with_capacity(tokens.len());
        let mut added = Vec::new();
        for (id, tok) in tokens.iter().enumerate() {
            vocab.insert(tok.clone(), json!(id));
            // llama.cpp token types: 3 = control, 4 = user-defined.
            let ty = types.get(id).copied().unwrap_or(1);
            if ty == 3 || ty == 4 {
                added.push(json!({
                    "id": id, "content": tok, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": ty == 3
                }));
            }
        }
        let spec = json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": pre_tokenizer(&pre),
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {
                "type": "BPE", "dropout": null, "unk_token": null,
                "continuing_subword_prefix": null, "end_of_word_suffix": null,
                "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                "vocab": vocab, "merges": merges
            }
        });
        let text = spec.to_string();
        let inner: tokenizers::Tokenizer = text.parse().map_err(|e| tok_err(&src, e))?;
        let eos = gguf::u32_key(&header, "tokenizer.ggml.eos_token_id")
            .into_iter()
            .collect();
        let chat = gguf::string_key(&header, "tokenizer.chat_template")
            .as_deref()
            .and_then(parse_template);
        let mut t = Tokenizer {
            inner,
            source: src,
            bos: gguf::u32_key(&header, "tokenizer.ggml.bos_token_id"),
            add_bos: gguf::bool_key(&header, "tokenizer.ggml.add_bos_token").unwrap_or(false),
            eos,
            chat,
        };
        t.add_chat_eos();
        Ok(t)
    }

    /// With ChatML, `<|im_end|>` also ends a turn.
    fn add_chat_eos(&mut self) {
        if self.chat.as_ref().is_some_and(ChatTemplate::is_chatml)
            && let Some(id) = self.inner.token_to_id("<|im_end|>")
            && !self.eos.contains(&id)
        {
            self.eos.push(id);
        }
    }

    /// Token ids of `text`, BOS first when wanted. Errors: [`ModelError::Tokenizer`].
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ModelError> {
        let enc = self
            .inner
            .encode(text, true)
            .map_err(|e| tok_err(&self.source, e))?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if self.add_bos
            && let Some(b) = self.bos
        {
            ids.push(b);
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// Text of `ids`, special tokens skipped. Errors: [`ModelError::Tokenizer`].
    pub fn decode(&self, ids: &[u32]) -> Result<String, ModelError> {
        self.inner
            .decode(ids, true)
            .map_err(|e| tok_err(&self.source, e))
    }

    /// End-of-sequence ids (EOS, and `<|im_end|>` for ChatML models).
    pub fn eos_tokens(&self) -> &[u32] {
        &self.eos
    }

    /// The chat format, if the model has a recognised one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat.as_ref()
    }

    /// The chat prompt for one user message. Errors as [`Tokenizer::render_chat`].
    pub fn chat_prompt(&self, user: &str) -> Result<String, ModelError> {
        self.render_chat(&[ChatMessage::new("user", user)], true)
    }

    /// A conversation through the chat template (assistant header if `add_generation_prompt`).
    /// Errors: [`ModelError::ChatTemplate`].
    pub fn render_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ModelError> {
        let template = self.chat.as_ref().ok_or_else(|| ModelError::ChatTemplate {
            reason: format!("{} has no chat template", self.source),
        })?;
        let name = |id: Option<u32>| {
            id.and_then(|i| self.inner.id_to_token(i))
                .unwrap_or_default()
        };
        template.render(
            messages,
            add_generation_prompt,
            &name(self.bos),
            &name(self.eos.first().copied()),
        )
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The id of a token string, if in the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }
}

/// A template that does not compile is logged and ignored.
fn parse_template(jinja: &str) -> Option<ChatTemplate> {
    ChatTemplate::new(jinja)
        .inspect_err(|e| tracing::warn!(error = %e, "ignoring the model's chat template"))
        .ok()
}

//! The autoregressive loop: prefill the prompt in one pass, then one position per step, sampling
//! from the last row of logits; plus incremental detokenisation.

use crate::{AttentionMask, DeltaHook, Model, ModelError, Sampler, SamplingParams, Tokenizer};

/// Options of [`generate`].
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// Maximum number of new tokens.
    pub max_tokens: usize,
    /// Sampling parameters.
    pub sampling: SamplingParams,
    /// Token ids that end generation (not included in the output).
    pub eos: Vec<u32>,
}

/// Result of [`generate`].
#[derive(Debug, Clone)]
pub struct Generated {
    /// The new tokens.
    pub tokens: Vec<u32>,
    /// Whether an EOS token ended generation.
    pub stopped_at_eos: bool,
    /// Wall time of the prompt pass, seconds.
    pub prefill_secs: f64,
    /// Wall time of the decode steps, seconds.
    pub decode_secs: f64,
}

/// Generates up to `opts.max_tokens` tokens after `prompt`, calling `on_token` with each; `hook`
/// adapts every pass ([`crate::NoAdapter`]: base model). Errors: [`ModelError::Input`] for an empty
/// prompt; those of the forward pass, the sampler and `on_token`.
pub fn generate(
    model: &Model,
    prompt: &[u32],
    opts: &GenerateOptions,
    hook: &mut dyn DeltaHook,
    on_token: &mut dyn FnMut(u32) -> Result<(), ModelError>,
) -> Result<Generated, ModelError> {
    if prompt.is_empty() {
        return Err(ModelError::Input("empty prompt".into()));
    }
    let mut sampler = Sampler::new(opts.sampling.clone())?;
    let mut cache = model.new_cache(prompt.len() + opts.max_tokens + 1)?;
    let mut history = prompt.to_vec();
    let mut out = Generated {
        tokens: Vec::new(),
        stopped_at_eos: false,
        prefill_secs: 0.0,
        decode_secs: 0.0,
    };
    let t0 = std::time::Instant::now();
    let mut logits = model.forward(prompt, &mut cache, &AttentionMask::Causal, hook)?;
    out.prefill_secs = t0.elapsed().as_secs_f64();
    let t1 = std::time::Instant::now();
    while out.tokens.len() < opts.max_tokens {
        let last = logits.get(logits.dim(0)? - 1)?.to_vec1::<f32>()?;
        let next = sampler.sample(&last, &history);
        if opts.eos.contains(&next) {
            out.stopped_at_eos = true;
            break;
        }
        out.tokens.push(next);
        history.push(next);
        on_token(next)?;
        if out.tokens.len() == opts.max_tokens {
            break;
        }
        logits = model.forward(&[next], &mut cache, &AttentionMask::Causal, hook)?;
    }
    out.decode_secs = t1.elapsed().as_secs_f64();
    Ok(out)
}

/// Turns a stream of token ids into text pieces, holding back bytes that do not yet form whole
/// UTF-8 characters.
#[derive(Debug)]
pub struct TextStream<'a> {
    tokenizer: &'a Tokenizer,
    ids: Vec<u32>,
    emitted: usize,
}

impl<'a> TextStream<'a> {
    /// An empty stream.
    pub fn new(tokenizer: &'a Tokenizer) -> Self {
        TextStream {
            tokenizer,
            ids: Vec::new(),
            emitted: 0,
        }
    }

    /// Adds a token; returns the newly complete text, if any. Errors: [`ModelError::Tokenizer`].
    pub fn push(&mut self, id: u32) -> Result<Option<String>, ModelError> {
        self.ids.push(id);
        let text = self.tokenizer.decode(&self.ids)?;
        if text.ends_with('\u{FFFD}') || text.len() <= self.emitted {
            return Ok(None);
        }
        let Some(piece) = text.get(self.emitted..) else {
            return Ok(None);
        };
        let piece = piece.to_string();
        self.emitted = text.len();
        Ok(Some(piece))
    }
}

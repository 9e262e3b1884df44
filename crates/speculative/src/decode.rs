//! Speculative generation: draft, verify K+1 positions in one pass, accept,
//! roll back. The base drafter syncs its cache from the target's, so it
//! drafts over the adapted prefix; with constant-K padding the server always
//! sees K+1 positions. The entry points are here; the configuration in
//! `config`, the steps of a generation in `decoding`, the drafter in
//! `drafter`, the prompt's passes in `prefill`. Invariants: code-notes.md,
//! "spec: decode".

use cipherlora_model::{DeltaHook, Model, Tensor};

use crate::prefix_cache::CachedContext;
use crate::{ConfigError, SpecError};

mod certify;
mod config;
mod decoding;
mod draft_model;
mod drafter;
mod prefill;
mod prefill_span;

pub use config::{ChainDrafter, Drafting, SpecConfig, SpecOutput, SpecStats};
use decoding::Decoding;
pub use draft_model::DraftModel;
use draft_model::check_draft_model;
pub use prefill_span::{PREFILL_MEMORY, PrefillSpan};

/// Speculative generation after `prompt`; `verifier` supplies each verify
/// pass's adapter deltas, `on_tokens` sees each round's new tokens. Greedy
/// output equals sequential greedy decoding of the adapted model; sampled
/// output follows its distribution ([`crate::acceptance`]).
///
/// Errors: [`SpecError::Config`] (empty prompt, K = 0 with a drafter),
/// [`SpecError::Model`] (forward pass or hook; not retried here).
pub fn generate(
    model: &Model,
    prompt: &[u32],
    cfg: &SpecConfig,
    verifier: &mut dyn DeltaHook,
    on_tokens: &mut dyn FnMut(&[u32]) -> Result<(), SpecError>,
) -> Result<SpecOutput, SpecError> {
    generate_drafted(model, model, prompt, cfg, verifier, on_tokens)
}

/// [`generate`] with a drafter model other than the target: a copy of its
/// weights or another network ([`DraftModel`]); same output. Errors: as
/// [`generate`]; [`SpecError::Config`] when a copy's shapes differ from the
/// target's, when a separate drafter's vocabulary does, or when a separate
/// drafter is asked for trees.
pub fn generate_drafted<'m>(
    model: &Model,
    draft_model: impl Into<DraftModel<'m>>,
    prompt: &[u32],
    cfg: &SpecConfig,
    verifier: &mut dyn DeltaHook,
    on_tokens: &mut dyn FnMut(&[u32]) -> Result<(), SpecError>,
) -> Result<SpecOutput, SpecError> {
    let (out, _) = generate_cached(model, draft_model, prompt, cfg, verifier, on_tokens, None)?;
    Ok(out)
}

/// [`generate_drafted`] reusing the rows of an earlier context
/// ([`crate::prefix_cache`]); returns the output and the new context's rows.
/// Same output as without the cache. Errors: as [`generate_drafted`].
pub fn generate_cached<'m>(
    model: &Model,
    draft_model: impl Into<DraftModel<'m>>,
    prompt: &[u32],
    cfg: &SpecConfig,
    verifier: &mut dyn DeltaHook,
    on_tokens: &mut dyn FnMut(&[u32]) -> Result<(), SpecError>,
    cached: Option<CachedContext>,
) -> Result<(SpecOutput, CachedContext), SpecError> {
    let drafting = draft_model.into();
    check_draft_model(model, drafting, cfg)?;
    if prompt.is_empty() {
        return Err(ConfigError::EmptyPrompt.into());
    }
    cfg.validate()?;
    // Sampling runs its own fixed point ([`SpecConfig::effective_schedule`]).
    let sampled_cfg;
    let cfg = if cfg.sampling.is_greedy() {
        cfg
    } else {
        sampled_cfg = SpecConfig {
            schedule: cfg.effective_schedule(),
            ..cfg.clone()
        };
        &sampled_cfg
    };
    let mut run = Decoding::start(model, drafting, prompt, cfg, verifier, on_tokens, cached)?;
    while run.wants_more() {
        run.round(verifier, on_tokens)?;
    }
    Ok(run.finish())
}

/// The first `n` rows of a (T, vocab) logits tensor.
fn rows(logits: &Tensor, n: usize) -> Result<Vec<Vec<f32>>, SpecError> {
    let all = logits.narrow(0, 0, n).and_then(|t| t.to_vec2::<f32>());
    all.map_err(|e| SpecError::Model(cipherlora_model::ModelError::from(e)))
}

/// The greedy choice, by the same rule as the plaintext reference.
fn greedy_token(row: &[f32]) -> u32 {
    cipherlora_model::argmax(row) as u32
}

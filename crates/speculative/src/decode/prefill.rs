//! The caches a generation starts from and the prompt's passes.

use cipherlora_model::{DeltaHook, KvCache, Model, ModelError, PassDeltas};

use super::{SpecConfig, rows};
use crate::SpecError;
use crate::prefix_cache::CachedContext;
use crate::row_deltas::RowDeltas;
use crate::schedule::{Schedule, prefill_pass};

/// The caches a generation starts from.
pub(super) struct Rows {
    pub(super) target: KvCache,
    pub(super) shadow: Option<KvCache>,
    pub(super) log: Option<RowDeltas>,
    /// The reused rows' settling state (`None`: fresh caches).
    pub(super) settled: Option<usize>,
    pub(super) prompt_settled: bool,
}

impl Rows {
    /// Fresh caches, or `cached`'s rows of the longest prefix of `prefilled`.
    pub(super) fn start(
        model: &Model,
        cfg: &SpecConfig,
        capacity: usize,
        prefilled: &[u32],
        cached: Option<CachedContext>,
    ) -> Result<Self, SpecError> {
        let config = model.config();
        let row_bytes = KvCache::bytes_for(config, config.num_layers, 1);
        let usable = cached.filter(|c| {
            c.schedule == cfg.schedule
                && c.target.layers() == (0..config.num_layers)
                && c.target.bytes() == row_bytes * c.target.capacity()
        });
        let reuse = usable.as_ref().map_or(0, |c| {
            c.common_prefix(prefilled)
                .min(prefilled.len().saturating_sub(1))
        });
        match usable.filter(|_| reuse > 0) {
            Some(c) => {
                let c = c.prefix(reuse, capacity)?;
                Ok(Self {
                    target: c.target,
                    shadow: c.shadow,
                    log: c.log,
                    settled: Some(c.settled),
                    prompt_settled: c.prompt_settled,
                })
            }
            None => {
                let shadow = match cfg.schedule {
                    Schedule::FixedPoint(fp) if fp.shadow => Some(model.new_cache(capacity)?),
                    _ => None,
                };
                Ok(Self {
                    target: model.new_cache(capacity)?,
                    log: shadow.as_ref().map(|_| RowDeltas::new()),
                    shadow,
                    settled: None,
                    prompt_settled: true,
                })
            }
        }
    }
}

/// What [`prefill`] did.
pub(super) struct Prefilled {
    /// Passes through the hook.
    pub(super) passes: usize,
    /// Batched round trips of those passes.
    pub(super) round_trips: usize,
    /// The last prefilled token's logits row (group-by-group prefill only).
    pub(super) last_row: Option<Vec<f32>>,
    /// The last pass's deltas and its last prompt row (the first drafting guide).
    pub(super) last_deltas: (PassDeltas, usize),
}

/// Runs `tokens` through the adapted model: group by group in unpadded passes
/// of up to `span` positions when `span > width`; otherwise in chunks of `width`
/// (padded when `pad`; then a last chunk that fits `narrow`, the verify
/// width or 0 for none, is padded to that instead, so the cheaper verify
/// session runs it).
pub(super) fn prefill(
    model: &Model,
    (cache, mut shadow, mut log): (&mut KvCache, Option<&mut KvCache>, Option<&mut RowDeltas>),
    tokens: &[u32],
    (width, narrow, span): (usize, usize, usize),
    pad: bool,
    hook: &mut dyn DeltaHook,
    schedule: &Schedule,
) -> Result<Prefilled, SpecError> {
    let mut done = Prefilled {
        passes: 0,
        round_trips: 0,
        last_row: None,
        last_deltas: (PassDeltas::new(), 0),
    };
    if tokens.is_empty() {
        return Ok(done);
    }
    // A group-by-group pass needs no fixed width: the hook splits it into
    // requests of its sessions' widths and pipelines them.
    let per_group = span > width && schedule.prefills_per_group();
    let pad = pad && !per_group;
    let chunk = match (pad, per_group) {
        (true, _) => width,
        (false, true) => span,
        (false, false) => tokens.len(),
    };
    for part in tokens.chunks(chunk) {
        let mut inputs = part.to_vec();
        if pad {
            let padded = if part.len() <= narrow { narrow } else { width };
            inputs.resize(padded, *part.last().expect("chunks are non-empty"));
        }
        let before = cache.len();
        let pass = prefill_pass(model, &inputs, cache, hook, schedule, shadow.as_deref_mut())?;
        done.round_trips += pass.round_trips;
        // Only the last prompt row's logits are needed (the first token): the head, a
        // (hidden × vocab) product per row, runs on that row alone.
        done.last_row = match pass.hidden {
            Some(h) => {
                let last = h.narrow(0, part.len() - 1, 1).map_err(ModelError::from)?;
                Some(rows(&model.head(&last)?, 1)?.pop().expect("one row"))
            }
            None => None,
        };
        if let Some(log) = log.as_deref_mut() {
            log.truncate(before);
            log.push_first(&pass.deltas, part.len())?;
        }
        done.last_deltas = (pass.deltas, part.len() - 1);
        cache.truncate(before + part.len());
        if let Some(sh) = shadow.as_deref_mut() {
            sh.truncate(before + part.len());
        }
        done.passes += 1;
    }
    Ok(done)
}

//! One client, several sessions of different verify widths.
//!
//! A session's plans are fixed for one T; [`ByWidth`] sends each pass to the
//! session whose T equals its positions, and a pass of any other width to
//! the session that serves it soonest in requests of its own width
//! (`SpecConfig::prefill_span`). Each session still sees requests of its own
//! constant width, so the server learns nothing more.

use candle_core::Tensor;
use cipherlora_model::{
    DeltaHook, DeltaStream, GroupDeltas, GroupInput, ModelError, ProjGroup, Wavefront,
};

use crate::client::Transport;
use crate::client::{HeHook, HeTimings};

/// The link speed, Mbit/s, at which [`ByWidth`] prices the sessions a pass of
/// another width could be split over (the simulator's WAN profiles' speed).
pub const SPLIT_LINK_MBIT_S: f64 = 100.0;

/// [`HeHook`]s keyed by their session's width T.
pub struct ByWidth<T: Transport> {
    hooks: Vec<(usize, HeHook<T>)>,
}

impl<T: Transport> std::fmt::Debug for ByWidth<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let widths: Vec<usize> = self.hooks.iter().map(|(t, _)| *t).collect();
        f.debug_struct("ByWidth")
            .field("widths", &widths)
            .finish_non_exhaustive()
    }
}

impl<T: Transport> ByWidth<T> {
    /// Routes passes of `t` positions to `hook` (replacing an earlier one).
    #[must_use]
    pub fn with(mut self, t: usize, hook: HeHook<T>) -> Self {
        self.hooks.retain(|(w, _)| *w != t);
        self.hooks.push((t, hook));
        self
    }

    /// No sessions yet.
    #[must_use]
    pub fn new() -> Self {
        Self { hooks: Vec::new() }
    }

    /// Time and bytes summed over all sessions.
    #[must_use]
    pub fn timings(&self) -> HeTimings {
        let mut sum = HeTimings::default();
        for (_, h) in &self.hooks {
            sum.add(h.timings());
        }
        sum
    }

    /// [`HeHook::timings_since_prefill`] summed over all sessions: the
    /// decode part of the latest generation.
    #[must_use]
    pub fn timings_since_prefill(&self) -> HeTimings {
        let mut sum = HeTimings::default();
        for (_, h) in &self.hooks {
            sum.add(&h.timings_since_prefill());
        }
        sum
    }

    /// The sessions, by width (e.g. to close them).
    #[must_use]
    pub fn into_sessions(self) -> Vec<(usize, HeHook<T>)> {
        self.hooks
    }

    /// The sessions' widths, in the order they were added.
    #[must_use]
    pub fn widths(&self) -> Vec<usize> {
        self.hooks.iter().map(|(t, _)| *t).collect()
    }

    /// The session of width `t`, if any.
    #[must_use]
    pub fn session(&self, t: usize) -> Option<&HeHook<T>> {
        self.hooks.iter().find(|(w, _)| *w == t).map(|(_, h)| h)
    }
}

impl<T: Transport> Default for ByWidth<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Transport> DeltaHook for ByWidth<T> {
    /// Errors: [`ModelError::Hook`] when no session has the pass's width; the
    /// chosen session's errors.
    fn deltas(
        &mut self,
        layer: usize,
        group: ProjGroup,
        x: &Tensor,
    ) -> Result<GroupDeltas, ModelError> {
        let t = x.dims().first().copied().unwrap_or(0);
        match self.for_rows(t) {
            Some(hook) => hook.deltas(layer, group, x),
            None => Err(ModelError::Hook {
                layer,
                proj: group.projs()[0],
                reason: format!("no session verifies {t} positions per pass"),
            }),
        }
    }

    fn wants(&self, layer: usize, group: ProjGroup) -> bool {
        self.hooks.iter().any(|(_, h)| h.wants(layer, group))
    }

    /// Errors: as [`ByWidth::deltas`]; a batch's inputs share one width.
    fn deltas_many(&mut self, inputs: &[GroupInput]) -> Result<Vec<GroupDeltas>, ModelError> {
        self.batch(inputs, None)
    }

    /// Errors: as [`ByWidth::deltas_many`].
    fn deltas_many_within(
        &mut self,
        inputs: &[GroupInput],
        tolerance: f64,
    ) -> Result<Vec<GroupDeltas>, ModelError> {
        self.batch(inputs, Some(tolerance))
    }

    /// The stream of the session of width `t`, if any.
    fn stream(&mut self, t: usize) -> Option<&mut dyn DeltaStream> {
        self.hooks
            .iter_mut()
            .find(|(w, _)| *w == t)
            .and_then(|(_, h)| h.stream(t))
    }

    /// The wavefront of the session [`ByWidth::deltas`] would split a pass of
    /// `t` positions over.
    fn wavefront(&mut self, t: usize) -> Option<Wavefront<'_>> {
        self.for_rows(t)?.wavefront(t)
    }

    /// Marks every session ([`HeHook::timings_since_prefill`]).
    fn prefill_done(&mut self) {
        for (_, h) in &mut self.hooks {
            h.prefill_done();
        }
    }
}

impl<T: Transport> ByWidth<T> {
    /// The session for one group's input of `t` rows, among those whose
    /// requests carry one group: the one of width `t`, else the one whose
    /// `⌈t / width⌉` pipelined requests finish first under the sessions'
    /// pass models at [`SPLIT_LINK_MBIT_S`] ([`HeHook`] splits and pads a
    /// long prompt's wide pass or a short last chunk). With none such, the
    /// one of width `t` (whose error then names the grouping).
    fn for_rows(&mut self, t: usize) -> Option<&mut HeHook<T>> {
        if t == 0 {
            return None;
        }
        // A session grouped by layers answers only a whole layer's inputs.
        let by_input = |(_, h): &(usize, HeHook<T>)| h.plan_space().grouping.layers().is_none();
        let i = match self.hooks.iter().position(|e| e.0 == t && by_input(e)) {
            Some(i) => i,
            None if !self.hooks.iter().any(by_input) => {
                self.hooks.iter().position(|(w, _)| *w == t)?
            }
            None => {
                // n pipelined requests: one request's stages end to end, then
                // one busiest stage per further request.
                let cost = |(w, h): &(usize, HeHook<T>)| {
                    let m = h.pass_model();
                    let link = |bytes: f64| bytes * 8e-3 / SPLIT_LINK_MBIT_S;
                    let stages = [
                        link(m.bytes_up),
                        m.server_ms,
                        link(m.bytes_down),
                        m.client_he_ms,
                    ];
                    let busiest = stages.iter().copied().fold(0.0, f64::max);
                    let n = t.div_ceil(*w) as f64;
                    stages.iter().sum::<f64>() + (n - 1.0) * busiest
                };
                (0..self.hooks.len())
                    .filter(|&i| by_input(&self.hooks[i]))
                    .min_by(|&a, &b| cost(&self.hooks[a]).total_cmp(&cost(&self.hooks[b])))?
            }
        };
        Some(&mut self.hooks[i].1)
    }

    /// A batch to the session of its width, within `tolerance` if given.
    fn batch(
        &mut self,
        inputs: &[GroupInput],
        tolerance: Option<f64>,
    ) -> Result<Vec<GroupDeltas>, ModelError> {
        let Some(first) = inputs.first() else {
            return Ok(Vec::new());
        };
        let t = first.x.dims().first().copied().unwrap_or(0);
        let unreachable = |g: &GroupInput, reason: String| ModelError::Hook {
            layer: g.layer,
            proj: g.group.projs()[0],
            reason,
        };
        if let Some(g) = inputs
            .iter()
            .find(|g| g.x.dims().first().copied().unwrap_or(0) != t)
        {
            return Err(unreachable(g, "a batch mixes pass widths".into()));
        }
        match (self.hooks.iter_mut().find(|(w, _)| *w == t), tolerance) {
            (Some((_, hook)), None) => hook.deltas_many(inputs),
            (Some((_, hook)), Some(tol)) => hook.deltas_many_within(inputs, tol),
            (None, _) => Err(unreachable(
                first,
                format!("no session verifies {t} positions per pass"),
            )),
        }
    }
}

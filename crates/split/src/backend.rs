//! The server side: a [`SplitBackend`] over a loaded base model; each session holds a KV cache of
//! its own layers only ([`KvCache::for_layers`]).

use std::ops::Range;
use std::sync::Arc;

use candle_core::{Device, Tensor};
use cipherlora_model::{AttentionMask, KvCache, Model};
use cipherlora_service::backend::BackendError;
use cipherlora_service::{SplitBackend, SplitCompute, SplitModelInfo};

/// Serves the decoder layers of `model` to split-inference clients.
#[derive(Debug, Clone)]
pub struct ModelBackend {
    model: Arc<Model>,
    max_capacity: u32,
}

impl ModelBackend {
    /// Sessions may ask for at most `max_capacity` positions (the model's own
    /// `max_position_embeddings` caps it too).
    pub fn new(model: Arc<Model>, max_capacity: u32) -> Self {
        let cap = u32::try_from(model.config().max_position_embeddings).unwrap_or(u32::MAX);
        Self {
            model,
            max_capacity: max_capacity.min(cap),
        }
    }
}

impl SplitBackend for ModelBackend {
    fn info(&self) -> SplitModelInfo {
        let c = self.model.config();
        SplitModelInfo {
            model: self
                .model
                .path()
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
            num_layers: u32::try_from(c.num_layers).unwrap_or(u32::MAX),
            hidden_size: u32::try_from(c.hidden_size).unwrap_or(u32::MAX),
            max_capacity: self.max_capacity,
        }
    }

    fn session_bytes(&self, layers: Range<u32>, capacity: u32) -> usize {
        KvCache::bytes_for(self.model.config(), layers.len(), capacity as usize)
    }

    fn open(
        &self,
        layers: Range<u32>,
        capacity: u32,
    ) -> Result<Box<dyn SplitCompute>, BackendError> {
        let layers = layers.start as usize..layers.end as usize;
        let cache = KvCache::for_layers(self.model.config(), capacity as usize, layers.clone())
            .map_err(BackendError::internal)?;
        Ok(Box::new(ModelSession {
            model: self.model.clone(),
            layers,
            cache,
        }))
    }
}

/// One session: layers `layers` of `model` and their KV cache.
pub(crate) struct ModelSession {
    pub(crate) model: Arc<Model>,
    pub(crate) layers: Range<usize>,
    pub(crate) cache: KvCache,
}

impl ModelSession {
    /// Runs the session's layers on `hidden` (T × d) under the causal mask (`parents` empty) or the
    /// token tree `parents`; see [`SplitCompute::forward`].
    pub(crate) fn run(
        &mut self,
        hidden: Vec<f32>,
        positions: usize,
        parents: &[Option<usize>],
    ) -> Result<Vec<f32>, cipherlora_model::ModelError> {
        let _span = tracing::debug_span!(
            "split_server_forward",
            positions,
            tree = !parents.is_empty()
        )
        .entered();
        let d = self.model.config().hidden_size;
        let x = Tensor::from_vec(hidden, (positions, d), &Device::Cpu)?;
        let mask = if parents.is_empty() {
            AttentionMask::Causal
        } else {
            AttentionMask::tree(parents.to_vec())
        };
        let y = self
            .model
            .forward_layers(&x, self.layers.clone(), &mut self.cache, &mask)?;
        Ok(y.flatten_all()?.to_vec1::<f32>()?)
    }

    /// Keeps the cached rows `start + keep[k]` at `start + k` (an empty `keep` truncates to
    /// `start`); see [`SplitCompute::compact`].
    pub(crate) fn compact(
        &mut self,
        start: usize,
        keep: &[usize],
    ) -> Result<(), cipherlora_model::ModelError> {
        if keep.is_empty() {
            if start > self.cache.len() {
                return Err(cipherlora_model::ModelError::Input(format!(
                    "start {start} beyond the {} cached positions",
                    self.cache.len()
                )));
            }
            self.cache.truncate(start);
            Ok(())
        } else {
            self.cache.compact(start, keep)
        }
    }
}

impl SplitCompute for ModelSession {
    fn len(&self) -> usize {
        self.cache.len()
    }

    fn capacity(&self) -> usize {
        self.cache.capacity()
    }

    fn truncate(&mut self, len: usize) {
        self.cache.truncate(len);
    }

    fn compact(&mut self, start: usize, keep: &[usize]) -> Result<(), BackendError> {
        ModelSession::compact(self, start, keep).map_err(BackendError::internal)
    }

    fn forward(
        &mut self,
        hidden: Vec<f32>,
        positions: usize,
        parents: &[Option<usize>],
    ) -> Result<Vec<f32>, BackendError> {
        self.run(hidden, positions, parents)
            .map_err(BackendError::internal)
    }
}

//! The server side: a [`SplitBackend`] over a loaded base model; each
//! session holds a KV cache of its own layers only
//! ([`KvCache::for_layers`]).

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
    /// Sessions may ask for at most `max_capacity` positions (the model's
    /// own `max_position_embeddings` caps it too).
    pub fn new(model: Arc<Model>, max_capacity: u32) -> Self {
        let cap = u32::try_from(model.config().max_position_embeddings).unwrap_or(u32::MAX);
        Self {
            model,
            max_capacity: max_capacity.min(cap),
        }
    }
}

fn internal(e: impl std::fmt::Display) -> BackendError {
    BackendError::Internal {
        reason: e.to_string(),
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
            .map_err(internal)?;
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
    /// Runs the session's layers on `hidden` (T × d); see
    /// [`SplitCompute::forward`].
    pub(crate) fn run(
        &mut self,
        hidden: Vec<f32>,
        positions: usize,
    ) -> Result<Vec<f32>, cipherlora_model::ModelError> {
        let _span = tracing::debug_span!("split_server_forward", positions).entered();
        let d = self.model.config().hidden_size;
        let x = Tensor::from_vec(hidden, (positions, d), &Device::Cpu)?;
        let y = self.model.forward_layers(
            &x,
            self.layers.clone(),
            &mut self.cache,
            &AttentionMask::Causal,
        )?;
        Ok(y.flatten_all()?.to_vec1::<f32>()?)
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

    fn forward(&mut self, hidden: Vec<f32>, positions: usize) -> Result<Vec<f32>, BackendError> {
        self.run(hidden, positions).map_err(internal)
    }
}

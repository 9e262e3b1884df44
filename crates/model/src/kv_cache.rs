//! Preallocated per-layer key/value cache with rollback.
//!
//! Layout per layer: keys and values of shape (num_kv_heads, capacity, head_dim),
//! f32, written in place. Keys are stored after RoPE, so an entry is only valid
//! at the position it was computed for: rollback is [`KvCache::truncate`], and
//! after a tree verify pass [`KvCache::compact`] keeps one accepted root-to-node
//! path, whose node at depth d then sits exactly at position `start + d`.
//! Entries below `len()` are committed; a forward pass appends after them.

use candle_core::{DType, Device, Tensor};

use crate::{ModelConfig, ModelError};

/// Key/value cache of every layer; see the module docs.
#[derive(Debug)]
pub struct KvCache {
    keys: Vec<Tensor>,
    values: Vec<Tensor>,
    len: usize,
    capacity: usize,
}

impl KvCache {
    /// An empty cache for `capacity` positions (memory:
    /// 2 · layers · kv_heads · capacity · head_dim · 4 bytes).
    ///
    /// # Errors
    /// [`ModelError::Candle`] if the allocation fails.
    pub fn new(config: &ModelConfig, capacity: usize) -> Result<Self, ModelError> {
        let shape = (config.num_kv_heads, capacity, config.head_dim);
        let mut keys = Vec::with_capacity(config.num_layers);
        let mut values = Vec::with_capacity(config.num_layers);
        for _ in 0..config.num_layers {
            keys.push(Tensor::zeros(shape, DType::F32, &Device::Cpu)?);
            values.push(Tensor::zeros(shape, DType::F32, &Device::Cpu)?);
        }
        Ok(KvCache {
            keys,
            values,
            len: 0,
            capacity,
        })
    }

    /// Number of committed positions.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions the cache can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Rolls back to the first `len` positions (no-op if `len >= self.len()`).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// After a tree pass that appended nodes at `start..self.len()`, keeps the
    /// nodes `keep` (indices relative to `start`, strictly increasing, forming a
    /// root-to-node path so that `keep[d]` has depth d) at `start..start+keep.len()`.
    ///
    /// # Errors
    /// [`ModelError::Input`] if `keep` is not increasing or points past `len()`.
    pub fn compact(&mut self, start: usize, keep: &[usize]) -> Result<(), ModelError> {
        if start > self.len {
            return Err(ModelError::Input(format!(
                "compact start {start} beyond cache length {}",
                self.len
            )));
        }
        let n = self.len - start;
        if keep.windows(2).any(|w| w[0] >= w[1]) || keep.last().is_some_and(|&k| k >= n) {
            return Err(ModelError::Input(format!(
                "compact indices {keep:?} must increase and be < {n}"
            )));
        }
        let identity = keep.iter().enumerate().all(|(i, &k)| i == k);
        if !identity {
            let idx: Vec<u32> = keep.iter().map(|&k| (start + k) as u32).collect();
            let idx = Tensor::new(idx.as_slice(), &Device::Cpu)?;
            for t in self.keys.iter().chain(self.values.iter()) {
                let picked = t.index_select(&idx, 1)?.contiguous()?;
                t.slice_set(&picked, 1, start)?;
            }
        }
        self.len = start + keep.len();
        Ok(())
    }

    /// An independent deep copy (e.g. for a drafter that runs ahead).
    ///
    /// # Errors
    /// [`ModelError::Candle`] if the copy fails.
    pub fn fork(&self) -> Result<Self, ModelError> {
        let copy = |v: &Vec<Tensor>| -> Result<Vec<Tensor>, ModelError> {
            v.iter().map(|t| Ok(t.copy()?)).collect()
        };
        Ok(KvCache {
            keys: copy(&self.keys)?,
            values: copy(&self.values)?,
            len: self.len,
            capacity: self.capacity,
        })
    }

    /// Writes keys/values (num_kv_heads, t, head_dim) of `layer` at `at..at+t`.
    pub(crate) fn write(
        &self,
        layer: usize,
        at: usize,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<(), ModelError> {
        self.keys[layer].slice_set(k, 1, at)?;
        self.values[layer].slice_set(v, 1, at)?;
        Ok(())
    }

    /// Keys and values of `layer` for positions `0..upto`, each
    /// (num_kv_heads, upto, head_dim).
    pub(crate) fn read(&self, layer: usize, upto: usize) -> Result<(Tensor, Tensor), ModelError> {
        Ok((
            self.keys[layer].narrow(1, 0, upto)?,
            self.values[layer].narrow(1, 0, upto)?,
        ))
    }

    /// Marks `len` positions as committed (after the forward pass wrote them).
    pub(crate) fn set_len(&mut self, len: usize) {
        debug_assert!(len <= self.capacity);
        self.len = len;
    }
}

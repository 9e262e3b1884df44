//! Preallocated per-layer key/value cache with rollback.
//!
//! Per layer, keys and values of shape (num_kv_heads, capacity, head_dim),
//! f32, written in place after RoPE, so an entry is valid only at its
//! position: rollback is [`KvCache::truncate`], and [`KvCache::compact`]
//! keeps a tree pass's accepted path (depth d at `start + d`). A cache may
//! hold a range of layers only ([`KvCache::for_layers`], split inference).

use candle_core::{DType, Device, Tensor};

use crate::{ModelConfig, ModelError};

/// Key/value cache of every layer; see the module docs.
#[derive(Debug)]
pub struct KvCache {
    keys: Vec<Tensor>,
    values: Vec<Tensor>,
    len: usize,
    capacity: usize,
    /// Index of the layer whose keys are `keys[0]`.
    first_layer: usize,
}

/// Keys and values of consecutive positions copied out of a cache
/// ([`KvCache::rows`]): per layer (num_kv_heads, len, head_dim), f32, after
/// RoPE; [`KvCache::put_rows`] writes them back into a cache of the model.
#[derive(Debug, Clone)]
pub struct KvRows {
    keys: Vec<Tensor>,
    values: Vec<Tensor>,
    len: usize,
    first_layer: usize,
}

impl KvRows {
    /// Number of positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl KvCache {
    /// An empty cache for `capacity` positions (2 · layers · kv_heads ·
    /// capacity · head_dim · 4 bytes). Errors: [`ModelError::Candle`].
    pub fn new(config: &ModelConfig, capacity: usize) -> Result<Self, ModelError> {
        Self::for_layers(config, capacity, 0..config.num_layers)
    }

    /// An empty cache for `capacity` positions of the decoder `layers` only
    /// ([`KvCache::bytes_for`]); a pass over another layer fails.
    /// Errors: [`ModelError::Input`] if `layers` is outside `0..num_layers`;
    /// [`ModelError::Candle`] if the allocation fails.
    pub fn for_layers(
        config: &ModelConfig,
        capacity: usize,
        layers: std::ops::Range<usize>,
    ) -> Result<Self, ModelError> {
        if layers.start > layers.end || layers.end > config.num_layers {
            return Err(ModelError::Input(format!(
                "layers {layers:?} not within the model's {} layers",
                config.num_layers
            )));
        }
        let shape = (config.num_kv_heads, capacity, config.head_dim);
        let mut keys = Vec::with_capacity(layers.len());
        let mut values = Vec::with_capacity(layers.len());
        for _ in layers.clone() {
            keys.push(Tensor::zeros(shape, DType::F32, &Device::Cpu)?);
            values.push(Tensor::zeros(shape, DType::F32, &Device::Cpu)?);
        }
        Ok(KvCache {
            keys,
            values,
            len: 0,
            capacity,
            first_layer: layers.start,
        })
    }

    /// Bytes of a cache of `layers` layers and `capacity` positions (f32).
    pub fn bytes_for(config: &ModelConfig, layers: usize, capacity: usize) -> usize {
        2usize
            .saturating_mul(layers)
            .saturating_mul(config.num_kv_heads)
            .saturating_mul(capacity)
            .saturating_mul(config.head_dim)
            .saturating_mul(4)
    }

    /// The decoder layers this cache holds.
    pub fn layers(&self) -> std::ops::Range<usize> {
        self.first_layer..self.first_layer + self.keys.len()
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

    /// Bytes the cache holds (f32 keys and values at full capacity).
    pub fn bytes(&self) -> usize {
        self.keys
            .iter()
            .chain(&self.values)
            .map(|t| t.elem_count() * 4)
            .sum()
    }

    /// A copy of positions `0..len()` in a cache of `capacity` positions
    /// (prefix caching: shrink or grow). Errors: [`ModelError::Input`] if
    /// `capacity < len()`; [`ModelError::Candle`].
    pub fn resized(&self, capacity: usize) -> Result<Self, ModelError> {
        self.prefix(self.len, capacity)
    }

    /// A copy of positions `0..len` in a cache of `capacity` positions (a
    /// shared prefix of a cached context, shrunk or grown in one copy).
    /// Errors: [`ModelError::Input`] if `len > len()` or `capacity < len`;
    /// [`ModelError::Candle`].
    pub fn prefix(&self, len: usize, capacity: usize) -> Result<Self, ModelError> {
        if len > self.len {
            return Err(ModelError::Input(format!(
                "a prefix of {len} rows of a cache of {}",
                self.len
            )));
        }
        if capacity < len {
            return Err(ModelError::Input(format!(
                "a cache of {capacity} positions cannot hold {len} rows"
            )));
        }
        let copy = |v: &Vec<Tensor>| -> Result<Vec<Tensor>, ModelError> {
            v.iter()
                .map(|t| {
                    let (heads, _, dim) = t.dims3()?;
                    let out = Tensor::zeros((heads, capacity, dim), DType::F32, &Device::Cpu)?;
                    if len > 0 {
                        out.slice_set(&t.narrow(1, 0, len)?.contiguous()?, 1, 0)?;
                    }
                    Ok(out)
                })
                .collect()
        };
        Ok(KvCache {
            keys: copy(&self.keys)?,
            values: copy(&self.values)?,
            len,
            capacity,
            first_layer: self.first_layer,
        })
    }

    /// Rolls back to the first `len` positions (no-op if `len >= self.len()`).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// After a tree pass that appended nodes at `start..self.len()`, keeps the
    /// root-to-node path `keep` (relative to `start`, increasing, `keep[d]` at
    /// depth d) at `start..start+keep.len()`.
    /// Errors: [`ModelError::Input`] if `keep` is not increasing or out of range.
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

    /// An independent deep copy. Errors: [`ModelError::Candle`].
    pub fn fork(&self) -> Result<Self, ModelError> {
        let copy = |v: &Vec<Tensor>| -> Result<Vec<Tensor>, ModelError> {
            v.iter().map(|t| Ok(t.copy()?)).collect()
        };
        Ok(KvCache {
            keys: copy(&self.keys)?,
            values: copy(&self.values)?,
            len: self.len,
            capacity: self.capacity,
            first_layer: self.first_layer,
        })
    }

    /// Copies positions `from..src.len()` of `src` (same model) and rolls to
    /// `src.len()`: a drafter syncs only the positions added since `from`.
    /// Errors: [`ModelError::Input`] for other shapes, `from` past either
    /// length or `src.len()` past capacity; [`ModelError::Candle`].
    pub fn sync_from(&mut self, src: &KvCache, from: usize) -> Result<(), ModelError> {
        let n = src.len;
        if from > n || from > self.len || n > self.capacity || src.layers() != self.layers() {
            return Err(ModelError::Input(format!(
                "cannot sync positions {from}..{n} into a cache of {} of {} positions",
                self.len, self.capacity
            )));
        }
        for (dst, s) in [(&self.keys, &src.keys), (&self.values, &src.values)] {
            for (d, s) in dst.iter().zip(s) {
                if d.dims()[0] != s.dims()[0] || d.dims()[2] != s.dims()[2] {
                    return Err(ModelError::Input("caches of different models".into()));
                }
                if n > from {
                    d.slice_set(&s.narrow(1, from, n - from)?.contiguous()?, 1, from)?;
                }
            }
        }
        self.len = n;
        Ok(())
    }

    /// A copy of positions `from..self.len()` of every layer that stays as it
    /// is when the cache moves on. Errors: [`ModelError::Input`] if `from`
    /// exceeds `len()`; [`ModelError::Candle`].
    pub fn rows(&self, from: usize) -> Result<KvRows, ModelError> {
        if from > self.len {
            return Err(ModelError::Input(format!(
                "rows from {from} beyond cache length {}",
                self.len
            )));
        }
        let idx: Vec<u32> = (from..self.len).map(|p| p as u32).collect();
        let idx = Tensor::new(idx.as_slice(), &Device::Cpu)?;
        // `index_select` allocates: the copy shares no storage with the cache.
        let pick = |v: &Vec<Tensor>| -> Result<Vec<Tensor>, ModelError> {
            v.iter().map(|t| Ok(t.index_select(&idx, 1)?)).collect()
        };
        Ok(KvRows {
            keys: pick(&self.keys)?,
            values: pick(&self.values)?,
            len: self.len - from,
            first_layer: self.first_layer,
        })
    }

    /// Rolls back to `at` and appends rows `pick` of `rows` (any order) at
    /// `at..at + pick.len()`; rows must belong at those positions (keys after
    /// RoPE), as [`Self::compact`] keeps a path.
    /// Errors: [`ModelError::Input`] if `at` exceeds `len()`, an index is out of
    /// range, the rows' layers or shapes differ, or capacity is exceeded;
    /// [`ModelError::Candle`].
    pub fn put_rows(&mut self, at: usize, rows: &KvRows, pick: &[usize]) -> Result<(), ModelError> {
        if at > self.len || at + pick.len() > self.capacity {
            return Err(ModelError::Input(format!(
                "cannot put {} rows at {at} into a cache of {} of {} positions",
                pick.len(),
                self.len,
                self.capacity
            )));
        }
        if pick.iter().any(|&i| i >= rows.len) {
            return Err(ModelError::Input(format!(
                "row indices {pick:?} must be < {}",
                rows.len
            )));
        }
        if rows.first_layer != self.first_layer || rows.keys.len() != self.keys.len() {
            return Err(ModelError::Input("rows of other layers".into()));
        }
        let pairs = || {
            self.keys
                .iter()
                .zip(&rows.keys)
                .chain(self.values.iter().zip(&rows.values))
        };
        // Every shape is checked first: a refused put leaves the cache unchanged.
        if pairs().any(|(d, s)| d.dims()[0] != s.dims()[0] || d.dims()[2] != s.dims()[2]) {
            return Err(ModelError::Input("rows of a different model".into()));
        }
        if !pick.is_empty() {
            let idx: Vec<u32> = pick.iter().map(|&i| i as u32).collect();
            let idx = Tensor::new(idx.as_slice(), &Device::Cpu)?;
            for (d, s) in pairs() {
                d.slice_set(&s.index_select(&idx, 1)?, 1, at)?;
            }
        }
        self.len = at + pick.len();
        Ok(())
    }

    /// Writes keys/values (num_kv_heads, t, head_dim) of `layer` at `at..at+t`.
    pub(crate) fn write(
        &self,
        layer: usize,
        at: usize,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<(), ModelError> {
        let i = self.slot(layer)?;
        self.keys[i].slice_set(k, 1, at)?;
        self.values[i].slice_set(v, 1, at)?;
        Ok(())
    }

    /// Index into `keys`/`values` of decoder layer `layer`.
    fn slot(&self, layer: usize) -> Result<usize, ModelError> {
        layer
            .checked_sub(self.first_layer)
            .filter(|&i| i < self.keys.len())
            .ok_or_else(|| {
                ModelError::Input(format!(
                    "layer {layer} is not in this cache (layers {:?})",
                    self.layers()
                ))
            })
    }

    /// Keys and values of `layer`, each the whole (num_kv_heads, capacity, head_dim) tensor.
    pub(crate) fn layer(&self, layer: usize) -> Result<(&Tensor, &Tensor), ModelError> {
        let i = self.slot(layer)?;
        Ok((&self.keys[i], &self.values[i]))
    }

    /// Keys and values of `layer` for `0..upto`, each (num_kv_heads, upto, head_dim).
    #[cfg(test)]
    pub(crate) fn read(&self, layer: usize, upto: usize) -> Result<(Tensor, Tensor), ModelError> {
        let i = self.slot(layer)?;
        Ok((
            self.keys[i].narrow(1, 0, upto)?,
            self.values[i].narrow(1, 0, upto)?,
        ))
    }

    /// Marks `len` positions as committed (after the forward pass wrote them).
    pub(crate) fn set_len(&mut self, len: usize) {
        debug_assert!(len <= self.capacity);
        self.len = len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ModelConfig {
        ModelConfig {
            arch: crate::config::Arch::Llama,
            hidden_size: 8,
            num_layers: 2,
            num_heads: 2,
            num_kv_heads: 2,
            head_dim: 4,
            intermediate_size: 16,
            vocab_size: 10,
            rms_norm_eps: 1e-5,
            rope_theta: 10000.0,
            max_position_embeddings: 64,
            tie_word_embeddings: true,
            rope_style: crate::config::RopeStyle::Interleaved,
        }
    }

    fn filled(c: &ModelConfig, cap: usize, len: usize, seed: f32) -> KvCache {
        let mut kv = KvCache::new(c, cap).unwrap();
        let n = c.num_kv_heads * len * c.head_dim;
        let vals: Vec<f32> = (0..n).map(|i| seed + i as f32).collect();
        let t = Tensor::from_vec(vals, (c.num_kv_heads, len, c.head_dim), &Device::Cpu).unwrap();
        for l in 0..c.num_layers {
            kv.write(l, 0, &t, &(&t * 2.0).unwrap()).unwrap();
        }
        kv.set_len(len);
        kv
    }

    fn prefix(kv: &KvCache, n: usize) -> Vec<Vec<f32>> {
        kv.layers()
            .flat_map(|l| {
                let (k, v) = kv.read(l, n).unwrap();
                [k, v].map(|t| t.flatten_all().unwrap().to_vec1::<f32>().unwrap())
            })
            .collect()
    }

    #[test]
    fn sync_copies_the_new_positions_and_keeps_the_synced_ones() {
        let c = config();
        let src = filled(&c, 8, 5, 0.0);
        let mut dst = filled(&c, 12, 7, 1000.0);
        dst.sync_from(&src, 0).unwrap();
        assert_eq!(dst.len(), 5);
        assert_eq!(prefix(&dst, 5), prefix(&src, 5));
        // Positions below `from` are not touched: make them differ first.
        let src2 = filled(&c, 8, 6, 0.5);
        dst.sync_from(&src2, 3).unwrap();
        assert_eq!(dst.len(), 6);
        let (d, s1, s2) = (prefix(&dst, 6), prefix(&src, 5), prefix(&src2, 6));
        let w = c.head_dim;
        for ((d, s1), s2) in d.iter().zip(&s1).zip(&s2) {
            for h in 0..c.num_kv_heads {
                let (row_d, row_1, row_2) = (h * 6 * w, h * 5 * w, h * 6 * w);
                assert_eq!(d[row_d..row_d + 3 * w], s1[row_1..row_1 + 3 * w]);
                assert_eq!(
                    d[row_d + 3 * w..row_d + 6 * w],
                    s2[row_2 + 3 * w..row_2 + 6 * w]
                );
            }
        }
    }

    #[test]
    fn sync_refuses_impossible_ranges() {
        let c = config();
        let src = filled(&c, 8, 5, 0.0);
        let mut small = filled(&c, 4, 2, 0.0);
        assert!(small.sync_from(&src, 0).is_err(), "beyond capacity");
        let mut dst = filled(&c, 8, 2, 0.0);
        assert!(dst.sync_from(&src, 3).is_err(), "from beyond this cache");
        assert!(dst.sync_from(&src, 6).is_err(), "from beyond the source");
    }

    #[test]
    fn resizing_keeps_the_committed_rows() {
        let c = config();
        let src = filled(&c, 8, 5, 0.0);
        for cap in [5, 6, 20] {
            let r = src.resized(cap).unwrap();
            assert_eq!((r.len(), r.capacity()), (5, cap));
            assert_eq!(prefix(&r, 5), prefix(&src, 5));
            assert_eq!(r.bytes(), KvCache::bytes_for(&c, c.num_layers, cap));
        }
        assert!(src.resized(4).is_err(), "fewer positions than rows");
        for cap in [3, 9] {
            let p = src.prefix(3, cap).unwrap();
            assert_eq!((p.len(), p.capacity()), (3, cap));
            assert_eq!(prefix(&p, 3), prefix(&src, 3));
        }
        assert!(src.prefix(6, 6).is_err(), "more rows than the cache holds");
        assert!(src.prefix(3, 2).is_err(), "fewer positions than rows");
    }

    /// Keys and values of every layer at position `pos`, all heads.
    fn at(kv: &KvCache, pos: usize) -> Vec<Vec<f32>> {
        kv.layers()
            .flat_map(|l| {
                let (k, v) = kv.read(l, kv.len()).unwrap();
                [k, v].map(|t| {
                    let row = t.narrow(1, pos, 1).unwrap();
                    row.flatten_all().unwrap().to_vec1::<f32>().unwrap()
                })
            })
            .collect()
    }

    #[test]
    fn rows_stay_as_copied_while_the_cache_is_overwritten() {
        let c = config();
        let mut kv = filled(&c, 8, 6, 0.0);
        let original = kv.fork().unwrap();
        let rows = kv.rows(2).unwrap();
        assert_eq!(rows.len(), 4);
        // Overwrite every position, then put the rows back after the first two.
        let other = filled(&c, 8, 6, 500.0);
        kv.sync_from(&other, 0).unwrap();
        assert_ne!(at(&kv, 3), at(&original, 3));
        kv.put_rows(2, &rows, &[0, 1, 2, 3]).unwrap();
        assert_eq!(kv.len(), 6);
        for pos in 0..2 {
            assert_eq!(at(&kv, pos), at(&other, pos), "position {pos}");
        }
        for pos in 2..6 {
            assert_eq!(at(&kv, pos), at(&original, pos), "position {pos}");
        }
    }

    #[test]
    fn putting_a_tree_path_back_equals_compacting_the_cache() {
        let c = config();
        // A tree pass appended 6 nodes after 3 context positions; put the path
        // [0, 2, 5] back into a drafter holding rows of its own.
        let target = filled(&c, 12, 9, 0.0);
        let window = target.rows(3).unwrap();
        let mut compacted = target.fork().unwrap();
        compacted.compact(3, &[0, 2, 5]).unwrap();
        let mut drafter = filled(&c, 12, 7, 1000.0);
        let own = drafter.fork().unwrap();
        drafter.put_rows(3, &window, &[0, 2, 5]).unwrap();
        assert_eq!(drafter.len(), 6);
        for pos in 0..3 {
            assert_eq!(at(&drafter, pos), at(&own, pos), "position {pos}");
        }
        for pos in 3..6 {
            assert_eq!(at(&drafter, pos), at(&compacted, pos), "position {pos}");
        }
    }

    #[test]
    fn put_rows_refuses_impossible_ranges() {
        let c = config();
        let rows = filled(&c, 8, 5, 0.0).rows(1).unwrap();
        let mut dst = filled(&c, 6, 3, 0.0);
        assert!(dst.put_rows(4, &rows, &[0]).is_err(), "at beyond the cache");
        assert!(
            dst.put_rows(3, &rows, &[0, 1, 2, 3]).is_err(),
            "beyond capacity"
        );
        assert!(
            dst.put_rows(1, &rows, &[4]).is_err(),
            "index beyond the rows"
        );
        assert!(
            filled(&c, 8, 5, 0.0).rows(6).is_err(),
            "from beyond the cache"
        );
        let mut other = KvCache::for_layers(&c, 8, 1..2).unwrap();
        assert!(other.put_rows(0, &rows, &[0]).is_err(), "other layers");
        let wide = ModelConfig {
            head_dim: 8,
            ..config()
        };
        let mut wider = filled(&wide, 8, 3, 0.0);
        let before: Vec<_> = (0..3).map(|p| at(&wider, p)).collect();
        assert!(wider.put_rows(1, &rows, &[0]).is_err(), "another model");
        assert_eq!((0..3).map(|p| at(&wider, p)).collect::<Vec<_>>(), before);
        assert_eq!(dst.len(), 3, "a refused put leaves the cache as it was");
    }
}

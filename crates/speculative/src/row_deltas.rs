//! The deltas each cached row was last computed with, in f16 (`2 · Σ d_out` bytes per row): a
//! settling pass starts from them (a warm start: Kelley, *Iterative Methods for Linear and
//! Nonlinear Equations*, SIAM 1995, §4.2), so its first pass reproduces the row and each trip
//! contracts its residual further. Nothing here leaves the client.

use candle_core::DType;
use cipherlora_model::{GroupDeltas, PassDeltas, Proj, Tensor};

use crate::SpecError;

/// One stored stretch of rows: `(rows, deltas)` with (rows, d_out) f16 tensors per adapted
/// projection.
type Chunk = (usize, PassDeltas);

/// The deltas of cached rows `0..len()` (the rows a [`RowDeltas::push`] appended, in cache order).
#[derive(Debug, Default, Clone)]
pub(crate) struct RowDeltas {
    chunks: Vec<Chunk>,
    len: usize,
}

fn model_err(e: impl Into<cipherlora_model::ModelError>) -> SpecError {
    SpecError::Model(e.into())
}

/// Rows `rows` (indices into the pass's T rows) of every delta of `deltas`, converted to `dtype`.
fn select(deltas: &PassDeltas, rows: &[usize], dtype: DType) -> Result<PassDeltas, SpecError> {
    let idx: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
    let mut index: Option<Tensor> = None;
    let mut out = PassDeltas::with_capacity(deltas.len());
    for (&key, group) in deltas {
        let mut one = GroupDeltas::none();
        for (proj, d) in group.iter() {
            // One index tensor for every delta (they share a device).
            let index = match &index {
                Some(i) => i,
                None => index.insert(Tensor::new(idx.as_slice(), d.device()).map_err(model_err)?),
            };
            let picked = d
                .index_select(index, 0)
                .and_then(|t| t.to_dtype(dtype))
                .map_err(model_err)?;
            one.push(proj, picked);
        }
        out.insert(key, one);
    }
    Ok(out)
}

impl RowDeltas {
    /// An empty log.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Rows logged.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Bytes of the logged deltas (f16).
    pub(crate) fn bytes(&self) -> usize {
        self.chunks
            .iter()
            .flat_map(|(_, d)| d.values())
            .flat_map(|g| g.iter())
            .map(|(_, t)| t.elem_count() * 2)
            .sum()
    }

    /// Appends rows `rows` of a pass's deltas ((T, d_out) per projection). Errors:
    /// [`SpecError::Model`] when a row is past a delta's rows.
    pub(crate) fn push(&mut self, deltas: &PassDeltas, rows: &[usize]) -> Result<(), SpecError> {
        if rows.is_empty() {
            return Ok(());
        }
        self.chunks
            .push((rows.len(), select(deltas, rows, DType::F16)?));
        self.len += rows.len();
        Ok(())
    }

    /// Appends rows `0..n` of a pass's deltas; errors as [`RowDeltas::push`].
    pub(crate) fn push_first(&mut self, deltas: &PassDeltas, n: usize) -> Result<(), SpecError> {
        self.push(deltas, &(0..n).collect::<Vec<_>>())
    }

    /// Keeps rows `..len` (a no-op past the end).
    pub(crate) fn truncate(&mut self, len: usize) {
        while self.len > len {
            let (n, _) = self.chunks.last().expect("len > 0 means a chunk");
            let n = *n;
            if self.len - n >= len {
                self.chunks.pop();
                self.len -= n;
                continue;
            }
            let keep = n - (self.len - len);
            let (rows, deltas) = self.chunks.last_mut().expect("checked above");
            for group in deltas.values_mut() {
                let mut cut = GroupDeltas::none();
                for (proj, d) in group.iter() {
                    // Narrowing a stored row range cannot fail.
                    cut.push(proj, d.narrow(0, 0, keep).expect("keep < rows"));
                }
                *group = cut;
            }
            *rows = keep;
            self.len = len;
        }
    }

    /// The deltas of `rows` as a `t`-position pass in f32, padding repeating the last row; `None`
    /// when a row is not logged. Errors: [`SpecError::Model`].
    pub(crate) fn start(
        &self,
        rows: std::ops::Range<usize>,
        t: usize,
    ) -> Result<Option<PassDeltas>, SpecError> {
        if rows.is_empty() || rows.end > self.len {
            return Ok(None);
        }
        // (chunk, first row in it, rows taken) covering `rows`.
        let mut pieces = Vec::new();
        let mut at = 0;
        for (i, (n, _)) in self.chunks.iter().enumerate() {
            let (lo, hi) = (rows.start.max(at), rows.end.min(at + n));
            if lo < hi {
                pieces.push((i, lo - at, hi - lo));
            }
            at += n;
        }
        let (_, first) = &self.chunks[pieces[0].0];
        let mut out = PassDeltas::with_capacity(first.len());
        for key in first.keys() {
            let projs: Vec<Proj> = first[key].iter().map(|(p, _)| p).collect();
            let mut group = GroupDeltas::none();
            for proj in projs {
                let mut parts = Vec::with_capacity(pieces.len() + 1);
                for &(c, from, n) in &pieces {
                    let d = self.chunks[c]
                        .1
                        .get(key)
                        .and_then(|g| g.get(proj))
                        .ok_or_else(|| SpecError::Invariant {
                            what: "logged rows disagree on their projections",
                        })?;
                    parts.push(d.narrow(0, from, n).map_err(model_err)?);
                }
                let last = parts.last().expect("rows is non-empty");
                let last_row = last
                    .narrow(0, last.dim(0).map_err(model_err)? - 1, 1)
                    .map_err(model_err)?;
                let width = last_row.dim(1).map_err(model_err)?;
                if t > rows.len() {
                    parts.push(
                        last_row
                            .broadcast_as((t - rows.len(), width))
                            .map_err(model_err)?,
                    );
                }
                let all = Tensor::cat(&parts, 0)
                    .and_then(|a| a.to_dtype(DType::F32))
                    .map_err(model_err)?;
                group.push(proj, all);
            }
            out.insert(*key, group);
        }
        Ok(Some(out))
    }
}

#[cfg(test)]
mod tests {
    use cipherlora_model::ProjGroup;
    use proptest::prelude::*;

    use super::*;

    /// A pass of `t` rows whose row `i`, projection column `j` holds `tag + i + j / 8` (exact in
    /// f16 for the sizes used here).
    fn pass(tag: f32, t: usize) -> PassDeltas {
        let dev = candle_core::Device::Cpu;
        let mk = |w: usize| {
            let v: Vec<f32> = (0..t * w)
                .map(|k| tag + (k / w) as f32 + (k % w) as f32 / 8.0)
                .collect();
            Tensor::from_vec(v, (t, w), &dev).unwrap()
        };
        let mut out = PassDeltas::new();
        out.insert(
            (0, ProjGroup::Qkv),
            GroupDeltas::none()
                .with(Proj::Q, mk(3))
                .with(Proj::V, mk(2)),
        );
        out.insert((1, ProjGroup::O), GroupDeltas::none().with(Proj::O, mk(3)));
        out
    }

    fn rows_of(d: &PassDeltas) -> Vec<Vec<f32>> {
        let mut keys: Vec<_> = d.keys().copied().collect();
        keys.sort();
        let t = d[&keys[0]].iter().next().unwrap().1.dim(0).unwrap();
        (0..t)
            .map(|i| {
                keys.iter()
                    .flat_map(|k| d[k].iter().collect::<Vec<_>>())
                    .flat_map(|(_, x)| x.get(i).unwrap().to_vec1::<f32>().unwrap())
                    .collect()
            })
            .collect()
    }

    proptest! {
        /// Pushes, truncations and reads agree with a plain list of rows.
        #[test]
        fn the_log_reads_back_what_a_list_of_rows_holds(
            ops in prop::collection::vec((0usize..3, 1usize..6, 0usize..40), 1..12),
            probe in (0usize..30, 1usize..9),
        ) {
            let mut log = RowDeltas::new();
            let mut list: Vec<Vec<f32>> = Vec::new();
            for (n, (kind, rows, at)) in ops.into_iter().enumerate() {
                match kind {
                    0 => {
                        let p = pass(n as f32 * 10.0, 6);
                        log.push_first(&p, rows).unwrap();
                        list.extend(rows_of(&p).into_iter().take(rows));
                    }
                    1 => {
                        // A tree round keeps scattered rows.
                        let p = pass(n as f32 * 10.0, 6);
                        let keep: Vec<usize> = (0..6).rev().step_by(2).take(rows).collect();
                        log.push(&p, &keep).unwrap();
                        let all = rows_of(&p);
                        list.extend(keep.iter().map(|&k| all[k].clone()));
                    }
                    _ => {
                        log.truncate(at);
                        list.truncate(at);
                    }
                }
                prop_assert_eq!(log.len(), list.len());
            }
            let (from, n) = probe;
            let t = n + 2;
            let got = log.start(from..from + n, t).unwrap();
            if from + n > list.len() {
                prop_assert!(got.is_none());
            } else {
                let got = rows_of(&got.unwrap());
                prop_assert_eq!(got.len(), t);
                for i in 0..t {
                    // The padding repeats the last row.
                    prop_assert_eq!(&got[i], &list[from + i.min(n - 1)]);
                }
            }
        }
    }
}

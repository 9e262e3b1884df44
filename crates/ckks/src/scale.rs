//! Scale equality and the checks of a product term, shared by the evaluator and hoisting.

use crate::error::{CkksError, Result};

/// Relative tolerance under which two scales count as equal.
pub const SCALE_TOLERANCE: f64 = 1e-9;

/// `Ok` when scales agree within [`SCALE_TOLERANCE`] (relative). Errors:
/// [`CkksError::ScaleMismatch`].
pub(crate) fn check_scale(a: f64, b: f64) -> Result<()> {
    if (a - b).abs() <= SCALE_TOLERANCE * a.abs().max(b.abs()) {
        Ok(())
    } else {
        Err(CkksError::ScaleMismatch { left: a, right: b })
    }
}

/// Checks one ct×pt term at `level`: levels, and `product_scale` equal to the recorded `scale` (set
/// by the first term). Errors: [`CkksError::LevelMismatch`], [`CkksError::ScaleMismatch`]; `scale`
/// unchanged then.
pub(crate) fn check_product_term(
    level: usize,
    scale: &mut Option<f64>,
    ct_level: usize,
    pt_level: usize,
    product_scale: f64,
) -> Result<()> {
    if ct_level != level {
        return Err(CkksError::LevelMismatch {
            left: level,
            right: ct_level,
        });
    }
    if pt_level < level {
        return Err(CkksError::LevelMismatch {
            left: level,
            right: pt_level,
        });
    }
    match *scale {
        Some(prev) => check_scale(prev, product_scale),
        None => {
            *scale = Some(product_scale);
            Ok(())
        }
    }
}

/// What an accumulator's `add_products` does with a batch that passed [`check_batch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BatchPath {
    /// No terms: nothing to add.
    Empty,
    /// The accumulator already holds terms: add one product at a time (not a hot path).
    OntoEarlierTerms,
    /// An empty accumulator: the one-pass lazy sum, normalised on the way.
    Fresh,
}

/// Checks a batch (equal counts, then `check(k)` per term), restoring `scale` on error; returns the
/// path for an accumulator holding `terms` terms. Errors: [`CkksError::TermCountMismatch`], or the
/// first term's error.
pub(crate) fn check_batch(
    n_cts: usize,
    n_pts: usize,
    terms: usize,
    scale: &mut Option<f64>,
    mut check: impl FnMut(&mut Option<f64>, usize) -> Result<()>,
) -> Result<BatchPath> {
    if n_cts != n_pts {
        return Err(CkksError::TermCountMismatch {
            ciphertexts: n_cts,
            plaintexts: n_pts,
        });
    }
    let saved = *scale;
    for k in 0..n_cts {
        if let Err(e) = check(scale, k) {
            *scale = saved;
            return Err(e);
        }
    }
    Ok(match (n_cts, terms) {
        (0, _) => BatchPath::Empty,
        (_, 0) => BatchPath::Fresh,
        _ => BatchPath::OntoEarlierTerms,
    })
}

/// [`check_batch`] for several sums into fresh accumulators; returns whether each has terms,
/// resetting every scale on error. Errors as `check_batch`.
pub(crate) fn check_fresh_batches(
    scales: &mut [&mut Option<f64>],
    lens: impl IntoIterator<Item = (usize, usize)>,
    mut check: impl FnMut(usize, &mut Option<f64>, usize) -> Result<()>,
) -> Result<Vec<bool>> {
    let mut fresh = Vec::with_capacity(scales.len());
    for (m, (n_cts, n_pts)) in lens.into_iter().enumerate() {
        let result = match scales.get_mut(m) {
            Some(scale) => check_batch(n_cts, n_pts, 0, scale, |s, k| check(m, s, k)),
            None => Ok(BatchPath::Empty),
        };
        match result {
            Ok(path) => fresh.push(path == BatchPath::Fresh),
            Err(e) => {
                for scale in scales.iter_mut() {
                    **scale = None;
                }
                return Err(e);
            }
        }
    }
    Ok(fresh)
}

//! Scale equality, shared by the evaluator and hoisting.

use crate::error::{CkksError, Result};

/// Relative tolerance under which two scales count as equal.
pub const SCALE_TOLERANCE: f64 = 1e-9;

/// `Ok` when scales `a` and `b` agree within [`SCALE_TOLERANCE`] (relative).
///
/// # Errors
/// [`CkksError::ScaleMismatch`] otherwise.
pub(crate) fn check_scale(a: f64, b: f64) -> Result<()> {
    if (a - b).abs() <= SCALE_TOLERANCE * a.abs().max(b.abs()) {
        Ok(())
    } else {
        Err(CkksError::ScaleMismatch { left: a, right: b })
    }
}

//! `--acceptance-prior`: the per-token acceptance rate the client's width model assumes, checked as
//! the adapter's published hint is.

/// Parses `--acceptance-prior`: a probability strictly in (0, 1) (as
/// [`cipherlora_private::protocol::is_acceptance_hint`]). Errors: not a number, or outside (0, 1).
pub fn parse_acceptance_prior(s: &str) -> Result<f64, String> {
    let a: f64 = s
        .parse()
        .map_err(|e| format!("{s:?} is not a number: {e}"))?;
    if cipherlora_private::protocol::is_acceptance_hint(a) {
        Ok(a)
    } else {
        Err(format!(
            "{a} is not an acceptance rate: it must lie strictly between 0 and 1"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::parse_acceptance_prior;

    /// Regression: `--acceptance-prior 5` was taken (the width model clamped it silently); now only
    /// a probability in (0, 1) is.
    #[test]
    fn an_acceptance_prior_outside_0_1_is_refused() {
        assert_eq!(parse_acceptance_prior("0.9"), Ok(0.9));
        assert_eq!(parse_acceptance_prior("0.05"), Ok(0.05));
        for bad in ["0", "1", "5", "-0.2", "NaN", "inf", "high", ""] {
            assert!(parse_acceptance_prior(bad).is_err(), "{bad:?}");
        }
    }
}

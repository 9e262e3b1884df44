//! Benchmarks behind `cipherlora bench`: each one writes a JSON report (the
//! machine-readable figures) and a Markdown table (what BENCHMARKS.md quotes).
//!
//! Speed is never asserted in tests; it is measured here, with ratios taken
//! side by side in one run because the machines are small and noisy.

pub mod ckks;
pub mod helora;
pub mod model;

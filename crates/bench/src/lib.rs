//! Benchmarks behind `cipherlora bench`: each one writes a JSON report (the
//! machine-readable figures) and a Markdown table (what BENCHMARKS.md quotes).
//!
//! Speed is never asserted in tests; it is measured here, with ratios taken
//! side by side in one run because the machines are small and noisy.

pub mod api;
pub mod chat;
pub mod ckks;
pub mod e2e;
pub mod helora;
pub mod model;
pub mod split;
pub mod split_inference;

use std::path::{Path, PathBuf};

use anyhow::Context;

/// Writes a report: `report` as pretty JSON to `json` and `md` to
/// `markdown` (default: `json` with the extension `.md`), creating the
/// folder. Returns the Markdown path.
///
/// # Errors
/// When a folder or file cannot be written, or the report not serialised.
pub fn write_report(
    json: &Path,
    markdown: Option<&Path>,
    report: &impl serde::Serialize,
    md: &str,
) -> anyhow::Result<PathBuf> {
    if let Some(dir) = json.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(json, serde_json::to_string_pretty(report)?)
        .with_context(|| format!("writing {}", json.display()))?;
    let md_path = markdown.map_or_else(|| json.with_extension("md"), Path::to_path_buf);
    std::fs::write(&md_path, md).with_context(|| format!("writing {}", md_path.display()))?;
    Ok(md_path)
}

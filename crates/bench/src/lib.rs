//! Benchmarks behind `cipherlora bench`: each writes a JSON report and a
//! Markdown table (quoted by docs/benchmarks/). Ratios are taken side by side
//! in one run; speed is never asserted in tests.

pub mod api;
pub mod chat;
pub mod ckks;
pub mod e2e;
pub mod helora;
pub mod masked_ring;
pub mod model;
pub mod split_inference;
pub mod trip;

use std::path::{Path, PathBuf};

use anyhow::Context;

/// Writes `report` as pretty JSON to `json` and `md` to `markdown`
/// (default: `json` with `.md`), creating the folder; returns that path.
/// Errors: a folder or file cannot be written, or serialisation fails.
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

//! Planner op costs measured once per machine and kept in `<cache
//! dir>/opcosts-v<N>-<preset>-<machine>.json`, so a restarted server offers the same plans;
//! `<machine>` hashes the CPU model and count. Debug builds keep a file of their own
//! (`…-debug.json`: tests measure under load). Bad files are re-measured; failed writes are
//! ignored.

use std::path::{Path, PathBuf};

use cipherlora_helora::planner::OpCosts;

use crate::PrivateError;

/// The cache directory: the default model's ([`cipherlora_model::fetch::cache_dir`]).
#[must_use]
pub fn cache_dir() -> PathBuf {
    cipherlora_model::fetch::cache_dir()
}

/// A stable name for this machine's CPU: FNV-1a 64 of the first `model name` of `/proc/cpuinfo`
/// (empty where unreadable) and the CPU count.
#[must_use]
pub fn machine_key() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .map(str::to_string)
        })
        .unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    let id = cipherlora_service::plan_id(format!("{model}|{cpus}").as_bytes());
    format!("{id:016x}")
}

/// Version of the measured costs in the file name, raised when a priced kernel changes speed.
pub const COSTS_VERSION: u32 = 2;

/// The cache file's name for `preset` on `machine` (module docs).
fn cache_file_name(preset: &str, machine: &str, debug_build: bool) -> String {
    let build = if debug_build { "-debug" } else { "" };
    format!("opcosts-v{COSTS_VERSION}-{preset}-{machine}{build}.json")
}

/// The costs for `preset` from `dir`'s cache, or `measure()`d and stored. Errors: those of
/// `measure`; never a cache read or write failure.
pub fn cached_costs(
    dir: &Path,
    preset: &str,
    measure: impl FnOnce() -> Result<OpCosts, PrivateError>,
) -> Result<OpCosts, PrivateError> {
    let f = dir.join(cache_file_name(
        preset,
        &machine_key(),
        cfg!(debug_assertions),
    ));
    if let Ok(text) = std::fs::read_to_string(&f) {
        match serde_json::from_str::<OpCosts>(&text) {
            Ok(c) => {
                tracing::info!(file = %f.display(), "planner op costs from the machine cache");
                return Ok(c);
            }
            Err(e) => {
                tracing::warn!(file = %f.display(), error = %e, "ignoring a malformed op-cost cache")
            }
        }
    }
    // Plan with what a later start will read back (JSON text → f64 may differ from the measured f64
    // in the last bit): the same plans.
    let measured = measure()?;
    let json = serde_json::to_string_pretty(&measured).unwrap_or_default();
    let costs = serde_json::from_str::<OpCosts>(&json).unwrap_or(measured);
    let write = || -> std::io::Result<()> {
        if let Some(parent) = f.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let tmp = f.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, &json)?;
        std::fs::rename(&tmp, &f)
    };
    if let Err(e) = write() {
        tracing::warn!(file = %f.display(), error = %e, "could not cache the op costs");
    }
    Ok(costs)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: a test run (dev profile, every core busy) wrote the release server's cache, and
    /// `serve` planned from costs 5× too high.
    #[test]
    fn debug_builds_keep_their_op_costs_apart() {
        let release = cache_file_name("N8192Depth2Fast", "651f", false);
        let debug = cache_file_name("N8192Depth2Fast", "651f", true);
        assert_eq!(release, "opcosts-v2-N8192Depth2Fast-651f.json");
        assert_ne!(debug, release);
        assert!(debug.ends_with(".json") && debug.contains("651f"));
    }

    /// Op costs are measured once per machine, so a restarted server picks the same plans.
    #[test]
    fn op_costs_are_measured_once_per_machine_and_read_back_identical() {
        let dir = std::env::temp_dir().join(format!("cl-costs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut measured = OpCosts::default();
        measured.rotate_ms[1] = 1.234_567_890_123;
        let mut calls = 0;
        let first = cached_costs(&dir, "p", || {
            calls += 1;
            Ok(measured.clone())
        })
        .unwrap();
        let second = cached_costs(&dir, "p", || {
            calls += 1;
            Ok(OpCosts::default())
        })
        .unwrap();
        assert_eq!(calls, 1, "the second start must not measure");
        assert_eq!(first, second, "a restart must plan with the same costs");
        assert!((first.rotate_ms[1] - measured.rotate_ms[1]).abs() < 1e-12);
        // Another preset is measured on its own.
        let other = cached_costs(&dir, "q", || Ok(OpCosts::default())).unwrap();
        assert_eq!(other, OpCosts::default());
        // A corrupt file is measured again and rewritten.
        for e in std::fs::read_dir(&dir).unwrap() {
            std::fs::write(e.unwrap().path(), "{not json").unwrap();
        }
        let again = cached_costs(&dir, "p", || Ok(measured.clone())).unwrap();
        assert_eq!(again, first);
        let reread = cached_costs(&dir, "p", || panic!("must be cached")).unwrap();
        assert_eq!(reread, first);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

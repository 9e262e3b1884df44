//! Helpers of the tests that run `cipherlora serve` as a process: ports, a
//! throw-away certificate and token, the server, and its `/metrics`.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_cipherlora");
pub const TOKEN: &str = "process-test-token-0123456789";

/// The workspace root (where `adapters/` lives).
pub fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A fresh folder `name` under the temp dir holding `dev-cert`'s files and a token file `token`.
pub fn credentials(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cl-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let made = Command::new(BIN)
        .args(["dev-cert", "--out"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    std::fs::write(dir.join("token"), TOKEN).unwrap();
    dir
}

/// `GET /metrics` from `port`, if it answers.
pub fn metrics(port: u16) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    Some(text)
}

/// The value of a metric line starting with `name`, summed over labels.
pub fn value(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Polls the metrics until `done` holds or `limit` passes; the last text.
pub fn wait_for(port: u16, limit: Duration, done: impl Fn(&str) -> bool) -> (bool, String) {
    let t0 = Instant::now();
    let mut last = String::new();
    while t0.elapsed() < limit {
        if let Some(text) = metrics(port) {
            if done(&text) {
                return (true, text);
            }
            last = text;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    (false, last)
}

/// A child process killed (SIGKILL) when dropped.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `serve` with the FFA code adapter on `port`, metrics on `metrics_port`, the credentials in
/// `dir`; its log goes to `dir/serve-<port>-<n>.log`.
pub fn serve(dir: &Path, port: u16, metrics_port: u16) -> Killed {
    let n = std::fs::read_dir(dir).map_or(0, Iterator::count);
    let log = std::fs::File::create(dir.join(format!("serve-{port}-{n}.log"))).unwrap();
    let child = Command::new(BIN)
        .args(["serve", "--adapter", "adapters/code-ffa-r16", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--metrics-listen")
        .arg(format!("127.0.0.1:{metrics_port}"))
        .arg("--tls-cert")
        .arg(dir.join("cert.pem"))
        .arg("--tls-key")
        .arg(dir.join("key.pem"))
        .arg("--token-file")
        .arg(dir.join("token"))
        .current_dir(root())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("starting serve");
    Killed(child)
}

/// `generate` against the server on `port` with the FFA code adapter (per-group schedule, K = 4,
/// one thread) and the extra `args`.
pub fn generate(dir: &Path, port: u16, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(["generate", "--server"])
        .arg(format!("https://127.0.0.1:{port}"))
        .args(["--adapter-id", "code-ffa-r16", "--token-file"])
        .arg(dir.join("token"))
        .arg("--ca-cert")
        .arg(dir.join("ca.pem"))
        .args(["--k", "4", "--schedule", "per-group", "--threads", "1"])
        .args(args)
        .current_dir(root());
    c
}

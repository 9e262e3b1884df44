//! A client killed mid-generation (SIGKILL: no close, no goodbye) leaves
//! sessions whose streams ended, and maybe one it never used; with its
//! default limits `serve` frees them within 30 s (the detached and unstarted
//! timeouts), not after the 10-minute idle timeout.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_cipherlora");
const TOKEN: &str = "dead-client-test-token-0123456789";

fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET /metrics` from `port`, if it answers.
fn metrics(port: u16) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    Some(text)
}

/// The value of a metric line starting with `name`, summed over labels.
fn value(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Polls the metrics until `done` holds or `limit` passes; the last text.
fn wait_for(port: u16, limit: Duration, done: impl Fn(&str) -> bool) -> (bool, String) {
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

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(dir: &Path, port: u16, metrics_port: u16) -> Killed {
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
        .stderr(Stdio::null())
        .spawn()
        .expect("starting serve");
    Killed(child)
}

#[test]
fn a_killed_clients_sessions_are_freed_within_seconds() {
    let dir = std::env::temp_dir().join(format!("cl-dead-client-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let made = Command::new(BIN)
        .args(["dev-cert", "--out"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    std::fs::write(dir.join("token"), TOKEN).unwrap();
    let (port, metrics_port) = (free_port(), free_port());
    let _server = serve(&dir, port, metrics_port);
    let (up, text) = wait_for(metrics_port, Duration::from_secs(60), |_| true);
    assert!(up, "serve did not come up: {text}");

    let client = Command::new(BIN)
        .args(["generate", "--server"])
        .arg(format!("https://127.0.0.1:{port}"))
        .args(["--adapter-id", "code-ffa-r16", "--token-file"])
        .arg(dir.join("token"))
        .arg("--ca-cert")
        .arg(dir.join("ca.pem"))
        .args(["--k", "4", "--schedule", "per-group", "--threads", "1"])
        .args(["--prompt", "def fibonacci(n):\n", "--max-tokens", "2000"])
        .current_dir(root())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting generate");
    let mut client = Killed(client);
    // Mid-generation: sessions open and group requests answered.
    let (running, text) = wait_for(metrics_port, Duration::from_secs(120), |t| {
        value(t, "cipherlora_sessions_active") >= 1.0
            && value(t, "cipherlora_requests_total{rpc=\"rounds\"") >= 120.0
    });
    assert!(running, "the client never got going: {text}");
    client.0.kill().unwrap(); // SIGKILL on Unix
    let killed = Instant::now();
    let (freed, text) = wait_for(metrics_port, Duration::from_secs(30), |t| {
        value(t, "cipherlora_sessions_active") == 0.0
    });
    assert!(
        freed,
        "sessions outlived their killed client by 30 s: {text}"
    );
    assert!(
        text.contains("cipherlora_sessions_total{event=\"evicted\"}"),
        "{text}"
    );
    eprintln!("freed {:?} after the kill", killed.elapsed());
    let _ = std::fs::remove_dir_all(&dir);
}

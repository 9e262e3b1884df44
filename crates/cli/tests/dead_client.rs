//! A client killed mid-generation (SIGKILL: no close, no goodbye) leaves
//! sessions whose streams ended, and maybe one it never used; with its
//! default limits `serve` frees them within 30 s (the detached and unstarted
//! timeouts), not after the 10-minute idle timeout.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{Killed, credentials, free_port, generate, serve, value, wait_for};

#[test]
fn a_killed_clients_sessions_are_freed_within_seconds() {
    let dir = credentials("dead-client");
    let (port, metrics_port) = (free_port(), free_port());
    let _server = serve(&dir, port, metrics_port);
    let (up, text) = wait_for(metrics_port, Duration::from_secs(60), |_| true);
    assert!(up, "serve did not come up: {text}");

    let client = generate(
        &dir,
        port,
        &["--prompt", "def fibonacci(n):\n", "--max-tokens", "2000"],
    )
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

//! SIGTERM to `serve` during a generation: the replica turns unready, lets
//! its in-flight rounds finish and exits; a fresh replica comes up on the
//! same address (what a balancer's next replica is to the client). The
//! client reconnects, reopens its sessions with the same keys, replays the
//! unanswered round and finishes with the plaintext adapted model's output.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{credentials, free_port, generate, serve, value, wait_for};

#[test]
fn a_generation_outlives_a_sigterm_to_its_server_with_exact_output() {
    let dir = credentials("sigterm");
    let (port, metrics_port) = (free_port(), free_port());
    let mut first = serve(&dir, port, metrics_port);
    let (up, text) = wait_for(metrics_port, Duration::from_secs(60), |_| true);
    assert!(up, "serve did not come up: {text}");

    let client = generate(
        &dir,
        port,
        &[
            "--adapter",
            "adapters/code-ffa-r16",
            "--check-plaintext",
            "--prompt",
            "def fibonacci(n):\n",
            "--max-tokens",
            "40",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("starting generate");
    let (running, text) = wait_for(metrics_port, Duration::from_secs(120), |t| {
        value(t, "cipherlora_requests_total{rpc=\"rounds\"") >= 120.0
    });
    assert!(running, "the client never got going: {text}");

    let term = Command::new("kill")
        .args(["-TERM", &first.0.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let t0 = Instant::now();
    let exit = loop {
        if let Some(s) = first.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "serve did not exit within 30 s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(exit.success(), "serve exited with {exit} after SIGTERM");

    let second_metrics = free_port();
    let _second = serve(&dir, port, second_metrics);
    let out = client.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "generate failed: {stderr}");
    assert!(
        stderr.contains("the private output equals the plaintext adapted model's"),
        "{stderr}"
    );
    let (_, text) = wait_for(second_metrics, Duration::from_secs(5), |_| true);
    assert!(
        value(&text, "cipherlora_sessions_total{event=\"opened\"}") >= 1.0,
        "the client never reopened on the fresh replica: {text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

//! `cipherlora serve`'s refusal to start insecure.

use std::process::Command;

fn serve(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_cipherlora"))
        .arg("serve")
        .args([
            "--adapter",
            "adapters/code-ffa-r16",
            "--listen",
            "127.0.0.1:0",
        ])
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .output()
        .expect("running cipherlora");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `serve` refuses to run without TLS or authentication unless `--insecure`, before loading
/// anything.
#[test]
fn serve_refuses_to_start_without_tls_and_tokens_unless_insecure() {
    let (ok, err) = serve(&[]);
    assert!(!ok, "served without TLS and tokens");
    assert!(err.contains("--insecure"), "{err}");
    assert!(err.contains("TLS") && err.contains("tokens"), "{err}");
    let (ok, err) = serve(&[
        "--tls-cert",
        "/nonexistent/c.pem",
        "--tls-key",
        "/nonexistent/k.pem",
    ]);
    assert!(!ok);
    assert!(
        err.contains("--token-file") && !err.contains("TLS ("),
        "{err}"
    );
    let (ok, err) = serve(&["--token-file", "/nonexistent/tokens"]);
    assert!(!ok);
    assert!(
        err.contains("--tls-cert") && !err.contains("--token-file"),
        "{err}"
    );
    // A malformed --config is refused (it is read before anything loads).
    let dir = std::env::temp_dir().join(format!("cl-serve-flags-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("serve.toml");
    std::fs::write(&cfg, "[limits]\nno_such_limit = 1\n").unwrap();
    let (ok, err) = serve(&["--insecure", "--config", cfg.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("serve.toml"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `serve-split` refuses to start insecure just as `serve` does, before it loads a model.
#[test]
fn serve_split_refuses_to_start_without_tls_and_tokens_unless_insecure() {
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_cipherlora"))
            .args(["serve-split", "--listen", "127.0.0.1:0"])
            .args(args)
            .output()
            .expect("running cipherlora");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, err) = run(&[]);
    assert!(!ok, "served without TLS and tokens");
    assert!(err.contains("--insecure") && err.contains("TLS"), "{err}");
    let (ok, err) = run(&["--token-file", "/nonexistent/tokens"]);
    assert!(!ok);
    assert!(
        err.contains("TLS (") && !err.contains("--token-file"),
        "{err}"
    );
}

//! `generate --draft-model` against a real `serve` (FFA code adapter, gRPC + TLS): the default
//! model loaded as a separate draft model keeps the output equal to the plaintext adapted run
//! (`--check-plaintext` fails the command otherwise), and a draft model without the target's
//! tokenizer is refused with an error that names it.

mod common;

use std::time::Duration;

use cipherlora_model::{SyntheticQuant, fetch, synthetic_shape, write_synthetic_gguf};
use common::{credentials, free_port, generate, serve, wait_for};

#[test]
fn a_draft_model_with_the_targets_tokenizer_drafts_exactly_and_another_is_refused() {
    let dir = credentials("draft-model");
    let (port, metrics_port) = (free_port(), free_port());
    let _server = serve(&dir, port, metrics_port);
    let (up, text) = wait_for(metrics_port, Duration::from_secs(60), |_| true);
    assert!(up, "serve did not come up: {text}");
    let target = fetch::ensure_default_model().expect("default model");
    let run = |draft_model: &std::path::Path| {
        generate(
            &dir,
            port,
            &["--prompt", "def fibonacci(n):\n", "--max-tokens", "12"],
        )
        .arg("--draft-model")
        .arg(draft_model)
        .args(["--check-plaintext", "--adapter", "adapters/code-ffa-r16"])
        .output()
        .expect("running generate")
    };

    let same = run(&target);
    let stderr = String::from_utf8_lossy(&same.stderr);
    assert!(same.status.success(), "{stderr}");
    assert!(stderr.contains("the private output equals"), "{stderr}");

    // A GGUF of random weights and no tokenizer.
    let other = dir.join("no-tokenizer.gguf");
    let mut shape = synthetic_shape("test-d1024").unwrap();
    shape.num_layers = 1;
    write_synthetic_gguf(&other, &shape, SyntheticQuant::Q4_1, 1).unwrap();
    let refused = run(&other);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(stderr.contains("draft model"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

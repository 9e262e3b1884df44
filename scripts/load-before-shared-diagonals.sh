#!/usr/bin/env bash
# Dev-only: issue 15's load test (16 concurrent private sessions, 8 FFA and
# 8 standard LoRA, T = 9, default SessionMemory budget) run on the code
# before shared diagonals: commit deb9299, the parent of 9c19fe8, where every
# session encodes its own copy of the adapter's diagonals. BENCHMARKS.md
# ("Many clients, and an attacker") compares it with main's
# crates/private/tests/load_16_sessions.rs. Not part of the test suite
# (.ci/run and scripts/test.sh never call it).
#
# It checks deb9299 out in a temporary worktree, puts
# scripts/load-before-shared-diagonals/load_16_sessions_old.rs (main's test
# ported to the old API) in place of crates/private/tests/load_16_sessions.rs,
# runs
#   cargo test --release -p cipherlora-private --test load_16_sessions -- --ignored --nocapture
# and removes the worktree. Each session's outcome (opened and equal to its
# plaintext reference, or refused with which status), the diagonals reserved
# and the process RSS are printed on stderr. The test stops the process if
# its RSS passes 18 GB or the machine's MemAvailable falls below 1 GiB.
#
# The old server measures the planner's op costs at every start, so its plans
# (and the bytes a session holds) follow what the machine measured then; main
# measures once per machine and caches them. With --main-costs the old server
# plans with main's cached costs for this machine instead (the plans main's
# server offers here); --costs FILE takes any file of that format.
#
# Usage (from the repository root; a release build of the old tree, minutes):
#   scripts/load-before-shared-diagonals.sh [--main-costs | --costs FILE]
# Environment: CARGO_TARGET_DIR (default target/load-before-shared-diagonals),
# WORKTREE (default ${TMPDIR:-/tmp}/cipherlora-load-before-shared-diagonals).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

# The last commit before 9c19fe8 (shared adapter diagonals).
OLD=deb92990fb0824447cd2b0bac09d04319a482e85
test_src=$root/scripts/load-before-shared-diagonals/load_16_sessions_old.rs

costs=""
while [ $# -gt 0 ]; do
  case "$1" in
    --costs) costs=$2; shift 2 ;;
    --main-costs)
      # main's machine cache (crates/private/src/server/cost_cache.rs):
      # <cache dir>/opcosts-v2-<preset>-<FNV-1a 64 of "model name|cpus">.json
      cache=${CIPHERLORA_CACHE:-${XDG_CACHE_HOME:+$XDG_CACHE_HOME/cipherlora}}
      cache=${cache:-$HOME/.cache/cipherlora}
      key=$(python3 - <<'EOF'
import os
model = next((l.rstrip("\n") for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
h = 0xCBF29CE484222325
for b in f"{model}|{len(os.sched_getaffinity(0))}".encode():
    h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
print(f"{h:016x}")
EOF
      )
      costs=$cache/opcosts-v2-N8192Depth2Fast-$key.json
      if [ ! -f "$costs" ]; then
        echo "no op-cost cache of main for this machine: $costs" >&2
        echo "(main's server writes it on its first start, e.g. main's load_16_sessions test)" >&2
        exit 1
      fi
      shift ;;
    -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
if [ -n "$costs" ]; then
  costs=$(realpath "$costs")
fi

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target/load-before-shared-diagonals}
wt=${WORKTREE:-${TMPDIR:-/tmp}/cipherlora-load-before-shared-diagonals}

remove_worktree() {
  git -C "$root" worktree remove --force "$wt" 2>/dev/null || rm -rf "$wt"
  git -C "$root" worktree prune
}
# A worktree left by an interrupted run is replaced.
if [ -e "$wt" ]; then
  remove_worktree
fi
git -C "$root" worktree add --detach "$wt" "$OLD" >/dev/null
trap remove_worktree EXIT

cp "$test_src" "$wt/crates/private/tests/load_16_sessions.rs"

echo "load before shared diagonals: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), commit $(git -C "$wt" rev-parse HEAD)"
echo "op costs: ${costs:-measured at load by the old server}; $(nproc) CPUs, MemTotal $(awk '/MemTotal/ {print $2, $3}' /proc/meminfo)"
cd "$wt"
if [ -n "$costs" ]; then
  export CIPHERLORA_LOAD_OPCOSTS=$costs
fi
start=$(date +%s)
cargo test --release -p cipherlora-private --test load_16_sessions -- --ignored --nocapture
echo "done: $(date -u '+%Y-%m-%d %H:%M:%S UTC') ($(($(date +%s) - start)) s with the build)"

#!/usr/bin/env bash
# One adapter server on this machine's cores, 1, 2, 4 and 8 concurrent clients per adapter kind
# (FFA, standard LoRA), each with --check-plaintext; then one standard-LoRA session's fixed-point
# trip with the server on 1 and on 2 cores (bench e2e --server-cores, alternating twice). Prints
# Markdown tables (docs/benchmarks/server.md, "Many clients on one server"). Run by hand (about
# 20 minutes; not in CI):
#
#   cargo build --release -p cipherlora && scripts/concurrency.sh [target/release/cipherlora]
#
# CLIENTS (default "1 2 4 8") sets the client counts, TOKENS (default 24) the tokens per answer.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-target/release/cipherlora}")
tokens=${TOKENS:-24}
counts=${CLIENTS:-1 2 4 8}
work=$(mktemp -d)
server=""
cleanup() {
    kill $(jobs -p) 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

"$bin" dev-cert --out "$work" >/dev/null
echo "concurrency-test-token-0123456789" >"$work/tokens"

start_server() { # extra serve flags...
    "$bin" serve --adapter adapters/code-ffa-r16 --adapter adapters/general-lora-r16 \
        --listen 127.0.0.1:50081 --metrics-listen 127.0.0.1:9181 \
        --tls-cert "$work/cert.pem" --tls-key "$work/key.pem" --token-file "$work/tokens" "$@" \
        >"$work/serve.log" 2>&1 &
    server=$!
    for _ in $(seq 1 120); do
        curl -sf http://127.0.0.1:9181/readyz >/dev/null && return 0
        sleep 1
    done
    echo "the server never became ready" >&2
    exit 1
}
stop_server() {
    kill -TERM "$server"
    wait "$server" 2>/dev/null || true
}
peak_mib() { awk '/VmHWM/ {printf "%.0f", $2 / 1024}' "/proc/$server/status"; }

client() { # index adapter [extra generate flags...]
    local i=$1 adapter=$2
    shift 2
    local prompts=("def is_palindrome(s: str) -> bool:" "The town council met every evening to"
        "def fibonacci(n):" "A good way to start cooking at home is" "class Stack:"
        "The river that runs through the valley" "def count_words(text):"
        "Write a short note to a friend about")
    RUST_LOG=warn "$bin" generate --server https://localhost:50081 --adapter-id "$adapter" \
        --token-file "$work/tokens" --ca-cert "$work/ca.pem" --adapter "adapters/$adapter" \
        --check-plaintext --prompt "${prompts[$((i % 8))]}" --max-tokens "$tokens" --threads 1 "$@" \
        >"$work/client-$i.log" 2>&1
}
field() { # log regex: the first capture of the summary line
    sed -nE "s#.*$2.*#\1#p" "$1" | head -1
}
pct() { # p values...: the p-th percentile (nearest rank) of the values
    local p=$1
    shift
    printf '%s\n' "$@" | sort -g | awk -v p="$p" '{v[NR] = $1} END {i = int((p * NR + 99) / 100); if (i < 1) i = 1; print v[i]}'
}

echo "| adapter | clients | aggregate tok/s | per-client tok/s (min–max) | verify round p50 / p95 ms | server peak RSS MiB | exact |"
echo "| --- | ---: | ---: | --- | --- | ---: | --- |"
for adapter in code-ffa-r16 general-lora-r16; do
    for n in $counts; do
        start_server
        pids=()
        for i in $(seq 0 $((n - 1))); do
            client "$i" "$adapter" &
            pids+=($!)
        done
        exact=yes
        for p in "${pids[@]}"; do wait "$p" || exact=no; done
        rates=() rounds=()
        for i in $(seq 0 $((n - 1))); do
            log="$work/client-$i.log"
            grep -q "equals the plaintext adapted model's" "$log" || exact=no
            rate=$(field "$log" "tokens [0-9]+, ([0-9.]+) tok/s")
            n_rounds=$(field "$log" "tok/s, ([0-9]+) verify rounds")
            prefill=$(field "$log" "\(prefill ([0-9]+) ms\)")
            rates+=("$rate")
            # Decode time per verify round: the generation's wall time minus its prefill.
            rounds+=("$(echo "($tokens / $rate * 1000 - $prefill) / $n_rounds" | bc -l | cut -d. -f1)")
        done
        total=$(printf '%s\n' "${rates[@]}" | paste -sd+ | bc -l)
        echo "| $adapter | $n | $(printf %.2f "$total") | $(printf %.2f "$(pct 50 "${rates[@]}")") ($(pct 0 "${rates[@]}")–$(pct 100 "${rates[@]}")) | $(pct 50 "${rounds[@]}") / $(pct 95 "${rounds[@]}") | $(peak_mib) | $exact |"
        [ "$exact" = yes ] || { echo "a client failed or differed:" >&2; tail -3 "$work"/client-*.log >&2; exit 1; }
        stop_server
    done
done

echo
echo "| server cores | fixed-point trip, ms (server + network per round trip) | decode tok/s | exact |"
echo "| ---: | ---: | ---: | --- |"
for rep in 1 2; do
    for cores in 1 2; do
        json="$work/trip-$cores-$rep.json"
        "$bin" bench e2e --adapter adapters/general-lora-r16 --links loopback --schedules fixed-point:1 \
            --configs base:4 --prompts 1 --max-tokens "$tokens" --server-cores "$cores" \
            --json "$json" >"$work/trip.log" 2>&1 || { tail -5 "$work/trip.log" >&2; exit 1; }
        python3 - "$json" "$cores" <<'PY'
import json, sys
run = next(r for r in json.load(open(sys.argv[1]))["runs"] if r["mode"] == "private")
trips = run["round_trips_per_round"] * run["rounds"]
split = run["split_ms"]
print(f"| {sys.argv[2]} | {(split['server'] + split['network']) / trips:.0f} | {run['tok_per_s']:.2f} | {run['matches_plaintext']} |")
PY
    done
done

#!/usr/bin/env bash
# Two adapter-server replicas behind HAProxy (deploy/haproxy.cfg) on loopback, 8 concurrent
# clients (4 FFA, 4 standard LoRA) with --check-plaintext, and one replica killed (SIGKILL)
# mid-run. Reports each client's exit status, wall time and replays; fails if any client did not
# finish with output equal to the plaintext reference. Run by hand (minutes; not in CI):
#
#   cargo build --release -p cipherlora && scripts/failover.sh [target/release/cipherlora]
#
# Needs haproxy (Debian: apt-get install haproxy). KILL_AFTER (seconds, default 25) sets when
# replica A dies; TOKENS (default 24) the tokens per answer.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-target/release/cipherlora}")
kill_after=${KILL_AFTER:-25}
tokens=${TOKENS:-24}
command -v haproxy >/dev/null || { echo "failover.sh needs haproxy" >&2; exit 2; }
work=$(mktemp -d)
cleanup() {
    kill $(jobs -p) 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

"$bin" dev-cert --out "$work" >/dev/null
echo "failover-test-token-0123456789" >"$work/tokens"

serve() { # grpc_port metrics_port
    "$bin" serve --adapter adapters/code-ffa-r16 --adapter adapters/general-lora-r16 \
        --listen "127.0.0.1:$1" --metrics-listen "127.0.0.1:$2" \
        --tls-cert "$work/cert.pem" --tls-key "$work/key.pem" --token-file "$work/tokens" \
        >"$work/serve-$1.log" 2>&1 &
    echo $!
}
ready() { # metrics_port
    for _ in $(seq 1 120); do
        curl -sf "http://127.0.0.1:$1/readyz" >/dev/null && return 0
        sleep 1
    done
    echo "replica on metrics port $1 never became ready" >&2
    exit 1
}
replica_a=$(serve 50071 9171)
replica_b=$(serve 50072 9172)
ready 9171
ready 9172
LISTEN=127.0.0.1:50070 REPLICA_A=127.0.0.1:50071 REPLICA_B=127.0.0.1:50072 \
    CHECK_PORT_A=9171 CHECK_PORT_B=9172 haproxy -f deploy/haproxy.cfg -db >"$work/haproxy.log" 2>&1 &
sleep 2

prompts=(
    "def is_palindrome(s: str) -> bool:"
    "def fibonacci(n):"
    "class Stack:"
    "def count_words(text):"
    "The town council met every evening to"
    "A good way to start cooking at home is"
    "The river that runs through the valley"
    "Write a short note to a friend about"
)
start=$(date +%s.%N)
for i in $(seq 0 7); do
    if [ "$i" -lt 4 ]; then adapter=code-ffa-r16; else adapter=general-lora-r16; fi
    (
        t0=$(date +%s.%N)
        rc=0
        RUST_LOG=warn "$bin" generate --server https://localhost:50070 --adapter-id "$adapter" \
            --token-file "$work/tokens" --ca-cert "$work/ca.pem" \
            --adapter "adapters/$adapter" --check-plaintext \
            --prompt "${prompts[$i]}" --max-tokens "$tokens" --threads 1 \
            >"$work/client-$i.log" 2>&1 || rc=$?
        t1=$(date +%s.%N)
        echo "$rc $(echo "$t1 - $t0" | bc) $adapter" >"$work/client-$i.result"
    ) &
done

sleep "$kill_after"
kill -9 "$replica_a"
killed=$(date +%s.%N)
echo "replica A (port 50071) killed $(echo "$killed - $start" | bc | cut -c1-5) s into the run"

for i in $(seq 0 7); do
    while [ ! -f "$work/client-$i.result" ]; do sleep 1; done
done
end=$(date +%s.%N)

failed=0
echo "| client | adapter | exit | wall s | replays/reopens | plaintext check |"
echo "| --- | --- | ---: | ---: | ---: | --- |"
for i in $(seq 0 7); do
    read -r rc secs adapter <"$work/client-$i.result"
    replays=$(grep -c -i "replaying\|reopen\|retrying" "$work/client-$i.log" || true)
    check=$(grep -o -m1 "the private output equals the plaintext adapted model's" "$work/client-$i.log" || true)
    [ "$rc" = 0 ] && [ -n "$check" ] || failed=1
    echo "| $i | $adapter | $rc | ${secs:0:6} | $replays | ${check:-**differs or failed**} |"
done
echo "all clients done $(echo "$end - $start" | bc | cut -c1-6) s after the start"
echo "replica B served: $(curl -s http://127.0.0.1:9172/metrics | grep '^cipherlora_sessions_total')"
if [ "$failed" != 0 ]; then
    echo "FAILED: a client did not finish with the plaintext reference's output" >&2
    for i in $(seq 0 7); do echo "--- client $i"; grep -v "^ \+[0-9]*:\|^ \+at " "$work/client-$i.log" | tail -4; done >&2
    exit 1
fi

#!/usr/bin/env bash
# Opening time of a client's sessions (`generate --prefill-width auto`) against an adapter server:
# a fresh one started with --no-prewarm (cold: it encodes the adapter's diagonals for both widths),
# the same server right after (warm: it kept them), and a fresh one with the default pre-encoding
# of the prefill width, once its start-up line says it is done (prewarmed: the verify width's
# diagonals are still encoded on demand). Standard and FFA, 3 rounds. Server on core 1, client on
# core 0, over a simulated link. Run by hand:
#
#   scripts/warm-open.sh [BINARY] [LINK]     # defaults: target/release/cipherlora wan20
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-target/release/cipherlora}
link=${2:-wan20}
D=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$D"' EXIT
"$B" dev-cert --out "$D/tls" >/dev/null
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$D/token"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

open_s() { # adapter → seconds from the line `generate` prints
    taskset -c 0 "$B" generate --server "https://localhost:$port" --adapter-id "$1" \
        --ca-cert "$D/tls/ca.pem" --token-file "$D/token" --prompt "def f(x):" --max-tokens 1 \
        --threads 1 --link "$link" --prefill-width auto 2>&1 >/dev/null | sed -n 's/^sessions open in \([0-9.]*\) s.*/\1/p'
}

serve() { # extra flags...
    taskset -c 1 "$B" serve --adapter adapters/general-lora-r16 --adapter adapters/code-ffa-r16 \
        --listen "127.0.0.1:$port" --tls-cert "$D/tls/cert.pem" --tls-key "$D/tls/key.pem" \
        --token-file "$D/token" "$@" >"$D/serve.log" 2>&1 &
    server=$!
    until (: </dev/tcp/127.0.0.1/"$port") 2>/dev/null; do sleep 1; done
}
stop() {
    kill "$server"
    wait "$server" 2>/dev/null || true
}

echo "| round | adapter | cold, s | warm, s | prewarmed, s |"
echo "| ---: | --- | ---: | ---: | ---: |"
for round in 1 2 3; do
    declare -A cold warm pre
    serve --no-prewarm
    for adapter in general-lora-r16 code-ffa-r16; do
        cold[$adapter]=$(open_s "$adapter")
        sleep 20 # past the server's 15 s for a detached session: none of the first client's is left
        warm[$adapter]=$(open_s "$adapter")
    done
    stop
    serve
    until [ "$(grep -c 'encoded in\|not encoded' "$D/serve.log")" -ge 2 ]; do sleep 1; done
    for adapter in general-lora-r16 code-ffa-r16; do
        pre[$adapter]=$(open_s "$adapter")
        echo "| $round | $adapter | ${cold[$adapter]} | ${warm[$adapter]} | ${pre[$adapter]} |"
    done
    grep 'encoded' "$D/serve.log" >&2
    stop
done

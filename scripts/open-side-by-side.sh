#!/usr/bin/env bash
# Opening time of a client's sessions (`generate --prefill-width auto`, offer to sessions open),
# two builds side by side: per round and build a fresh server of that build, once its encoding at
# start is done (prewarmed: what the server did not encode at start, the client waits for), then
# again after the server kept the client's widths (warm). Standard and FFA, 3 rounds, server on core 1,
# client on core 0, over a simulated link. Run by hand:
#
#   scripts/open-side-by-side.sh BEFORE AFTER [LINK]     # LINK defaults to wan20
set -euo pipefail
cd "$(dirname "$0")/.."
before=$1
after=$2
link=${3:-wan20}
D=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$D"' EXIT
"$after" dev-cert --out "$D/tls" >/dev/null
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$D/token"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

open_s() { # binary adapter → seconds from the line `generate` prints
    taskset -c 0 "$1" generate --server "https://localhost:$port" --adapter-id "$2" \
        --ca-cert "$D/tls/ca.pem" --token-file "$D/token" --prompt "def f(x):" --max-tokens 1 \
        --threads 1 --link "$link" --prefill-width auto 2>&1 >/dev/null | sed -n 's/^sessions open in \([0-9.]*\) s.*/\1/p'
}

echo "| round | build | adapter | prewarmed, s | warm, s |"
echo "| ---: | --- | --- | ---: | ---: |"
for round in 1 2 3; do
    for build in before after; do
        bin=$after
        [ "$build" = before ] && bin=$before
        taskset -c 1 "$bin" serve --adapter adapters/general-lora-r16 --adapter adapters/code-ffa-r16 \
            --listen "127.0.0.1:$port" --tls-cert "$D/tls/cert.pem" --tls-key "$D/tls/key.pem" \
            --token-file "$D/token" >"$D/serve.log" 2>&1 &
        server=$!
        until [ "$(grep -c 'prefill width\|prefill diagonals not' "$D/serve.log" 2>/dev/null)" -ge 2 ]; do sleep 1; done
        s1=$(open_s "$bin" general-lora-r16)
        f1=$(open_s "$bin" code-ffa-r16)
        sleep 16 # past the server's 15 s for a detached session: none of the first clients' is left
        s2=$(open_s "$bin" general-lora-r16)
        f2=$(open_s "$bin" code-ffa-r16)
        echo "| $round | $build | general-lora-r16 | $s1 | $s2 |"
        echo "| $round | $build | code-ffa-r16 | $f1 | $f2 |"
        kill "$server"
        wait "$server" 2>/dev/null || true
    done
done

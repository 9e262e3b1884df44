#!/usr/bin/env bash
# Time from a client's launch to both of its sessions open (model load included: the last
# "session keys made" line of its debug log), for one or more `cipherlora` binaries alternating,
# 3 rounds, standard and FFA, against a running `serve` over a simulated link. Run by hand:
#
#   scripts/open-time.sh URL TOKEN_FILE CA_PEM LINK BINARY...
#
# e.g. scripts/open-time.sh https://localhost:50051 token ca.pem wan20 /tmp/before target/release/cipherlora
set -euo pipefail
cd "$(dirname "$0")/.."
url=$1 token=$2 ca=$3 link=$4
shift 4
echo "| round | adapter | binary | launch to sessions open, s |"
echo "| ---: | --- | --- | ---: |"
for round in 1 2 3; do
    for adapter in general-lora-r16 code-ffa-r16; do
        for bin in "$@"; do
            t0=$(date +%s.%N)
            ts=$(RUST_LOG=cipherlora_private=debug "$bin" generate --server "$url" --adapter-id "$adapter" \
                --token-file "$token" --ca-cert "$ca" --prompt "def f(x):" --max-tokens 1 --threads 1 \
                --link "$link" 2>&1 >/dev/null | sed 's/\x1b\[[0-9;]*m//g' |
                grep "session keys made" | tail -1 | cut -d" " -f1)
            echo "| $round | $adapter | $bin | $(echo "$(date -d "$ts" +%s.%N) - $t0" | bc | cut -c1-5) |"
        done
    done
done

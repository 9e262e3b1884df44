#!/usr/bin/env bash
# Runs README.md's quick start as it stands, so the page cannot rot: the
# fenced block after the `<!-- quickstart: ... -->` marker in the section
# "Quick start" (dev-cert, serve with TLS and a token, generate, api and one
# curl chat completion), on the debug binary that scripts/test.sh builds,
# on free loopback ports and in a temporary folder. It checks that
# `generate` and the chat completion answer with non-empty text, and stops
# both servers on exit, whatever happens.
#
# Usage: scripts/quickstart.sh [path/to/cipherlora]   (default: target/debug/cipherlora)
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${1:-target/debug/cipherlora}
LIMIT_S=${QUICKSTART_LIMIT_S:-420}
[ -x "$BIN" ] || { echo "quickstart: $BIN is not built (cargo build -p cipherlora)" >&2; exit 1; }
if ! command -v curl >/dev/null; then    # the quick start's last step; CI images may lack it
    command -v apt-get >/dev/null && { apt-get update -qq && apt-get install -y -qq curl >/dev/null; }
    command -v curl >/dev/null || { echo "quickstart: needs curl" >&2; exit 1; }
fi
"$BIN" fetch >/dev/null

block=$(awk '/<!-- quickstart:/ { marked = 1; next }
             marked && /^```/ { if (inside) exit; inside = 1; next }
             inside { print }' README.md)
[ -n "$block" ] || { echo "quickstart: no marked block in README.md" >&2; exit 1; }

D=$(mktemp -d)
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
PORT=$(free_port)
API_PORT=$(free_port)

pids=""
cleanup() {
    local status=$?
    pids="$pids $(jobs -p)"
    for p in $pids; do kill "$p" 2>/dev/null || true; done
    for p in $pids; do wait "$p" 2>/dev/null || true; done
    for p in $pids; do
        if kill -0 "$p" 2>/dev/null; then echo "quickstart: process $p still running" >&2; status=1; fi
    done
    if [ "$status" -ne 0 ]; then
        for log in serve api; do
            [ -f "$D/$log.log" ] && { echo "--- $log.log ---" >&2; tail -n 40 "$D/$log.log" >&2; }
        done
        echo "quickstart: FAILED" >&2
    fi
    rm -rf "$D"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# The block waits for the servers in `until …; do sleep 1; done` loops:
# bound them, and every command that could hang, by one deadline.
deadline=$((SECONDS + LIMIT_S))
left() { local l=$((deadline - SECONDS)); [ "$l" -gt 0 ] || { echo "quickstart: no result after $LIMIT_S s" >&2; return 1; }; echo "$l"; }
sleep() { left >/dev/null || exit 1; command sleep "$@"; }

# The block calls `$B ...` and `curl`: run the binary with the servers'
# stderr kept for failures, and keep what the answers printed.
quickstart_cipherlora() {
    local rc=0
    case "$1" in
        serve | api) exec "$BIN" "$@" 2>"$D/$1.log" ;;
        generate)
            timeout "$(left)" "$BIN" "$@" >"$D/generate.out" || rc=$?
            cat "$D/generate.out"
            return "$rc" ;;
        *) "$BIN" "$@" ;;
    esac
}
curl() {
    local rc=0
    if [[ "$*" == */v1/chat/completions* ]]; then
        command curl --max-time "$(left)" "$@" >"$D/chat.json" || rc=$?
        cat "$D/chat.json"
        return "$rc"
    fi
    command curl --max-time 10 "$@"
}
B=quickstart_cipherlora

start=$SECONDS
set +o pipefail            # as in an interactive shell: `curl … | grep -q` may end curl early
eval "$block"
set -o pipefail
echo

prompt=$(grep -o -- '--prompt "[^"]*"' <<<"$block" | head -n 1 | sed 's/^--prompt "//; s/"$//')
python3 - "$D/generate.out" "$prompt" "$D/chat.json" <<'PY'
import json, sys
generated, prompt, chat = open(sys.argv[1]).read(), sys.argv[2], sys.argv[3]
text = generated[len(prompt):] if generated.startswith(prompt) else generated
if not text.strip():
    sys.exit("quickstart: generate printed no new text")
answer = json.load(open(chat))["choices"][0]["message"]["content"]
if not answer.strip():
    sys.exit("quickstart: the chat completion is empty")
print(f"quickstart: generate wrote {len(text.strip())} characters, the chat completion {len(answer.strip())}")
PY
echo "quickstart: ok in $((SECONDS - start)) s"

#!/usr/bin/env bash
# Dev-only: `cipherlora bench model` side by side with llama.cpp's
# `llama-bench` (issue 18), on the same GGUF and the same thread counts, in
# one run. Not part of the test suite (.ci/run and scripts/test.sh never call
# it).
#
# llama.cpp is built once, CPU only (-DGGML_NATIVE=ON), into
#   ${CIPHERLORA_CACHE:-~/.cache/cipherlora}/llama.cpp/<commit>/
# from the llama.cpp tree vendored in the PyPI sdist of llama-cpp-python
# (pinned below, sha256-checked; it records the llama.cpp commit), with cmake
# and ninja from a pip venv in the same cache.
#
# Usage (from the repository root):
#   scripts/bench-llama-cpp.sh [--model FILE.gguf | --synthetic SHAPE] [options]
# Options:
#   --model FILE        GGUF to measure (default: the fetched default model)
#   --synthetic SHAPE   write (once, cached) a GGUF of random weights of a real
#                       shape (`cipherlora bench synthetic-model`), measure it
#   --qtype T           weight format of --synthetic (q4_1, q8_0, q4_k; default q4_1)
#   --threads LIST      thread counts, comma-separated (default 1,2)
#   --weights LIST      our weight modes (default quantized,f32,f16)
#   --decode-tokens N   decode length, both engines (default 32)
#   --reps N            repetitions per round, both engines (default 5)
#   --rounds N          rounds; each runs llama.cpp then ours (default 2)
#   --out DIR           where the reports go (default reports/)
#   --name NAME         report base name (default llama-cpp-vs-ours[-SHAPE])
# Environment: CIPHERLORA_BIN (default target/release/cipherlora, or
# $CARGO_TARGET_DIR/release/cipherlora), LLAMA_CPP_JOBS (build jobs,
# default 1), NO_TASKSET=1 to run without CPU pinning.
set -euo pipefail
cd "$(dirname "$0")/.."

# llama-cpp-python 0.3.36 vendors llama.cpp at commit 0c1e57098bba.
LCP_VERSION=0.3.36
LCP_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e

model="" synthetic="" qtype=q4_1 threads=1,2 weights=quantized,f32,f16
decode=32 reps=5 rounds=2 out=reports name=""
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --synthetic) synthetic=$2; shift 2 ;;
    --qtype) qtype=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --weights) weights=$2; shift 2 ;;
    --decode-tokens) decode=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

cache=${CIPHERLORA_CACHE:-$HOME/.cache/cipherlora}
lc=$cache/llama.cpp
mkdir -p "$lc"

# --- llama.cpp, built once -------------------------------------------------
venv=$lc/venv
if [ ! -x "$venv/bin/cmake" ] || [ ! -x "$venv/bin/ninja" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q cmake ninja scikit-build-core
fi
sdist=$lc/llama_cpp_python-$LCP_VERSION.tar.gz
if [ ! -f "$sdist" ]; then
  # --no-build-isolation: pip only reads the sdist's metadata (scikit-build-core
  # from the venv), it builds nothing.
  "$venv/bin/pip" download -q --no-deps --no-build-isolation \
    --no-binary llama-cpp-python "llama-cpp-python==$LCP_VERSION" -d "$lc"
fi
echo "$LCP_SHA256  $sdist" | sha256sum -c --quiet
top=llama_cpp_python-$LCP_VERSION
commit=$(tar xzf "$sdist" -O "$top/.git/modules/vendor/llama.cpp/HEAD")
dir=$lc/$commit
bench=$dir/build/bin/llama-bench
# Native, but without AMX: on the development VM (Xeon with AMX in cpuid)
# ggml's AMX matmul segfaults at the first prompt pass (llama-bench --repack 0
# avoids it, but that also turns off the AVX2/AVX-512 repacked Q4_0/Q4_K
# kernels). GCC honours explicit -mno-* flags over -march=native.
noamx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
if [ ! -x "$bench" ]; then
  echo "building llama.cpp $commit (CPU, native) into $dir …" >&2
  rm -rf "$dir/src"
  mkdir -p "$dir/src"
  tar xzf "$sdist" -C "$dir/src" --strip-components=3 "$top/vendor/llama.cpp"
  rm -f "$dir/src/.git" # a gitlink into the sdist's .git, absent here
  PATH=$venv/bin:$PATH cmake -S "$dir/src" -B "$dir/build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
    -DCMAKE_C_FLAGS="$noamx" -DCMAKE_CXX_FLAGS="$noamx" \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >"$dir/configure.log"
  PATH=$venv/bin:$PATH nice -n 19 cmake --build "$dir/build" --target llama-bench \
    -j "${LLAMA_CPP_JOBS:-1}" >"$dir/build.log"
fi
[ "${BUILD_ONLY:-0}" = 1 ] && { echo "$bench"; exit 0; }

# --- the model -------------------------------------------------------------
bin=${CIPHERLORA_BIN:-${CARGO_TARGET_DIR:-target}/release/cipherlora}
[ -x "$bin" ] || { echo "no $bin: cargo build --release -p cipherlora first" >&2; exit 1; }
if [ -n "$synthetic" ]; then
  model=$cache/models/synthetic-$synthetic-$qtype-seed0.gguf
  if [ ! -f "$model" ]; then
    nice -n 19 "$bin" bench synthetic-model --shape "$synthetic" --qtype "$qtype" --seed 0 --out "$model"
  fi
  name=${name:-llama-cpp-vs-ours-$synthetic-$qtype}
elif [ -z "$model" ]; then
  model=$("$bin" fetch 2>/dev/null | tail -1 || true)
  [ -f "$model" ] || model=$cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
fi
name=${name:-llama-cpp-vs-ours}
[ -f "$model" ] || { echo "no model file $model" >&2; exit 1; }

# --- one run: per round and thread count, llama.cpp then ours ---------------
mkdir -p "$out"
raw=$out/$name.raw
ncpu=$(nproc)
pin() { # pin <threads>: the last <threads> CPUs
  if [ "${NO_TASKSET:-0}" = 1 ] || ! command -v taskset >/dev/null; then return; fi
  local n=$1; [ "$n" -gt "$ncpu" ] && n=$ncpu
  echo taskset -c "$((ncpu - n))-$((ncpu - 1))"
}
if [ "${REPORT_ONLY:-0}" != 1 ]; then
rm -rf "$raw"; mkdir -p "$raw"
uptime >"$raw/uptime-start"
date -u +%Y-%m-%dT%H:%M:%SZ >"$raw/date"
for round in $(seq 1 "$rounds"); do
  for t in ${threads//,/ }; do
    echo "round $round, $t thread(s): llama.cpp …" >&2
    $(pin "$t") "$bench" -m "$model" -t "$t" -p 9,17 -n "$decode" -r "$reps" \
      -o json >"$raw/llama-r$round-t$t.json" 2>"$raw/llama-r$round-t$t.log"
    echo "round $round, $t thread(s): cipherlora …" >&2
    $(pin "$t") "$bin" bench model --model "$model" --threads "$t" --weights "$weights" \
      --reps "$reps" --rounds 1 --decode-tokens "$decode" \
      --json "$raw/ours-r$round-t$t.json" >/dev/null 2>"$raw/ours-r$round-t$t.log"
    echo "r$round t$t $(uptime)" >>"$raw/uptime-rounds"
  done
done
uptime >"$raw/uptime-end"
fi

python3 - "$raw" "$out/$name" "$model" "$commit" "$decode" "$reps" "$rounds" "${NO_TASKSET:-0}" <<'PY'
import glob, json, os, re, statistics, sys
raw, base, model, commit, decode, reps, rounds, no_taskset = sys.argv[1:]
med = statistics.median
llama, ours = {}, {}
for f in sorted(glob.glob(os.path.join(raw, "llama-r*-t*.json"))):
    for r in json.load(open(f)):
        t = r["n_threads"]
        if r["n_gen"] > 0 and r["n_prompt"] == 0:
            key = "decode_tok_s"
            v = med(r["samples_ts"])
        elif r["n_prompt"] in (9, 17) and r["n_gen"] == 0:
            key = "pass%d_ms" % r["n_prompt"]
            v = med(r["samples_ns"]) / 1e6
        else:
            continue
        llama.setdefault(t, {}).setdefault(key, []).append(v)
for f in sorted(glob.glob(os.path.join(raw, "ours-r*-t*.json"))):
    for r in json.load(open(f))["records"]:
        d = ours.setdefault((r["weights"], r["threads"]), {})
        d.setdefault("decode_tok_s", []).append(r["decode_tok_s"])
        d.setdefault("step_ms", []).append(r["step_ms"])
        d.setdefault("pass9_ms", []).append(r["verify9_ms"])
        d.setdefault("pass17_ms", []).append(r["verify17_ms"])
# Per round: ratio of the two engines measured back to back.
per_round = []
for f in sorted(glob.glob(os.path.join(raw, "ours-r*-t*.json"))):
    m = re.search(r"ours-r(\d+)-t(\d+)", f)
    rnd, t = int(m.group(1)), int(m.group(2))
    lf = os.path.join(raw, f"llama-r{rnd}-t{t}.json")
    if not os.path.exists(lf):
        continue
    lr = {}
    for r in json.load(open(lf)):
        if r["n_gen"] > 0 and r["n_prompt"] == 0:
            lr["decode_tok_s"] = med(r["samples_ts"])
        elif r["n_prompt"] in (9, 17) and r["n_gen"] == 0:
            lr["pass%d_ms" % r["n_prompt"]] = med(r["samples_ns"]) / 1e6
    for r in json.load(open(f))["records"]:
        per_round.append({
            "round": rnd, "threads": t, "weights": r["weights"],
            "ours": {"decode_tok_s": r["decode_tok_s"], "pass9_ms": r["verify9_ms"], "pass17_ms": r["verify17_ms"]},
            "llama_cpp": lr,
            "ratio": {"decode": r["decode_tok_s"] / lr["decode_tok_s"],
                      "pass9": lr["pass9_ms"] / r["verify9_ms"],
                      "pass17": lr["pass17_ms"] / r["verify17_ms"]},
        })
L = {t: {k: med(v) for k, v in d.items()} for t, d in llama.items()}
O = {k: {kk: med(v) for kk, v in d.items()} for k, d in ours.items()}
rows = []
for (w, t), o in sorted(O.items(), key=lambda x: (x[0][1], x[0][0] != "quantized", x[0][0])):
    l = L.get(t, {})
    row = {"threads": t, "weights": w, "ours": o, "llama_cpp": l}
    # Speed ratios, ours / llama.cpp: ≥ 1 means ours is as fast or faster.
    row["ratio"] = {
        "decode": o["decode_tok_s"] / l["decode_tok_s"] if "decode_tok_s" in l else None,
        "pass9": l["pass9_ms"] / o["pass9_ms"] if "pass9_ms" in l else None,
        "pass17": l["pass17_ms"] / o["pass17_ms"] if "pass17_ms" in l else None,
    }
    rows.append(row)
rd = lambda n: open(os.path.join(raw, n)).read().strip() if os.path.exists(os.path.join(raw, n)) else ""
cpu = ""
try:
    cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
except Exception:
    pass
report = {
    "model": model, "llama_cpp_commit": commit, "date": rd("date"), "cpu": cpu,
    "decode_tokens": int(decode), "reps": int(reps), "rounds": int(rounds),
    "pinned": no_taskset != "1",
    "uptime_start": rd("uptime-start"), "uptime_end": rd("uptime-end"),
    "uptime_rounds": rd("uptime-rounds").splitlines(),
    "rows": rows,
    "per_round": per_round,
}
json.dump(report, open(base + ".json", "w"), indent=1)
f = lambda x, p=1: "–" if x is None else f"{x:.{p}f}"
md = [f"Model `{os.path.basename(model)}`; llama.cpp {commit[:12]} (`llama-bench -p 9,17 -n {decode} -r {reps}`, CPU, native); "
      f"ours `cipherlora bench model --decode-tokens {decode} --reps {reps}`; {rounds} round(s), each llama.cpp then ours per thread count"
      f"{', pinned with taskset' if no_taskset != '1' else ''}; medians over rounds. {report['date']}, {cpu}.",
      f"Load: start `{report['uptime_start']}`; end `{report['uptime_end']}`.", "",
      "Ratios are speed ratios ours / llama.cpp (≥ 1: ours as fast or faster); passes: llama.cpp's prompt evaluation of 9 / 17 tokens in one batch, ours a 9- / 17-position causal pass.", "",
      "| threads | ours: weights | decode tok/s ours | llama.cpp | ratio | 9-pos pass ms ours | llama.cpp | ratio | 17-pos pass ms ours | llama.cpp | ratio |",
      "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
for r in rows:
    o, l, q = r["ours"], r["llama_cpp"], r["ratio"]
    md.append(f"| {r['threads']} | {r['weights']} | {f(o['decode_tok_s'])} | {f(l.get('decode_tok_s'))} | {f(q['decode'],2)} | "
              f"{f(o['pass9_ms'])} | {f(l.get('pass9_ms'))} | {f(q['pass9'],2)} | {f(o['pass17_ms'])} | {f(l.get('pass17_ms'))} | {f(q['pass17'],2)} |")
md += ["", "Per round (each engine's medians over its repetitions; load = `uptime` after the pair):", "",
       "| round | threads | ours: weights | decode tok/s ours / llama.cpp | ratio | 9-pos ms ours / llama.cpp | ratio | 17-pos ms ours / llama.cpp | ratio | load (1 min) |",
       "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
loads = {}
for line in rd("uptime-rounds").splitlines():
    m = re.match(r"r(\d+) t(\d+) .*load average: ([0-9.]+)", line)
    if m:
        loads[(int(m.group(1)), int(m.group(2)))] = m.group(3)
for r in sorted(per_round, key=lambda x: (x["round"], x["threads"], x["weights"] != "quantized", x["weights"])):
    o, l, q = r["ours"], r["llama_cpp"], r["ratio"]
    md.append(f"| {r['round']} | {r['threads']} | {r['weights']} | {f(o['decode_tok_s'])} / {f(l['decode_tok_s'])} | {f(q['decode'],2)} | "
              f"{f(o['pass9_ms'])} / {f(l['pass9_ms'])} | {f(q['pass9'],2)} | {f(o['pass17_ms'])} / {f(l['pass17_ms'])} | {f(q['pass17'],2)} | {loads.get((r['round'], r['threads']), '?')} |")
open(base + ".md", "w").write("\n".join(md) + "\n")
print("\n".join(md))
PY
echo "wrote $out/$name.json and $out/$name.md (raw runs in $raw)" >&2

#!/usr/bin/env python3
"""End-to-end test of `cipherlora api` with the official `openai` client.

Starts an adapter server (`cipherlora serve`, TLS + bearer token, the two
committed adapters) and the local OpenAI-compatible endpoint (`cipherlora
api`) on loopback, then, through `openai.OpenAI`:

- lists the models (the base model, and each adapter with `parent` = base);
- chat completions, streamed and not, and a completion, on both adapters:
  each private greedy answer must equal the plaintext adapted model's
  answer to the same request (`cipherlora generate --adapter ...`, the
  reference `generate --check-plaintext` compares against);
- a stop sequence, a multi-turn chat (rendered by the model's own
  template: must equal the raw completion of the ChatML text), a private
  chat's second turn served from the prefix cache (equal to the plaintext
  adapted answer, `usage.prompt_tokens_details.cached_tokens` reported),
  the unknown-model 404 and a 400, in OpenAI's error shape.

Usage: python3 scripts/openai_api_test.py [path/to/cipherlora]
(default: target/debug/cipherlora; run `cargo build -p cipherlora` first).
Exits non-zero on the first failure.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "target" / "debug" / "cipherlora")
FFA = ROOT / "adapters" / "code-ffa-r16"
STD = ROOT / "adapters" / "code-lora-r16"
MAX_TOKENS = 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, check, timeout_s, proc=None):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"{what}: the process exited with {proc.returncode}")
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{what}: not ready after {timeout_s} s")


def reference(adapter, *, chat=None, prompt=None) -> str:
    """The plaintext (adapted) model's greedy output, as `generate` prints it."""
    cmd = [str(BIN), "generate", "--max-tokens", str(MAX_TOKENS)]
    if adapter is not None:
        cmd += ["--adapter", str(adapter)]
    cmd += ["--chat", chat] if chat is not None else ["--prompt", prompt]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    out = out[:-1] if out.endswith("\n") else out
    if prompt is not None:
        assert out.startswith(prompt), "generate --prompt echoes the prompt first"
        out = out[len(prompt):]
    return out


def check_equal(what, got, want):
    if got != want:
        raise SystemExit(f"FAIL {what}:\n  api:       {got!r}\n  plaintext: {want!r}")
    print(f"ok   {what}: {len(got)} characters, equal to the plaintext reference")


def main() -> None:
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        subprocess.run([str(BIN), "dev-cert", "--out", str(tmp / "tls")], check=True,
                       capture_output=True)
        (tmp / "token").write_text(os.urandom(32).hex() + "\n")
        grpc_port, http_port = free_port(), free_port()
        try:
            serve = subprocess.Popen(
                [str(BIN), "serve", "--adapter", str(FFA), "--adapter", str(STD),
                 "--listen", f"127.0.0.1:{grpc_port}",
                 "--tls-cert", str(tmp / "tls" / "cert.pem"),
                 "--tls-key", str(tmp / "tls" / "key.pem"),
                 "--token-file", str(tmp / "token")],
                stderr=open(tmp / "serve.log", "w"))
            procs.append(serve)
            wait_for("serve", lambda: socket.create_connection(("127.0.0.1", grpc_port)).close()
                     or True, 300, serve)
            api = subprocess.Popen(
                [str(BIN), "api", "--listen", f"127.0.0.1:{http_port}",
                 "--server", f"https://localhost:{grpc_port}",
                 "--ca-cert", str(tmp / "tls" / "ca.pem"),
                 "--token-file", str(tmp / "token"), "--schedule", "per-group"],
                stderr=open(tmp / "api.log", "w"))
            procs.append(api)
            base_url = f"http://127.0.0.1:{http_port}/v1"

            def warm():
                with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/health") as r:
                    adapters = json.load(r)["adapters"]
                return all(state == "open" for state in adapters.values())

            wait_for("api warm sessions", warm, 600, api)
            run(openai.OpenAI(base_url=base_url, api_key="unused"))
        except BaseException:
            for log in ("serve.log", "api.log"):
                path = tmp / log
                if path.exists():
                    print(f"--- {log} ---\n{path.read_text()[-4000:]}", file=sys.stderr)
            raise
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()


def run(client: "openai.OpenAI") -> None:
    models = {m.id: m for m in client.models.list().data}
    base = [i for i, m in models.items() if (m.model_extra or {}).get("parent") is None]
    assert len(base) == 1, f"one base model expected: {list(models)}"
    base = base[0]
    for adapter in ("code-ffa-r16", "code-lora-r16"):
        assert adapter in models, f"{adapter} not listed: {list(models)}"
        assert models[adapter].model_extra.get("parent") == base
    print(f"ok   models: {sorted(models)}, parent {base}")

    question = "Write a Python function that checks whether a number is prime."
    greedy = dict(temperature=0, max_tokens=MAX_TOKENS)

    # Chat, not streamed, FFA adapter.
    r = client.chat.completions.create(
        model="code-ffa-r16", messages=[{"role": "user", "content": question}], **greedy)
    check_equal("chat, FFA", r.choices[0].message.content, reference(FFA, chat=question))
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= MAX_TOKENS and r.usage.prompt_tokens > 0
    cost = r.model_extra["cipherlora"]
    assert cost["private"] and cost["bytes_up"] > 0 and cost["round_trips"] > 0, cost

    # Chat, streamed, standard LoRA.
    chunks = list(client.chat.completions.create(
        model="code-lora-r16", messages=[{"role": "user", "content": question}],
        stream=True, stream_options={"include_usage": True}, **greedy))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    check_equal("chat, streamed, standard", text, reference(STD, chat=question))
    assert chunks[0].choices[0].delta.role == "assistant"
    finished = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finished in (["stop"], ["length"]), finished
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0

    # Completion, not streamed and streamed.
    prompt = "def reverse_words(sentence):\n"
    r = client.completions.create(model="code-ffa-r16", prompt=prompt, **greedy)
    check_equal("completion, FFA", r.choices[0].text, reference(FFA, prompt=prompt))
    stream = client.completions.create(model="code-lora-r16", prompt=prompt, stream=True, **greedy)
    text = "".join(c.choices[0].text for c in stream if c.choices)
    check_equal("completion, streamed, standard", text, reference(STD, prompt=prompt))

    # A stop sequence: the text before it, finish_reason "stop".
    full = reference(FFA, prompt=prompt)
    stop = "\n"
    assert stop in full, "the reference must contain the stop sequence"
    r = client.completions.create(model="code-ffa-r16", prompt=prompt, stop=[stop], **greedy)
    check_equal("completion with stop", r.choices[0].text, full[: full.index(stop)])
    assert r.choices[0].finish_reason == "stop"

    # The base model, and a multi-turn chat rendered by the model's template:
    # equal to completing the ChatML text SmolLM2's template produces.
    check_equal("chat, base model",
                client.chat.completions.create(
                    model=base, messages=[{"role": "user", "content": question}], **greedy
                ).choices[0].message.content,
                reference(None, chat=question))
    turns = [{"role": "system", "content": "You answer in one sentence."},
             {"role": "user", "content": "What is a compiler?"},
             {"role": "assistant", "content": "A program that translates source code."},
             {"role": "user", "content": "And an interpreter?"}]
    chatml = "".join(f"<|im_start|>{t['role']}\n{t['content']}<|im_end|>\n" for t in turns)
    chatml += "<|im_start|>assistant\n"
    got = client.chat.completions.create(model=base, messages=turns, **greedy)
    want = client.completions.create(model=base, prompt=chatml, **greedy)
    check_equal("multi-turn chat = completion of its ChatML text",
                got.choices[0].message.content, want.choices[0].text)
    assert got.usage.prompt_tokens == want.usage.prompt_tokens

    # A private chat's second turn reuses the first turn's adapted keys and
    # values (prefix caching) and still answers as the plaintext adapted
    # model answers the whole conversation.
    convo = [{"role": "system", "content": "You write short Python functions."},
             {"role": "user", "content": question}]
    first = client.chat.completions.create(model="code-ffa-r16", messages=convo, **greedy)
    convo += [{"role": "assistant", "content": first.choices[0].message.content},
              {"role": "user", "content": "Now add type hints."}]
    second = client.chat.completions.create(model="code-ffa-r16", messages=convo, **greedy)
    chatml = "".join(f"<|im_start|>{t['role']}\n{t['content']}<|im_end|>\n" for t in convo)
    chatml += "<|im_start|>assistant\n"
    check_equal("second chat turn, FFA, prefix cached", second.choices[0].message.content,
                reference(FFA, prompt=chatml))
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens, (cached, first.usage)
    assert second.model_extra["cipherlora"]["cached_tokens"] == cached
    print(f"ok   prefix cache: {cached} of {second.usage.prompt_tokens} prompt tokens reused")

    # Errors in OpenAI's shape.
    try:
        client.chat.completions.create(model="no-such-adapter",
                                       messages=[{"role": "user", "content": "hi"}])
        raise SystemExit("FAIL unknown model: no error")
    except openai.NotFoundError as e:
        assert e.status_code == 404 and e.body["code"] == "model_not_found", e.body
        print("ok   unknown model: 404 model_not_found")
    try:
        client.chat.completions.create(model="code-ffa-r16", n=2,
                                       messages=[{"role": "user", "content": "hi"}])
        raise SystemExit("FAIL n = 2: no error")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and e.body["param"] == "n", e.body
        print("ok   n = 2: 400 invalid_request_error")
    print("all openai client checks passed")


if __name__ == "__main__":
    main()

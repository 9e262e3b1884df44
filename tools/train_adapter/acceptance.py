"""Acceptance statistics of speculative decoding, base model (or n-gram) drafting,
adapted model verifying: an independent PyTorch reference.

    python3 tools/train_adapter/acceptance.py adapters/code-lora-r16 adapters/code-ffa-r16 \
        --prompts 20 --new-tokens 64 --out adapters/acceptance.json
    python3 tools/train_adapter/acceptance.py adapters/general-lora-r16 --corpus general \
        --prompts 20 --new-tokens 64 --out adapters/acceptance-general.json

Setting (greedy, plain completion, no chat template):
- prompts: the first --prompts evaluation prompts, tokenised without special tokens:
  --corpus code (default): HumanEval problems (field "prompt": signature + docstring);
  --corpus general: adapters/eval/general_prompts.jsonl (prose from held-out Gutenberg
  works, cut mid-paragraph); --prompts-file: any JSONL of {"task_id", "prompt"};
- trajectory: the adapted model's greedy continuation, --new-tokens tokens (stops
  early at <|endoftext|> or <|im_end|>), float32, KV-cached generate();
- per-token agreement: fraction of trajectory positions where the base model's
  argmax (teacher-forced on prompt + trajectory prefix) equals the adapted token;
- base drafter, K in --ks: each round starts at trajectory position t, the base
  model drafts K tokens greedily from prompt + trajectory[:t]; the adapted model
  accepts the longest prefix equal to its own greedy tokens, then emits one bonus
  token. Under greedy verification, draft i+1 is conditioned on an accepted (hence
  trajectory) prefix, so the accepted length equals the run of consecutive
  base/adapted agreements starting at t, capped at K: it is computed from the
  teacher-forced agreement vector. --crosscheck N prompts are also simulated
  round by round with explicit base drafting (generate K tokens) and explicit
  adapted verification (one forward over context + K drafts), independent of the
  trajectory; the JSON records whether both give the same tokens and rounds.
- n-gram (prompt-lookup) drafter: at round start the context is prompt +
  trajectory[:t]; for n = 3, 2, 1 it looks for the most recent earlier occurrence
  of the context's last n tokens (the occurrence must be followed by at least one
  token) and proposes up to K following tokens; with no match, 0 drafts (the round
  yields only the bonus token).
- a round yields accepted + 1 tokens (bonus), except that the last round is cut
  at the trajectory's end. Reported per drafter and K: total tokens / total rounds
  (mean tokens per round, bonus included), mean accepted drafts per round, the
  per-prompt means, and the fraction of rounds accepting all K drafts.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from evaluate import eval_prompts  # noqa: E402

STOP_IDS = [0, 2]  # <|endoftext|>, <|im_end|>


def rounds_from_accepts(T: int, accept_len) -> list[tuple[int, int, int]]:
    """Play rounds over a trajectory of T tokens. accept_len(t) -> (drafts, accepted).
    Returns [(t, drafts, accepted)], each round yielding min(accepted + 1, T - t) tokens."""
    out, t = [], 0
    while t < T:
        nd, a = accept_len(t)
        a = min(a, T - t)
        out.append((t, nd, a))
        t += min(a + 1, T - t)
    return out


def summarize(rounds_per_prompt: list[list[tuple[int, int, int]]], traj_lens: list[int], K: int) -> dict:
    tot_rounds = sum(len(r) for r in rounds_per_prompt)
    tot_tokens = sum(traj_lens)
    tot_acc = sum(a for r in rounds_per_prompt for (_, _, a) in r)
    tot_drafts = sum(nd for r in rounds_per_prompt for (_, nd, _) in r)
    full = sum(1 for r in rounds_per_prompt for (_, nd, a) in r if nd == K and a == K)
    per_prompt = [round(T / len(r), 3) for r, T in zip(rounds_per_prompt, traj_lens)]
    return {
        "K": K,
        "rounds": tot_rounds,
        "tokens": tot_tokens,
        "mean_tokens_per_round": round(tot_tokens / tot_rounds, 3),
        "mean_accepted_drafts_per_round": round(tot_acc / tot_rounds, 3),
        "draft_acceptance_rate": round(tot_acc / tot_drafts, 3) if tot_drafts else None,
        "mean_drafts_proposed_per_round": round(tot_drafts / tot_rounds, 3),
        "fraction_rounds_all_K_accepted": round(full / tot_rounds, 3),
        "per_prompt_mean_tokens_per_round": per_prompt,
        "mean_over_prompts_tokens_per_round": round(sum(per_prompt) / len(per_prompt), 3),
    }


def base_accept_fn(agree: list[bool], K: int):
    def f(t):
        a = 0
        while a < K and t + a < len(agree) and agree[t + a]:
            a += 1
        return K, a
    return f


def ngram_drafts(ctx: list[int], K: int, nmax: int = 3) -> list[int]:
    L = len(ctx)
    for n in range(nmax, 0, -1):
        if L < n + 1:
            continue
        pat = ctx[L - n:]
        for i in range(L - n - 1, -1, -1):  # most recent earlier occurrence first; i + n < L
            if ctx[i:i + n] == pat:
                return ctx[i + n:i + n + K]
    return []


def ngram_accept_fn(prompt: list[int], traj: list[int], K: int):
    def f(t):
        d = ngram_drafts(prompt + traj[:t], K)
        a = 0
        while a < len(d) and t + a < len(traj) and d[a] == traj[t + a]:
            a += 1
        return len(d), a
    return f


@torch.no_grad()
def explicit_base_spec(base, adapted, prompt: list[int], T: int, K: int) -> tuple[list[int], int]:
    """Round-by-round simulation, not using the trajectory. Returns (tokens, rounds)."""
    ctx = list(prompt)
    out: list[int] = []
    rounds = 0
    while len(out) < T:
        x = torch.tensor([ctx])
        d = base.generate(x, max_new_tokens=K, min_new_tokens=K, do_sample=False, pad_token_id=0)[0, len(ctx):].tolist()
        logits = adapted(input_ids=torch.tensor([ctx + d]), use_cache=False).logits[0, len(ctx) - 1:]
        v = logits.argmax(-1).tolist()  # K + 1 adapted greedy tokens
        a = 0
        while a < K and d[a] == v[a]:
            a += 1
        new = d[:a] + [v[a]]
        rounds += 1
        for tkn in new:
            if len(out) < T:
                out.append(tkn)
        ctx += new
        if any(tkn in STOP_IDS for tkn in new):
            break
    return out, rounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("adapters", nargs="+")
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--ks", default="4,8")
    ap.add_argument("--crosscheck", type=int, default=1, help="prompts also simulated round by round")
    ap.add_argument("--prompt-format", choices=["rstrip", "raw"], default="rstrip",
                    help="rstrip: prompt without trailing whitespace (default); raw: as shipped")
    ap.add_argument("--corpus", choices=["code", "general"], default="code",
                    help="which evaluation prompts by default: HumanEval (code) or general_prompts.jsonl (general)")
    ap.add_argument("--prompts-file", default=None, help="JSONL {task_id, prompt} instead of the corpus's prompts")
    ap.add_argument("--out", default="adapters/acceptance.json")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    common.set_threads(args.threads)
    ks = [int(k) for k in args.ks.split(",")]
    t0 = time.time()
    from peft import PeftModel

    base, tok = common.load_base()
    common.sanity_check(base, tok)
    probs, prompts_desc = eval_prompts(args.corpus, args.prompts, args.prompts_file)
    # HumanEval prompts end in '"""\n'. A bare trailing "\n" token is out of distribution for a BPE
    # model, whose code text always merges a newline with the next line's indentation ("\n    "):
    # from a bare "\n" both models skip the function body and start a new top-level block.
    # --prompt-format rstrip (default) drops the trailing whitespace so the continuation is the body.
    texts = [p["prompt"].rstrip() if args.prompt_format == "rstrip" else p["prompt"] for p in probs]
    prompts = [tok(t, add_special_tokens=False).input_ids for t in texts]
    res = {
        "setting": {
            "prompts": f"{prompts_desc}, plain {'code' if args.corpus == 'code' else 'text'} completion, "
            "no chat template, "
            + ({"code": "trailing whitespace stripped (prompt ends with the docstring's closing quotes)",
                "general": "trailing whitespace stripped (the prompts have none: prose cut mid-paragraph)"}[args.corpus]
               if args.prompt_format == "rstrip" else
               "prompt as shipped" + (" (ends with a newline)" if args.corpus == "code" else "")),
            "new_tokens": args.new_tokens,
            "decoding": "greedy; trajectory = adapted model's greedy continuation (stops at <|endoftext|>/<|im_end|>)",
            "Ks": ks,
            "precision": "float32",
            "ngram": "prompt lookup, n = 3..1, most recent earlier occurrence, up to K following tokens, 0 drafts if none",
            "round": "accepted drafts + 1 bonus token from the adapted model (last round cut at trajectory end)",
        },
        "base_model": common.base_identity(),
        "adapters": {},
    }
    for d in args.adapters:
        d = Path(d)
        am, _ = common.load_base()
        adapted = PeftModel.from_pretrained(am, str(d))
        adapted.eval()
        trajs, agrees, tf_mismatch, per_prompt = [], [], 0, []
        for p, pid in zip(probs, prompts):
            x = torch.tensor([pid])
            with torch.no_grad():
                g = adapted.generate(x, max_new_tokens=args.new_tokens, do_sample=False,
                                     eos_token_id=STOP_IDS, pad_token_id=0)[0, len(pid):].tolist()
                full = torch.tensor([pid + g])
                b_arg = base(input_ids=full, use_cache=False).logits[0, len(pid) - 1:-1].argmax(-1).tolist()
                a_arg = adapted(input_ids=full, use_cache=False).logits[0, len(pid) - 1:-1].argmax(-1).tolist()
            tf_mismatch += sum(1 for u, v in zip(a_arg, g) if u != v)
            ag = [u == v for u, v in zip(b_arg, g)]
            trajs.append(g)
            agrees.append(ag)
            per_prompt.append({"task_id": p["task_id"], "prompt_tokens": len(pid), "trajectory_tokens": len(g),
                               "agreement": round(sum(ag) / len(ag), 3),
                               "base_greedy_differs_from_adapted_greedy": not all(ag),
                               "agree_bits": "".join("1" if a else "0" for a in ag)})
        lens = [len(g) for g in trajs]
        n_tok = sum(lens)
        entry = {
            "trajectory_tokens": n_tok,
            "per_token_agreement": round(sum(sum(a) for a in agrees) / n_tok, 4),
            "prompts_where_adapter_changes_greedy_output": sum(1 for a in agrees if not all(a)),
            "teacher_forced_vs_generate_argmax_mismatches": tf_mismatch,
            "base_drafter": {},
            "ngram_drafter": {},
        }
        for K in ks:
            rb = [rounds_from_accepts(len(g), base_accept_fn(a, K)) for g, a in zip(trajs, agrees)]
            entry["base_drafter"][f"K{K}"] = summarize(rb, lens, K)
            rn = [rounds_from_accepts(len(g), ngram_accept_fn(pid, g, K)) for pid, g in zip(prompts, trajs)]
            entry["ngram_drafter"][f"K{K}"] = summarize(rn, lens, K)
        checks = []
        for i in range(min(args.crosscheck, len(prompts))):
            for K in ks:
                toks, nr = explicit_base_spec(base, adapted, prompts[i], lens[i], K)
                analytic = len(rounds_from_accepts(lens[i], base_accept_fn(agrees[i], K)))
                checks.append({"task_id": probs[i]["task_id"], "K": K, "tokens_equal_trajectory": toks == trajs[i],
                               "rounds_explicit": nr, "rounds_from_agreement": analytic})
        entry["explicit_simulation_crosscheck"] = checks
        entry["per_prompt"] = per_prompt
        entry["example_trajectories"] = [{"task_id": probs[i]["task_id"], "text": tok.decode(trajs[i])}
                                         for i in range(min(3, len(trajs)))]
        res["adapters"][d.name] = entry
        print(f"{d.name}: agreement {entry['per_token_agreement']}, "
              + ", ".join(f"base K{K} {entry['base_drafter'][f'K{K}']['mean_tokens_per_round']}" for K in ks) + ", "
              + ", ".join(f"ngram K{K} {entry['ngram_drafter'][f'K{K}']['mean_tokens_per_round']}" for K in ks)
              + f" crosscheck {checks} ({time.time() - t0:.0f}s)", flush=True)
        del adapted, am
    res["versions"] = common.versions()
    res["wall_seconds"] = round(time.time() - t0, 1)
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {args.out}", flush=True)


if __name__ == "__main__":
    main()

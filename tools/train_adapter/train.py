"""Train a LoRA adapter (standard or FFA) for SmolLM2-135M-Instruct on one of common.py's corpora:
CPython stdlib source (--corpus code, the default) or public-domain English prose
(--corpus general, Project Gutenberg books).

    python3 tools/train_adapter/train.py --mode standard --out adapters/code-lora-r16
    python3 tools/train_adapter/train.py --mode ffa      --out adapters/code-ffa-r16
    python3 tools/train_adapter/train.py --mode standard --corpus general --target-modules all-linear \
        --r 8 --alpha 16 --out adapters/general-all-r8

Writes into --out: adapter_config.json + adapter_model.safetensors (exactly what
PEFT's save_pretrained writes), cipherlora.json (FFA flag, lora_A seed, base-model
identity) and training.json (hyperparameters, seed, losses, wall time, versions).

Modes
- standard: PEFT LoRA (default r=16, lora_alpha=32, q/k/v/o_proj), lora_A PEFT's default
  kaiming-uniform init from torch.manual_seed(--seed), lora_B zeros; both trained.
- ffa: FFA-LoRA (Sun et al., ICLR 2024): lora_A drawn from a recorded public seed
  and frozen (requires_grad False), only lora_B trained. Init procedure:
  g = torch.Generator().manual_seed(lora_A_seed); for layer i = 0..29, for module
  in the target modules in the order (q_proj, k_proj, v_proj, o_proj, gate_proj,
  up_proj, down_proj): lora_A.weight (r, d_in) <- uniform_(-b, b, generator=g) with
  b = 1/sqrt(d_in) (the bound of PEFT's kaiming_uniform_(a=sqrt(5))).

--target-modules: "q,k,v,o" (default), any comma list of q, k, v, o, gate, up, down, or
"all-linear" (all seven projections of every layer).

The schedule is linear warm-up then constant, so a run cut short by --max-minutes
is still a clean prefix of the planned run; the steps done are recorded.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def ffa_init_lora_a(model, seed: int, n_layers: int, targets: list[str]) -> None:
    g = torch.Generator().manual_seed(seed)
    for i in range(n_layers):
        layer = model.base_model.model.model.layers[i]
        for name in targets:
            a = common.target_module(layer, name).lora_A["default"].weight
            bound = 1.0 / math.sqrt(a.shape[1])
            with torch.no_grad():
                a.uniform_(-bound, bound, generator=g)
            a.requires_grad_(False)


def corpus_info(corpus, train_files: list[str], held_files: list[str], stream: torch.Tensor) -> dict:
    info = corpus.describe()
    info.update({"train_files": len(train_files), "heldout_files": len(held_files),
                 "train_stream_tokens": int(stream.numel())})
    if corpus.name == "general":
        info["heldout_works"] = sorted({corpus.split_key(d) for d in held_files})
        info["files_used"] = [{k: corpus.files[d][k] for k in ("path", "work", "title", "author", "pg_ebook", "sha256")}
                              | {"split": "heldout" if d in held_files else "train"} for d in corpus.documents()]
    return info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["standard", "ffa"], required=True)
    ap.add_argument("--out", required=True)
    common.add_corpus_args(ap)
    ap.add_argument("--target-modules", default="q,k,v,o",
                    help='projections to adapt: comma list of q,k,v,o,gate,up,down or "all-linear"')
    ap.add_argument("--seed", type=int, default=1234, help="data order + (standard) PEFT init seed")
    ap.add_argument("--lora-a-seed", type=int, default=20240507, help="FFA: public seed of the frozen lora_A")
    ap.add_argument("--r", type=int, default=16)
    ap.add_argument("--alpha", type=int, default=32)
    ap.add_argument("--lr", type=float, default=None, help="default 2e-3 (standard), 5e-3 (ffa)")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--max-minutes", type=float, default=32.0, help="stop early (recorded) past this wall time")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-bf16", action="store_true", help="train in float32 instead of bf16 autocast")
    args = ap.parse_args()
    lr = args.lr if args.lr is not None else (2e-3 if args.mode == "standard" else 5e-3)
    targets = common.parse_target_modules(args.target_modules)

    common.set_threads(args.threads)
    t0 = time.time()
    torch.manual_seed(args.seed)
    model, tok = common.load_base()
    sanity = common.sanity_check(model, tok)

    corpus = common.get_corpus(args.corpus, args.corpus_root)
    train_files, held_files = common.split_files(corpus)
    stream = common.token_stream(tok, train_files, corpus)
    all_chunks = common.chunks(stream, args.seq_len)
    order = common.shuffled(all_chunks, args.seed)
    need = args.steps * args.batch
    if need > order.shape[0]:
        sys.exit(f"not enough training chunks: need {need}, have {order.shape[0]}")
    data = order[:need]
    print(f"corpus {corpus.name}: {len(train_files)} train files ({stream.numel()} tokens), "
          f"{len(held_files)} held-out files; "
          f"training on {need} x {args.seq_len} tokens", flush=True)

    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(
        r=args.r,
        lora_alpha=args.alpha,
        target_modules=targets,
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    torch.manual_seed(args.seed)
    pm = get_peft_model(model, cfg)
    n_layers = model.config.num_hidden_layers
    if args.mode == "ffa":
        ffa_init_lora_a(pm, args.lora_a_seed, n_layers, targets)
    trainable = [p for p in pm.parameters() if p.requires_grad]
    n_trainable = sum(p.numel() for p in trainable)
    print(f"trainable params: {n_trainable}", flush=True)
    if args.mode == "ffa":
        assert all(".lora_B." in n for n, p in pm.named_parameters() if p.requires_grad)
        a_before = {n: p.detach().clone() for n, p in pm.named_parameters() if ".lora_A." in n}

    opt = torch.optim.AdamW(trainable, lr=lr, betas=(0.9, 0.999), weight_decay=args.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / args.warmup))
    pm.train()
    losses = []
    t_train = time.time()
    steps_done = 0
    stopped_early = False
    for step in range(args.steps):
        if (time.time() - t0) / 60 > args.max_minutes:
            stopped_early = True
            break
        x = data[step * args.batch : (step + 1) * args.batch]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=not args.no_bf16):
            out = pm(input_ids=x, labels=x, use_cache=False)
        out.loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(trainable, 1.0).item()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(round(out.loss.item(), 4))
        steps_done = step + 1
        el = time.time() - t_train
        print(f"step {steps_done}/{args.steps} loss {out.loss.item():.4f} gnorm {gnorm:.3f} "
              f"{el / steps_done:.1f}s/step elapsed {el / 60:.1f} min", flush=True)
    train_seconds = time.time() - t_train

    if args.mode == "ffa":
        for n, p in pm.named_parameters():
            if ".lora_A." in n:
                assert torch.equal(p.detach(), a_before[n]), f"FFA lora_A changed: {n}"

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    pm.peft_config["default"].base_model_name_or_path = common.GGUF_FILE
    pm.save_pretrained(out_dir)
    card = out_dir / "README.md"
    if card.exists():  # PEFT's empty model-card template; adapters/README.md documents these
        card.unlink()
    size = (out_dir / "adapter_model.safetensors").stat().st_size

    base = common.base_identity()
    cl = {
        "ffa": args.mode == "ffa",
        "rank": args.r,
        "lora_alpha": args.alpha,
        "target_modules": targets,
        "base_model": base,
    }
    if args.mode == "ffa":
        cl["lora_A_seed"] = args.lora_a_seed
        cl["init"] = (
            "g = torch.Generator().manual_seed(lora_A_seed); for layer i in 0..29, for module in "
            f"({', '.join(targets)}): lora_A.weight (r, d_in) float32 <- "
            "torch.Tensor.uniform_(-1/sqrt(d_in), 1/sqrt(d_in), generator=g); frozen during training "
            "(only lora_B trained). lora_A is public: the server may publish it."
        )
    else:
        cl["init"] = "PEFT default (lora_A kaiming_uniform a=sqrt(5) after torch.manual_seed(seed), lora_B zeros); both trained"
        cl["seed"] = args.seed
    (out_dir / "cipherlora.json").write_text(json.dumps(cl, indent=2) + "\n")

    info = {
        "mode": args.mode,
        "command": "python3 " + " ".join([os.path.relpath(__file__)] + sys.argv[1:]),
        "seed": args.seed,
        "lora_A_seed": args.lora_a_seed if args.mode == "ffa" else None,
        "hyperparameters": {
            "r": args.r,
            "lora_alpha": args.alpha,
            "lora_dropout": 0.0,
            "target_modules": targets,
            "optimizer": "AdamW(betas=(0.9,0.999), eps=1e-8)",
            "lr": lr,
            "weight_decay": args.weight_decay,
            "schedule": f"linear warm-up {args.warmup} steps, then constant",
            "grad_clip": 1.0,
            "batch_sequences": args.batch,
            "seq_len": args.seq_len,
            "tokens_per_step": args.batch * args.seq_len,
            "steps_planned": args.steps,
            "steps_done": steps_done,
            "stopped_early_by_time_limit": stopped_early,
            "tokens_trained": steps_done * args.batch * args.seq_len,
            "compute": "CPU, bf16 autocast (weights and LoRA params float32)" if not args.no_bf16 else "CPU float32",
            "threads": args.threads,
        },
        "trainable_params": n_trainable,
        "corpus": corpus_info(corpus, train_files, held_files, stream),
        "train_loss_per_step": losses,
        "train_seconds": round(train_seconds, 1),
        "wall_seconds_total": round(time.time() - t0, 1),
        "adapter_model_safetensors_bytes": size,
        "base_model": base,
        "base_sanity_continuation": sanity,
        "versions": common.versions(),
    }
    (out_dir / "training.json").write_text(json.dumps(info, indent=2) + "\n")
    print(f"saved {out_dir} ({size} bytes) in {time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()

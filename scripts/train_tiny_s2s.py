#!/usr/bin/env python
"""Train ``tiny-s2s`` from scratch on the translation task and write ``lrp_core/assets/tiny_s2s/``.

Deterministic: the weights are initialised from ``--seed``, step ``s`` trains on
``make_translations(batch, seed=s, split="train")`` (sentences whose hash puts them in the training
split: no held-out sentence is ever seen), and torch runs on a fixed number of threads. The loss is
the cross-entropy of every target token (``</s>`` included) under teacher forcing, AdamW with a
linear warm-up and a cosine decay. The held-out figures — greedy exact match and teacher-forced
token accuracy on ``make_translations(--eval, seed=HELD_OUT_SEED, split="held_out")`` — are written
to ``meta.json``.

    python scripts/train_tiny_s2s.py                      # the committed weights (a few minutes on one core)
    python scripts/train_tiny_s2s.py --steps 200 --out /tmp/tiny_s2s   # a quick look
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from lrp_core.data.translation import make_translations
from lrp_core.models.tiny_s2s import (
    ASSET_DIR,
    CONFIG,
    HELD_OUT_SEED,
    accuracies,
    build_model,
    build_tokenizer,
    encode_pairs,
    state_to_save,
)


def train(steps: int, batch: int, lr: float, seed: int, threads: int) -> tuple:
    """Train a fresh model; returns ``(model, tokenizer)``, the model in eval mode."""
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    tok = build_tokenizer()
    model = build_model(len(tok))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    )
    model.train()
    bar = tqdm(range(steps), desc="training tiny-s2s", mininterval=5)
    for step in bar:
        enc, labels = encode_pairs(tok, make_translations(batch, seed=step, split="train"))
        loss = model(**enc, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0:
            bar.set_postfix(loss=f"{loss.item():.4f}")
    return model.eval(), tok


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: the committed weights)")
    ap.add_argument("--eval", type=int, default=2000, help="held-out sentences for the accuracies")
    ap.add_argument("--out", type=Path, default=ASSET_DIR)
    args = ap.parse_args(argv)
    if args.steps >= HELD_OUT_SEED:
        ap.error(f"--steps must stay below the held-out seed ({HELD_OUT_SEED})")
    t0 = time.time()
    model, tok = train(args.steps, args.batch, args.lr, args.seed, args.threads)
    minutes = (time.time() - t0) / 60
    acc = accuracies(model, tok, make_translations(args.eval, seed=HELD_OUT_SEED, split="held_out"))
    print(
        f"held-out exact match {acc['exact_match']:.4f}, token accuracy {acc['token_accuracy']:.4f} "
        f"on {args.eval} sentences; trained in {minutes:.1f} min"
    )
    from safetensors.torch import save_file

    args.out.mkdir(parents=True, exist_ok=True)
    save_file(state_to_save(model), str(args.out / "model.safetensors"))
    tok.backend_tokenizer.save(str(args.out / "tokenizer.json"))
    meta = {
        "held_out_exact_match": acc["exact_match"],
        "held_out_token_accuracy": acc["token_accuracy"],
        "held_out_sentences": args.eval,
        "held_out_seed": HELD_OUT_SEED,
        "train_steps": args.steps,
        "batch": args.batch,
        "lr": args.lr,
        "seed": args.seed,
        "threads": args.threads,
        "train_minutes": round(minutes, 1),
        "parameters": sum(p.numel() for p in model.parameters()),
        "config": CONFIG,
    }
    (args.out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")


if __name__ == "__main__":
    main()

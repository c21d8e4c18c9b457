#!/usr/bin/env python
"""Train ``tiny-lm`` from scratch on the facts task and write ``lrp_core/assets/tiny_lm/``.

Deterministic: the weights are initialised from ``--seed``, step ``s`` trains on
``make_facts(batch, seed=s)`` (training seeds 0 … steps−1, all below
``HELD_OUT_SEED``), and torch runs on a fixed number of threads. The loss is the
cross-entropy of the answer word at the last prompt position (the model is
asked "Answer:" and must write the asked fact's value), plus ``--lm-weight`` ×
the next-token loss over the prompt. Held-out accuracy —
the greedy next token equals the answer — is measured on seeds from
``HELD_OUT_SEED`` on and written to ``meta.json``.

    python scripts/train_tiny_lm.py                 # the committed weights (about 10 min on 2 cores)
    python scripts/train_tiny_lm.py --steps 200 --out /tmp/tiny_lm   # a quick look
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from lrp_core.data.facts import make_facts
from lrp_core.models.tiny_lm import ASSET_DIR, CONFIG, HELD_OUT_SEED, build_model, build_tokenizer


def batch_of(tok, records) -> tuple[dict, torch.Tensor]:
    """Left-padded prompts (with position ids that follow the mask) and the answers' token ids (B,)."""
    enc = tok([r.prompt for r in records], return_tensors="pt", padding=True)
    mask = enc["attention_mask"]
    enc["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)
    answers = torch.tensor(tok.convert_tokens_to_ids([r.answer for r in records]))
    return dict(enc), answers


@torch.no_grad()
def accuracy(model, tok, n: int, seed: int, batch: int = 250) -> float:
    """Share of ``make_facts(n, seed)`` whose greedy next token is the answer."""
    records = make_facts(n, seed)
    hits = 0
    for i in range(0, n, batch):
        enc, answers = batch_of(tok, records[i:i + batch])
        hits += int((model(**enc).logits[:, -1].argmax(-1) == answers).sum())
    return hits / n


def lm_loss(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy over the prompt's real tokens (an auxiliary signal: it shapes the attention early)."""
    keep = (mask[:, 1:] * mask[:, :-1]).bool()
    return F.cross_entropy(logits[:, :-1][keep], ids[:, 1:][keep])


def train(steps: int, batch: int, lr: float, seed: int, threads: int, lm_weight: float) -> tuple:
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    tok = build_tokenizer()
    model = build_model(len(tok))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    model.train()
    bar = tqdm(range(steps), desc="training tiny-lm")
    for step in bar:
        enc, answers = batch_of(tok, make_facts(batch, seed=step))
        logits = model(**enc).logits
        loss = F.cross_entropy(logits[:, -1], answers)
        if lm_weight:
            loss = loss + lm_weight * lm_loss(logits, enc["input_ids"], enc["attention_mask"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()
    return model, tok


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lm-weight", type=float, default=0.5, help="weight of the next-token loss over the prompt")
    ap.add_argument("--eval", type=int, default=2000, help="held-out prompts for the accuracy")
    ap.add_argument("--out", type=Path, default=ASSET_DIR)
    args = ap.parse_args(argv)
    if args.steps >= HELD_OUT_SEED:
        ap.error(f"--steps must stay below the held-out seeds ({HELD_OUT_SEED})")
    t0 = time.time()
    model, tok = train(args.steps, args.batch, args.lr, args.seed, args.threads, args.lm_weight)
    minutes = (time.time() - t0) / 60
    acc = accuracy(model, tok, args.eval, HELD_OUT_SEED)
    print(f"held-out accuracy {acc:.4f} on {args.eval} prompts (seed {HELD_OUT_SEED}); trained in {minutes:.1f} min")
    from safetensors.torch import save_file
    args.out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(args.out / "model.safetensors"))
    meta = {"held_out_accuracy": acc, "held_out_prompts": args.eval, "held_out_seed": HELD_OUT_SEED,
            "train_steps": args.steps, "batch": args.batch, "lr": args.lr, "seed": args.seed,
            "threads": args.threads, "lm_weight": args.lm_weight, "train_minutes": round(minutes, 1), "parameters": sum(
                p.numel() for p in model.parameters()), "config": CONFIG}
    (args.out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""Train ``toy-vit`` on freshly generated procedural scenes (CPU, 2 threads, seeded).

Every step draws a new batch: one-object scenes (one-hot target) and
(``--two-object-share``, default half) two-object scenes (soft target 0.5 / 0.5 on the two classes), trained with
soft-target cross-entropy on the [CLS] output, AdamW and a warm-up + cosine
learning rate. A token-labelling term (``--token-loss``) also asks the same
head to classify the patch tokens that objects cover (targets from the exact
masks): it gives a ViT trained from scratch a dense signal and shortens the
long initial plateau. The model itself is a plain token-pooled ViT. At the
end the model is measured on held-out seeds and the weights
(``model.safetensors``) and facts (``info.json``) are written to
``lrp_core/assets/toy_vit/``.

    .venv/bin/python scripts/train_toy_vit.py --recipe committed   # the committed weights
    .venv/bin/python scripts/train_toy_vit.py            # one phase with the default options
    .venv/bin/python scripts/train_toy_vit.py --steps 50 --out /tmp/toy  # quick try
    .venv/bin/python scripts/train_toy_vit.py --init lrp_core/assets/toy_vit/model.safetensors \
        --seed 1 ...                                     # continue training (records phase 1)
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lrp_core.data.scenes import CLASS_NAMES, make_scenes  # noqa: E402
from lrp_core.models.toy_vit import ASSET_DIR, TOY_VIT_CONFIG, build_toy_vit, soft_targets  # noqa: E402

EVAL_SEED = 10_000_019  # held-out: training seeds are seed * 1_000_000 + step * 2 + {0, 1} < 10^7


@torch.no_grad()
def evaluate(model: torch.nn.Module, n: int, seed: int = EVAL_SEED, batch: int = 250
             ) -> dict[str, float]:
    """Accuracy on ``n`` one-object scenes and top-2 hit rate on ``n`` two-object scenes."""
    model.eval()
    hits1 = hits2 = 0
    for start in range(0, n, batch):
        m = min(batch, n - start)
        s1 = make_scenes(m, seed + start, n_objects=1)
        hits1 += int((model(s1.images).argmax(1) == s1.labels[:, 0]).sum())
        s2 = make_scenes(m, seed + 5_000_000 + start, n_objects=2)
        top2 = model(s2.images).topk(2, dim=1).indices.sort(1).values
        hits2 += int((top2 == s2.labels.sort(1).values).all(1).sum())
    return {"single_object_accuracy": hits1 / n, "two_object_top2_accuracy": hits2 / n,
            "n_eval": n}


def soft_ce(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of (n, C) logits against (n, C) probability targets."""
    return torch.sum(-target * F.log_softmax(logits, dim=-1), dim=-1).mean()


def _pad_objects(t: torch.Tensor) -> torch.Tensor:
    """(B, 1, ...) -> (B, 2, ...) with an empty (zero) second object."""
    return torch.cat([t, torch.zeros_like(t)], dim=1)


def save_weights(model: torch.nn.Module, path: Path) -> None:
    """Write the state dict as safetensors (creating the folder)."""
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(path))


def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to 2 % of ``lr``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * t)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=2400)
    p.add_argument("--batch", type=int, default=64, help="scenes per step")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--log-every", type=int, default=100, help="quick held-out check (0: never)")
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--two-object-share", type=float, default=0.5,
                   help="fraction of each batch with two objects")
    p.add_argument("--token-loss", type=float, default=0.5,
                   help="weight of the token-labelling loss on the patch tokens (0: off)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--eval", type=int, default=2000, help="held-out scenes of each kind")
    p.add_argument("--out", type=Path, default=ASSET_DIR)
    p.add_argument("--init", type=Path, default=None,
                   help="start from these weights (a model.safetensors) instead of random ones")
    p.add_argument("--recipe", choices=["single", "committed"], default="single",
                   help="single: one run with the options above; committed: the phases that\n"
                        "produced the committed weights (PHASES), chained through --init")
    args = p.parse_args()
    if args.recipe == "single":
        train(args)
        return
    import copy
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="toy_vit_"))
    init = None
    for i, phase in enumerate(PHASES):
        a = copy.copy(args)
        for key, val in phase.items():
            setattr(a, key, val)
        a.init = init
        a.out = args.out if i == len(PHASES) - 1 else work / f"phase{i + 1}"
        print(f"phase {i + 1}/{len(PHASES)}: {phase}")
        train(a)
        init = a.out / "model.safetensors"


#: The phases behind the committed weights (each continues the previous one).
PHASES: list[dict] = [
    dict(seed=0, steps=2400, lr=1e-3, warmup=30, two_object_share=0.5),
    dict(seed=1, steps=3600, lr=1e-3, warmup=50, two_object_share=0.6),
    dict(seed=2, steps=3000, lr=7e-4, warmup=50, two_object_share=0.75),
    dict(seed=3, steps=2400, lr=5e-4, warmup=30, two_object_share=0.75),
]


def train(args: argparse.Namespace) -> None:
    """One training run (a phase) with the parsed options; writes weights and info.json."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = build_toy_vit()
    if args.init is not None:
        from safetensors.torch import load_file

        model.load_state_dict(load_file(str(args.init)))
    decay = [q for n, q in model.named_parameters() if q.ndim > 1 and "pos_embed" not in n]
    no_decay = [q for n, q in model.named_parameters() if not (q.ndim > 1 and "pos_embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr)
    half = int(round(args.batch * args.two_object_share))  # two-object scenes per step
    patch, n_cls = TOY_VIT_CONFIG["patch_size"], len(CLASS_NAMES)
    t0 = time.perf_counter()
    bar = tqdm(range(args.steps), desc="toy-vit", unit="step")
    ema_loss = None
    for step in bar:
        model.train()
        base = args.seed * 1_000_000 + step * 2
        s1 = make_scenes(args.batch - half, base, n_objects=1)
        s2 = make_scenes(half, base + 1, n_objects=2)
        x = torch.cat([s1.images, s2.images])
        y = torch.cat([soft_targets(s1.labels), soft_targets(s2.labels)])
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        feats = model.forward_features(x)  # (B, 1 + patches, D), after the final norm
        loss = soft_ce(model.forward_head(feats), y)
        if args.token_loss > 0:  # token labelling: each object patch predicts its object's class
            masks = torch.cat([_pad_objects(s1.masks), s2.masks])
            labels = torch.cat([_pad_objects(s1.labels[:, :, None, None])[:, :, 0, 0], s2.labels])
            cover = F.avg_pool2d(masks.float(), patch)  # (B, 2, g, g) object share per patch
            tgt = torch.zeros(x.shape[0], cover.shape[2] * cover.shape[3], n_cls)
            for j in range(2):
                tgt += cover[:, j].flatten(1)[..., None] * F.one_hot(labels[:, j], n_cls)[:, None, :]
            keep = tgt.sum(-1) >= 0.25  # patches at least a quarter covered by objects
            if keep.any():
                tl = model.head(feats[:, model.num_prefix_tokens:])[keep]
                loss = loss + args.token_loss * soft_ce(tl, tgt[keep] / tgt[keep].sum(-1, keepdim=True))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema_loss = float(loss) if ema_loss is None else 0.95 * ema_loss + 0.05 * float(loss)
        bar.set_postfix(loss=f"{ema_loss:.3f}")
        if args.log_every and (step + 1) % args.log_every == 0 and step + 1 < args.steps:
            quick = evaluate(model, 200, seed=EVAL_SEED + 900_000)
            tqdm.write(f"step {step + 1}: loss {ema_loss:.3f}, single "
                       f"{quick['single_object_accuracy']:.3f}, two-object top-2 "
                       f"{quick['two_object_top2_accuracy']:.3f}, "
                       f"{time.perf_counter() - t0:.0f} s")
            save_weights(model, args.out / "checkpoint.safetensors")
    train_s = time.perf_counter() - t0

    metrics = evaluate(model, args.eval)
    print(json.dumps(metrics, indent=1), f"\ntraining time {train_s:.0f} s")
    save_weights(model, args.out / "model.safetensors")
    (args.out / "checkpoint.safetensors").unlink(missing_ok=True)
    info = {
        "name": "toy-vit", "class_names": list(CLASS_NAMES), "config": TOY_VIT_CONFIG,
        "accuracy": metrics, "eval_seed": EVAL_SEED,
        "training": {"steps": args.steps, "batch": args.batch, "lr": args.lr,
                     "weight_decay": args.weight_decay,
                     "token_loss": args.token_loss,
                     "two_object_share": args.two_object_share, "warmup": args.warmup, "seed": args.seed,
                     "threads": args.threads, "seconds": round(train_s, 1),
                     "init": str(args.init) if args.init else None,
                     "scenes_seen": args.steps * args.batch,
                     "loss": "soft-target cross-entropy on [CLS] (1 or 0.5/0.5) + token_loss x "
                             "soft cross-entropy of the head on object patch tokens",
                     "torch": torch.__version__},
    }
    prev = args.init.parent / "info.json" if args.init is not None else None
    if prev is not None and prev.is_file():  # keep the provenance of a continued run
        before = json.loads(prev.read_text())
        info["training"]["previous_phases"] = before["training"].get("previous_phases", []) + [
            {**before["training"], "accuracy": before.get("accuracy")}]
        info["training"]["previous_phases"][-1].pop("previous_phases", None)
    (args.out / "info.json").write_text(json.dumps(info, indent=1) + "\n")
    print(f"wrote {args.out / 'model.safetensors'} and info.json")


if __name__ == "__main__":
    main()

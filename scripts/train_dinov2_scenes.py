"""Train ``dinov2-scenes``: DINOv2 ViT-S/14 at 112 px, its last block and a head tuned on the scenes.

    python scripts/train_dinov2_scenes.py                  # dinov2-scenes, [CLS] readout (about 5 min on 2 cores)
    python scripts/train_dinov2_scenes.py --readout avg    # dinov2-scenes-avg, mean of the patch tokens
    python scripts/train_dinov2_scenes.py --tiny --out /tmp/x   # a seconds-long run (tests)

Recipe (seeded; the same machine and thread count give the same bits):

1. draw ``--n-single`` one-object and ``--n-two`` two-object scenes at 112 px
   (seeds :data:`TRAIN_SEED`, ``+1``), ImageNet-normalised;
2. run the frozen blocks 1-11 once (batches of 64) and cache the tokens that
   enter block 12, (N, 65, 384) — blocks 1-11 are never trained;
3. tune block 12, the final LayerNorm and a ``Linear(384, 8)`` head reading
   the normalised [CLS] token (``--readout token``, timm ``global_pool='token'``)
   or the mean of the normalised patch tokens (``--readout avg``,
   ``global_pool='avg'``, ``fc_norm=False``) with AdamW (one-cycle schedule,
   ``--epochs`` epochs of batches of 64) on one-vs-rest logistic losses with
   multi-hot targets (each present class 1);
4. store the tuned tensors in float16 (``tuned.safetensors``, or
   ``tuned_avg.safetensors`` for ``avg``; 3.5 MB), load
   them back into the full timm model and measure, with that model, held-out
   single-object accuracy and two-object top-2 rate (seeds :data:`EVAL_SEED`,
   ``+1``); write ``info.json`` (``info_avg.json``).

Why not a head on the frozen features alone (measured here, 2,000 + 4,000
training scenes, 300 + 300 held out, best of L2 1e-5 / 1e-4): a linear head
on [CLS] reaches single 0.940 / two-object top-2 0.790, on the patch mean
0.923 / 0.750, on [CLS] ‖ mean 0.953 / 0.803 — DINOv2's final features
separate one shape well but do not let a linear map read out *two* shapes.
Tuning the last block as well (a nonlinear head the timm model expresses
without any new module) reaches 0.99 / 0.91 (avg) and 0.99 / 0.90 ([CLS]).
A first [CLS] probe with a quarter of the learning rate (5e-5, 3,000 scenes,
3 epochs) stayed at 0.957 / 0.707: the recipe, not the readout, was short.
Why one-vs-rest: soft-target softmax cross-entropy (½ / ½ for two objects) gave lower top-2 rates on the
same features (e.g. 0.733 vs 0.790 on [CLS]).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from lrp_core.data.scenes import CLASS_NAMES, make_scenes
from lrp_core.models.dinov2_scenes import (
    ASSET_DIR,
    IMAGE_SIZE,
    READOUTS,
    TUNED_PREFIXES,
    asset_paths,
    build_dinov2_scenes,
    scene_inputs,
)

TRAIN_SEED = 30_000_001
"""Seeds of the training scenes (one-object; two-object = +1); apart from every evaluation seed."""
EVAL_SEED = 30_000_011
"""Seeds of the script's own held-out measurement (one-object; two-object = +1)."""


def frozen_tokens(
    model: torch.nn.Module, rgb: np.ndarray, batch: int = 64, progress: bool = True, desc: str = "blocks 1-11"
) -> torch.Tensor:
    """(N, 65, 384) tokens entering the last block, for scenes ``rgb`` (N, H, W, 3)."""
    from tqdm.auto import tqdm

    out = []
    with torch.inference_mode():
        for s in tqdm(range(0, len(rgb), batch), desc=desc, disable=not progress):
            h = model.norm_pre(model._pos_embed(model.patch_embed(scene_inputs(rgb[s : s + batch]))))
            for blk in model.blocks[:-1]:
                h = blk(h)
            out.append(h)
    return torch.cat(out)


def tail(model: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
    """Last block -> norm -> readout ([CLS] or patch mean) -> head: (B, 65, 384) -> (B, 8), as timm's forward."""
    return model.forward_head(model.norm(model.blocks[-1](h)))


def multi_hot(labels: torch.Tensor, n: int = len(CLASS_NAMES)) -> torch.Tensor:
    """(N, k) class ids -> (N, n) float targets, 1 for each present class."""
    return torch.nn.functional.one_hot(labels, n).sum(1).clamp(max=1).float()


def tune(
    model: torch.nn.Module,
    h: torch.Tensor,
    y: torch.Tensor,
    epochs: int,
    lr_block: float,
    lr_head: float,
    batch: int = 64,
    progress: bool = True,
) -> None:
    """Train the last block, the final norm and the head in place on cached tokens ``h`` (N, 65, 384)."""
    from tqdm.auto import tqdm

    for n, p in model.named_parameters():
        p.requires_grad_(n.startswith(TUNED_PREFIXES))
    head = list(model.head.parameters())
    body = [p for n, p in model.named_parameters() if n.startswith(TUNED_PREFIXES) and not n.startswith("head.")]
    opt = torch.optim.AdamW([{"params": body, "lr": lr_block}, {"params": head, "lr": lr_head}], weight_decay=1e-4)
    steps = epochs * -(-len(h) // batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=[lr_block, lr_head], total_steps=steps, pct_start=0.1)
    model.train()  # no dropout / drop-path in this model: train mode changes nothing but the flag
    bar = tqdm(total=steps, desc="tuning block 12 + head", disable=not progress)
    for _ in range(epochs):
        order = torch.randperm(len(h))
        for s in range(0, len(h), batch):
            i = order[s : s + batch]
            loss = torch.nn.functional.binary_cross_entropy_with_logits(tail(model, h[i]), y[i])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            bar.update()
            bar.set_postfix(loss=f"{loss.item():.4f}")
    bar.close()
    model.eval().requires_grad_(True)
    model.zero_grad(set_to_none=True)


def accuracy(
    logits1: torch.Tensor, labels1: torch.Tensor, logits2: torch.Tensor, labels2: torch.Tensor
) -> dict[str, float]:
    """Single-object top-1 accuracy and the rate at which both classes are the top-2 logits."""
    top2 = logits2.topk(2, dim=1).indices.sort(1).values
    return {
        "single_object_accuracy": float((logits1.argmax(1) == labels1[:, 0]).float().mean()),
        "two_object_top2_accuracy": float((top2 == labels2.sort(1).values).all(1).float().mean()),
    }


def logits(model: torch.nn.Module, rgb: np.ndarray, batch: int = 64) -> torch.Tensor:
    """The full timm model's (N, 8) logits for scenes ``rgb``."""
    with torch.inference_mode():
        return torch.cat([model(scene_inputs(rgb[s : s + batch])) for s in range(0, len(rgb), batch)])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n-single", type=int, default=2000)
    p.add_argument("--n-two", type=int, default=4000)
    p.add_argument("--n-eval", type=int, default=300, help="held-out scenes of each kind")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr-block", type=float, default=2e-4, help="peak learning rate of block 12 and the norm")
    p.add_argument("--lr-head", type=float, default=2e-3, help="peak learning rate of the head")
    p.add_argument(
        "--readout",
        choices=sorted(READOUTS),
        default="token",
        help="token: [CLS] (dinov2-scenes); avg: mean of the patch tokens (dinov2-scenes-avg)",
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tiny", action="store_true", help="24 + 24 scenes, 8 + 8 held out, 3 epochs")
    p.add_argument("--out", default=str(ASSET_DIR))
    a = p.parse_args()
    if a.tiny:
        a.n_single, a.n_two, a.n_eval, a.epochs = 24, 24, 8, 3
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    model = build_dinov2_scenes(readout=a.readout)
    one = make_scenes(a.n_single, TRAIN_SEED, 1, size=IMAGE_SIZE)
    two = make_scenes(a.n_two, TRAIN_SEED + 1, 2, size=IMAGE_SIZE)
    h = torch.cat(
        [
            frozen_tokens(model, one.rgb, desc="blocks 1-11, 1-object"),
            frozen_tokens(model, two.rgb, desc="blocks 1-11, 2-object"),
        ]
    )
    y = torch.cat([multi_hot(one.labels), multi_hot(two.labels)])
    del one, two
    tune(model, h, y, a.epochs, a.lr_block, a.lr_head)
    del h
    train_s = time.perf_counter() - t0

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    from safetensors.torch import load_file, save_file

    tuned = {n: t.detach().half().contiguous() for n, t in model.state_dict().items() if n.startswith(TUNED_PREFIXES)}
    weights, facts = asset_paths(a.readout, out)
    save_file(tuned, str(weights))
    # measure the model as shipped: the float16 tensors loaded back
    model.load_state_dict({n: t.float() for n, t in load_file(str(weights)).items()}, strict=False)
    e1 = make_scenes(a.n_eval, EVAL_SEED, 1, size=IMAGE_SIZE)
    e2 = make_scenes(a.n_eval, EVAL_SEED + 1, 2, size=IMAGE_SIZE)
    acc = accuracy(logits(model, e1.rgb), e1.labels, logits(model, e2.rgb), e2.labels)
    info = {
        "model": READOUTS[a.readout],
        "readout": a.readout,
        "class_names": list(CLASS_NAMES),
        "image_size": IMAGE_SIZE,
        "accuracy": {**acc, "n_eval_each": a.n_eval, "eval_seed": EVAL_SEED},
        "training": {
            "seconds": round(train_s, 1),
            "n_single": a.n_single,
            "n_two": a.n_two,
            "train_seed": TRAIN_SEED,
            "epochs": a.epochs,
            "lr_block": a.lr_block,
            "lr_head": a.lr_head,
            "batch": 64,
            "optimizer": "AdamW, one-cycle, weight decay 1e-4",
            "threads": a.threads,
            "loss": "one-vs-rest logistic, multi-hot targets",
            "tuned": "block 12, final norm, head (float16 on disk); blocks 1-11, patch and "
            "position embeddings: DINOv2's, frozen",
        },
    }
    facts.write_text(json.dumps(info, indent=1) + "\n")
    print(json.dumps(info, indent=1))


if __name__ == "__main__":
    main()

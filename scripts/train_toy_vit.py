#!/usr/bin/env python
"""Train ``toy-vit`` from scratch on procedural scenes: about 9 minutes on 2 CPU cores.

    .venv/bin/python scripts/train_toy_vit.py                    # the committed weights
    .venv/bin/python scripts/train_toy_vit.py --steps 300 --out /tmp/toy   # a quick try

A plain ViT trained from scratch on a few hundred thousand scenes sits at
chance for a long time. Four things make it learn within the budget; the
model that comes out is still a standard token-pooled timm ViT:

1. **Data-driven start.** The patch embedding starts from the principal
   components of real scene patches (so the first layer already separates
   edges from flat colour) and the position embedding from a 2-d sine-cosine
   grid (so nearby patches look alike to attention from the first step).
2. **Dense labels.** Besides the soft-target cross-entropy on [CLS] (one-hot
   for one object, 0.5 / 0.5 for two), the same head classifies every patch
   token that objects cover (targets from the exact masks: token labelling).
3. **Object-focused token dropping.** For the first ``1 - full_fraction`` of the
   steps each image keeps only ``keep`` of its 64 patch tokens: all patches that
   touch an object and a random sample of background patches. This halves the
   cost of a step without losing the objects; the last steps see all tokens,
   as the model will at test time.
4. **A scene pool.** The scenes are drawn once (both cores, deterministic per
   chunk) and reused for several epochs with random horizontal flips (every
   class is mirror-symmetric), so the step time is all model.

AdamW with a warm-up and a cosine decay, gradient clipping, seeded throughout.
At the end the model is measured on held-out seeds (2,000 one-object and 2,000
two-object scenes) and ``model.safetensors`` plus ``info.json`` are written to
``lrp_core/assets/toy_vit/``. Runs are reproducible for a given seed and
thread count on the same machine.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lrp_core.data.scenes import CLASS_NAMES, make_scenes  # noqa: E402
from lrp_core.models.toy_vit import ASSET_DIR, TOY_VIT_CONFIG, build_toy_vit  # noqa: E402

#: Held-out seeds of the final measurement (the pool uses seeds >= 10^8, the tests 987,654).
EVAL_SEED = 10_000_019
POOL_SEED = 100_000_000  # pool chunk c of run seed s: POOL_SEED + s * 1_000_000 + c
CHUNK = 1024  # scenes per pool chunk
PATCH = TOY_VIT_CONFIG["patch_size"]
N_CLASSES = len(CLASS_NAMES)


# --------------------------------------------------------------------------- data


def _pool_chunk(job: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One chunk of the pool: images (n, 3, 64, 64) fp16, labels (n, 2), cover (n, 2, 8, 8) fp16.

    One-object scenes are stored like two-object ones: the label is repeated and
    the second object's cover is empty.
    """
    n, seed, n_objects = job
    torch.set_num_threads(1)
    s = make_scenes(n, seed, n_objects=n_objects)
    cover = F.avg_pool2d(s.masks.float(), PATCH)  # (n, k, 8, 8) object share of each patch
    labels = s.labels
    if n_objects == 1:
        cover = torch.cat([cover, torch.zeros_like(cover)], dim=1)
        labels = labels.repeat(1, 2)
    return s.images.half(), labels, cover.half()


def make_pool(n_single: int, n_double: int, seed: int, workers: int) -> dict[str, torch.Tensor]:
    """Draw the training scenes once; chunk ``c`` always has the same seed, whatever ``workers``."""
    jobs = []
    for n_total, k in ((n_single, 1), (n_double, 2)):
        for start in range(0, n_total, CHUNK):
            jobs.append((min(CHUNK, n_total - start), POOL_SEED + seed * 1_000_000 + len(jobs), k))
    with ProcessPoolExecutor(max_workers=workers) as ex:
        parts = list(tqdm(ex.map(_pool_chunk, jobs), total=len(jobs), desc="scenes", unit="chunk"))
    images, labels, cover = (torch.cat(p) for p in zip(*parts))
    return {
        "images": images,
        "labels": labels,
        "cover": cover,
        "two": torch.cat([torch.full((j[0],), j[2] == 2) for j in jobs]),
    }


def sample_batch(
    pool: dict[str, torch.Tensor],
    one_idx: torch.Tensor,
    two_idx: torch.Tensor,
    batch: int,
    two_share: float,
    gen: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A random batch with ``round(batch * two_share)`` two-object scenes, randomly mirrored.

    ``one_idx`` / ``two_idx`` are the pool rows of the one- and two-object scenes.
    Returns images (B, 3, 64, 64), labels (B, 2) and cover (B, 2, 8, 8).
    """
    n_two = int(round(batch * two_share))
    idx = torch.cat(
        [
            one_idx[torch.randint(len(one_idx), (batch - n_two,), generator=gen)],
            two_idx[torch.randint(len(two_idx), (n_two,), generator=gen)],
        ]
    )
    x, y, cover = pool["images"][idx].float(), pool["labels"][idx], pool["cover"][idx].float()
    flip = torch.rand(batch, generator=gen) < 0.5
    x[flip] = x[flip].flip(-1)
    cover[flip] = cover[flip].flip(-1)
    return x, y, cover


# --------------------------------------------------------------------------- model


def sincos_grid(grid: int, dim: int) -> torch.Tensor:
    """(grid * grid, dim) 2-d sine-cosine position code: dim/4 frequencies each for x and y."""
    y, x = torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij")
    omega = 1.0 / 10_000 ** (torch.arange(dim // 4) / (dim / 4))
    x, y = x.flatten()[:, None] * omega, y.flatten()[:, None] * omega
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1)


@torch.no_grad()
def data_driven_init(model: torch.nn.Module, images: torch.Tensor, scale: float = 2.0) -> None:
    """Patch embedding = leading principal components of (n, 3, 64, 64) scene patches; sin-cos positions.

    Row ``i`` of the patch projection is ``scale`` times the i-th principal axis of the
    192-d patch vectors, and the bias centres the patches, so the embedding starts as a
    rotation onto the directions along which patches vary most.
    """
    conv = model.patch_embed.proj  # weight (D, 3, 8, 8)
    dim = conv.weight.shape[0]
    patches = F.unfold(images.float(), PATCH, stride=PATCH).transpose(1, 2).reshape(-1, 3 * PATCH**2)
    mean = patches.mean(0)
    cov = (patches - mean).T @ (patches - mean) / patches.shape[0]  # (192, 192)
    _, vecs = torch.linalg.eigh(cov.double())
    k = min(dim, vecs.shape[1])
    w = scale * vecs.flip(1)[:, :k].T.float()  # (k, 192), largest variance first
    conv.weight.zero_()
    conv.weight[:k] = w.reshape(k, 3, PATCH, PATCH)
    conv.bias.zero_()
    conv.bias[:k] = -(w @ mean)
    grid = model.patch_embed.grid_size[0]
    model.pos_embed[0, model.num_prefix_tokens :] = sincos_grid(grid, dim)


def forward_kept(
    model: torch.nn.Module, x: torch.Tensor, cover: torch.Tensor, keep: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward pass on ``keep`` patch tokens per image: every object patch, then random background.

    Args:
        x: (B, 3, 64, 64) images; cover: (B, 2, 8, 8) object share of each patch.

    Returns:
        features (B, 1 + keep, D) after the final norm and the kept tokens' cover (B, 2, keep).
    """
    tokens = model._pos_embed(model.patch_embed(x))  # (B, 1 + 64, D)
    cover = cover.flatten(2)  # (B, 2, 64)
    score = (cover.sum(1) > 0).float() * 2 + torch.rand(cover.shape[0], cover.shape[2], generator=gen)
    idx = score.topk(keep, dim=1).indices.sort(dim=1).values  # (B, keep), in raster order
    patches = tokens[:, 1:].gather(1, idx[..., None].expand(-1, -1, tokens.shape[-1]))
    h = torch.cat([tokens[:, :1], patches], dim=1)
    h = model.norm(model.blocks(model.norm_pre(model.patch_drop(h))))
    return h, cover.gather(2, idx[:, None].expand(-1, 2, -1))


def losses(
    model: torch.nn.Module,
    feats: torch.Tensor,
    labels: torch.Tensor,
    cover: torch.Tensor,
    token_weight: float,
    token_min_cover: float,
) -> torch.Tensor:
    """[CLS] soft-target cross-entropy + ``token_weight`` x token-labelling cross-entropy.

    Args:
        feats: (B, 1 + T, D) final features; labels: (B, 2) class ids (repeated for one object);
        cover: (B, 2, T) object share of each of the T patch tokens in ``feats``.
    """
    onehot = F.one_hot(labels, N_CLASSES).float()  # (B, 2, C)
    present = onehot.sum(1).clamp(max=1.0)
    target = present / present.sum(1, keepdim=True)  # 1 or 0.5 / 0.5
    loss = soft_ce(model.forward_head(feats), target)
    if token_weight > 0:
        tok_target = torch.einsum("bkt,bkc->btc", cover, onehot)  # (B, T, C)
        keep = tok_target.sum(-1) >= token_min_cover
        if keep.any():
            t = tok_target[keep]
            tok_logits = model.head(feats[:, model.num_prefix_tokens :][keep])
            loss = loss + token_weight * soft_ce(tok_logits, t / t.sum(-1, keepdim=True))
    return loss


def soft_ce(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of (n, C) logits against (n, C) probability targets."""
    return torch.sum(-target * F.log_softmax(logits, dim=-1), dim=-1).mean()


def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to 2 % of ``lr``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * t)))


# --------------------------------------------------------------------------- evaluation


@torch.no_grad()
def evaluate(model: torch.nn.Module, n: int, seed: int = EVAL_SEED, batch: int = 250) -> dict[str, float]:
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
    return {"single_object_accuracy": hits1 / n, "two_object_top2_accuracy": hits2 / n, "n_eval": n}


def save_weights(model: torch.nn.Module, path: Path) -> None:
    """Write the state dict as safetensors (creating the folder)."""
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(path))


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=6400)
    p.add_argument("--batch", type=int, default=64, help="scenes per step")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--two-object-share", type=float, default=0.75, help="fraction of each batch with two objects")
    p.add_argument("--pool-single", type=int, default=16_000, help="one-object scenes in the pool")
    p.add_argument("--pool-double", type=int, default=48_000, help="two-object scenes in the pool")
    p.add_argument("--token-loss", type=float, default=0.5, help="weight of the token-labelling term (0: off)")
    p.add_argument(
        "--token-min-cover", type=float, default=0.25, help="least object share of a patch for it to get a token label"
    )
    p.add_argument("--keep", type=int, default=32, help="patch tokens kept per image while dropping (64: no dropping)")
    p.add_argument(
        "--full-fraction", type=float, default=0.33, help="final fraction of the steps trained on all 64 tokens"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--processes", type=int, default=2, help="data-parallel training processes (gradients averaged each step)"
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument("--eval", type=int, default=2000, help="held-out scenes of each kind")
    p.add_argument("--log-every", type=int, default=1000, help="quick held-out check (0: never)")
    p.add_argument("--out", type=Path, default=ASSET_DIR)
    return p.parse_args(argv)


def train(args: argparse.Namespace) -> dict:
    """Run the whole recipe; returns the info written next to the weights."""
    t0 = time.perf_counter()
    pool = make_pool(args.pool_single, args.pool_double, args.seed, workers=max(2, args.processes))
    pool_s = time.perf_counter() - t0
    if args.processes == 1:
        state = _fit(0, args, pool, None)
    else:  # data-parallel: each process takes batch / processes scenes, gradients are averaged
        import tempfile

        import torch.multiprocessing as mp

        for t in pool.values():
            t.share_memory_()
        work = Path(tempfile.mkdtemp(prefix="toy_vit_"))
        mp.spawn(_fit, args=(args, pool, work), nprocs=args.processes)
        state = torch.load(work / "state.pt")
    train_s = time.perf_counter() - t0
    del pool

    torch.set_num_threads(args.threads * args.processes)
    model = build_toy_vit()
    model.load_state_dict(state)
    metrics = evaluate(model, args.eval)
    save_weights(model, args.out / "model.safetensors")
    info = {
        "name": "toy-vit",
        "class_names": list(CLASS_NAMES),
        "config": TOY_VIT_CONFIG,
        "accuracy": metrics,
        "eval_seed": EVAL_SEED,
        "training": {
            "script": "scripts/train_toy_vit.py",
            "options": {
                k: (str(v) if isinstance(v, Path) else v)
                for k, v in vars(args).items()
                if k not in ("out", "log_every")
            },
            "seconds": round(train_s, 1),
            "pool_seconds": round(pool_s, 1),
            "scenes_in_pool": args.pool_single + args.pool_double,
            "scenes_seen": args.steps * args.batch,
            "init": "patch embedding = principal components of pool patches; 2-d sin-cos positions",
            "loss": "soft-target cross-entropy on [CLS] (1 or 0.5/0.5) + token_loss x soft "
            "cross-entropy of the head on object patch tokens",
            "torch": torch.__version__,
        },
    }
    (args.out / "info.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def _fit(
    rank: int, args: argparse.Namespace, pool: dict[str, torch.Tensor], group: Path | None
) -> dict[str, torch.Tensor]:
    """The training loop of one process (rank); returns the state dict.

    Data-parallel (``group`` = a scratch folder), the ranks meet through a file in it
    and rank 0 also writes the final state dict there.
    """
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if group is not None:
        dist.init_process_group(
            "gloo", init_method=f"file://{group / 'rendezvous'}", rank=rank, world_size=args.processes
        )
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    model = build_toy_vit()
    data_driven_init(model, pool["images"][:4000])  # identical on every rank
    params = list(model.parameters())
    decay = [q for n, q in model.named_parameters() if q.ndim > 1 and "pos_embed" not in n]
    no_decay = [q for n, q in model.named_parameters() if not (q.ndim > 1 and "pos_embed" not in n)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=args.lr
    )
    local_batch = args.batch // args.processes
    drop_steps = int(args.steps * (1 - args.full_fraction)) if args.keep < 64 else 0
    one_idx, two_idx = torch.nonzero(~pool["two"]).flatten(), torch.nonzero(pool["two"]).flatten()
    model.train()
    ema, t0 = None, time.perf_counter()
    bar = tqdm(range(args.steps), desc="toy-vit", unit="step", disable=rank > 0)
    for step in bar:
        x, y, cover = sample_batch(pool, one_idx, two_idx, local_batch, args.two_object_share, gen)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        if step < drop_steps:
            feats, cover = forward_kept(model, x, cover, args.keep, gen)
        else:
            feats, cover = model.forward_features(x), cover.flatten(2)
        loss = losses(model, feats, y, cover, args.token_loss, args.token_min_cover)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        if group is not None:  # average the gradients of all ranks in one flat buffer
            flat = torch.cat([q.grad.flatten() for q in params])
            dist.all_reduce(flat)
            flat /= args.processes
            offset = 0
            for q in params:
                q.grad.copy_(flat[offset : offset + q.numel()].view_as(q))
                offset += q.numel()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        bar.set_postfix(loss=f"{ema:.3f}", refresh=False)
        if rank == 0 and args.log_every and (step + 1) % args.log_every == 0 and step + 1 < args.steps:
            quick = evaluate(model, 250, seed=EVAL_SEED + 900_000)
            model.train()
            tqdm.write(
                f"step {step + 1}: loss {ema:.3f}, single {quick['single_object_accuracy']:.3f}, "
                f"two-object top-2 {quick['two_object_top2_accuracy']:.3f}, "
                f"{time.perf_counter() - t0:.0f} s"
            )
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if group is not None:
        if rank == 0:
            torch.save(state, group / "state.pt")
        dist.barrier()
        dist.destroy_process_group()
    return state


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    info = train(args)
    print(json.dumps(info["accuracy"], indent=1))
    print(
        f"training (pool included) {info['training']['seconds']:.0f} s; "
        f"wrote {args.out / 'model.safetensors'} and info.json"
    )


if __name__ == "__main__":
    main()

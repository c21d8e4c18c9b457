"""Speed benchmark: ``python -m lrp_core.bench``.

For every method, milliseconds per image on timm ``deit_tiny_patch16_224`` and
``deit_small_patch16_224`` (random weights: speed does not depend on them) at
batch 1 and 16, and the ratio to a plain forward + backward of the same model
and batch (loss = the target logit, gradients for the parameters as in
training). Ratios are what carries across machines.
"""
from __future__ import annotations

import argparse
import time
from typing import Callable, Sequence

import torch

from .api import METHODS, explain

MODELS = ("deit_tiny_patch16_224", "deit_small_patch16_224")
BATCHES = (1, 16)


def _time(fn: Callable[[], object], repeat: int, warmup: int = 1) -> float:
    """Best wall time of ``fn`` over ``repeat`` runs, in seconds (the least disturbed by other load)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def forward_backward(model: torch.nn.Module, x: torch.Tensor) -> None:
    """The baseline: forward, loss = target (argmax) logit, backward into the parameters."""
    logits = model(x)
    logits.gather(1, logits.argmax(1, keepdim=True)).sum().backward()
    model.zero_grad(set_to_none=True)


def run(models: Sequence[str] = MODELS, batches: Sequence[int] = BATCHES, methods: Sequence[str] = METHODS,
        repeat: int = 3, seed: int = 0, printer: Callable[[str], None] = print) -> list[dict]:
    import timm

    rows = []
    torch.manual_seed(seed)
    printer(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    printer(f"{'model':<24}{'batch':>6}  {'method':<26}{'ms/image':>10}{'× fwd+bwd':>11}")
    for name in models:
        model = timm.create_model(name, pretrained=False).eval()
        for B in batches:
            x = torch.randn(B, 3, 224, 224)
            base = _time(lambda: forward_backward(model, x), repeat)
            printer(f"{name:<24}{B:>6}  {'forward+backward':<26}{1000 * base / B:>10.1f}{1.0:>11.2f}")
            for method in methods:
                reps = 1 if method == "token_ablation" else repeat
                warm = 0 if method == "token_ablation" else 1
                t = _time(lambda: explain(model, x, method=method), reps, warmup=warm)
                rows.append({"model": name, "batch": B, "method": method, "ms_per_image": 1000 * t / B,
                             "ratio": t / base})
                printer(f"{name:<24}{B:>6}  {method:<26}{1000 * t / B:>10.1f}{t / base:>11.2f}")
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated timm model names")
    p.add_argument("--batches", default=",".join(map(str, BATCHES)), help="comma-separated batch sizes")
    p.add_argument("--methods", default="all", help="'all' or comma-separated method names")
    p.add_argument("--repeat", type=int, default=3, help="timed repetitions (the best is reported)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    methods = METHODS if a.methods == "all" else tuple(m.strip() for m in a.methods.split(","))
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        p.error(f"unknown method(s) {unknown}; choose from {', '.join(METHODS)}")
    run(models=[m.strip() for m in a.models.split(",")], batches=[int(b) for b in a.batches.split(",")],
        methods=methods, repeat=a.repeat)


if __name__ == "__main__":
    main()

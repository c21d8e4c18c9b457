"""CUDA timing and memory rows: each method's time and peak against a plain forward + backward of the same model.

    PYTHONPATH=. python scripts/bench_gpu.py --json bench_gpu.json          # on a CUDA machine
    PYTHONPATH=. python scripts/bench_gpu.py --device cpu --quick           # a dry run of the machinery

Rows (the models of ``lrp_core.tools.bench_models`` / ``bench_vlm``, random weights, seeded):

* ``llava`` at 1 × 260: a random LLaVA (CLIP ViT-B/16 tower at 224 px + the D 512, 8-block Llama; 1 image = 196
  image tokens + 64 text tokens), methods attnlrp, cp_lrp, lrp, transformer_attribution;
* ``llama`` (D 512, 8 blocks, 8 / 2 heads, sdpa; positions widened to the longest row) at 1 × 1024, 1 × 4096 and
  1 × 16384 tokens, method attnlrp.

Each in float32 and in bfloat16 (the engine explains a half model in float32 without copying it,
``lrp_core.runtime.precision``; the baseline runs the bfloat16 model as it is). The baseline is
``lrp_core.tools.bench.forward_backward`` (LM head on the last position, backward into the parameters). Times:
CUDA events around each call after ``--warmup`` untimed calls, the median of ``--repeat`` timed calls (fewer when
a call takes longer than ``--budget`` / ``--repeat`` seconds); memory: ``torch.cuda.max_memory_allocated``, reset
before each (row, method) cell, whole peak and the part above the model and inputs. The ratios are to the
baseline of the same row and dtype; the targets printed are AttnLRP ≤ 1.0× time and ≤ 1.3× peak. A cell that runs
out of memory is recorded as such. ``--quick``: the stand-ins (tiny-llava, tiny-llama at 1 × 32 / 64 / 128).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, Callable, Optional

import torch

from lrp_core import explain
from lrp_core.tools.bench import forward_backward
from lrp_core.tools.bench_models import build_in, llama_config
from lrp_core.tools.bench_vlm import vlm_inputs

#: (model, tokens per row) -> methods; the VLM row's length is fixed by its image and text
VLM_METHODS = ("attnlrp", "cp_lrp", "lrp", "transformer_attribution")
LLAMA_LENGTHS = (1024, 4096, 16384)
QUICK_LLAMA_LENGTHS = (32, 64, 128)
LLAMA_METHODS = ("attnlrp",)
#: the baseline row (the name lrp_core.tools.bench gives it)
BASELINE = "forward+backward"
#: the targets of the VLM issue, for AttnLRP: time and peak memory relative to forward + backward
TIME_TARGET, MEMORY_TARGET = 1.0, 1.3


def build_llama(tiny: bool, dtype: torch.dtype, positions: int) -> torch.nn.Module:
    """The decoder rows' Llama (``llama_config``) with ``positions`` positions, its weights made in ``dtype``."""
    from transformers import LlamaForCausalLM

    cfg = llama_config(tiny=tiny)
    cfg.max_position_embeddings = max(cfg.max_position_embeddings, positions)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return LlamaForCausalLM(cfg).eval().to(dtype)
    finally:
        torch.set_default_dtype(old)


def token_inputs(vocab: int, tokens: int, seed: int = 0) -> dict:
    """One row of ``tokens`` random ids (mask all ones)."""
    ids = torch.randint(0, vocab, (1, tokens), generator=torch.Generator().manual_seed(seed))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def on(x: dict, device: str, dtype: torch.dtype) -> dict:
    """The inputs on ``device``, floating ones (the pixels) in the model's ``dtype``."""
    return {k: v.to(device, dtype) if v.is_floating_point() else v.to(device) for k, v in x.items()}


class Clock:
    """Times a call on ``device``: CUDA events (synchronised) on a GPU, ``perf_counter`` elsewhere; the peak
    allocated memory since :meth:`reset` on a GPU (``None`` elsewhere)."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def reset(self) -> int:
        """Clear the caches and the peak; return the bytes allocated now (the model and inputs)."""
        if not self.cuda:
            return 0
        self.sync()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()

    def peak(self) -> Optional[int]:
        return torch.cuda.max_memory_allocated() if self.cuda else None

    def time(self, fn: Callable[[], Any]) -> float:
        """Seconds of one call of ``fn``."""
        if not self.cuda:
            t = time.perf_counter()
            fn()
            return time.perf_counter() - t
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.sync()
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000.0


def measure(clock: Clock, fn: Callable[[], Any], warmup: int, repeat: int, budget: float) -> dict:
    """Median seconds of ``fn`` over up to ``repeat`` timed calls after ``warmup`` untimed ones (fewer timed calls
    when the last warm-up took over ``budget`` / ``repeat`` s), the peak bytes allocated and those before."""
    before = clock.reset()
    t_warm = 0.0
    for _ in range(warmup):
        t_warm = clock.time(fn)
    runs = max(1, min(repeat, int(budget // max(t_warm, 1e-9)))) if warmup else repeat
    times = [clock.time(fn) for _ in range(runs)]
    return {
        "seconds": statistics.median(times),
        "min_seconds": min(times),
        "runs": runs,
        "before_bytes": before,
        "peak_bytes": clock.peak(),
    }


def mb(x: Optional[int]) -> Optional[float]:
    return None if x is None else x / 2**20


def run_row(
    model_name: str,
    model: torch.nn.Module,
    x: dict,
    methods: tuple,
    dtype: str,
    clock: Clock,
    a: argparse.Namespace,
    emit: Callable[[dict], None],
) -> None:
    """The baseline, then each method, on one (model, inputs); each cell emitted as a row dict."""
    tokens = int(x["input_ids"].shape[1])
    base: Optional[dict] = None
    for method in (BASELINE, *methods):
        row: dict = {"model": model_name, "dtype": dtype, "batch": 1, "tokens": tokens, "method": method}
        if time.perf_counter() > a.deadline:
            emit({**row, "note": "skipped: --total-budget spent"})
            continue
        fn = (
            (lambda: forward_backward(model, x))
            if method == BASELINE
            else (lambda m=method: explain(model, x, method=m))
        )
        try:
            r = measure(clock, fn, a.warmup, a.repeat, a.budget)
        except torch.cuda.OutOfMemoryError as e:
            row["note"] = f"out of memory: {str(e).splitlines()[0][:160]}"
            model.zero_grad(set_to_none=True)
            clock.reset()
            emit(row)
            continue
        except Exception as e:  # one failing cell is recorded, the others run
            row["note"] = f"error: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            model.zero_grad(set_to_none=True)
            emit(row)
            continue
        row.update(
            ms=1e3 * r["seconds"],
            ms_min=1e3 * r["min_seconds"],
            runs=r["runs"],
            peak_mb=mb(r["peak_bytes"]),
            above_mb=mb(None if r["peak_bytes"] is None else r["peak_bytes"] - r["before_bytes"]),
        )
        if method == BASELINE:
            base = row
        elif base is not None:
            row["time_ratio"] = row["ms"] / base["ms"]
            if row["peak_mb"] is not None and base["peak_mb"]:
                row["peak_ratio"] = row["peak_mb"] / base["peak_mb"]
                row["above_ratio"] = row["above_mb"] / max(base["above_mb"], 1e-9)
            if method == "attnlrp":
                ok_t = "ok" if row["time_ratio"] <= TIME_TARGET else "OVER"
                ok_m = "—" if row.get("peak_ratio") is None else "ok" if row["peak_ratio"] <= MEMORY_TARGET else "OVER"
                row["targets"] = f"time {ok_t}, memory {ok_m}"
        emit(row)


def fmt(row: dict) -> str:
    def f(key: str, spec: str) -> str:
        v = row.get(key)
        return "—" if v is None else format(v, spec)

    return (
        f"{row['model']:10s} {row['dtype']:8s} {row['batch']} × {row['tokens']:<6d} {row['method']:24s} "
        f"{f('ms', '10.1f')} ms {f('time_ratio', '6.2f')}×  peak {f('peak_mb', '9.0f')} MB "
        f"(above {f('above_mb', '8.0f')}) {f('peak_ratio', '6.2f')}× {f('above_ratio', '7.2f')}×  "
        f"runs {row.get('runs', '—')}  {row.get('targets', '')}{row.get('note', '')}"
    )


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--quick", action="store_true", help="the stand-ins: tiny-llava, tiny-llama at 1 × 32/64/128")
    p.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated: float32, bfloat16, float16")
    p.add_argument("--rows", default="vlm,llama", help="comma-separated: vlm, llama")
    p.add_argument("--lengths", help="comma-separated llama lengths (default 1024,4096,16384; --quick 32,64,128)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--budget", type=float, default=5.0, help="seconds of timed calls per cell, about")
    p.add_argument(
        "--total-budget",
        type=float,
        default=float("inf"),
        help="seconds: the cells left after this are skipped (recorded as such)",
    )
    p.add_argument("--json", metavar="PATH", help="save the rows (rewritten after every row)")
    a = p.parse_args(argv)
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("no CUDA device here; use --device cpu --quick for a dry run")
    lengths = (
        [int(v) for v in a.lengths.split(",")] if a.lengths else list(QUICK_LLAMA_LENGTHS if a.quick else LLAMA_LENGTHS)
    )
    clock = Clock(a.device)
    a.deadline = time.perf_counter() + a.total_budget
    import transformers

    meta = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": a.device,
        "device_name": torch.cuda.get_device_name() if clock.cuda else "cpu",
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "warmup": a.warmup,
        "repeat": a.repeat,
        "budget_s": a.budget,
        "statistic": "median of the timed runs",
        "memory": "torch.cuda.max_memory_allocated, reset per cell" if clock.cuda else None,
    }
    print(" ".join(f"{k}={v}" for k, v in meta.items()), flush=True)
    rows: list = []

    def emit(row: dict) -> None:
        rows.append(row)
        print(fmt(row), flush=True)
        if a.json:
            os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
            with open(a.json, "w") as fh:
                json.dump({**meta, "rows": rows}, fh, indent=1)

    t0 = time.perf_counter()
    for dtype_name in a.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        if time.perf_counter() > a.deadline:
            break
        if "vlm" in a.rows.split(","):
            name = "tiny-llava" if a.quick else "llava"
            torch.manual_seed(0)
            model = build_in(name, dtype).to(a.device)
            x = on(vlm_inputs(model, 1, seed=0), a.device, dtype)
            run_row(name, model, x, VLM_METHODS, dtype_name, clock, a, emit)
            del model, x
        if "llama" in a.rows.split(","):
            name = "tiny-llama" if a.quick else "llama"
            torch.manual_seed(0)
            model = build_llama(a.quick, dtype, max(lengths)).to(a.device)
            for n in lengths:
                x = on(token_inputs(model.config.vocab_size, n), a.device, dtype)
                run_row(name, model, x, LLAMA_METHODS, dtype_name, clock, a, emit)
            del model
        clock.reset()
    print(f"total {time.perf_counter() - t0:.1f} s", flush=True)
    return int(any("error" in r.get("note", "") for r in rows))


if __name__ == "__main__":
    sys.exit(main())

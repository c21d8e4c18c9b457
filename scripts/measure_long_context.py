"""AttnLRP's memory at long context on CPU: forward + backward, the full pass, the blockwise pass, predicted.

    OMP_NUM_THREADS=2 python scripts/measure_long_context.py [--tokens 1024 2048 4096 8192 16384] \\
        [--method attnlrp] [--threads 2] [--json docs/results/long-context-cpu.json]

The model is the benchmarks' Llama row (:func:`lrp_core.tools.bench_models.llama_config`: D 512, 8 blocks, 8 / 2
heads, MLP 1376, vocabulary 32,000, sdpa) with 16,384 positions, random weights, batch 1, float32. Each
(length, case) runs in a fresh process (this script re-runs itself): the model and the ids are built, one
16-token call loads the kernels, then the case runs once with

* ``peak_mb``: the peak of the CPU allocator's live tensor bytes during the call above those before it, from
  the profiler's memory events (``torch.profiler`` with ``profile_memory=True``: every allocation and free,
  summed in time order) — what the memory model predicts;
* ``rss_mb``: the resident set's peak during the call (``VmHWM`` after ``/proc/self/clear_refs``) minus the
  resident set before it: what the operating system saw (allocator caching and the libraries' pages included);
* ``seconds``: the call's time (one run, the profiler on: a loaded-machine figure).

Cases: ``forward_backward`` (the model's own forward, the argmax logit of the last row, backward into the
parameters), ``full`` (``explain(..., low_memory=False)``), ``blockwise`` (``low_memory=True``); both explain calls
with ``unverified=True`` (the verification is one no-grad forward of the model: not the pass). A case whose
prediction exceeds ``--room`` of the memory available is not run; its prediction is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

CASES = ("forward_backward", "full", "blockwise")
RESULT = "LONG_CONTEXT "


def _kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1])
    raise KeyError(key)


def allocator_peak(fn) -> tuple[float, float]:
    """(peak live tensor bytes above the start, seconds) of ``fn()``, from the profiler's memory events."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        t0 = time.perf_counter()
        fn()
        seconds = time.perf_counter() - t0
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    total = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        total += e.nbytes()
        peak = max(peak, total)
    return float(peak), seconds


def build(tokens: int):
    """The Llama row (16,384 positions) and a (1, tokens) batch of random ids."""
    import torch
    from transformers import LlamaForCausalLM

    from lrp_core.tools.bench_models import llama_config

    cfg = llama_config()
    cfg.max_position_embeddings = 16384
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(5, cfg.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(1))
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def run_case(case: str, tokens: int, method: str, threads: int) -> dict:
    """One case in this process: the measured peaks and time, and the prediction."""
    import torch

    torch.set_num_threads(threads)
    from lrp_core import explain
    from lrp_core.adapters import get_adapter
    from lrp_core.runtime import pass_memory
    from lrp_core.tools.bench_measure import forward_backward

    model, x = build(tokens)
    short = {k: v[:, :16] for k, v in x.items()}
    if case == "forward_backward":
        forward_backward(model, short)

        def fn() -> None:
            forward_backward(model, x)
    else:
        low = case == "blockwise"
        explain(model, short, method=method, low_memory=low, unverified=True)

        def fn() -> None:
            explain(model, x, method=method, low_memory=low, unverified=True)

    adapter = get_adapter(model)
    pred = pass_memory.predict(adapter, adapter.check_inputs(x))
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _kib("VmRSS")
    peak, seconds = allocator_peak(fn)
    rss = _kib("VmHWM") - before
    predicted = {"forward_backward": pred.forward_backward, "full": pred.full, "blockwise": pred.blockwise}[case]
    return {
        "tokens": tokens,
        "case": case,
        "method": method,
        "peak_mb": peak / 2**20,
        "rss_mb": rss / 1024,
        "predicted_mb": predicted / 2**20,
        "ratio": predicted / peak if peak else None,
        "seconds": seconds,
        "threads": torch.get_num_threads(),
    }


def predicted_only(case: str, tokens: int, method: str) -> dict:
    """A case too large to run here: its prediction only."""
    from lrp_core.adapters import get_adapter
    from lrp_core.runtime import pass_memory

    model, x = build(tokens)
    adapter = get_adapter(model)
    pred = pass_memory.predict(adapter, adapter.check_inputs(x))
    value = {"forward_backward": pred.forward_backward, "full": pred.full, "blockwise": pred.blockwise}[case]
    return {"tokens": tokens, "case": case, "method": method, "predicted_mb": value / 2**20, "measured": False}


def available_mb() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable"):
                return int(line.split()[1]) / 1024
    return float("inf")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    p.add_argument("--method", default="attnlrp", choices=("attnlrp", "cp_lrp"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--room", type=float, default=0.5, help="run a case only if its prediction is below this share")
    p.add_argument("--json", help="write the rows there (JSON)")
    p.add_argument("--case", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.case:  # the worker
        print(RESULT + json.dumps(run_case(a.case, a.tokens[0], a.method, a.threads)), flush=True)
        return
    rows = []
    print("| T | case | allocator peak MB | RSS peak MB | predicted MB | predicted / peak | s (loaded) |")
    print("|---|---|---|---|---|---|---|")
    for tokens in a.tokens:
        for case in a.cases:
            guess = predicted_only(case, tokens, a.method)
            if guess["predicted_mb"] > a.room * available_mb():
                row = guess
            else:
                cmd = [sys.executable, os.path.abspath(__file__), "--case", case, "--tokens", str(tokens)]
                cmd += ["--method", a.method, "--threads", str(a.threads)]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
                row = json.loads(next(line for line in out.splitlines() if line.startswith(RESULT))[len(RESULT) :])
            rows.append(row)
            if row.get("measured", True):
                print(
                    f"| {tokens} | {case} | {row['peak_mb']:.0f} | {row['rss_mb']:.0f} | {row['predicted_mb']:.0f} "
                    f"| {row['ratio']:.2f} | {row['seconds']:.1f} |",
                    flush=True,
                )
            else:
                print(f"| {tokens} | {case} | not run | | {row['predicted_mb']:.0f} | | |", flush=True)
            if a.json:
                with open(a.json, "w") as f:
                    json.dump({"model": "llama row, 16384 positions, batch 1, float32", "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

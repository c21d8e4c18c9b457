"""The GPU table (issue #46, item 6): AttnLRP and CP-LRP on a random Llama-3-8B-shaped model in bfloat16 and its
NF4 copy, against the model's own forward + backward and against LXT on the same GPU, time and memory per cell.

    # on the GPU machine, LXT and bitsandbytes carried in .gpu-carry (scripts/pack_gpu_carry.sh), ≤ 9 minutes:
    PYTHONUNBUFFERED=1 PYTHONPATH=. python3 scripts/bench_gpu_llama8b.py --site .gpu-carry/site \\
        --lxt-src .gpu-carry/lxt --json $OUT/bench-gpu-llama8b.json
    # the dry run of the whole machinery here (tiny shapes, CPU, LXT from its own venv), < 2 minutes:
    PYTHONPATH=. python scripts/bench_gpu_llama8b.py --device cpu --quick --lxt-python /work/lxt-venv/bin/python \\
        --json docs/results/bench-gpu-llama8b-dryrun.json

The model (``scripts/gpu8b_model.py``): D 4096, 32 blocks, 32 / 8 heads, MLP 14336, vocabulary 128,256, RoPE θ
500000, bfloat16, sdpa, made on the meta device and drawn on the GPU from one seed, so that every process builds
the same weights (each worker records a fingerprint of them); ``nf4``: its block Linears replaced in place by
bitsandbytes NF4 ``Linear4bit`` (compute dtype bfloat16). Lengths 4k / 16k / 32k / 64k tokens (one row of random
ids; the dry run: 16 and 32); a method out of memory at a length is not tried at the longer ones.

Cells, each in the process of its phase (the driver itself never touches the GPU):

* ``lrp_core`` worker, per variant: ``forward+backward`` (the bfloat16 model's own forward and backward as LXT's
  examples run it: no parameter gradient, gradient w.r.t. the input embeddings, backward of the top logit at the
  last position; ``plain``, or ``checkpointed`` — gradient checkpointing — where plain runs out of memory), then
  ``lrp_core.explain(model, ids, method)`` for attnlrp and cp_lrp in the default mode (the half model computed in
  float32), and with ``dtype=torch.bfloat16`` (``…/bf16`` rows) where ``explain`` accepts it (tried on a tiny
  bfloat16 Llama first; the setup row says which ran, and why not).
* ``lxt`` worker, per variant and method (``scripts/lxt_gpu_worker.py``: LXT patches transformers globally):
  ``lxt.efficient.monkey_patch(modeling_llama, attnLRP | cp_LRP)``, as its examples run it (plain, or
  checkpointed as the examples do where plain runs out of memory).

Time: CUDA events, the median of ``--repeat`` calls after a first (warm-up) call where they fit in
``--cell-budget`` seconds, else the first call alone (``runs`` 0). Memory: ``torch.cuda.max_memory_allocated``,
reset per cell (``peak_mb``; ``above_mb`` above the model and inputs). Ratios: ``x_fwd_bwd`` (time) and
``mem_x_fwd_bwd`` against the same variant's forward + backward at the same length; ``x_lxt`` and ``mem_x_lxt``
against LXT's same method. Agreement of each lrp_core map with LXT's (same variant, method, length): max |Δ| / max
|LXT| and Pearson. Goals printed: ≤ 1.0× forward + backward time, ≤ LXT's time and memory.

Time budget: ``--total-budget`` seconds (default 450) shared among the phases (lrp_core 3 parts, each LXT phase
1; time a phase leaves goes to the next; at least 30 s each, 12 s in the dry run, and its cells at least 15 s / 6 s
after its setup); a cell whose predicted time would pass its phase's end is skipped and recorded; a worker still
running 60 s after its end is killed (its finished rows stay); a phase that would start after the total budget is
skipped — all in all ≤ budget + about 90 s (540 s by default). The JSON is rewritten
every few seconds. Exit status 0 unless the driver itself failed (failed cells are rows with a note).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gpu8b_model  # noqa: E402
from gpu_cells import Clock, Rows, save_map, sweep  # noqa: E402

LENGTHS = (4096, 16384, 32768, 65536)
QUICK_LENGTHS = (16, 32)
METHODS = ("attnlrp", "cp_lrp")
BASELINE = "forward+backward"
#: a phase's share of the time: the lrp_core worker runs the baseline and every method
WEIGHTS = {"lrp_core": 3.0, "lxt": 1.0}
#: seconds a worker may run past its phase's end before it is killed
GRACE = 45.0
#: seconds a phase gets at least (its process's start and model build included): the table's, the dry run's
MIN_PHASE = {False: 30.0, True: 12.0}
#: seconds a worker's cells get at least after its setup, whatever its phase's end (a slow start on a loaded CPU)
MIN_SWEEP = {False: 15.0, True: 6.0}


# --------------------------------------------------------------------------------------------- lrp_core worker
def fast_mode(device: str) -> tuple[bool, str]:
    """Whether ``explain`` accepts ``dtype=torch.bfloat16`` (a fast half mode), tried on a tiny bfloat16 Llama."""
    from lrp_core import explain

    tiny = gpu8b_model.build("tiny", device, torch.bfloat16, 0)
    ids = gpu8b_model.token_ids(tiny.config.vocab_size, 8).to(device)
    try:
        explain(tiny, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, "attnlrp", dtype=torch.bfloat16)
        return True, "explain(..., dtype=torch.bfloat16) accepted"
    except Exception as e:
        return False, f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def baseline_call(model: torch.nn.Module, ids: torch.Tensor, mode: str):
    """The forward + backward LXT's examples run, without LXT: gradient w.r.t. the input embeddings only."""
    if mode == "checkpointed":
        model.train()
        model.gradient_checkpointing_enable()
    embed = model.get_input_embeddings()

    def call() -> int:
        e = embed(ids).detach().requires_grad_()
        logits = model(inputs_embeds=e, use_cache=False, logits_to_keep=1).logits
        top, index = torch.max(logits[0, -1, :], dim=-1)
        top.backward()
        return int(index)

    return call


def plain(model: torch.nn.Module) -> None:
    """Eval mode, no gradient checkpointing (what a baseline cell may have switched on)."""
    if any(getattr(m, "gradient_checkpointing", False) for m in model.modules()):
        model.gradient_checkpointing_disable()
    model.eval()


def lrp_core_worker(s: dict) -> int:
    """The lrp_core phase of one variant (settings ``s`` as :func:`settings` makes them)."""
    import transformers

    import lrp_core
    from lrp_core import explain

    t_start = time.time()
    rows = Rows(s["rows"])
    base = {"side": "lrp_core", "variant": s["variant"], "dtype": "bfloat16"}
    fast, why = fast_mode(s["device"]) if s["fast"] else (False, "not asked (--no-fast)")
    try:
        model = gpu8b_model.build(s["shape"], s["device"], torch.bfloat16, s["seed"], "sdpa")
        if s["variant"] == "nf4":
            model = gpu8b_model.quantise_nf4(model)
    except Exception as e:  # bitsandbytes missing or failing: the cells record why
        rows.emit({**base, "method": "(setup)", "note": f"error building the model: {type(e).__name__}: {e}"})
        return 0
    rows.emit(
        {
            **base,
            "method": "(setup)",
            "fingerprint": gpu8b_model.fingerprint(model),
            "setup_s": time.time() - t_start,
            "fast_mode": fast,
            "fast_mode_note": why,
            "lrp_core": os.path.dirname(os.path.abspath(lrp_core.__file__)),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "device_name": torch.cuda.get_device_name() if s["device"].startswith("cuda") else "cpu",
            "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        }
    )
    dev = s["device"]
    inputs = {}

    def ids_of(tokens: int) -> torch.Tensor:
        if tokens not in inputs:
            inputs.clear()
            inputs[tokens] = gpu8b_model.token_ids(model.config.vocab_size, tokens, s["seed"]).to(dev)
        return inputs[tokens]

    def baseline(tokens: int, mode: str):
        plain(model)
        return baseline_call(model, ids_of(tokens), mode)

    def method(name: str, dtype: Optional[torch.dtype]):
        def factory(tokens: int, mode: str):
            plain(model)
            ids = ids_of(tokens)
            x = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
            kw = {} if dtype is None else {"dtype": dtype}
            return lambda: explain(model, x, name, progress=False, **kw)

        return factory

    cells: list = [(BASELINE, baseline, ["plain", "checkpointed"])]
    for m in s["methods"]:
        cells.append((m, method(m, None), ["default"]))
        if fast:
            cells.append((f"{m}/bf16", method(m, torch.bfloat16), ["bfloat16"]))

    def keep(name: str, tokens: int, r: dict) -> None:
        out = r.pop("out")
        if name == BASELINE:
            r["target"] = out
            return
        r["target"] = int(out.target[0])
        side = "lrp_core_fast" if name.endswith("/bf16") else "lrp_core"
        r["map"] = save_map(
            s["maps"], f"{s['variant']}-{name.split('/')[0]}-{tokens}-{side}", out.scores[0], r["target"]
        )

    deadline = max(s["deadline"], time.time() + s["min_sweep"])
    sweep(Clock(dev), rows, base, s["lengths"], cells, deadline, s["repeat"], s["budget"], keep)
    plain(model)
    return 0


# --------------------------------------------------------------------------------------------- the driver
def settings(a: argparse.Namespace, variant: str, method: Optional[str], rows: str, deadline: float) -> dict:
    """A worker's settings (JSON on its command line)."""
    return {
        "shape": "tiny" if a.quick else "8b",
        "device": a.device,
        "variant": variant,
        "method": method,
        "methods": list(a.methods),
        "lengths": list(a.lengths),
        "seed": a.seed,
        "rows": rows,
        "maps": a.maps,
        "deadline": deadline,
        "repeat": a.repeat,
        "budget": a.cell_budget,
        "fast": not a.no_fast,
        "min_sweep": MIN_SWEEP[a.quick],
    }


def read_rows(path: str) -> list:
    """The rows a worker has written so far (a half-written last line is left for the next read)."""
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as fh:
        for line in fh:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return out


def agreement(maps: str, variant: str, method: str, tokens: int, side: str) -> Optional[dict]:
    """Max |Δ| / max |LXT| and Pearson of the ``side`` map against LXT's, where both were saved."""
    paths = [os.path.join(maps, f"{variant}-{method}-{tokens}-{x}.pt") for x in (side, "lxt")]
    if not all(os.path.exists(p) for p in paths):
        return None
    ours, lxt = (torch.load(p) for p in paths)
    a, b = ours["scores"].double(), lxt["scores"].double()
    if a.shape != b.shape:
        return {"note": f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}"}
    pearson = float(torch.corrcoef(torch.stack([a, b]))[0, 1])
    return {
        "max_rel": float((a - b).abs().max() / b.abs().max().clamp_min(1e-30)),
        "pearson": pearson,
        "same_target": ours["target"] == lxt["target"],
    }


def ratios(rows: list, maps: str) -> list:
    """Each measured row with its ratios to the baseline and to LXT and, for lrp_core maps, the agreement."""

    def find(side: str, variant: str, method: str, tokens: int) -> Optional[dict]:
        for r in rows:
            key = (r.get("side"), r.get("variant"), r.get("method"), r.get("tokens"))
            if key == (side, variant, method, tokens) and "ms" in r:
                return r
        return None

    out = []
    for r in rows:
        r = dict(r)
        if "ms" in r and r.get("method") != BASELINE:
            v, t, m = r["variant"], r["tokens"], r["method"].split("/")[0]
            for key, ref in (("fwd_bwd", find("lrp_core", v, BASELINE, t)), ("lxt", find("lxt", v, m, t))):
                if ref is None or r["side"] == "lxt" and key == "lxt":
                    continue
                r[f"x_{key}"] = r["ms"] / ref["ms"]
                if r.get("peak_mb") and ref.get("peak_mb"):
                    r[f"mem_x_{key}"] = r["peak_mb"] / ref["peak_mb"]
            if r["side"] == "lrp_core":
                side = "lrp_core_fast" if r["method"].endswith("/bf16") else "lrp_core"
                agree = agreement(maps, v, m, t, side)
                if agree is not None:
                    r["vs_lxt"] = agree
        r.pop("map", None)
        out.append(r)
    return out


def table(rows: list) -> str:
    """The summary printed last: one line per measured or failed cell."""

    def f(v: Any, spec: str) -> str:
        return "—" if v is None else format(v, spec)

    lines = [
        f"{'variant':7s} {'tokens':>6s} {'side':8s} {'method':17s} {'mode':12s} {'ms':>9s} {'×f+b':>6s} "
        f"{'×LXT':>6s} {'peak MB':>9s} {'mem×f+b':>7s} {'mem×LXT':>7s} {'max rel':>8s} {'pearson':>8s} note"
    ]
    for r in rows:
        if r.get("method") == "(setup)":
            continue
        if "tokens" not in r:  # a phase's own note (skipped, its worker failed)
            lines.append(
                f"{r.get('variant', ''):7s} {'':6s} {r.get('side', ''):8s} {r.get('method', ''):17s} "
                f"{r.get('note', '')[:120]}"
            )
            continue
        agree = r.get("vs_lxt") or {}
        lines.append(
            f"{r['variant']:7s} {r['tokens']:6d} {r['side']:8s} {r['method']:17s} {r.get('mode', ''):12s} "
            f"{f(r.get('ms'), '9.1f')} {f(r.get('x_fwd_bwd'), '6.2f')} {f(r.get('x_lxt'), '6.2f')} "
            f"{f(r.get('peak_mb'), '9.0f')} {f(r.get('mem_x_fwd_bwd'), '7.2f')} {f(r.get('mem_x_lxt'), '7.2f')} "
            f"{f(agree.get('max_rel'), '8.1e')} {f(agree.get('pearson'), '8.5f')} {r.get('note', '')[:90]}"
        )
    return "\n".join(lines)


def phases(a: argparse.Namespace) -> list:
    """(side, variant, method) in the order they run: per variant, lrp_core then LXT's methods."""
    out = []
    for v in a.variants:
        if "lrp_core" in a.sides:
            out.append(("lrp_core", v, None))
        if "lxt" in a.sides:
            out += [("lxt", v, m) for m in a.methods]
    return out


def worker_command(a: argparse.Namespace, side: str, s: dict) -> tuple[list, dict]:
    """The command line and environment of a worker: the carried packages (``--site``) and, for LXT, its source
    (``--lxt-src``) first on its path; the repository's root on the lrp_core worker's."""
    env = dict(os.environ)
    paths = [p for p in (a.site, a.lxt_src if side == "lxt" else None) if p]
    if side == "lrp_core":
        paths.append(os.path.dirname(HERE))
    env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(p) for p in paths] + [env.get("PYTHONPATH", "")]).strip(
        os.pathsep
    )
    env.setdefault("PYTHONUNBUFFERED", "1")
    if side == "lxt":
        return [a.lxt_python or sys.executable, os.path.join(HERE, "lxt_gpu_worker.py"), json.dumps(s)], env
    return [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(s)], env


def drive(a: argparse.Namespace) -> int:
    """Run the phases one after another, each in its own process, rewriting the JSON as rows come."""
    start = time.time()
    end = start + a.total_budget
    work = tempfile.mkdtemp(prefix="bench-gpu-8b-")
    a.maps = os.path.join(work, "maps")
    meta = {
        "command": " ".join(sys.argv),
        "device": a.device,
        "shape": "tiny (dry run)" if a.quick else "llama-3-8b: D 4096, 32 blocks, 32/8 heads, MLP 14336, V 128256",
        "lengths": list(a.lengths),
        "repeat": a.repeat,
        "cell_budget_s": a.cell_budget,
        "total_budget_s": a.total_budget,
        "statistic": "median of the timed calls after a first call (runs 0: the first call alone)",
        "memory": "torch.cuda.max_memory_allocated, reset per cell" if a.device.startswith("cuda") else None,
        "goals": "lrp_core: time <= 1.0x forward+backward, time and memory <= LXT's",
    }
    done: list = []
    plan = phases(a)
    weights = [WEIGHTS[side] for side, _, _ in plan]

    def write(current: list) -> list:
        rows = ratios(done + current, a.maps)
        prints: dict = {}
        for r in rows:
            if r.get("method") == "(setup)" and "fingerprint" in r:
                prints.setdefault(r["variant"], set()).add(r["fingerprint"])
        meta["same_weights"] = {v: len(f) == 1 for v, f in prints.items()}  # every worker built the same model
        if a.json:
            os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
            with open(a.json, "w") as fh:
                json.dump({**meta, "elapsed_s": time.time() - start, "rows": rows}, fh, indent=1)
        return rows

    for i, (side, variant, method) in enumerate(plan):
        now = time.time()
        if now > end:
            done.append(
                {
                    "side": side,
                    "variant": variant,
                    "method": method or "(worker)",
                    "note": "skipped: --total-budget spent",
                }
            )
            continue
        deadline = now + max(max(end - now, 0.0) * weights[i] / sum(weights[i:]), MIN_PHASE[a.quick])
        path = os.path.join(work, f"rows-{i}.jsonl")
        cmd, env = worker_command(a, side, settings(a, variant, method, path, deadline))
        print(f"# phase {i + 1}/{len(plan)}: {side} {variant} {method or ''} ({deadline - now:.0f} s)", flush=True)
        log = open(os.path.join(work, f"worker-{i}.log"), "w")
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            if time.time() > min(deadline, end) + GRACE + MIN_SWEEP[a.quick]:
                proc.kill()
                print(f"# killed {side} {variant} {method or ''}: past its end", flush=True)
            time.sleep(2.0)
            write(read_rows(path))
        log.close()
        new = read_rows(path)
        if proc.returncode:
            tail = open(log.name).read()[-600:]
            new.append(
                {
                    "side": side,
                    "variant": variant,
                    "method": method or "(worker)",
                    "note": f"worker exit {proc.returncode}: {tail.strip().splitlines()[-1] if tail.strip() else ''}",
                }
            )
            print(tail, flush=True)
        done += new
        write([])
    rows = write([])
    print(table(rows), flush=True)
    print(f"total {time.time() - start:.0f} s; work folder {work}", flush=True)
    return 0


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--device", default="cuda")
    p.add_argument("--quick", action="store_true", help="the tiny stand-in at 16 and 32 tokens (the dry run)")
    p.add_argument("--lengths", help="comma-separated token counts (default 4096,16384,32768,65536)")
    p.add_argument("--variants", default="bf16,nf4", help="comma-separated: bf16, nf4")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--sides", default="lrp_core,lxt", help="comma-separated: lrp_core, lxt")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--cell-budget", type=float, default=6.0, help="seconds of timed calls per cell, about")
    p.add_argument("--total-budget", type=float, help="seconds for all phases (default 450; --quick 100)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-fast", action="store_true", help="do not try explain(..., dtype=torch.bfloat16)")
    p.add_argument("--site", help="a folder put first on every worker's path (the carried bitsandbytes)")
    p.add_argument("--lxt-src", help="the folder holding LXT's package lxt (put first on the LXT worker's path)")
    p.add_argument("--lxt-python", help="the Python the LXT worker runs under (default this one)")
    p.add_argument("--json", metavar="PATH", help="the rows, rewritten as they come")
    a = p.parse_args(argv)
    if a.worker:
        return lrp_core_worker(json.loads(a.worker))
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("no CUDA device here; use --device cpu --quick for a dry run")
    a.lengths = [int(v) for v in a.lengths.split(",")] if a.lengths else list(QUICK_LENGTHS if a.quick else LENGTHS)
    a.variants, a.methods, a.sides = a.variants.split(","), a.methods.split(","), a.sides.split(",")
    a.total_budget = a.total_budget or (80.0 if a.quick else 480.0)
    return drive(a)


if __name__ == "__main__":
    sys.exit(main())

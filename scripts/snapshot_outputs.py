"""Save, or compare with a saved file, every method's output on every model the tests build.

A developer tool for changes to the engine that must not change behaviour:

    python scripts/snapshot_outputs.py save before.pt      # on the old code
    python scripts/snapshot_outputs.py compare before.pt   # on the new code
    python scripts/snapshot_outputs.py compare before.pt --only 'timm-vit|bert' --dtype float64

The models are those of ``snapshot_cases.py``. ``compare`` prints, per case and
dtype, the largest relative difference (max |Δ| / max |before|) over every
method and tensor field of the ``Explanation``, then each run over its
tolerance (float64 1e-10, float32 1e-6). A method a model refuses is recorded
as its error; another error is a difference.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from typing import Any

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]  # this checkout's lrp_core, not an installed one
from snapshot_cases import cases  # noqa: E402

FIELDS = ("scores", "target", "logits", "pixels", "layers", "layers_per_head", "token_relevance")
TOL = {torch.float64: 1e-10, torch.float32: 1e-6}

#: (method, options) pairs; every method once with its defaults, plus the options that change the arithmetic.
RUNS: list[tuple[str, dict]] = [
    ("transformer_attribution", {"keep_heads": True}),
    ("transformer_attribution", {"start_layer": 1}),
    ("transformer_attribution", {"use_gradient": False, "rollout_norm": "row"}),
    ("generic_attention", {"keep_heads": True}),
    ("generic_attention", {"start_layer": 1}),
    ("rollout", {"keep_heads": True}),
    ("rollout", {"start_layer": 1, "end_layer": 1}),
    ("raw_attention", {}),
    ("attention_gradcam", {}),
    ("lrp", {}),
    ("partial_lrp", {}),
    ("cdam", {}),
    ("token_ablation", {}),
    ("transformer_attribution", {}),
    ("attnlrp", {}),
    ("cp_lrp", {}),
    ("pa_lrp", {}),
    ("input_x_gradient", {}),
    ("integrated_gradients", {"n_steps": 4}),
    ("smoothgrad", {"n_samples": 3, "seed": 0}),
    ("occlusion", {}),
    ("kernel_shap", {"n_samples": 16, "seed": 0}),
]


DTYPES = {"float32": (torch.float32,), "float64": (torch.float64,), "both": (torch.float64, torch.float32)}


def _cast(inputs: Any, dtype: torch.dtype) -> Any:
    """Floating tensors (alone or in a dict) in ``dtype``; ids, masks and strings as they are."""
    if isinstance(inputs, torch.Tensor):
        return inputs.to(dtype) if inputs.is_floating_point() else inputs
    if isinstance(inputs, dict):
        return {k: _cast(v, dtype) for k, v in inputs.items()}
    return inputs


def collect(only: str = "", dtypes: tuple = DTYPES["both"], save_to: str = "") -> dict:
    """Every run of every case whose name matches ``only``, dtype by dtype: key ``case|dtype|method|options`` ->
    the tensor fields of the explanation, or ``{"error": "Type: message"}``. ``save_to``: the runs so far are
    written there after each case (a stopped save leaves the finished cases)."""
    from lrp_core import explain

    out: dict = {}
    for dtype in dtypes:
        for name, build in cases():
            if not re.search(only, name):
                continue
            start, refused = time.perf_counter(), 0
            model, inputs, case_opts = build()
            model, x = model.to(dtype), _cast(inputs, dtype)
            for method, opts in RUNS:
                key = f"{name}|{str(dtype)[6:]}|{method}|{sorted(opts.items())}"
                torch.manual_seed(0)
                try:
                    exp = explain(model, x, method=method, **case_opts, **opts)
                except Exception as err:  # noqa: BLE001 - an error is part of the behaviour
                    out[key] = {"error": f"{type(err).__name__}: {err}"}
                    refused += 1
                    continue
                out[key] = {f: getattr(exp, f).detach().clone() for f in FIELDS if getattr(exp, f) is not None}
            took = time.perf_counter() - start
            print(f"{name} {str(dtype)[6:]}: {len(RUNS)} runs, {refused} errors, {took:.1f} s", flush=True)
            if save_to:
                torch.save(out, save_to + ".part")
                os.replace(save_to + ".part", save_to)
    return out


def difference(ref: dict, new: dict | None) -> tuple[float, str]:
    """The largest relative difference over the fields of one run (inf if missing, reshaped or another error)."""
    if new is None:
        return float("inf"), "missing"
    if "error" in ref or "error" in new:
        if ref.get("error") == new.get("error"):
            return 0.0, ""
        return float("inf"), f"error {ref.get('error')!r} -> {new.get('error')!r}"
    worst, why = 0.0, ""
    for f, r in ref.items():
        n = new.get(f)
        if n is None or n.shape != r.shape:
            return float("inf"), f"{f}: {None if n is None else tuple(n.shape)} vs {tuple(r.shape)}"
        scale = r.double().abs().max().item() or 1.0
        err = (n.double() - r.double()).abs().max().item() / scale
        if not err <= worst:  # a NaN is a difference too
            worst, why = err, f
    return worst, why


def compare(before: dict, after: dict) -> int:
    """Print each case's largest difference per dtype and every run over its tolerance; 1 if any, else 0."""
    chosen = {tuple(k.split("|")[:2]) for k in after}  # the (case, dtype) pairs --only / --dtype kept
    worst: dict[str, dict[str, float]] = {}
    bad = 0
    for key, ref in before.items():
        name, dt = key.split("|")[:2]
        if (name, dt) not in chosen:
            continue
        err, why = difference(ref, after.get(key))
        row = worst.setdefault(name, {})
        prev = row.get(dt, 0.0)
        row[dt] = prev if err <= prev else err  # a NaN is kept
        if not err <= TOL[getattr(torch, dt)]:
            print(f"DIFF {key}: {err:.3e} {why}")
            bad += 1
    for key in sorted(set(after) - set(before)):
        print(f"NEW  {key} (not in the saved file)")
    width = max([len(n) for n in worst] + [4])
    print(f"{'case':<{width}}  {'float32':>9}  {'float64':>9}")
    for name, row in worst.items():
        cells = "  ".join(f"{row[dt]:9.1e}" if dt in row else f"{'-':>9}" for dt in ("float32", "float64"))
        print(f"{name:<{width}}  {cells}")
    for dt in ("float32", "float64"):
        vals = [row[dt] for row in worst.values() if dt in row]
        if vals:
            tol = TOL[getattr(torch, dt)]
            print(f"{dt}: {len(vals)} cases, largest relative difference {max(vals):.3e} (tolerance {tol:.0e})")
    print("OK" if not bad else f"{bad} differences")
    return 1 if bad else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=("save", "compare"))
    p.add_argument("path")
    p.add_argument("--only", default="", help="only the cases whose name matches this regular expression")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="both")
    args = p.parse_args()
    torch.set_num_threads(1)
    import lrp_core

    print(f"lrp_core from {os.path.dirname(os.path.abspath(lrp_core.__file__))}")
    start = time.perf_counter()
    outputs = collect(args.only, DTYPES[args.dtype], args.path if args.mode == "save" else "")
    print(f"{len(outputs)} runs in {time.perf_counter() - start:.0f} s")
    if args.mode == "save":
        print(f"saved {len(outputs)} runs to {args.path}")
        return 0
    return compare(torch.load(args.path), outputs)


if __name__ == "__main__":
    sys.exit(main())

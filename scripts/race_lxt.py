#!/usr/bin/env python
"""Developer race: ``attnlrp`` / ``cp_lrp`` against LXT's efficient mode on the same model, same CPU, same threads.

NOT a test; LXT is never a dependency. LXT runs under its own interpreter (``/work/lxt-venv``, recipe in
``scripts/lxt_findings.md``), the project under this one. Every case runs in a fresh process, one after the other
(never two at once), so each has the machine and its own peak memory::

    .venv/bin/python scripts/race_lxt.py                       # 1k / 2k / 4k tokens, both methods, 2 threads
    .venv/bin/python scripts/race_lxt.py --lengths 1024 --methods attnlrp --repeat 5 --json race.json

The model: the benchmark's Llama row (``lrp_core.tools.bench_models.llama_config``: D 512, 8 blocks, 8 / 2 heads,
F 1376, vocabulary 32,000, sdpa), float32, random weights drawn once (seeded) and saved, so that both sides load
the same state dict; one row of random token ids, no padding. The explained logit is the argmax of the
next-token logits at the last position.

The sides, each timed as the best of ``--repeat`` calls after one warm-up call:

* ``lxt``: ``lxt.efficient.monkey_patch(modeling_llama, <attnLRP | cp_LRP>)`` before the model is built, then as
  LXT's examples run it: parameters without gradients, ``e = embed(ids)``, ``model(inputs_embeds=e)``, backward of
  the logit, relevance ``(e · ∂/∂e).sum(-1)``;
  ``--lxt-attention eager`` runs LXT's patched eager attention instead of sdpa (the model's setting, as
  ``from_pretrained`` loads it; ``both``: two LXT columns);
* ``ours``: ``lrp_core.explain(model, inputs, method=...)``, the default call (the check of the replay against the
  model's own forward included), and ``ours_unchecked``: the same with ``unverified=True`` (without the check's
  forward);
* ``fwd+bwd``: the unpatched model the same way as ``lxt`` (gradient × input): the cost of one forward + backward.

Peak memory: the process's peak RSS (``ru_maxrss``) minus its RSS once the model and inputs are built ("above
model"). Agreement: max |ours − lxt| / max |lxt| over the tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TAG = "RACE_RESULT "
SEED = 20261202
FIRST_ID = 3  # ids 0..2 are special in the config


def rss_mib() -> float:
    """The process's resident set now, MiB (``/proc/self/status`` VmRSS)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def peak_mib() -> float:
    """The process's peak resident set so far, MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def llama(tokens: int) -> Any:
    """The bench's Llama config with positions for ``tokens``."""
    sys.path.insert(0, str(ROOT))
    from lrp_core.tools.bench_models import llama_config

    cfg = llama_config()
    cfg.max_position_embeddings = max(cfg.max_position_embeddings, tokens)
    return cfg


def make_fixture(path: Path, tokens: int) -> None:
    """Draws the weights and the token row once; both sides load them."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(SEED)
    cfg = llama(tokens)
    model = LlamaForCausalLM(cfg)
    ids = torch.randint(FIRST_ID, cfg.vocab_size, (1, tokens))
    torch.save({"config": cfg.to_dict(), "state": model.state_dict(), "ids": ids}, path)


def load(path: Path, patch: str | None, attention: str = "sdpa") -> tuple[Any, Any]:
    """(model, ids) from the fixture, LXT's map applied first when ``patch`` names one; ``attention``: the
    model's attention implementation."""
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama import modeling_llama

    if patch is not None:
        import lxt.efficient.models.llama as lxt_llama
        from lxt.efficient import monkey_patch

        monkey_patch(modeling_llama, getattr(lxt_llama, patch), verbose=False)
    fx = torch.load(path, weights_only=False)
    cfg = LlamaConfig.from_dict(fx["config"])
    cfg._attn_implementation = attention
    model = modeling_llama.LlamaForCausalLM(cfg).eval()
    model.load_state_dict(fx["state"])
    return model, fx["ids"]


def gradient_x_input(model: Any, ids: Any) -> Any:
    """LXT's way: relevance = (e · ∂y/∂e).sum(-1) for the argmax next-token logit y; (T,)."""
    e = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    logits = model(inputs_embeds=e, use_cache=False, logits_to_keep=1).logits[0, -1]
    logits.max().backward()
    return (e * e.grad).sum(-1)[0].detach()


def worker(side: str, method: str, fixture: Path, out: Path, repeat: int, threads: int) -> None:
    """One case in this process: times the side, prints its result line, saves its relevance."""
    import torch

    torch.set_num_threads(threads)
    patch = {"attnlrp": "attnLRP", "cp_lrp": "cp_LRP"}[method] if side.startswith("lxt") else None
    model, ids = load(fixture, patch, "eager" if side == "lxt_eager" else "sdpa")
    for p in model.parameters():
        p.requires_grad_(False)
    if side.startswith("ours"):
        sys.path.insert(0, str(ROOT))
        from lrp_core import explain

        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

        def call() -> Any:
            return (
                explain(model, inputs, method=method, progress=False, unverified=side == "ours_unchecked")
                .scores[0]
                .detach()
            )
    else:

        def call() -> Any:
            return gradient_x_input(model, ids)

    base = rss_mib()
    times = []
    for i in range(repeat + 1):
        t0 = time.perf_counter()
        rel = call()
        if i:
            times.append(time.perf_counter() - t0)
    torch.save(rel, out)
    result = {"side": side, "method": method, "tokens": ids.shape[1], "s": min(times), "runs": len(times)}
    result.update(peak_mib=peak_mib(), above_model_mib=peak_mib() - base, threads=threads)
    print(TAG + json.dumps(result), flush=True)


def run_case(python: str, args: list[str]) -> dict:
    """Runs one worker process and returns its result line."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", TRANSFORMERS_VERBOSITY="error")
    proc = subprocess.run([python, __file__, "--worker", *args], capture_output=True, text=True, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith(TAG):
            return json.loads(line[len(TAG) :])
    raise RuntimeError(f"worker {args} failed:\n{proc.stderr[-3000:]}")


def sides(opts: argparse.Namespace) -> list[tuple[str, str]]:
    """(side, interpreter) of every timed side but the baseline."""
    lxt = {"sdpa": ["lxt"], "eager": ["lxt_eager"], "both": ["lxt", "lxt_eager"]}[opts.lxt_attention]
    return [(name, opts.lxt_python) for name in lxt] + [(name, sys.executable) for name in ("ours", "ours_unchecked")]


def race(opts: argparse.Namespace) -> list[dict]:
    """Every (length, method): each side's time and memory, their ratios and the agreement with LXT."""
    import torch

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for tokens in opts.lengths:
            fixture = Path(tmp) / f"llama_{tokens}.pt"
            make_fixture(fixture, tokens)
            common = [str(fixture), str(opts.repeat), str(opts.threads)]
            base = run_case(sys.executable, ["fwd+bwd", "attnlrp", *common, str(Path(tmp) / "fb.pt")])
            for method in opts.methods:
                row: dict[str, Any] = {"tokens": tokens, "method": method, "fwd_bwd_s": base["s"]}
                row["fwd_bwd_above_mib"] = base["above_model_mib"]
                rel = {}
                for side, python in sides(opts):
                    rel_path = Path(tmp) / f"{side}_{method}_{tokens}.pt"
                    got = run_case(python, [side, method, *common, str(rel_path)])
                    rel[side] = torch.load(rel_path)
                    row[f"{side}_s"], row[f"{side}_above_mib"], row["runs"] = (
                        got["s"],
                        got["above_model_mib"],
                        got["runs"],
                    )
                lxt = "lxt" if "lxt" in rel else "lxt_eager"
                for side in rel:
                    row[f"{side}_over_fwd_bwd"] = row[f"{side}_s"] / base["s"]
                    if side.startswith("ours"):
                        for ref in (k for k in rel if k.startswith("lxt")):
                            row[f"{side}_over_{ref}"] = row[f"{side}_s"] / row[f"{ref}_s"]
                            row[f"memory_{side}_over_{ref}"] = row[f"{side}_above_mib"] / row[f"{ref}_above_mib"]
                row["agreement"] = float((rel["ours"] - rel[lxt]).abs().max() / rel[lxt].abs().max())
                rows.append(row)
                print(
                    f"{tokens:>6} {method:<8} "
                    + "  ".join(
                        f"{k} {v:.3g}"
                        for k, v in row.items()
                        if k.endswith(("_s", "over_lxt", "over_lxt_eager", "over_fwd_bwd")) or k == "agreement"
                    ),
                    flush=True,
                )
                if opts.json:
                    Path(opts.json).write_text(json.dumps({"settings": vars(opts), "rows": rows}, indent=1))
    return rows


def main() -> None:
    """Command line: the race, or one worker (``--worker``)."""
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        side, method, fixture, repeat, threads, out = sys.argv[2:8]
        worker(side, method, Path(fixture), Path(out), int(repeat), int(threads))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=[1024, 2048, 4096])
    ap.add_argument("--methods", type=lambda s: s.split(","), default=["attnlrp", "cp_lrp"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--lxt-python", default="/work/lxt-venv/bin/python")
    ap.add_argument("--lxt-attention", choices=("sdpa", "eager", "both"), default="both")
    ap.add_argument("--json", default=None)
    opts = ap.parse_args()
    race(opts)


if __name__ == "__main__":
    main()

"""Measure the peak memory of one ``explain`` call and compare it with ``lrp_core.runtime.memory``'s estimate.

    python scripts/measure_memory.py --family bert --width 256 --blocks 4 --tokens 128 --batch 2 \\
        --method transformer_attribution [--dtype float64] [--json]

Each measurement runs in a fresh process (this script re-runs itself per
configuration): a randomly initialised model of the given size is built, a
warm-up call on one short input (BERT: 16 tokens; ViT: a tiny ViT's 2×2
patches) loads the kernels, the peak resident set size is reset to the
current one (``/proc/self/clear_refs``), then the resident set size before
the call is read from ``/proc/self/statm`` and the peak after it from
``VmHWM`` in ``/proc/self/status`` (``ru_maxrss`` where that is missing; on
Linux ``ru_maxrss`` is carried over from the parent across ``exec``, so a
large parent hides the call's peak). The
difference is the call's peak on CPU (activations, gradients, temporaries;
the weights are already resident). ``--grid`` measures the calibration grid
of docs/ARCHITECTURE.md ("Memory and pieces") and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

GRID_METHODS = ("transformer_attribution", "generic_attention", "attnlrp")
#: (family, tokens, batch): BERT at 128 / 256 tokens, ViT at 145 / 257 (12² / 16² patches + [CLS])
GRID = [
    (family, tokens, batch)
    for family, sizes in (("bert", (128, 256)), ("vit", (145, 257)))
    for tokens in sizes
    for batch in (2, 8)
]


def build(family: str, width: int, blocks: int, heads: int, tokens: int):
    """A random model and a batch maker for ``tokens`` tokens (ViT: patches + [CLS])."""
    import torch

    torch.manual_seed(0)
    if family == "bert":
        from transformers import BertConfig, BertForSequenceClassification

        cfg = BertConfig(
            vocab_size=1000,
            hidden_size=width,
            num_hidden_layers=blocks,
            num_attention_heads=heads,
            intermediate_size=4 * width,
            max_position_embeddings=max(512, tokens),
            num_labels=3,
            attn_implementation="eager",
        )
        model = BertForSequenceClassification(cfg).eval()

        def batch(b: int, n: int = tokens):
            g = torch.Generator().manual_seed(1)
            return {
                "input_ids": torch.randint(5, 1000, (b, n), generator=g),
                "attention_mask": torch.ones(b, n, dtype=torch.long),
            }

        return model, batch
    if family == "llama":  # a Llama-shaped causal LM (grouped-query sdpa attention, gated MLP, LM head)
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(
            vocab_size=8000,
            hidden_size=width,
            num_hidden_layers=blocks,
            num_attention_heads=heads,
            num_key_value_heads=max(1, heads // 4),
            intermediate_size=(8 * width) // 3,
            max_position_embeddings=max(512, tokens),
            attn_implementation="sdpa",
        )
        model = LlamaForCausalLM(cfg).eval()

        def batch(b: int, n: int = tokens):
            g = torch.Generator().manual_seed(1)
            return {
                "input_ids": torch.randint(5, 8000, (b, n), generator=g),
                "attention_mask": torch.ones(b, n, dtype=torch.long),
            }

        return model, batch
    from timm.models.vision_transformer import VisionTransformer

    side = int(round((tokens - 1) ** 0.5))
    if side * side + 1 != tokens:
        raise SystemExit(f"a ViT has h·w + 1 tokens; {tokens} is not a square plus one")
    model = VisionTransformer(
        img_size=8 * side, patch_size=8, embed_dim=width, depth=blocks, num_heads=heads, num_classes=5
    ).eval()

    def batch(b: int, n: int = tokens):
        s = 8 * int(round((n - 1) ** 0.5))
        return torch.randn(b, 3, s, s, generator=torch.Generator().manual_seed(1))

    return model, batch


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_bytes() -> int:
    """The process's peak resident set size: ``VmHWM`` (this process's own, unlike ``ru_maxrss``, which Linux
    carries over from the parent across ``exec``), else ``ru_maxrss``."""
    from lrp_core.runtime.utils import proc_kib

    kib = proc_kib("/proc/self/status", "VmHWM")
    return (kib if kib is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def reset_peak() -> bool:
    """Set the peak to the current resident set size (Linux ≥ 4.0: ``5 > /proc/self/clear_refs``)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def measure_here(a) -> dict:
    """Measure in this process (called in a fresh one)."""
    import torch

    torch.set_num_threads(a.threads)
    from lrp_core import explain
    from lrp_core.adapters import get_adapter
    from lrp_core.methods import registry
    from lrp_core.runtime import memory

    dtype = getattr(torch, a.dtype)
    model, batch = build(a.family, a.width, a.blocks, a.heads, a.tokens)
    model = model.to(dtype)
    cast = (lambda x: x.to(dtype)) if a.family == "vit" else (lambda x: x)
    if a.family == "vit":  # a ViT takes one image size: warm up on a tiny one of its own
        tiny, tiny_batch = build("vit", 32, 1, 2, 5)
        explain(tiny.to(dtype), cast(tiny_batch(1)), method=a.method)
        del tiny
    elif a.method not in registry.SOURCE_METHODS:
        explain(model, batch(1, 16), method=a.method)
    x = cast(batch(a.batch))
    extra = {}
    if a.method in registry.SOURCE_METHODS:  # S equal sources over the context before the read token
        from lrp_core.tools.bench import equal_spans

        extra = dict(sources=equal_spans(a.tokens, a.sources), batch_size=a.batch_size)
        explain(model, batch(1, 16), method=a.method, sources=equal_spans(16, 2))
    reset = reset_peak()
    before_rss, before_peak = rss_bytes(), peak_bytes()
    explain(model, x, method=a.method, max_memory=float("inf"), **extra)
    peak = peak_bytes()
    adapter = get_adapter(model)
    prepared = adapter.check_inputs(x)
    est = memory.estimate(
        registry.get(a.method).memory, memory.facts_of(adapter, prepared), a.batch, batch_size=a.batch_size
    )
    return {
        "family": a.family,
        "method": a.method,
        "tokens": a.tokens,
        "batch": a.batch,
        "dtype": a.dtype,
        "measured_mb": (peak - before_rss) / 2**20,
        "estimated_mb": est / 2**20,
        "reliable": reset or peak > before_peak,
    }


def measure(
    family: str,
    method: str,
    tokens: int,
    batch: int,
    width: int = 256,
    blocks: int = 4,
    heads: int = 4,
    dtype: str = "float32",
    threads: int = 1,
    sources: int = 8,
    batch_size: int = 64,
) -> dict:
    """Run one measurement in a fresh Python process; the result as a dict."""
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--family",
        family,
        "--method",
        method,
        "--tokens",
        str(tokens),
        "--batch",
        str(batch),
        "--width",
        str(width),
        "--blocks",
        str(blocks),
        "--heads",
        str(heads),
        "--dtype",
        dtype,
        "--threads",
        str(threads),
        "--sources",
        str(sources),
        "--batch-size",
        str(batch_size),
        "--json",
    ]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", choices=("bert", "vit", "llama"), default="bert")
    p.add_argument("--method", default="transformer_attribution")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--sources", type=int, default=8, help="equal sources (leave_one_out, context_cite)")
    p.add_argument(
        "--batch-size",
        type=int,
        default=64,
        help="sequences per forward pass of the batched methods (the estimate's batch_size)",
    )
    p.add_argument("--json", action="store_true", help="measure in this process, print one JSON line")
    p.add_argument("--grid", action="store_true", help="the calibration grid, as a Markdown table")
    a = p.parse_args()
    if a.json:
        print(json.dumps(measure_here(a)))
        return
    rows = (
        [(f, m, t, b) for f, t, b in GRID for m in GRID_METHODS]
        if a.grid
        else [(a.family, a.method, a.tokens, a.batch)]
    )
    print("| family | method | T | B | measured MB | estimated MB | est / meas |")
    print("|---|---|---|---|---|---|---|")
    for f, m, t, b in rows:
        r = measure(f, m, t, b, a.width, a.blocks, a.heads, a.dtype, a.threads, a.sources, a.batch_size)
        flag = "" if r["reliable"] else " (peak not above the warm-up's)"
        print(
            f"| {f} | {m} | {t} | {b} | {r['measured_mb']:.1f} | {r['estimated_mb']:.1f} | "
            f"{r['estimated_mb'] / max(r['measured_mb'], 1e-9):.2f}{flag} |",
            flush=True,
        )


if __name__ == "__main__":
    main()

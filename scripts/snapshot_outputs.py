"""Save, or compare with a saved file, every method's output on every model the tests build.

A developer tool for changes to the engine that must not change behaviour:

    python scripts/snapshot_outputs.py save before.pt      # on the old code
    python scripts/snapshot_outputs.py compare before.pt   # on the new code

``compare`` prints, per model, dtype and method, the largest relative
difference (max |Δ| / max |before|) over every tensor field of the
``Explanation`` and fails when float64 exceeds 1e-10 or float32 1e-6.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable, Iterator

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

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


def _cases() -> Iterator[tuple[str, Callable[[], tuple[torch.nn.Module, Any]]]]:
    from conftest import make_tiny_bert, make_tiny_vit

    images = lambda n=3, s=32: torch.randn(n, 3, s, s, generator=torch.Generator().manual_seed(1))  # noqa: E731
    ids = torch.tensor([[2, 11, 12, 13, 14, 15, 3], [2, 21, 22, 3, 0, 0, 0], [2, 31, 32, 33, 34, 3, 0]])
    text = {"input_ids": ids, "attention_mask": (ids != 0).long()}
    left = {
        "input_ids": torch.tensor([[0, 0, 2, 5, 3], [2, 6, 7, 8, 3]]),
        "attention_mask": torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]),
    }

    yield "timm-vit", lambda: (make_tiny_vit(), images())
    yield "timm-vit-unfused", lambda: (_unfused(make_tiny_vit(seed=3)), images())
    yield (
        "timm-vit-ls-reg",
        lambda: (make_tiny_vit(seed=2, init_values=0.5, reg_tokens=2, no_embed_class=True), images()),
    )
    yield "hf-vit", lambda: (_hf_vit(), images())
    for impl in ("eager", "sdpa"):
        yield f"bert-{impl}", lambda impl=impl: (make_tiny_bert(attn_implementation=impl), text)
    yield "bert-wide", lambda: (make_tiny_bert(weight_scale=5.0), text)
    yield "bert-left-padded", lambda: (make_tiny_bert(seed=4), left)

    def toy():
        from lrp_core.data import make_scenes
        from lrp_core.models import load

        lm = load("toy-vit")
        return lm.model, make_scenes(4, seed=123).images

    def minilm():
        from lrp_core.models import load

        lm = load("minilm-sentiment")
        enc = lm.tokenizer(
            ["a truly wonderful film", "dull and far too long, I left early"], padding=True, return_tensors="pt"
        )
        return lm.model, {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}

    yield "toy-vit", toy
    yield "minilm-sentiment", minilm

    from decoders import FAMILIES, batch, make_decoder, rows

    for family in FAMILIES:
        yield f"{family}-causal", lambda family=family: (make_decoder(family), batch(rows(), "left"))
    yield "llama-seq", lambda: (make_decoder("llama", head="seq"), batch(rows(), "right"))


def _unfused(model):
    for blk in model.blocks:
        blk.attn.fused_attn = False
    return model


def _hf_vit():
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(5)
    cfg = ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=48,
        num_hidden_layers=3,
        num_attention_heads=3,
        intermediate_size=96,
        num_labels=5,
    )
    model = ViTForImageClassification(cfg).eval()
    from conftest import _perturb_norms

    _perturb_norms(model, 5)
    return model


def _cast(inputs: Any, dtype: torch.dtype) -> Any:
    if isinstance(inputs, torch.Tensor):
        return inputs.to(dtype)
    return inputs


def collect() -> dict:
    from lrp_core import explain

    out: dict = {}
    for name, build in _cases():
        for dtype in (torch.float32, torch.float64):
            model, inputs = build()
            model = model.to(dtype)
            x = _cast(inputs, dtype)
            for method, opts in RUNS:
                if name.startswith(("bert", "minilm")) and method == "lrp" and opts:
                    continue
                key = f"{name}|{str(dtype)[6:]}|{method}|{sorted(opts.items())}"
                try:
                    exp = explain(model, x, method=method, **opts)
                except Exception as err:  # noqa: BLE001 - an error is part of the behaviour
                    out[key] = {"error": f"{type(err).__name__}: {err}"}
                    continue
                out[key] = {f: getattr(exp, f).detach().clone() for f in FIELDS if getattr(exp, f) is not None}
            print(f"{name} {dtype}: {len(RUNS)} runs", flush=True)
    return out


def compare(before: dict, after: dict) -> int:
    bad = 0
    worst: dict[str, float] = {}
    for key, ref in before.items():
        dtype = torch.float64 if "|float64|" in key else torch.float32
        new = after.get(key)
        if new is None:
            print(f"MISSING {key}")
            bad += 1
            continue
        if "error" in ref or "error" in new:
            if ref.get("error") != new.get("error"):
                print(f"ERROR DIFFERS {key}: {ref.get('error')} -> {new.get('error')}")
                bad += 1
            continue
        for f, r in ref.items():
            n = new.get(f)
            if n is None or n.shape != r.shape:
                print(f"FIELD {key} {f}: {None if n is None else tuple(n.shape)} vs {tuple(r.shape)}")
                bad += 1
                continue
            scale = r.double().abs().max().item() or 1.0
            err = (n.double() - r.double()).abs().max().item() / scale
            worst[key] = max(worst.get(key, 0.0), err)
            if not err <= TOL[dtype]:
                print(f"DIFF {key} {f}: {err:.3e}")
                bad += 1
    for dt in ("float32", "float64"):
        vals = [v for k, v in worst.items() if f"|{dt}|" in k]
        if vals:
            print(f"{dt}: {len(vals)} runs compared, largest relative difference {max(vals):.3e}")
    print("OK" if not bad else f"{bad} differences")
    return 1 if bad else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=("save", "compare"))
    p.add_argument("path")
    args = p.parse_args()
    torch.set_num_threads(1)
    outputs = collect()
    if args.mode == "save":
        torch.save(outputs, args.path)
        print(f"saved {len(outputs)} runs to {args.path}")
        return 0
    return compare(torch.load(args.path), outputs)


if __name__ == "__main__":
    sys.exit(main())

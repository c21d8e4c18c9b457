"""How far each method's map on a half-precision model is from the float32 map on the same weights.

For every family, method and precision case the script explains

* ``float16`` / ``bfloat16``: the model cast to that dtype (inputs too), against a float32 copy made
  *from the half weights* (so both see the same numbers; the difference is the arithmetic alone);
* ``autocast-bf16``: the float32 model under ``torch.autocast(<device>, torch.bfloat16)``, against the
  same model without autocast,

and prints ``max |Δscores| / max |scores_float32|`` per method × case (the largest over the families), then
the same per family with ``--detail``. ``nan`` marks a map with NaN, ``zero`` a map of zeros where the
float32 map is not, and an exception's class name a case the engine refused.

    python scripts/measure_half_precision.py                # tiny models of every family (about a minute)
    python scripts/measure_half_precision.py --size base --families bert timm-vit   # BERT-/ViT-base shaped
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import sys
from typing import Any, Callable

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "tests"), os.path.join(HERE, "..", "tests", "adapters")]

CASES = ("float16", "bfloat16", "autocast-bf16")


def _images(n: int = 2, size: int = 32) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(1))


def _text(model: torch.nn.Module) -> dict:
    from text_families import text_batch

    return text_batch(model)


def _clip_inputs() -> dict:
    ids = torch.tensor([[1, 5, 6, 7, 98], [1, 8, 9, 98, 0], [1, 10, 98, 0, 0]])
    return {"pixel_values": _images(2), "input_ids": ids, "attention_mask": (ids != 0).long()}


def _hf_vit(size: str) -> torch.nn.Module:
    from conftest import _perturb_norms
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(5)
    if size == "base":
        cfg = ViTConfig(image_size=224, patch_size=16, num_labels=1000)
    else:
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
    _perturb_norms(model, 5)
    return model


def families(size: str = "tiny") -> dict[str, Callable[[], tuple[torch.nn.Module, Any]]]:
    """name -> builder of (float32 model, inputs). ``size="base"``: BERT-base / ViT-B/16 shapes (random)."""
    from conftest import make_tiny_bert, make_tiny_vit
    from text_families import make
    from tiny_clip import make_clip

    if size == "base":
        from timm.models.vision_transformer import VisionTransformer
        from transformers import BertConfig, BertForSequenceClassification

        def bert_base():
            torch.manual_seed(0)
            model = BertForSequenceClassification(BertConfig(num_labels=3)).eval()
            ids = torch.randint(1000, 20000, (2, 128), generator=torch.Generator().manual_seed(0))
            ids[:, 0], ids[:, -1] = 101, 102
            return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

        def vit_base():
            torch.manual_seed(0)
            return VisionTransformer(num_classes=1000).eval(), _images(2, 224)

        return {"bert": bert_base, "timm-vit": vit_base, "hf-vit": lambda: (_hf_vit("base"), _images(2, 224))}
    out = {
        "timm-vit": lambda: (make_tiny_vit(), _images()),
        "hf-vit": lambda: (_hf_vit(size), _images()),
        "clip": lambda: (make_clip(), _clip_inputs()),
        "clip-text": lambda: (make_clip(), dict(_clip_inputs(), explain="text")),
        "bert": lambda: (make_tiny_bert(), _text(make_tiny_bert())),
    }
    for fam in ("distilbert", "roberta", "electra", "albert", "mpnet"):
        out[fam] = lambda fam=fam: (make(fam), _text(make(fam)))
    from vision_models import FAMILIES as VISION

    for fam in ("timm_avg_registers", "timm_distilled", "hf_deit_teacher", "hf_dinov2"):
        out[fam.replace("_", "-")] = lambda fam=fam: (VISION[fam](), _images())
    return out


def cast_inputs(inputs: Any, dtype: torch.dtype) -> Any:
    """Float tensors (images, pixel_values) to ``dtype``; token ids and masks as they are."""
    if isinstance(inputs, torch.Tensor):
        return inputs.to(dtype)
    return {k: (v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in inputs.items()}


def upcast_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A float32 copy of a (half) model: the reference that sees exactly the half weights."""
    return copy.deepcopy(model).float()


def run_case(
    model: torch.nn.Module, inputs: Any, method: str, case: str, device: str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the map under ``case``, the float32 reference map) for a float32 ``model``."""
    from lrp_core import explain

    if case == "autocast-bf16":
        ref = explain(model, inputs, method=method).scores
        with torch.autocast(device, dtype=torch.bfloat16):
            got = explain(model, inputs, method=method).scores
        return got, ref
    dtype = getattr(torch, case)
    half = copy.deepcopy(model).to(dtype)
    x = cast_inputs(inputs, dtype)
    got = explain(half, x, method=method).scores
    ref = explain(upcast_copy(half), cast_inputs(x, torch.float32), method=method).scores
    return got, ref


def error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max |got − ref| / max |ref| in float64 (NaN if ``got`` has a NaN)."""
    got, ref = got.double(), ref.double()
    if not torch.isfinite(got).all():
        return math.nan
    return float((got - ref).abs().max() / ref.abs().max().clamp(min=1e-30))


def describe(got: torch.Tensor, ref: torch.Tensor) -> str:
    e = error(got, ref)
    if math.isnan(e):
        return "nan"
    if not got.abs().max() > 0 and ref.abs().max() > 0:
        return "zero"
    return f"{e:.1e}"


def measure(names: list[str], size: str, methods: list[str], cases: tuple = CASES, device: str = "cpu") -> dict:
    """{(family, method, case): text} — the relative error, or why there is none."""
    builders = families(size)
    table = {}
    for name in names:
        for method in methods:
            for case in cases:
                model, inputs = builders[name]()
                try:
                    table[name, method, case] = describe(*run_case(model, inputs, method, case, device))
                except Exception as err:  # noqa: BLE001 - a refusal (or a crash) is part of the table
                    table[name, method, case] = type(err).__name__
                print(f"  {name} {method} {case}: {table[name, method, case]}", file=sys.stderr, flush=True)
    return table


def _worst(cells: list[str]) -> str:
    """The worst of several cells: a crash or NaN before any number, then the largest number."""
    words = [c for c in cells if not c[0].isdigit()]
    if words:
        return "/".join(sorted(set(words)))
    return max(cells, key=float)


def print_table(table: dict, names: list[str], methods: list[str], detail: bool, cases: tuple = CASES) -> None:
    print(f"{'method':<24}" + "".join(f"{c:>16}" for c in cases) + "   (worst over: " + ", ".join(names) + ")")
    for m in methods:
        print(f"{m:<24}" + "".join(f"{_worst([table[n, m, c] for n in names]):>16}" for c in cases))
    if detail:
        for n in names:
            print(f"\n{n}")
            for m in methods:
                print(f"  {m:<22}" + "".join(f"{table[n, m, c]:>16}" for c in cases))


def main() -> int:
    from lrp_core import METHODS

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=("tiny", "base"), default="tiny")
    p.add_argument("--families", nargs="*")
    p.add_argument("--methods", nargs="*", default=list(METHODS))
    p.add_argument("--cases", nargs="*", choices=CASES, default=list(CASES))
    p.add_argument("--detail", action="store_true", help="also print every family's row")
    args = p.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    names = args.families or list(families(args.size))
    cases = tuple(args.cases)
    table = measure(names, args.size, args.methods, cases)
    print_table(table, names, args.methods, args.detail, cases)
    return 0


if __name__ == "__main__":
    sys.exit(main())

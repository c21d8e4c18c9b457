"""The fast half-precision mode against the float32 mode on the same half weights, per method and family.

For every family, method and half dtype the script explains the half model twice:

* ``dtype=torch.bfloat16`` / ``torch.float16`` (its own dtype): the fast mode (lrp_core.runtime.fast_half);
* ``dtype=None``: the default float32 mode, the exact reference (what ``model.float()`` gives),

and prints, per row: the map's max relative deviation ``max |fast − ref| / max |ref|``, the Pearson r of the two
maps (all real tokens of the batch together), the top-k overlap (k = 10 % of each row's real tokens, at least 1;
the mean over rows of |top-k(fast) ∩ top-k(ref)| / k), the explained logits of the fast mode against the model's
own half forward (what the verification on every call measures, ``logit-own``) and against the float32 logits
(``logit-f32``). The cells of the table are the worst over the inputs.

    python scripts/measure_half_fast.py                      # tiny models of every family (about a minute)
    python scripts/measure_half_fast.py --size small         # Llama / Qwen3 / BERT / ViT of D 256, 6 blocks
    python scripts/measure_half_fast.py --families llama --methods attnlrp --dtypes bfloat16
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Any, Callable

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [
    os.path.join(HERE, ".."),
    os.path.join(HERE, "..", "tests"),
    os.path.join(HERE, "..", "tests", "adapters"),
]  # noqa: E501

METHODS = ("attnlrp", "cp_lrp", "pa_lrp", "input_x_gradient")
DTYPES = ("bfloat16", "float16")

Builder = Callable[[], tuple[torch.nn.Module, Any]]


def _decoder(family: str, attn: str = "eager", size: str = "tiny") -> Builder:
    def build() -> tuple[torch.nn.Module, Any]:
        from decoders import batch, make_decoder, rows

        if size == "small":
            over = dict(hidden_size=256, intermediate_size=688, num_hidden_layers=6, num_attention_heads=8)
            over.update(num_key_value_heads=4, max_position_embeddings=512)
            if family in ("qwen3",):
                over["head_dim"] = 32
            if family == "qwen2":
                over.update(sliding_window=64)
            model = make_decoder(family, attn, dtype=torch.float32, **over)
            with torch.no_grad():  # 0.3·N(0, 1) weights: to std 1/sqrt(fan-in), as an init
                for name, p in model.named_parameters():
                    if "norm" not in name and p.dim() == 2:
                        p.mul_(1.0 / (0.3 * math.sqrt(p.shape[-1])))
            return model, batch(rows(1, (96, 128, 80)))
        return make_decoder(family, attn, dtype=torch.float32), batch(rows())

    return build


def _gpt2(size: str) -> Builder:
    def build() -> tuple[torch.nn.Module, Any]:
        from decoders import batch, make_decoder, rows

        return make_decoder("gpt2", "eager", dtype=torch.float32), batch(rows())

    return build


def _bert(size: str) -> Builder:
    def build() -> tuple[torch.nn.Module, Any]:
        from conftest import make_tiny_bert
        from text_families import text_batch

        if size == "small":
            model = make_tiny_bert(
                vocab_size=200,
                hidden_size=256,
                num_hidden_layers=6,
                num_attention_heads=8,
                intermediate_size=1024,
                max_position_embeddings=160,
                weight_scale=2.0,
            )
            g = torch.Generator().manual_seed(3)
            ids = torch.randint(5, 200, (2, 128), generator=g)
            return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        model = make_tiny_bert()
        return model, text_batch(model)

    return build


def _images(n: int = 2, size: int = 32) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(1))


def _timm_vit(size: str) -> Builder:
    def build() -> tuple[torch.nn.Module, Any]:
        from conftest import make_tiny_vit

        if size == "small":
            return make_tiny_vit(img_size=128, patch_size=8, embed_dim=256, depth=6, num_heads=8), _images(2, 128)
        return make_tiny_vit(), _images()

    return build


def _hf_vit(size: str) -> Builder:
    def build() -> tuple[torch.nn.Module, Any]:
        from measure_half_precision import _hf_vit as hf_vit

        return hf_vit("tiny"), _images()

    return build


def _llava(size: str) -> Builder:
    def build() -> tuple[torch.nn.Module, Any]:
        from vlms import inputs, make_llava, prompt

        model = make_llava(tower="clip", attn="sdpa", dtype=torch.float32)
        return model, inputs([prompt([5, 6], [7, 8, 9]), prompt([10], [11, 12])], dtype=torch.float32)

    return build


def families(size: str = "tiny") -> dict[str, Builder]:
    """name -> builder of (float32 model, inputs)."""
    out = {
        "llama": _decoder("llama", "eager", size),
        "llama-sdpa": _decoder("llama", "sdpa", size),
        "qwen2": _decoder("qwen2", "eager", size),
        "qwen3": _decoder("qwen3", "eager", size),
        "gpt2": _gpt2(size),
        "bert": _bert(size),
        "timm-vit": _timm_vit(size),
        "hf-vit": _hf_vit(size),
        "llava": _llava(size),
    }
    if size == "small":
        return {k: out[k] for k in ("llama", "llama-sdpa", "qwen3", "bert", "timm-vit")}
    return out


def cast_inputs(inputs: Any, dtype: torch.dtype) -> Any:
    """Float tensors (images, pixel_values) to ``dtype``; token ids and masks as they are."""
    if isinstance(inputs, torch.Tensor):
        return inputs.to(dtype)
    return {k: (v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in inputs.items()}


def real_tokens(e: Any) -> torch.Tensor:
    """(B, T) bool: the tokens a map scores (the attention mask where there is one)."""
    mask = e.attention_mask
    if mask is None or mask.shape != e.scores.shape:
        return torch.ones_like(e.scores, dtype=torch.bool)
    return mask.bool()


def compare(fast: torch.Tensor, ref: torch.Tensor, real: torch.Tensor) -> dict[str, float]:
    """Max relative deviation, Pearson r and top-k overlap (k = 10 % of a row's real tokens, at least 1)."""
    a, b = fast.double(), ref.double()
    if not torch.isfinite(a).all():
        return {"max_rel": math.nan, "pearson": math.nan, "topk": math.nan}
    rel = float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))
    x, y = a[real], b[real]
    x, y = x - x.mean(), y - y.mean()
    r = float((x * y).sum() / (x.norm() * y.norm()).clamp(min=1e-300))
    overlaps = []
    for row in range(a.shape[0]):
        idx = real[row].nonzero().squeeze(1)
        k = max(1, round(0.1 * len(idx)))
        top_a = set(idx[a[row, idx].topk(k).indices].tolist())
        top_b = set(idx[b[row, idx].topk(k).indices].tolist())
        overlaps.append(len(top_a & top_b) / k)
    return {"max_rel": rel, "pearson": r, "topk": min(overlaps)}


def own_logits(model: torch.nn.Module, inputs: Any, fast: Any) -> torch.Tensor:
    """The model's own half forward at the logits the explanation read (decoders: each row's read position)."""
    from lrp_core.adapters import get_adapter, verification

    adapter = get_adapter(model).for_inputs(inputs)
    prepared = adapter.check_inputs(inputs)
    prepared, _ = adapter.task_inputs(prepared, None, fast.target)
    from lrp_core.runtime.pieces import Piece

    own, _ = verification.own_logits(adapter, prepared, [Piece(torch.arange(prepared.size), None)])
    return own


def run_case(build: Builder, method: str, dtype: torch.dtype) -> dict[str, float]:
    """The figures of one family × method × dtype."""
    from lrp_core import explain

    model, inputs = build()
    model = model.to(dtype)
    x = cast_inputs(inputs, dtype)
    fast = explain(model, x, method=method, dtype=dtype)
    ref = explain(model, x, method=method, target=fast.target)  # the same prediction (a near tie may flip the argmax)
    out = compare(fast.scores, ref.scores, real_tokens(ref))
    with torch.no_grad():
        own = own_logits(model, x, fast)
    dev = lambda a, b: float((a.double() - b.double()).abs().max() / b.double().abs().max())  # noqa: E731
    out["logit_own"] = dev(fast.logits, own)
    out["logit_f32"] = dev(fast.logits, ref.logits)
    return out


COLUMNS = ("max_rel", "pearson", "topk", "logit_own", "logit_f32")


def fmt(key: str, v: float) -> str:
    if math.isnan(v):
        return "nan"
    return f"{v:.4f}" if key in ("pearson", "topk") else f"{v:.1e}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=("tiny", "small"), default="tiny")
    p.add_argument("--families", nargs="*")
    p.add_argument("--methods", nargs="*", default=list(METHODS))
    p.add_argument("--dtypes", nargs="*", choices=DTYPES, default=list(DTYPES))
    args = p.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    builders = families(args.size)
    names = args.families or list(builders)
    print(f"| family | method | dtype | {' | '.join(COLUMNS)} |")
    print("|" + "---|" * (3 + len(COLUMNS)))
    for name in names:
        for method in args.methods:
            for dt in args.dtypes:
                try:
                    got = run_case(builders[name], method, getattr(torch, dt))
                    cells = [fmt(k, got[k]) for k in COLUMNS]
                except Exception as err:  # noqa: BLE001 - a refusal is part of the table
                    cells = [type(err).__name__ + ": " + str(err)[:60]] + [""] * (len(COLUMNS) - 1)
                print(f"| {name} | {method} | {dt} | {' | '.join(cells)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

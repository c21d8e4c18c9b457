"""How far each method's float32 map is from its float64 map, on the embedded models and on seeded random ones.

For every model and method: the float32 map of the model as it is, and the float64 map of the same weights
(``explain(..., dtype=torch.float64)``); the distance is ``max |Δscores| / max |scores_float64|``. Prints a Markdown
table (docs/METHODS.md §5.10 quotes it). The float32 digits depend on the CPU's kernels; run it with
``ATEN_CPU_CAPABILITY=default`` too to see another CPU's.

    python scripts/measure_float64.py                 # all models, 2 inputs each
    python scripts/measure_float64.py --models toy-vit seeded-vit-6
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lrp_core import METHODS, explain  # noqa: E402
from lrp_core.errors import UnsupportedModelError  # noqa: E402

#: methods whose random draws are made in float64 in the float64 mode: their two maps are other samples
DRAWS = ("smoothgrad", "kernel_shap")


def _embedded(name: str) -> Callable[[], tuple[Any, Any]]:
    def build() -> tuple[Any, Any]:
        from lrp_core.data import make_scenes
        from lrp_core.models import load

        loaded = load(name)
        if name == "toy-vit":
            return loaded.model, make_scenes(2, seed=11, n_objects=2).images
        if name == "dinov2-scenes":
            from lrp_core.models.dinov2_scenes import scene_inputs

            return loaded.model, scene_inputs(make_scenes(2, seed=11, n_objects=2, size=112).rgb)
        if name == "minilm-sentiment":
            enc = loaded.tokenizer(
                ["a warm, funny and moving film", "dull and far too long"], padding=True, return_tensors="pt"
            )
            return loaded.model, dict(enc)
        raise ValueError(name)

    return build


def _seeded_vit(depth: int) -> Callable[[], tuple[Any, Any]]:
    def build() -> tuple[Any, Any]:
        from timm.models.vision_transformer import VisionTransformer

        torch.manual_seed(0)
        model = VisionTransformer(img_size=32, patch_size=8, embed_dim=48, depth=depth, num_heads=3, num_classes=5)
        return model.eval(), torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))

    return build


def _seeded_bert() -> tuple[Any, Any]:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=60,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=40,
        num_labels=3,
    )
    ids = torch.tensor([[2, 11, 12, 13, 14, 3], [2, 21, 22, 3, 0, 0]])
    return BertForSequenceClassification(cfg).eval(), {"input_ids": ids, "attention_mask": (ids != 0).long()}


def _seeded_llama() -> tuple[Any, Any]:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    ids = torch.randint(1, 64, (2, 9), generator=torch.Generator().manual_seed(2))
    return LlamaForCausalLM(cfg).eval(), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


MODELS: dict[str, Callable[[], tuple[Any, Any]]] = {
    "toy-vit": _embedded("toy-vit"),
    "dinov2-scenes": _embedded("dinov2-scenes"),
    "minilm-sentiment": _embedded("minilm-sentiment"),
    "seeded-vit-6": _seeded_vit(6),
    "seeded-bert-4": _seeded_bert,
    "seeded-llama-4": _seeded_llama,
}


def measure(name: str) -> dict[str, Any]:
    """``{method: deviation, or the reason it does not run}`` for one model."""
    model, x = MODELS[name]()
    row: dict[str, Any] = {}
    for method in METHODS:
        if method in DRAWS:
            continue
        try:
            f32 = explain(model, x, method=method).scores.double()
            f64 = explain(model, x, method=method, dtype=torch.float64).scores
        except UnsupportedModelError:
            row[method] = None
            continue
        row[method] = ((f32 - f64).abs().max() / f64.abs().max().clamp_min(1e-300)).item()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = {name: measure(name) for name in args.models}
    methods = [m for m in METHODS if m not in DRAWS]
    print(f"kernels: {torch.backends.cpu.get_cpu_capability()}\n")
    print("| method | " + " | ".join(args.models) + " |")
    print("|---|" + "---|" * len(args.models))
    for m in methods:
        cells = ["—" if rows[n].get(m) is None else f"{rows[n][m]:.1e}" for n in args.models]
        print(f"| `{m}` | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

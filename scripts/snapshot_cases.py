"""The models and inputs of ``snapshot_outputs.py``: every family the library supports, built by the tests' own
tiny builders (tests/), batches of 2–3.

:func:`cases` yields ``(name, build)``; ``build()`` gives ``(model, inputs, options)``, the options (a CLIP
target, say) passed to every method of that case.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Iterator

import torch

TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests")

Build = Callable[[], tuple[torch.nn.Module, Any, dict]]


def _tests_on_path() -> None:
    """tests/ and each folder under it on ``sys.path``, tests/ first (its conftest is the root one)."""
    folders = [TESTS] + sorted(
        root for root, _, files in os.walk(TESTS) if root != TESTS and "__pycache__" not in root and files
    )
    for folder in reversed(folders):
        if folder not in sys.path:
            sys.path.insert(0, folder)


def _images(n: int = 3, size: int = 32, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def cases() -> Iterator[tuple[str, Build]]:
    """Every case, in a fixed order."""
    _tests_on_path()
    yield from _vits()
    yield from _vision_families()
    yield from _texts()
    yield from _swins()
    yield from _evas()
    yield from _image_text()
    yield from _embedded()
    yield from _decoders()
    yield from _vlms()


def _vits() -> Iterator[tuple[str, Build]]:
    from conftest import make_tiny_bert, make_tiny_vit

    ids = torch.tensor([[2, 11, 12, 13, 14, 15, 3], [2, 21, 22, 3, 0, 0, 0], [2, 31, 32, 33, 34, 3, 0]])
    text = {"input_ids": ids, "attention_mask": (ids != 0).long()}
    left = {
        "input_ids": torch.tensor([[0, 0, 2, 5, 3], [2, 6, 7, 8, 3]]),
        "attention_mask": torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]),
    }
    yield "timm-vit", lambda: (make_tiny_vit(), _images(), {})
    yield "timm-vit-unfused", lambda: (_unfused(make_tiny_vit(seed=3)), _images(), {})
    yield (
        "timm-vit-ls-reg",
        lambda: (make_tiny_vit(seed=2, init_values=0.5, reg_tokens=2, no_embed_class=True), _images(), {}),
    )
    yield "hf-vit", lambda: (_hf_vit(), _images(), {})
    for impl in ("eager", "sdpa"):
        yield f"bert-{impl}", lambda impl=impl: (make_tiny_bert(attn_implementation=impl), text, {})
    yield "bert-wide", lambda: (make_tiny_bert(weight_scale=5.0), text, {})
    yield "bert-left-padded", lambda: (make_tiny_bert(seed=4), left, {})


def _unfused(model: torch.nn.Module) -> torch.nn.Module:
    for blk in model.blocks:
        blk.attn.fused_attn = False
    return model


def _hf_vit() -> torch.nn.Module:
    from conftest import _perturb_norms
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
    _perturb_norms(model, 5)
    return model


def _vision_families() -> Iterator[tuple[str, Build]]:
    from test_vision_families import FAMILIES, siglip2_patches

    for family, make in FAMILIES.items():
        yield f"vision-{family}", lambda make=make: (make(), _images(), {})
    yield (
        "vision-hf_siglip2-patches",
        lambda: (FAMILIES["hf_siglip2"](), siglip2_patches(_images(), length=20), {}),
    )


def _texts() -> Iterator[tuple[str, Build]]:
    from text_families import CASES, make, text_batch

    def build(family: str, impl: str) -> tuple[torch.nn.Module, Any, dict]:
        model = make(family, impl)
        return model, text_batch(model), {}

    for family, impl in CASES:
        yield f"text-{family}-{impl}", lambda f=family, i=impl: build(f, i)


def _swins() -> Iterator[tuple[str, Build]]:
    from test_swin import FAMILIES as TIMM
    from test_swin import make_swin
    from test_swin_v2_hf import FAMILIES as OTHERS
    from test_swin_v2_hf import make_swin as make_other

    for family, kw in TIMM.items():
        yield f"swin-timm-{family}", lambda kw=kw: (make_swin(**kw), _images(2), {})
    for family in OTHERS:
        yield f"swin-{family}", lambda f=family: (make_other(f), _images(2), {})


def _evas() -> Iterator[tuple[str, Build]]:
    from test_eva import FAMILIES, make_eva

    for family, kw in FAMILIES.items():
        yield f"eva-{family}", lambda kw=kw: (make_eva(**kw), _images(2), {})


def _image_text() -> Iterator[tuple[str, Build]]:
    """CLIP (image side and text side) and SigLIP / SigLIP 2 similarity, with the targets their tests use."""
    from test_siglip import _siglip2, siglip2_patches
    from tiny_clip import make_clip

    try:  # tests/adapters/vision_models.py since the tests mirror the package
        from vision_models import siglip_model as _siglip_model
        from vision_models import siglip_pair as _pair
    except ImportError:
        from test_siglip import _pair, _siglip_model

    ids = torch.tensor([[1, 5, 6, 7, 98], [1, 8, 9, 98, 0], [1, 10, 98, 0, 0]])  # 98: end of text
    clip = {"pixel_values": _images(2, seed=3), "input_ids": ids, "attention_mask": (ids != 0).long()}
    yield "clip-image", lambda: (make_clip(), clip, {"target": [0, 2]})
    yield "clip-text", lambda: (make_clip(4), {**clip, "explain": "text"}, {"target": [1, 0, 1]})
    yield "siglip-pair", lambda: (_siglip_model(seed=1), _pair(_images(2)), {"target": [0, 2]})

    def siglip2_pair() -> tuple[torch.nn.Module, Any, dict]:
        x = dict(siglip2_patches(_images(2, seed=1), 20), input_ids=_pair(None)["input_ids"])
        return _siglip2("Siglip2Model"), x, {"target": [0, 2]}

    yield "siglip2-pair", siglip2_pair


def _embedded() -> Iterator[tuple[str, Build]]:
    """The course's embedded models (offline, trained weights)."""
    from lrp_core.data import make_scenes
    from lrp_core.models import load

    def toy() -> tuple[torch.nn.Module, Any, dict]:
        return load("toy-vit").model, make_scenes(4, seed=123).images, {}

    def minilm() -> tuple[torch.nn.Module, Any, dict]:
        lm = load("minilm-sentiment")
        texts = ["a truly wonderful film", "dull and far too long, I left early"]
        enc = lm.tokenizer(texts, padding=True, return_tensors="pt")
        return lm.model, {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}, {}

    def dinov2() -> tuple[torch.nn.Module, Any, dict]:
        from lrp_core.data.scenes import DINOV2_SCENE_SIZE

        return load("dinov2-scenes").model, make_scenes(2, seed=7, size=DINOV2_SCENE_SIZE).images, {}

    yield "toy-vit", toy
    yield "minilm-sentiment", minilm
    yield "dinov2-scenes", dinov2


def _decoders() -> Iterator[tuple[str, Build]]:
    from decoders import FAMILIES, batch, make_decoder, rows

    for family in FAMILIES:
        yield f"{family}-causal", lambda family=family: (make_decoder(family), batch(rows(), "left"), {})
    yield "llama-seq", lambda: (make_decoder("llama", head="seq"), batch(rows(), "right"), {})


def _vlms() -> Iterator[tuple[str, Build]]:
    """The five VLM families (LLaVA with both towers, SmolVLM / Idefics3, Qwen2-VL / 2.5-VL, Gemma 3, PaliGemma)."""
    import vlms

    def llava(tower: str, layer: int, strategy: str) -> tuple[torch.nn.Module, Any, dict]:
        rows = [vlms.prompt([5, 6], [7, 8, 9], strategy), vlms.prompt([10], [11, 12], strategy)]
        return vlms.make_llava(tower, layer=layer, strategy=strategy), vlms.inputs(rows, side="left"), {}

    def smolvlm(cls: str) -> tuple[torch.nn.Module, Any, dict]:
        rows = [vlms.smol_prompt([5, 6], [7, 8, 9]), vlms.smol_prompt([10], [11, 12])]
        return vlms.make_smolvlm(cls), vlms.smol_inputs(rows, side="left"), {}

    def qwen(version: str) -> tuple[torch.nn.Module, Any, dict]:
        rows = [vlms.qwen_prompt([5, 6], [7, 8, 9]), vlms.qwen_prompt([10], [11])]
        return vlms.make_qwen_vl(version=version), vlms.qwen_inputs(rows, side="left"), {}

    def gemma3() -> tuple[torch.nn.Module, Any, dict]:
        rows = [vlms.gemma3_prompt([5, 6], [7, 8, 9]), vlms.gemma3_prompt([10], [11, 12])]
        return vlms.make_gemma3(), vlms.image_types(vlms.inputs(rows, side="left")), {}

    def paligemma(version: int) -> tuple[torch.nn.Module, Any, dict]:
        (r0, t0), (r1, t1) = vlms.paligemma_prompt([5, 6, 7]), vlms.paligemma_prompt([8], [9, 10])
        x = vlms.with_types(vlms.inputs([r0, r1], side="left"), [t0, t1], "left")
        return vlms.make_paligemma(version, attn="sdpa" if version == 1 else "eager"), x, {}

    yield "llava-dinov2", lambda: llava("dinov2", -1, "default")
    yield "llava-clip-full", lambda: llava("clip", -2, "full")
    yield "smolvlm", lambda: smolvlm("SmolVLM")
    yield "idefics3", lambda: smolvlm("Idefics3")
    yield "qwen2.5-vl", lambda: qwen("2.5")
    yield "qwen2-vl", lambda: qwen("2")
    yield "gemma3-vlm", gemma3
    yield "paligemma1", lambda: paligemma(1)
    yield "paligemma2", lambda: paligemma(2)

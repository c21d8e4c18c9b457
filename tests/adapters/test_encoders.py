"""One description per image encoder: the eager softmax replayed in the dtype of the installed transformers'
kernel, and a float64 eager model replayed to float64 round-off (CLIP's two towers, HF ViT, DeiT, DINOv2,
SigLIP); the classifier and the vision-language tower of one encoder read the same description."""

from __future__ import annotations

import importlib
import inspect

import pytest
import torch
import transformers
from conftest import _perturb_norms
from tiny_clip import make_clip
from vlms import make_llava, make_paligemma

from lrp_core.adapters import get_adapter
from lrp_core.adapters.kernels import eager_softmax_dtype
from lrp_core.adapters.verification import deviation

CFG = dict(image_size=32, patch_size=8, hidden_size=48, num_hidden_layers=2, num_attention_heads=3)
CFG.update(intermediate_size=96, num_labels=5)


def _hf(cls: str, config: str, attn: str, **kw) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = getattr(transformers, config)(**{**CFG, **kw})
    model = getattr(transformers, cls)._from_config(cfg, attn_implementation=attn).double().eval()
    _perturb_norms(model, 0)
    return model


def _siglip(attn: str) -> torch.nn.Module:
    torch.manual_seed(0)
    vision = {k: v for k, v in CFG.items() if k != "num_labels"}
    cfg = transformers.SiglipConfig(vision_config=vision, num_labels=5)
    return transformers.SiglipForImageClassification._from_config(cfg, attn_implementation=attn).double().eval()


def _clip(attn: str) -> torch.nn.Module:
    model = make_clip()
    model.set_attn_implementation(attn)
    return model.double().eval()


IMAGES = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
PROMPTS = {"input_ids": torch.tensor([[1, 5, 6, 98, 0], [1, 7, 8, 9, 98]])}
PROMPTS["attention_mask"] = (PROMPTS["input_ids"] != 0).long()

#: (transformers module, builder, inputs)
FAMILIES = {
    "clip-image": ("clip", _clip, {"pixel_values": IMAGES, **PROMPTS}),
    "clip-text": ("clip", _clip, {"pixel_values": IMAGES, **PROMPTS, "explain": "text"}),
    "hf-vit": ("vit", lambda a: _hf("ViTForImageClassification", "ViTConfig", a), IMAGES),
    "hf-deit": ("deit", lambda a: _hf("DeiTForImageClassification", "DeiTConfig", a), IMAGES),
    "hf-dinov2": ("dinov2", lambda a: _hf("Dinov2ForImageClassification", "Dinov2Config", a, mlp_ratio=2), IMAGES),
    "hf-siglip": ("siglip", _siglip, IMAGES),
}


def _kernel_casts(module: str) -> bool:
    """Whether the installed transformers' eager attention of ``module`` computes its softmax in float32."""
    source = inspect.getsource(importlib.import_module(f"transformers.models.{module}.modeling_{module}"))
    kernel = source[source.index("def eager_attention_forward") :]
    kernel = kernel[: kernel.index("return attn_output")]
    return "dtype=torch.float32" in kernel


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_the_replayed_softmax_dtype_is_the_installed_kernels(family, attn):
    module, build, inputs = FAMILIES[family]
    adapter = get_adapter(build(attn)).for_inputs(inputs)
    expected = torch.float32 if attn == "eager" and _kernel_casts(module) else None
    assert {spec.attn.softmax_dtype for spec in adapter.blocks} == {expected}


@pytest.mark.parametrize("family", FAMILIES)
def test_a_float64_eager_encoder_is_replayed_to_float64_round_off(family):
    """The model's own float32 softmax is replayed as it computes it, so replay and model agree to float64
    round-off (a float64 softmax would leave a float32-sized gap, ~1e-8)."""
    _, build, inputs = FAMILIES[family]
    adapter = get_adapter(build("eager")).for_inputs(inputs)
    prepared = adapter.check_inputs(inputs)
    with torch.no_grad():
        assert deviation(adapter.forward(prepared).logits, adapter.own_output(prepared)) <= 1e-12


@pytest.mark.parametrize("value", [None, "eager", "sdpa", "flash_attention_2", "flex_attention"])
def test_only_the_eager_kernel_runs_its_softmax_in_float32(value):
    config = transformers.PretrainedConfig()
    config._attn_implementation = value
    assert eager_softmax_dtype(config) == (torch.float32 if value in (None, "eager") else None)


@pytest.mark.parametrize(
    "vlm, classifier",
    [
        (lambda: make_llava(tower="clip"), lambda: _clip("sdpa")),
        (lambda: make_llava(tower="dinov2"), lambda: FAMILIES["hf-dinov2"][1]("sdpa")),
        (make_paligemma, lambda: _siglip("sdpa")),
    ],
)
def test_a_vlm_tower_and_its_encoders_classifier_share_one_description(vlm, classifier):
    tower = get_adapter(vlm()).tower
    assert type(tower.encoder) is type(get_adapter(classifier()).encoder)
    assert tower.blocks == tower.encoder.blocks(len(tower.blocks))  # the tower is that description, cut

"""Every family split over devices (issue #46 item 3): BERT-likes, DistilBERT, ALBERT (layer groups), MPNet (its
relative position bias), ModernBERT, DeBERTa v2 / v3, ESM-2, the relative-position-bias ViTs (BEiT, data2vec, timm's;
shared tables beside per-block ones), I-JEPA, EVA, DeiT (distilled), every decoder family (dense, MoE, windowed,
parallel-residual), CLIP (its image tower after the text tower: zᴮ where the pixels are) and SigLIP, dispatched by
accelerate over two accelerators simulated on the CPU (tests/fake_devices.py) with a block-granularity map
(``block_maps.block_map``): AttnLRP's and LRP's maps and logits equal the model on one device (measured 0.0; bound
1e-6 relative). Not here: ALBERT with one shared layer (a single block list entry: nothing to split) and ModernBERT
with mean pooling (transformers' own forward multiplies the last block's output by the mask from the inputs' device,
so the model itself does not run split).
"""

from __future__ import annotations

import copy

import pytest
import test_deberta as deberta
import test_esm as esm
import text_families as text
import torch
import vit_variants as variants
from block_maps import block_map
from decoders import FAMILIES as DECODERS
from decoders import batch, make_decoder, rows
from fake_devices import GPU0, GPU1, FakeDevices
from tiny_clip import make_clip
from vision_models import make_eva, random_images, siglip_model, siglip_pair, timm_distilled

from lrp_core import explain
from lrp_core.adapters import get_adapter

accelerate = pytest.importorskip("accelerate", reason="accelerate is a test extra (pyproject [test-extras])")

#: name -> (builder, inputs of the built model)
CASES: dict = {
    f: ((lambda f=f: text.make(f)), text.text_batch) for f in text.FAMILIES if f not in ("albert", "modernbert_mean")
}
CASES.update({f"deberta_{v}": ((lambda v=v: deberta.make(v)), lambda m: deberta.batch()) for v in ("v2", "v3")})
CASES["esm2"] = (lambda: esm.make("esm2"), lambda m: esm.batch())
IMAGES = lambda m: random_images(2, (32, 32))  # noqa: E731
CASES.update({v: (build, IMAGES) for v, build in variants.VARIANTS.items()})
CASES.update({"eva": (make_eva, IMAGES), "deit_distilled": (timm_distilled, IMAGES)})
CASES.update(
    {f: ((lambda f=f: make_decoder(f, dtype=torch.float32)), lambda m: batch(rows(lengths=(5, 7)))) for f in DECODERS}
)
CASES["clip"] = (make_clip, lambda m: {"pixel_values": IMAGES(m), **_prompts()})  # the image tower after the text one
CASES["siglip"] = (siglip_model, lambda m: siglip_pair(IMAGES(m)))
#: a contrastive pair's target: one prompt per image
TARGETS = {"clip": [0, 1], "siglip": [0, 1]}


def _prompts() -> dict:
    ids = torch.tensor([[1, 5, 6, 7, 98], [1, 8, 9, 98, 0], [1, 10, 98, 0, 0]])  # 98: end of text
    return {"input_ids": ids, "attention_mask": (ids != 0).long()}


def _dev(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double().cpu() - b.double().cpu()).abs().max() / b.double().abs().max().clamp_min(1e-300))


@pytest.mark.parametrize("case", list(CASES))
def test_a_split_model_of_each_family_equals_the_model_on_one_device(case):
    build, make_inputs = CASES[case]
    model = build().eval().float()
    x = make_inputs(model)
    methods = [m for m in ("attnlrp", "lrp") if m not in get_adapter(model).refused_methods]
    reference, target = copy.deepcopy(model), TARGETS.get(case)
    wants = {m: explain(reference, x, m, target=target) for m in methods}
    with FakeDevices():
        model = accelerate.dispatch_model(model, block_map(model))
        assert {p.device for p in model.parameters()} == {GPU0, GPU1}
        for method in methods:
            got = explain(model, x, method, target=target)
            for field in ("scores", "logits"):
                assert _dev(getattr(got, field), getattr(wants[method], field)) <= 1e-6, (method, field)


@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen3_moe"])
def test_a_split_bfloat16_model_in_both_modes_equals_the_model_on_one_device(family):
    """The case users have (a bfloat16 model loaded with device_map="auto"): the exact mode (computed in float32)
    and the fast half mode (``dtype=torch.bfloat16``) each give, split, what they give on one device."""
    model, x = make_decoder(family, dtype=torch.bfloat16), batch(rows(lengths=(5, 7)))
    reference = copy.deepcopy(model)
    modes = ({}, {"dtype": torch.bfloat16})
    wants = [explain(reference, x, method, **mode) for method in ("attnlrp", "cp_lrp") for mode in modes]
    with FakeDevices():
        model = accelerate.dispatch_model(model, block_map(model))
        gots = [explain(model, x, method, **mode) for method in ("attnlrp", "cp_lrp") for mode in modes]
    for got, want in zip(gots, wants):
        assert got.scores.dtype == torch.float32 and _dev(got.scores, want.scores) <= 1e-6, got.method
        assert _dev(got.logits, want.logits) <= 1e-6, got.method

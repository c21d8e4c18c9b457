"""Vision models with their own block loops split over devices (issue #46 item 3): Swin (timm v1 with windows 4 and
2, timm v2, Hugging Face v1 and v2: patch merging before a stage in timm, after it in HF) and CaiT (its
class-attention blocks split too), dispatched by accelerate over two accelerators simulated on the CPU
(tests/fake_devices.py) with a block-granularity map (``block_maps.block_map``): each block where its weights are,
the patch mergings and the head's modules on their own devices; the maps and logits equal the model on one device
(measured 0.0; bound 1e-6 relative), the explanation on the inputs' device (the CPU).
"""

from __future__ import annotations

import copy

import pytest
import torch
from block_maps import block_map
from fake_devices import CPU, GPU0, GPU1, FakeDevices
from test_cait import cait
from test_swin_v2_hf import _images as swin_images
from test_swin_v2_hf import make_swin as make_v2_or_hf
from vision_models import make_swin, random_images

from lrp_core import explain
from lrp_core.adapters import get_adapter

accelerate = pytest.importorskip("accelerate", reason="accelerate is a test extra (pyproject [test-extras])")

METHODS = ("attnlrp", "cp_lrp", "lrp", "input_x_gradient", "cdam")
CASES = {
    "swin_window4": (make_swin, lambda: random_images(2, (32, 32))),
    "swin_window2": (lambda: make_swin(window_size=2), lambda: random_images(2, (32, 32))),
    "swin_v2_timm": (lambda: make_v2_or_hf("timm_v2"), swin_images),
    "swin_hf": (lambda: make_v2_or_hf("hf_v1_sdpa"), swin_images),
    "swin_v2_hf": (lambda: make_v2_or_hf("hf_v2"), swin_images),
    "cait": (lambda: cait(depth_token_only=2), lambda: random_images(2, (32, 32))),
}


def _dev(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double().cpu() - b.double().cpu()).abs().max() / b.double().abs().max().clamp_min(1e-300))


@pytest.mark.parametrize("case", list(CASES))
def test_a_split_vision_model_equals_the_model_on_one_device(case):
    build, images = CASES[case]
    model, x = build().eval(), images()
    methods = [m for m in METHODS if m not in get_adapter(model).refused_methods]
    reference = copy.deepcopy(model)
    wants = {m: explain(reference, x, m) for m in methods}
    with FakeDevices():
        model = accelerate.dispatch_model(model, block_map(model))
        assert {p.device for p in model.parameters()} == {GPU0, GPU1}
        for method in methods:
            got = explain(model, x, method)
            assert got.scores.device == CPU and got.logits.device == CPU, method
            for field in ("scores", "logits"):
                assert _dev(getattr(got, field), getattr(wants[method], field)) <= 1e-6, (method, field)

"""VLMs split over devices (issue #46 item 3): LLaVA (DINOv2 and CLIP towers), Qwen2.5-VL, SmolVLM, Gemma 3 and
PaliGemma dispatched by accelerate over two accelerators simulated on the CPU (tests/fake_devices.py) — the vision
tower's blocks and the language model's each split between the two — are explained block by block where their
weights are and equal the model on one device: the token map, the pixel map (one image per row) and the logits.

The map (``block_maps.block_map``) is the one ``from_pretrained(device_map="auto")`` makes at block granularity: every
list of blocks (a ``ModuleList``) split in half, its first half on the first device and the rest on the second;
every other module with the module before it in module order; tied parameters together. Measured: 0.0 for every
family, method and input device (the same kernels in the same order); bound 1e-6 relative.
"""

from __future__ import annotations

import copy

import pytest
import torch
from block_maps import block_map
from decoders import quick
from fake_devices import CPU, GPU0, GPU1, FakeDevices
from test_gemma_vlms import _gemma3_inputs, _pali_inputs
from vlms import (
    inputs,
    make_gemma3,
    make_llava,
    make_paligemma,
    make_qwen_vl,
    make_smolvlm,
    prompt,
    qwen_inputs,
    qwen_prompt,
    smol_inputs,
    smol_prompt,
)

from lrp_core import explain

accelerate = pytest.importorskip("accelerate", reason="accelerate is a test extra (pyproject [test-extras])")

METHODS = ("attnlrp", "cp_lrp", "lrp", "input_x_gradient")

F32 = dict(dtype=torch.float32)
FAMILIES = {
    "llava_dinov2": (lambda: make_llava(**F32), lambda: inputs([prompt([5, 6], [7, 8]), prompt([9], [10])], **F32)),
    "llava_clip": (
        lambda: make_llava("clip", **F32),
        lambda: inputs([prompt([5, 6], [7, 8]), prompt([9], [10])], **F32),
    ),
    "qwen2_5_vl": (
        lambda: make_qwen_vl(**F32),
        lambda: qwen_inputs([qwen_prompt([5, 6], [7, 8, 9]), qwen_prompt([10], [11])], **F32),
    ),
    "smolvlm": (
        lambda: make_smolvlm(**F32),
        lambda: smol_inputs([smol_prompt([5, 6], [7, 8, 9]), smol_prompt([10], [11, 12])], **F32),
    ),
    "gemma3": (lambda: make_gemma3(**F32), lambda: _float(_gemma3_inputs())),
    "paligemma2": (lambda: make_paligemma(2, **F32), lambda: _float(_pali_inputs())),
}


def _float(x: dict) -> dict:
    return {k: v.float() if v.is_floating_point() else v for k, v in x.items()}


def _dev(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double().cpu() - b.double().cpu()).abs().max() / b.double().abs().max().clamp_min(1e-300))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_split_vlm_equals_the_model_on_one_device(family):
    build, make_inputs = FAMILIES[family]
    model, x = build(), make_inputs()
    reference = copy.deepcopy(model)
    wants = {m: explain(reference, x, m, **quick(m)) for m in METHODS}
    with FakeDevices():
        model = accelerate.dispatch_model(model, block_map(model))
        assert {p.device for p in model.parameters()} == {GPU0, GPU1}
        # the inputs where the user has them: every method from the CPU, and from another device than the first
        for device, method in [(CPU, m) for m in METHODS] + [(GPU1, "attnlrp")]:
            got = explain(model, {k: v.to(device) for k, v in x.items()}, method, **quick(method))
            want = wants[method]
            assert got.scores.device == device and got.logits.device == device, (method, device)
            fields = ("scores", "logits") + (("pixels",) if want.pixels is not None else ())
            for field in fields:
                assert _dev(getattr(got, field), getattr(want, field)) <= 1e-6, (method, device, field)

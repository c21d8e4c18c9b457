"""Encoder-decoders split over devices (issue #46 item 3): BART, Marian, mBART, T5 (and its gated form) and Whisper
dispatched by accelerate over two accelerators simulated on the CPU (tests/fake_devices.py), each block whole on
one device, are explained block by block where their weights are and equal the model on one device.

The maps place the encoder's second block, the decoder's blocks and the modules around them (BART's decoder
``layernorm_embedding``, mBART's final norms) on the second device, the embeddings and the tied head on the first,
as ``from_pretrained(device_map="auto")`` splits a model in module order (a map under which the model's own
forward runs: Marian's sinusoidal positions stay with its word embeddings). Measured: 0.0 for every family,
method and input device (the same kernels in the same order); bound 1e-6 relative.
"""

from __future__ import annotations

import copy

import pytest
import torch
from decoders import quick
from fake_devices import CPU, GPU0, GPU1, FakeDevices
from seq2seq_models import batch, make_seq2seq
from test_seq2seq_whisper import _inputs, _whisper

from lrp_core import explain
from lrp_core.adapters import get_adapter

accelerate = pytest.importorskip("accelerate", reason="accelerate is a test extra (pyproject [test-extras])")

METHODS = ("attnlrp", "cp_lrp", "lrp", "input_x_gradient", "integrated_gradients")


def _device_map(model: torch.nn.Module) -> dict:
    """Block granularity: embeddings and the head on GPU0; encoder block 1, the decoder's blocks and what follows
    the embeddings in the decoder on GPU1; every other module where the one before it in module order is."""
    if hasattr(model, "shared") and hasattr(model.encoder, "block"):  # T5: model.{shared, encoder, decoder, lm_head}
        dm = {"shared": GPU0, "encoder.embed_tokens": GPU0, "encoder.block.0": GPU0, "encoder.block.1": GPU1}
        dm.update({"encoder.final_layer_norm": GPU1, "encoder.dropout": GPU1, "decoder.embed_tokens": GPU0})
        dm.update({"decoder.block": GPU1, "decoder.final_layer_norm": GPU1, "decoder.dropout": GPU1})
        dm["lm_head"] = GPU0 if model.config.tie_word_embeddings else GPU1
        return dm
    base, pre = model.model, "model."
    first = {"embed_tokens", "embed_positions", "conv1", "conv2"}
    dm = {f"{pre}shared": GPU0} if hasattr(base, "shared") else {}
    for side in ("encoder", "decoder"):
        stack = getattr(base, side)
        for name, _ in stack.named_children():
            if name == "layers":
                for i in range(len(stack.layers)):
                    dm[f"{pre}{side}.layers.{i}"] = GPU0 if side == "encoder" and i == 0 else GPU1
            else:
                dm[f"{pre}{side}.{name}"] = (
                    GPU0 if name in first or (side == "encoder" and name == "layernorm_embedding") else GPU1
                )
    for name in ("lm_head", "proj_out"):
        if hasattr(model, name):
            dm[name] = GPU0
    if "final_logits_bias" in dict(model.named_buffers()):  # a root buffer, placed by its name (with the head)
        dm["final_logits_bias"] = GPU0
    return dm


def _family(name: str):
    if name == "whisper":
        return _whisper(torch.float32), _inputs(dtype=torch.float32)
    return make_seq2seq(name, torch.float32), batch([[5, 6, 7, 8, 2], [9, 10, 2]], [[0, 11, 12], [0, 13]])


def _dev(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double().cpu() - b.double().cpu()).abs().max() / b.double().abs().max().clamp_min(1e-300))


@pytest.mark.parametrize("family", ["bart", "marian", "mbart", "t5", "t5_gated", "whisper"])
def test_a_split_encoder_decoder_equals_the_model_on_one_device(family):
    model, x = _family(family)
    reference = copy.deepcopy(model)
    methods = [m for m in METHODS if m not in get_adapter(model).refused_methods]  # Whisper: no LRP for its stem
    wants = {m: explain(reference, x, m, **quick(m)) for m in methods}
    with FakeDevices():
        model = accelerate.dispatch_model(model, _device_map(model))
        assert {p.device for p in model.parameters()} == {GPU0, GPU1}
        # the inputs where the user has them: every method from the CPU, and from another device than the first
        for device, method in [(CPU, m) for m in methods] + [(GPU1, "attnlrp")]:
            got = explain(model, {k: v.to(device) for k, v in x.items()}, method, **quick(method))
            assert got.scores.device == device and got.logits.device == device, (method, device)
            for field in ("scores", "logits"):
                assert _dev(getattr(got, field), getattr(wants[method], field)) <= 1e-6, (method, device, field)

"""T5 (v1.0 ReLU, v1.1 gated-GELU) and mT5 (issue #48): docs/METHODS.md §2i.

Tiny seeded models (tests/adapters/seq2seq_models.py). What is checked: the replay's logits are the model's own
(float32 1e-5, float64 1e-10, padding on either side); input × gradient is autograd through the model; CP-LRP
conserves, Σ source + Σ prefix = y_t, with the biases zeroed (T5 has none) — the relative position bias is a
constant of the scores and stays; every method is batch and padding invariant; the model is untouched.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from seq2seq_models import PREFIXES, SOURCES, batch, input_x_gradient, make_seq2seq, own_logits  # noqa: E402
from test_seq2seq_bart import QUICK, SIDES, _defined, _rel, _row  # noqa: E402
from untouched import assert_untouched, snapshot  # noqa: E402

import lrp_core  # noqa: E402
from lrp_core.adapters import get_adapter  # noqa: E402

FAMILIES = ("t5", "t5_gated", "mt5")


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
def test_replay_logits_equal_the_models_own(family, dtype, tol):
    model = make_seq2seq(family, dtype)
    alone = own_logits(model, SOURCES, PREFIXES)
    adapter = get_adapter(model)
    for src_side, dec_side in SIDES:
        got = adapter.forward(adapter.check_inputs(batch(SOURCES, PREFIXES, src_side, dec_side))).logits
        assert _rel(got, alone) < tol, (src_side, dec_side, _rel(got, alone))


@pytest.mark.parametrize("family", FAMILIES)
def test_input_x_gradient_is_autograd_through_the_model(family):
    model = make_seq2seq(family)
    inputs = batch(SOURCES, PREFIXES, "left", "right")
    exp = lrp_core.explain(model, inputs, method="input_x_gradient", target=7)
    for i, (s, p) in enumerate(zip(SOURCES, PREFIXES)):
        assert _rel(_row(exp, inputs, i), input_x_gradient(model, s, p, 7)) < 1e-10, i


@pytest.mark.parametrize("family", FAMILIES)
def test_cp_lrp_conserves(family):
    """T5 has no additive constant in its stream: CP-LRP conserves on the model as it is (the position bias is a
    constant inside the softmax, whose weights CP-LRP holds fixed)."""
    model = make_seq2seq(family)
    exp = lrp_core.explain(model, batch(SOURCES, PREFIXES, "right", "left"), method="cp_lrp")
    y = exp.logits.gather(1, exp.target[:, None]).squeeze(1)
    assert torch.allclose(exp.source.sum(-1) + exp.prefix.sum(-1), y, rtol=1e-8, atol=0)
    assert (exp.source.abs().sum(-1) > 0).all()


def test_every_method_batch_and_padding_invariant_and_untouched():
    model = make_seq2seq("t5_gated")
    before = snapshot(model)
    for method in _defined(model):
        kw = QUICK.get(method, {})
        alone = [
            lrp_core.explain(model, batch([s], [p]), method=method, target=7, **kw).scores[0]
            for s, p in zip(SOURCES, PREFIXES)
        ]
        inputs = batch(SOURCES, PREFIXES, "left", "right")
        exp = lrp_core.explain(model, inputs, method=method, target=7, **kw)
        assert (exp.source[inputs["attention_mask"] == 0] == 0).all(), method
        assert (exp.prefix[inputs["decoder_attention_mask"] == 0] == 0).all(), method
        for i, one in enumerate(alone):
            assert _rel(_row(exp, inputs, i), one) < 1e-9, (method, i)
    assert_untouched(before, snapshot(model))

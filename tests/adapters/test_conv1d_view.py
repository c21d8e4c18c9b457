"""GPT-2's Conv1D seen as a Linear (``lrp_core.adapters.gpt2.Conv1DLinear``): a view, never a copy, and every
rule set treats it exactly as the equivalent ``nn.Linear``."""

from __future__ import annotations

import pytest
import torch
from transformers.pytorch_utils import Conv1D

from lrp_core.adapters.blocks import Replay
from lrp_core.adapters.gpt2 import Conv1DLinear
from lrp_core.errors import UnsupportedModelError
from lrp_core.rules.composites import ATTNLRP, CP_LRP, LRP_BASELINE, TRANSFORMER_ATTRIBUTION
from lrp_core.rules.ops import LINEAR


def _conv_and_linear(d_in: int = 6, d_out: int = 5, seed: int = 0) -> tuple[Conv1D, torch.nn.Linear]:
    """A Conv1D with random weight and bias, and the nn.Linear computing the same map."""
    torch.manual_seed(seed)
    conv = Conv1D(d_out, d_in).double()
    with torch.no_grad():
        conv.bias.normal_()
    linear = torch.nn.Linear(d_in, d_out).double()
    with torch.no_grad():
        linear.weight.copy_(conv.weight.T)
        linear.bias.copy_(conv.bias)
    return conv, linear


def test_the_view_shares_the_conv_storage_and_owns_nothing():
    conv, _ = _conv_and_linear()
    view = Conv1DLinear(conv)
    assert view.weight.shape == (5, 6) and (view.in_features, view.out_features) == (6, 5)
    assert view.weight.data_ptr() == conv.weight.data_ptr() and view.bias is conv.bias
    assert list(view.parameters()) == [] and list(view.children()) == []
    with torch.no_grad():
        conv.weight[2, 3] = 7.0  # the view reads the live tensor
    assert view.weight[3, 2] == 7.0
    conv.float()  # a dtype change of the model reaches the view too
    assert view.weight.dtype == torch.float32


def test_forward_is_the_conv_bit_for_bit_and_its_hooks_fire():
    conv, linear = _conv_and_linear()
    view = Conv1DLinear(conv)
    x = torch.randn(2, 3, 6, dtype=torch.float64)
    calls = []
    handle = conv.register_forward_hook(lambda m, i, o: calls.append(o.shape))
    try:
        assert torch.equal(view(x), conv(x))
    finally:
        handle.remove()
    assert calls == [(2, 3, 5), (2, 3, 5)]
    torch.testing.assert_close(view(x), linear(x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("composite", [TRANSFORMER_ATTRIBUTION, LRP_BASELINE], ids=lambda c: c.name)
def test_explicit_linear_rules_equal_those_of_the_linear(composite):
    conv, linear = _conv_and_linear(seed=1)
    x = torch.randn(2, 4, 6, dtype=torch.float64)
    R = torch.randn(2, 4, 5, dtype=torch.float64)
    rels = []
    for module in (Conv1DLinear(conv), linear):  # the Linear in the explicit replay: its backward is the rule
        xi = x.clone().requires_grad_(True)
        (R_x,) = torch.autograd.grad(Replay(composite).module(LINEAR, module, xi), xi, R)
        rels.append(R_x)
    got, expected = rels
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-14)
    assert got.abs().sum() > 0


@pytest.mark.parametrize("composite", [ATTNLRP, CP_LRP], ids=lambda c: c.name)
def test_modified_gradient_rules_equal_those_of_the_linear(composite):
    conv, linear = _conv_and_linear(seed=2)
    x = torch.randn(2, 4, 6, dtype=torch.float64)
    g = torch.randn(2, 4, 5, dtype=torch.float64)
    grads = []
    for module in (Conv1DLinear(conv), linear):
        xi = x.clone().requires_grad_(True)
        y = Replay(composite).module(LINEAR, module, xi)
        (grad,) = torch.autograd.grad(y, xi, g)
        grads.append((y.detach(), grad))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grads[0][1], grads[1][1], rtol=1e-12, atol=1e-12)


def test_the_model_is_not_modified():
    conv, _ = _conv_and_linear()
    before = {k: v.clone() for k, v in conv.state_dict().items()}
    modules_before = [type(m) for m in conv.modules()]
    view = Conv1DLinear(conv)
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    torch.autograd.grad(
        Replay(TRANSFORMER_ATTRIBUTION).module(LINEAR, view, x), x, torch.randn(3, 5, dtype=torch.float64)
    )
    assert all(torch.equal(before[k], v) for k, v in conv.state_dict().items())
    assert [type(m) for m in conv.modules()] == modules_before and conv.weight.shape == (6, 5)
    assert not conv._forward_hooks and not conv._forward_pre_hooks


def test_something_else_is_refused():
    with pytest.raises(UnsupportedModelError, match="Conv1D"):
        Conv1DLinear(torch.nn.ReLU())

"""Every layer whose weights a rule reads is read through a view that reproduces the layer's own output on the
input the forward gave it (issue #43 item 2, docs/METHODS.md §4 "Part by part"; lrp_core.rules.views).

A Linear that is not the map ``x Wᵀ + b`` of its weights (a subclass with another forward, a forward hook or
pre-hook that changes its output, activations quantised to 8 bits) or a patch convolution that is not
``conv2d(x, W, b)`` is refused where a rule would read it, naming the module and the measured deviation — before
this, the explicit passes read ``W, b`` and explained another function, silently. Round-off passes: the check
measures against the size of the sum, so a dequantised product (1e-7) is far inside float32's 1e-5.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import make_tiny_bert, make_tiny_vit

from lrp_core import explain
from lrp_core.errors import UnsupportedModelError
from lrp_core.rules import ATTNLRP, LINEAR, GammaGradient
from lrp_core.rules.views import ROWS, check_linear, tolerance


def _images():
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(5))


class DoubledLinear(torch.nn.Linear):
    """A Linear subclass that is not what its class suggests: it returns 2 (x Wᵀ + b)."""

    def forward(self, x):
        return 2 * super().forward(x)


def _swap(model, name: str, cls=DoubledLinear):
    old = model.get_submodule(name)
    new = cls(old.in_features, old.out_features, bias=old.bias is not None)
    new.load_state_dict(old.state_dict())
    path, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(path), leaf, new.eval())
    return model


@pytest.mark.parametrize("method", ["transformer_attribution", "lrp", "partial_lrp"])
def test_a_linear_that_computes_another_function_is_refused_naming_it(method):
    model = _swap(make_tiny_vit(), "blocks.2.mlp.fc1")
    with pytest.raises(
        UnsupportedModelError, match=r"blocks\.2\.mlp\.fc1 \(DoubledLinear\): its output departs .* by 0\.\d"
    ):
        explain(model, _images(), method)


def test_a_forward_hook_that_changes_a_linear_is_refused_where_a_rule_reads_it_and_replayed_where_none_does():
    model = make_tiny_bert()
    ids = torch.tensor([[2, 11, 12, 3], [2, 21, 22, 3]])
    x = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    plain = explain(model, x, "attnlrp")
    model.bert.encoder.layer[0].attention.self.value.register_forward_hook(lambda m, i, o: o + 0.5)
    with pytest.raises(UnsupportedModelError, match=r"attention\.self\.value \(Linear\).* a forward hook or pre-hook"):
        explain(model, x, "lrp")
    # AttnLRP differentiates the layer itself (no rule reads its weights): the hooked function, replayed
    hooked = explain(model, x, "attnlrp")
    assert not torch.allclose(hooked.scores, plain.scores)


def test_a_forward_pre_hook_that_changes_a_linears_input_is_refused():
    model = make_tiny_vit()
    model.head.register_forward_pre_hook(lambda m, args: (args[0] * 1.5,))
    with pytest.raises(UnsupportedModelError, match=r"head \(Linear\).* a forward hook or pre-hook"):
        explain(model, _images(), "transformer_attribution")


def test_a_gamma_rule_reads_only_a_linear_its_view_reproduces():
    model = _swap(make_tiny_vit(), "blocks.0.attn.proj")
    composite = ATTNLRP.with_rules(by_kind={LINEAR: GammaGradient(0.25)})
    with pytest.raises(UnsupportedModelError, match=r"blocks\.0\.attn\.proj \(DoubledLinear\)"):
        explain(model, _images(), "attnlrp", composite=composite)


def test_a_hooked_patch_convolution_is_refused_where_the_pixel_rule_reads_it():
    model = make_tiny_vit()
    model.patch_embed.proj.register_forward_hook(lambda m, i, o: o * 3)
    with pytest.raises(UnsupportedModelError, match=r"patch_embed\.proj \(Conv2d\).*conv2d\(x, W, b"):
        explain(model, _images(), "lrp")


def test_the_check_passes_round_off_and_catches_8_bit_activations():
    """On the recorded rows: a dequantised int8 product (rounded otherwise) passes, the same weights on inputs
    quantised to 8 bits per row do not, nor does any change O(1)."""
    g = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(64, 32)
    x = torch.randn(3, 7, 64, generator=g)
    scale = layer.weight.abs().amax(1, keepdim=True) / 127
    w_int = torch.round(layer.weight / scale)
    w = w_int * scale  # the dequantised weight
    with torch.no_grad():
        y = (x @ w_int.t()) * scale.t() + layer.bias  # the product a weight-only kernel computes
        check_linear(layer, x, y, w, layer.bias)  # round-off: passes
        row_max = x.abs().amax(-1, keepdim=True) / 127
        y8 = F.linear(torch.round(x / row_max) * row_max, w, layer.bias)  # LLM.int8()-like activations
        with pytest.raises(UnsupportedModelError, match=r"departs from x·Wᵀ \+ b .* by 0\.00\d"):
            check_linear(layer, x, y8, w, layer.bias)
        with pytest.raises(UnsupportedModelError, match="departs"):
            check_linear(layer, x, y.flip(0), w, layer.bias)  # another input's output
        check_linear(layer, x, None, w, layer.bias)  # nothing recorded: nothing to check
    assert ROWS == 4 and tolerance(torch.float64) == 1e-10 and tolerance(torch.float32) == 1e-5
    assert tolerance(torch.bfloat16) == 2e-2

"""transformer_attribution's memory-lean path (issue #22 item 6) against the plain computation, in float64.

The method makes each block's attention gradient only when the top-down relevance pass reaches it, forms
``mean_h((∇A ⊙ R^A)⁺)`` in place and reads the map as a vector chain from the readout. The reference here is
the textbook computation from the public pieces: every ∇A_b from one backward and R^{A_b} from one relevance
pass (``attention_parts``), the N×N product (``accumulate``) and the readout's row of it.
"""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_bert, make_tiny_vit
from decoders import FAMILIES as DECODER_FAMILIES
from decoders import batch, make_decoder, rows

from lrp_core import attention_parts, explain
from lrp_core.adapters import get_adapter
from lrp_core.errors import InputError
from lrp_core.methods.products import accumulate, accumulate_row

TOL = 1e-12  # relative, float64


def _reference(model, inputs, target, start: int = 0, end=None, norm: str = "none") -> torch.Tensor:
    """(B, T) the map the old path computed: the N×N product of (I + Ā_b), its readout row, readout minimum."""
    parts = attention_parts(model, inputs, target=target)
    layers = (parts.gradient * parts.relevance).clamp(min=0).mean(dim=2)  # (B, L, N, N)
    adapter = get_adapter(model).for_inputs(inputs)
    prepared = adapter.check_inputs(inputs)
    layout = adapter.layout(prepared)
    joint = accumulate(layers, start, end, norm=norm)
    return layout.readout_minimum(layout.scores(adapter.readout_for(prepared).row(joint)))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-300))


@pytest.mark.parametrize("family", sorted(DECODER_FAMILIES))
def test_decoders_match_the_full_product(family):
    model = make_decoder(family, dtype=torch.float64)
    inputs = batch(rows(lengths=(9, 9)))  # unpadded: explain runs the batch at once, like the reference
    e = explain(model, inputs, method="transformer_attribution")
    ref = _reference(model, inputs, e.target, norm=e.options["rollout_norm"])  # a family's default may be "row"
    assert e.scores.dtype == torch.float64
    assert _rel(e.scores, ref) <= TOL
    assert torch.isfinite(e.scores).all()


@pytest.mark.parametrize(
    "options", [dict(start_layer=1), dict(rollout_norm="row"), dict(start_layer=1, end_layer=1, rollout_norm="row")]
)
def test_options_match_the_full_product(options):
    model = make_decoder("llama", dtype=torch.float64, num_hidden_layers=3)
    inputs = batch(rows(lengths=(8, 8)))
    e = explain(model, inputs, method="transformer_attribution", **options)
    used = e.options
    assert all(used[k] == v for k, v in options.items())
    ref = _reference(model, inputs, e.target, used["start_layer"], used["end_layer"], used["rollout_norm"])
    assert _rel(e.scores, ref) <= TOL


@pytest.mark.parametrize("make", [make_tiny_bert, make_tiny_vit], ids=["bert", "vit"])
def test_encoders_match_the_full_product(make, text_batch, images):
    model = make().double()
    inputs = text_batch if make is make_tiny_bert else images.double()
    if make is make_tiny_bert:  # equal lengths: the reference runs the batch at once
        inputs = {k: v[:, :4].clone() for k, v in inputs.items()}
        inputs["attention_mask"][:] = 1
    e = explain(model, inputs, method="transformer_attribution", target=1)
    assert _rel(e.scores, _reference(model, inputs, e.target, norm=e.options["rollout_norm"])) <= TOL


def test_keep_heads_layers_are_the_heads_mean():
    model = make_decoder("qwen2", dtype=torch.float64)
    inputs = batch(rows(lengths=(9,)))
    e = explain(model, inputs, method="transformer_attribution", keep_heads=True)
    parts = attention_parts(model, inputs, target=e.target)
    per_head = (parts.gradient * parts.relevance).clamp(min=0)
    assert _rel(e.layers_per_head, per_head) <= TOL
    assert _rel(e.layers, per_head.mean(dim=2)) <= TOL


def test_vector_chain_is_the_row_of_the_product():
    g = torch.Generator().manual_seed(0)
    layers = torch.rand(2, 4, 6, 6, generator=g, dtype=torch.float64)
    w = torch.rand(2, 6, generator=g, dtype=torch.float64)
    for norm in ("none", "row"):
        for start, stop in ((0, 3), (1, 2), (2, 2)):
            full = accumulate(layers, start, stop, norm=norm)
            expected = (w[:, None, :] @ full)[:, 0]
            assert _rel(accumulate_row(layers, w, start, stop, norm=norm), expected) <= TOL
    with pytest.raises(InputError, match="norm must be one of"):
        accumulate_row(layers, w, norm="col")
    with pytest.raises(InputError, match="start <= stop"):
        accumulate_row(layers, w, 3, 1)


def test_gradients_are_handed_out_top_down_only():
    from lrp_core.errors import LRPError
    from lrp_core.methods.attention import _TopDownGradients

    model = make_decoder("llama", dtype=torch.float64)
    adapter = get_adapter(model)
    trace = adapter.forward(adapter.check_inputs(batch(rows(lengths=(6,)))), grad=True)
    assert _TopDownGradients.applies(trace)
    grads = _TopDownGradients(trace, trace.logits[:, 3].sum(), 0)
    with pytest.raises(LRPError, match="top-down: block 1 next, asked for 0"):
        grads(0)
    assert grads(1).shape == trace.attention(1).shape


@pytest.mark.parametrize("method", ["transformer_attribution", "generic_attention"])
@pytest.mark.parametrize("options", [{}, {"keep_heads": True}, {"start_layer": 1}])
def test_one_backward_for_all_blocks_gives_the_split_backwards_maps(monkeypatch, method, options):
    """A model that is not a plain stack gets every ∂y/∂A_b from one backward: the same maps, float64."""
    from lrp_core.methods.attention import _TopDownGradients

    model = make_tiny_vit().double()
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    split = explain(model, x, method=method, **options)
    monkeypatch.setattr(_TopDownGradients, "applies", staticmethod(lambda trace: False))

    def not_split(*args):
        raise AssertionError("the split backward ran")

    monkeypatch.setattr(_TopDownGradients, "__init__", not_split)
    whole = explain(model, x, method=method, **options)
    assert _rel(whole.scores, split.scores) <= TOL
    assert _rel(whole.layers, split.layers) <= TOL

"""The per-batch readout seam: ``Adapter.readout_for(prepared)``, ``trace.readout``, :class:`PositionReadout`,
and adapters that validate without side effects (issue #21 items 3, 4)."""

from __future__ import annotations

import pytest
import torch
from tiny_clip import make_clip

from lrp_core import METHODS, InputError, explain
from lrp_core.adapters import get_adapter
from lrp_core.adapters.readouts import PositionReadout, TokenReadout
from lrp_core.methods import registry
from lrp_core.methods.call import Call, one_hot
from lrp_core.methods.targets import resolver
from lrp_core.rules.composites import LRP_BASELINE


# ----------------------------------------------------------------------------
# PositionReadout against the readouts it generalises
# ----------------------------------------------------------------------------
def _position_twin(readout: TokenReadout, batch: int) -> PositionReadout:
    """The PositionReadout reading every row at the TokenReadout's index."""
    return PositionReadout(readout.norm, readout.head_layers, torch.full((batch,), readout.index))


def test_position_readout_at_one_index_is_the_token_readout_bit_for_bit(tiny_bert, text_batch):
    """Same logits, same relevance at every block (a selection either way), same readout rows."""
    a = get_adapter(tiny_bert.double())
    prepared = a.check_inputs(text_batch)
    twin = _position_twin(a.readout, 3)
    with torch.no_grad():
        ref, got = (
            a.forward(prepared, composite=LRP_BASELINE),
            a.forward(prepared, readout=twin, composite=LRP_BASELINE),
        )
        assert ref.readout is a.readout and got.readout is twin  # the trace keeps the readout it ran with
        assert torch.equal(ref.logits, got.logits)
        start = one_hot(ref.logits, ref.logits.argmax(-1))
        r_ref = a.relprop(ref, start, LRP_BASELINE, to_input=True, prepared=prepared)
        r_got = a.relprop(got, start, LRP_BASELINE, to_input=True, prepared=prepared)
    assert torch.equal(r_ref.tokens, r_got.tokens) and torch.equal(r_ref.scores, r_got.scores)
    M = torch.randn(3, 2, 7, 7, dtype=torch.float64)
    assert torch.equal(twin.row(M), a.readout.row(M))


def test_position_readout_rows_weights_and_pool_follow_each_rows_position():
    norm = torch.nn.Identity()
    positions = torch.tensor([4, 0, 2])
    ro = PositionReadout(norm, [], positions)
    w = ro.weights(5)
    assert w.shape == (3, 5) and torch.equal(w.argmax(-1), positions) and torch.equal(w.sum(-1), torch.ones(3))
    M = torch.randn(3, 2, 5, 5, dtype=torch.float64)
    assert torch.equal(ro.row(M), torch.stack([M[b, :, p] for b, p in enumerate(positions.tolist())]))
    assert torch.allclose(ro.row(M), torch.einsum("bn,bhnm->bhm", w.double(), M))
    h = torch.randn(3, 5, 4)
    assert torch.equal(ro.pool(h), h[torch.arange(3), positions])
    assert ro.tokens == () and torch.equal(ro.positions, positions)


def test_position_readout_after_a_removal_reads_the_same_token():
    """Token ablation: removing a token before the read one moves it one place left; after it, not at all."""
    ro = PositionReadout(torch.nn.Identity(), [], torch.tensor([4, 2]))
    moved = ro.after_removal(torch.tensor([0, 0, 1]), torch.tensor([1, 4, 3]))
    assert moved.positions.tolist() == [3, 4, 2]


# ----------------------------------------------------------------------------
# CLIP: the prompts / images live in the batch's readout, never in the adapter
# ----------------------------------------------------------------------------
@pytest.fixture
def inputs():
    ids = torch.tensor([[1, 5, 6, 7, 98], [1, 8, 9, 98, 0], [1, 10, 98, 0, 0]])  # 98: end of text
    return {
        "pixel_values": torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3)),
        "input_ids": ids,
        "attention_mask": (ids != 0).long(),
    }


def _state(adapter) -> dict:
    """Everything an adapter holds: each attribute's identity, and the readout's head layers and their weights."""
    head = adapter.readout.head_layers
    return {
        "attrs": {k: id(v) for k, v in vars(adapter).items()},
        "readout": id(adapter.readout),
        "head": [(layer.kind, id(layer.module)) for layer in head],
        "weights": [layer.module.weight.detach().clone() for layer in head if hasattr(layer.module, "weight")],
    }


def _assert_same(before: dict, after: dict) -> None:
    assert before["attrs"] == after["attrs"] and before["readout"] == after["readout"]
    assert before["head"] == after["head"]
    assert all(torch.equal(u, v) for u, v in zip(before["weights"], after["weights"]))


@pytest.mark.parametrize("side", ["image", "text"])
def test_clip_calls_and_failed_calls_leave_the_adapter_and_model_unchanged(inputs, side):
    model = make_clip(5)
    params = {k: v.clone() for k, v in model.state_dict().items()}
    x = dict(inputs, explain=side)
    a = get_adapter(model).for_inputs(x)
    before = _state(a)
    prepared = a.check_inputs(x)
    readout = a.readout_for(prepared)
    assert readout is not a.readout and readout.num_classes == (3 if side == "image" else 2)
    a.forward(prepared, grad=True)
    _assert_same(before, _state(a))
    with pytest.raises(InputError, match="expects images of size"):
        a.check_inputs(dict(x, pixel_values=torch.randn(1, 3, 64, 64)))
    with pytest.raises(InputError):
        explain(model, dict(x, pixel_values=torch.randn(1, 3, 64, 64)))
    explain(model, x, method="attnlrp")
    _assert_same(before, _state(a))
    assert all(torch.equal(params[k], v) for k, v in model.state_dict().items())


def test_clip_readout_compares_with_the_batch_it_was_built_for(inputs):
    """Two batches with different prompts, prepared one after the other: each keeps its own classes."""
    model = make_clip(6)
    a = get_adapter(model)
    first = a.check_inputs(inputs)
    second = a.check_inputs(
        dict(inputs, input_ids=inputs["input_ids"][:2], attention_mask=inputs["attention_mask"][:2])
    )
    with torch.no_grad():
        logits = a.forward(first).logits  # prepared after the first: nothing of the second leaks in
    assert logits.shape == (2, 3) and a.readout_for(second).num_classes == 2
    assert torch.allclose(logits, model(**inputs).logits_per_image, atol=1e-5)


# ----------------------------------------------------------------------------
# CLIP text: each prompt's end-of-text token, with or without the length grouping
# ----------------------------------------------------------------------------
def _ungrouped(model, x: dict, method: str, target) -> torch.Tensor:
    """The whole padded batch through the method at once (no length grouping, no pieces)."""
    a = get_adapter(model).for_inputs(x)
    prepared = a.check_inputs(x)
    spec = registry.get(method)
    bound = spec().bind(a.num_blocks, a.modality)
    readout = a.readout_for(prepared)
    resolve = resolver(target, prepared.size, readout.num_classes)
    return spec.run(Call(a, prepared, a.layout(prepared), resolve, bound, readout=readout)).scores


@pytest.mark.parametrize("method", METHODS)
def test_clip_text_of_mixed_lengths_without_grouping_reads_each_prompts_end_of_text(inputs, method):
    model = make_clip(4).double()
    x = {**inputs, "pixel_values": inputs["pixel_values"].double(), "explain": "text"}
    target = [1, 0, 1]
    scores = _ungrouped(model, x, method, target)
    lengths = inputs["attention_mask"].sum(1).tolist()
    assert scores.shape == (3, 5) and (scores[inputs["attention_mask"] == 0] == 0).all()
    for p, n in enumerate(lengths):
        alone = explain(
            model,
            {**x, "input_ids": x["input_ids"][p : p + 1, :n], "attention_mask": x["attention_mask"][p : p + 1, :n]},
            method=method,
            target=target[p],
        ).scores[0]
        scale = alone.abs().max().clamp(min=1e-30)
        assert ((scores[p, :n] - alone).abs().max() / scale) < 1e-9, (p, method)

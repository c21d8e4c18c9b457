"""``explain(..., dtype=torch.float64)``: every pass of a float32 model in float64, the model left as it was.

The reference is a float64 copy of the same weights (``copy.deepcopy(model).double()``) explained as it is:
the mode must give its maps without making the copy. SmoothGrad and KernelSHAP draw their noise and
coalitions from tensors the mode has upcast, so their draws differ from the copy's (float32 arguments there);
every other method is compared.
"""

from __future__ import annotations

import copy
import os
import sys

import pytest
import torch

from lrp_core import METHODS, explain
from lrp_core.errors import InputError
from lrp_core.runtime import precision

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from by_path import root_fixtures  # noqa: E402
from decoders import batch, make_decoder, rows  # noqa: E402

make_tiny_bert, make_tiny_vit = root_fixtures().make_tiny_bert, root_fixtures().make_tiny_vit

#: methods whose random draws depend on the dtype of the tensors they are drawn from (see the module text)
DRAWS = {"smoothgrad", "kernel_shap"}
DETERMINISTIC = [m for m in METHODS if m not in DRAWS]


def _snapshot(model: torch.nn.Module) -> dict:
    return {k: (v.dtype, v.clone()) for k, v in model.state_dict().items()}


def _unchanged(model: torch.nn.Module, before: dict) -> bool:
    now = model.state_dict()
    return all(now[k].dtype == d and torch.equal(now[k], v) for k, (d, v) in before.items())


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()


def _vit_case():
    return make_tiny_vit(), torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def _bert_case():
    ids = torch.tensor([[2, 11, 12, 13, 3], [2, 21, 22, 3, 0]])
    return make_tiny_bert(), {"input_ids": ids, "attention_mask": (ids != 0).long()}


@pytest.mark.parametrize("method", DETERMINISTIC)
@pytest.mark.parametrize("case", [_vit_case, _bert_case], ids=["vit", "bert"])
def test_float64_mode_equals_a_float64_copy_and_leaves_the_model(case, method):
    model, x = case()
    before = _snapshot(model)
    got = explain(model, x, method=method, dtype=torch.float64)
    assert _unchanged(model, before), "the float32 model must stay float32, bit for bit"
    ref_model = copy.deepcopy(model).double()
    ref_x = x.double() if isinstance(x, torch.Tensor) else x
    ref = explain(ref_model, ref_x, method=method)
    assert got.scores.dtype == torch.float64 and got.logits.dtype == torch.float64
    assert _rel(got.scores, ref.scores) <= 1e-12
    assert _rel(got.logits, ref.logits) <= 1e-12


@pytest.mark.parametrize("method", ["attnlrp", "cp_lrp", "input_x_gradient", "lrp"])
def test_a_float32_decoder_in_float64_mode_lifts_its_float32_islands(method):
    """Llama's RMSNorm computes in float32 (``hidden_states.to(torch.float32)``); in the mode that cast is to
    float64, so a float32 Llama asked for float64 agrees with its float64 copy to float64 round-off only where
    the copy's own islands allow: both are checked against the copy at float32 round-off, and the mode's result
    is batch-independent to float64 round-off on every CPU."""
    model = make_decoder("llama", dtype=torch.float32)
    seqs = rows()
    try:
        left = explain(model, batch(seqs, "left"), method=method, dtype=torch.float64)
    except Exception as err:  # a method the decoder does not take is refused by name
        pytest.skip(f"{method} on a decoder: {err}")
    ref = explain(copy.deepcopy(model).double(), batch(seqs, "left"), method=method)
    assert _rel(left.scores, ref.scores) <= 1e-5
    for i, s in enumerate(seqs):
        one = explain(model, {"input_ids": s[None]}, method=method, dtype=torch.float64)
        assert _rel(left.scores[i, -len(s) :], one.scores[0]) <= 1e-10


def test_float32_model_gains_digits_where_the_method_is_ill_conditioned():
    """Plain LRP through a deeper seeded ViT: its float32 map is visibly off the float64 one (the reason for the
    option); rollout, a product of softmaxes, is not."""
    model = make_tiny_vit(depth=6, seed=3)
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    for method, floor in (("lrp", 1e-4), ("rollout", None)):
        f32 = explain(model, x, method=method).scores.double()
        f64 = explain(model, x, method=method, dtype=torch.float64).scores
        gap = _rel(f32, f64)
        assert (gap > floor) if floor is not None else (gap < 1e-5), (method, gap)


def test_the_dtype_option_is_checked():
    model, x = _vit_case()
    for bad in ("float64", torch.int64, 64):
        with pytest.raises(InputError, match="dtype must be None"):
            explain(model, x, dtype=bad)
    with pytest.raises(InputError, match="fast half-precision mode.*this model is float32"):  # a half model's own
        explain(model, x, dtype=torch.float16)
    with pytest.raises(InputError, match="below the precision"):
        explain(copy.deepcopy(model).double(), x, dtype=torch.float32)
    e = explain(model, x, dtype=torch.float32)  # the model's own precision: an ordinary call
    assert e.scores.dtype == torch.float32


def test_the_mode_is_left_and_nests():
    model, _ = _vit_case()
    assert precision.active_dtype() is None
    with precision.compute_precision(model, torch.float64):
        assert precision.active_dtype() == torch.float64
        with precision.compute_precision(model):  # a nested call of the engine keeps the outer precision
            assert precision.active_dtype() == torch.float64
            assert (torch.ones(2) + torch.ones(2)).dtype == torch.float64  # every float32 operand is upcast
            assert model.head(torch.zeros(1, 48)).dtype == torch.float64
    assert precision.active_dtype() is None

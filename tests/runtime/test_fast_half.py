"""The fast half-precision mode: ``explain(half_model, ..., dtype=<its dtype>)`` (issue #46 item 1; docs/METHODS.md
§5.9, "The fast half mode").

The matrix products run in the model's half dtype on its own weights (no float32 copy of any weight), the
ill-conditioned steps in float32; its maps are held against the float32 mode's maps of the same half weights (the
exact reference) with bounds derived from ``scripts/measure_half_fast.py`` with margin, its logits against the
model's own half forward with the verification's stated tolerance, and the refusals name what is accepted.
"""

from __future__ import annotations

import copy
import os
import sys

import pytest
import torch
from torch.overrides import TorchFunctionMode

from lrp_core import explain
from lrp_core.adapters.verification import TOLERANCE
from lrp_core.errors import InputError
from lrp_core.rules import ATTNLRP, GammaGradient
from lrp_core.runtime.fast_half import FAST_METHODS

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "adapters"))

from by_path import root_fixtures  # noqa: E402  (the root conftest by path: tests/widgets has one too)
from decoders import batch, make_decoder, model_logits  # noqa: E402
from untouched import assert_untouched, snapshot  # noqa: E402

make_tiny_bert, make_tiny_vit = root_fixtures().make_tiny_bert, root_fixtures().make_tiny_vit

HALF = {"bfloat16": torch.bfloat16, "float16": torch.float16}
#: bounds on the fast map against the float32 map of the same weights: (max relative deviation, Pearson r, top-k
#: overlap (k = 10 % of a row's tokens: 4 here, one swap is 0.75)), by method kind and dtype. Measured on these
#: models (docs/METHODS.md §5.9): AttnLRP / CP-LRP bfloat16 ≤ 0.060 / ≥ 0.9988 / ≥ 0.75, float16 ≤ 0.0041 /
#: ≥ 0.99999 / 1; input × gradient (Captum's products in half) bfloat16 ≤ 0.075 / ≥ 0.994 / ≥ 0.75, float16
#: ≤ 0.014 / ≥ 0.9999 / 1. The bounds leave a factor 3 or more on the deviation and on 1 − r.
BOUNDS = {
    ("lrp", torch.bfloat16): (0.2, 0.995, 0.5),
    ("lrp", torch.float16): (0.015, 0.9999, 0.75),
    ("input_x_gradient", torch.bfloat16): (0.25, 0.98, 0.5),
    ("input_x_gradient", torch.float16): (0.05, 0.999, 0.75),
}


def _rows(n: int = 3, length: int = 40, seed: int = 1) -> list:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 96, (length - 4 * i,), generator=g) for i in range(n)]


def _decoder(family: str, attn: str = "eager"):
    return lambda: (make_decoder(family, attn, dtype=torch.float32), batch(_rows()))


def _bert():
    model = make_tiny_bert()
    ids = torch.randint(5, 60, (2, 30), generator=torch.Generator().manual_seed(2))
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _vit():
    images = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    return make_tiny_vit(img_size=64, patch_size=8), images


FAMILIES = {
    "llama": _decoder("llama"),
    "llama_sdpa": _decoder("llama", "sdpa"),
    "qwen3": _decoder("qwen3"),
    "gpt2": _decoder("gpt2"),
    "bert": _bert,
    "timm_vit": _vit,
}
DECODERS = ("llama", "llama_sdpa", "qwen3", "gpt2")


def _half(family: str, dtype: torch.dtype):
    model, inputs = FAMILIES[family]()
    if isinstance(inputs, torch.Tensor):
        inputs = inputs.to(dtype)
    return model.to(dtype), inputs


def _compare(fast: torch.Tensor, ref: torch.Tensor, real: torch.Tensor) -> tuple[float, float, float]:
    """(max |a − b| / max |b|, Pearson r over the real tokens, the smallest top-k overlap over the rows)."""
    a, b = fast.double(), ref.double()
    rel = float((a - b).abs().max() / b.abs().max())
    x, y = a[real] - a[real].mean(), b[real] - b[real].mean()
    r = float((x * y).sum() / (x.norm() * y.norm()))
    overlaps = []
    for row in range(a.shape[0]):
        idx = real[row].nonzero().squeeze(1)
        k = max(1, round(0.1 * len(idx)))
        top_a = set(idx[a[row, idx].topk(k).indices].tolist())
        top_b = set(idx[b[row, idx].topk(k).indices].tolist())
        overlaps.append(len(top_a & top_b) / k)
    return rel, r, min(overlaps)


def _real(e) -> torch.Tensor:
    mask = e.attention_mask
    return mask.bool() if mask is not None and mask.shape == e.scores.shape else torch.ones_like(e.scores).bool()


@pytest.mark.parametrize("dtype", HALF.values(), ids=HALF.keys())
@pytest.mark.parametrize("method", ["attnlrp", "cp_lrp", "input_x_gradient"])
@pytest.mark.parametrize("family", FAMILIES)
def test_fast_maps_are_near_the_float32_maps_of_the_same_weights(family, method, dtype):
    if method == "input_x_gradient":
        pytest.importorskip("captum", reason="input_x_gradient needs captum (the baselines extra)")
    model, inputs = _half(family, dtype)
    before = snapshot(model)
    fast = explain(model, inputs, method=method, dtype=dtype)
    assert_untouched(before, snapshot(model))
    # the same prediction: a near tie of two logits may order them otherwise in half precision
    ref = explain(model, inputs, method=method, target=fast.target)
    assert fast.scores.dtype == torch.float32 and fast.logits.dtype == torch.float32
    assert torch.isfinite(fast.scores).all()
    rel, r, topk = _compare(fast.scores, ref.scores, _real(ref))
    most, least_r, least_topk = BOUNDS["input_x_gradient" if method == "input_x_gradient" else "lrp", dtype]
    assert rel <= most and r >= least_r and topk >= least_topk, (rel, r, topk)


@pytest.mark.parametrize("dtype", HALF.values(), ids=HALF.keys())
@pytest.mark.parametrize("family", DECODERS)
def test_fast_logits_are_the_models_own_half_forward(family, dtype):
    """The replay of a decoder in its own dtype is the model's half arithmetic: its logits are the model's own, bit
    for bit on CPU (the verification's tolerance, TOLERANCE[dtype], is the bound that is stated and applied)."""
    model, inputs = _half(family, dtype)
    e = explain(model, inputs, method="attnlrp", dtype=dtype)
    own = model_logits(model, inputs).float()
    dev = float((e.logits - own).abs().max() / own.abs().max())
    assert dev <= TOLERANCE[dtype]
    assert dev == 0.0


@pytest.mark.parametrize("dtype", HALF.values(), ids=HALF.keys())
@pytest.mark.parametrize("family", ["bert", "timm_vit"])
def test_fast_logits_meet_the_stated_tolerance(family, dtype):
    model, inputs = _half(family, dtype)
    e = explain(model, inputs, method="cp_lrp", dtype=dtype)
    with torch.no_grad():
        out = model(**inputs) if isinstance(inputs, dict) else model(inputs)
    own = (out if isinstance(out, torch.Tensor) else out.logits).float()
    dev = float((e.logits - own).abs().max() / own.abs().max())
    assert dev <= TOLERANCE[dtype] / 2  # half the tolerance: measured ≤ 9.3e-3 (bfloat16), 1.2e-3 (float16)


class _Products(TorchFunctionMode):
    """Records the dtypes of the floating operands of every matrix product and the tensors each call returns."""

    PRODUCTS = {"linear", "matmul", "__matmul__", "bmm", "mm", "addmm", "baddbmm", "scaled_dot_product_attention"}

    def __init__(self, big: int = 0):
        super().__init__()
        self.dtypes: list = []
        self.big, self.float32_big = big, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if getattr(func, "__name__", "") in self.PRODUCTS:
            self.dtypes += [a.dtype for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
        if self.big and isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.numel() >= self.big:
            self.float32_big += 1
        return out


@pytest.mark.parametrize("method", ["attnlrp", "cp_lrp"])
@pytest.mark.parametrize("family", ["llama", "llama_sdpa", "bert", "timm_vit"])
def test_the_matrix_products_run_in_half(family, method):
    """What gives the GPU's speed: every Linear, q·kᵀ, A·v and sdpa of the fast pass sees bfloat16 operands (the
    float32 mode hands them float32 ones)."""
    model, inputs = _half(family, torch.bfloat16)
    with _Products() as fast:
        explain(model, inputs, method=method, dtype=torch.bfloat16)
    with _Products() as exact:
        explain(model, inputs, method=method)
    assert len(fast.dtypes) >= 8 and set(fast.dtypes) == {torch.bfloat16}
    assert set(exact.dtypes) == {torch.float32}


def test_no_float32_copy_of_a_weight_is_made():
    """A decoder whose weights (256 × 1024) dwarf its activations (8 tokens): the fast pass creates no float32
    tensor of a weight's size (the float32 mode upcasts each weight, one operation at a time)."""
    model = make_decoder("llama", dtype=torch.bfloat16, hidden_size=256, intermediate_size=1024, vocab_size=512)
    inputs = batch([torch.arange(1, 9)])
    big = 256 * 256
    with _Products(big) as fast:
        explain(model, inputs, method="attnlrp", dtype=torch.bfloat16)
    with _Products(big) as exact:
        explain(model, inputs, method="attnlrp")
    assert fast.float32_big == 0
    assert exact.float32_big >= 2 * 7  # two blocks of seven Linears, each weight upcast at least once


@pytest.mark.parametrize("family", ["llama", "timm_vit"])
def test_a_batch_is_its_samples_one_by_one(family):
    dtype = torch.bfloat16
    model, inputs = _half(family, dtype)
    whole = explain(model, inputs, method="attnlrp", dtype=dtype).scores
    n = whole.shape[0]
    for i in range(n):
        if isinstance(inputs, torch.Tensor):
            row = inputs[i : i + 1]
            one = explain(model, row, method="attnlrp", dtype=dtype).scores[0]
            got = whole[i]
        else:
            real = inputs["attention_mask"][i].bool()
            row = {k: v[i : i + 1, real] for k, v in inputs.items()}
            one = explain(model, row, method="attnlrp", dtype=dtype).scores[0]
            got = whole[i][real]
        # within the fast mode's own round-off (the bfloat16 bound of the maps against float32)
        assert float((got - one).abs().max() / one.abs().max()) <= BOUNDS["lrp", dtype][0]


def test_a_float32_model_is_refused_naming_what_it_accepts():
    model, inputs = _half("llama", torch.float32)
    with pytest.raises(InputError, match=r"this model is float32; for it dtype may be None .* or torch.float64"):
        explain(model, inputs, method="attnlrp", dtype=torch.bfloat16)


def test_another_half_dtype_is_refused_naming_the_models_own():
    model, inputs = _half("llama", torch.bfloat16)
    with pytest.raises(InputError, match=r"this model is bfloat16; for it dtype may be torch.bfloat16"):
        explain(model, inputs, method="attnlrp", dtype=torch.float16)


@pytest.mark.parametrize("method", ["lrp", "transformer_attribution", "rollout"])
def test_methods_outside_the_fast_mode_are_refused_by_name(method):
    model, inputs = _half("llama", torch.bfloat16)
    with pytest.raises(InputError, match=f"method '{method}' does not run in the fast half") as err:
        explain(model, inputs, method=method, dtype=torch.bfloat16)
    assert ", ".join(FAST_METHODS) in str(err.value) and "dtype=None" in str(err.value)


def test_a_rule_set_with_ill_conditioned_rules_is_refused():
    model, inputs = _half("llama", torch.bfloat16)
    gamma = ATTNLRP.with_rules("gamma_mlps", by_name={"*mlp*": GammaGradient(0.25)})
    with pytest.raises(InputError, match=r"does not run the rule GammaGradient\(0.25\).*dtype=None"):
        explain(model, inputs, method="attnlrp", composite=gamma, dtype=torch.bfloat16)
    explain(model, inputs, method="attnlrp", composite=gamma)  # the float32 mode runs it


def test_the_identity_rule_survives_float16_zeros():
    """In float16 the identity rule's 1e-10 underflows: x = 0 would give 0/0; its ratio is computed in float32."""
    model, inputs = _half("gpt2", torch.float16)
    with torch.no_grad():
        for block in model.transformer.h:  # GELU inputs of exactly 0 at every unit of one block's MLP
            block.mlp.c_fc.weight.zero_()
            block.mlp.c_fc.bias.zero_()
            break
    e = explain(model, inputs, method="attnlrp", dtype=torch.float16)
    assert torch.isfinite(e.scores).all()
    ref = explain(model, inputs, method="attnlrp", target=e.target)
    assert _compare(e.scores, ref.scores, _real(ref))[1] >= BOUNDS["lrp", torch.float16][1]


def test_the_float32_mode_is_unchanged_by_the_fast_modes_edits():
    """``dtype=None`` on a half model still equals the float32 copy of the same weights (the exact reference)."""
    model, inputs = _half("llama", torch.bfloat16)
    got = explain(model, inputs, method="attnlrp").scores
    want = explain(copy.deepcopy(model).float(), inputs, method="attnlrp").scores
    assert float((got - want).abs().max() / want.abs().max()) <= 1e-6


def test_a_float16_start_scale_that_overflows_is_lowered(monkeypatch):
    """float16's start relevance is scaled by 2^k (its gradients would be subnormal at N·D ≳ 16k elements); a
    scale that overflows (inf at the leaves) is lowered and the pass redone: the map is the unforced one."""
    import lrp_core.runtime.fast_half as fast_half

    model, inputs = _half("llama", torch.float16)
    want = explain(model, inputs, method="attnlrp", dtype=torch.float16)
    tries = []
    real_grad = torch.autograd.grad

    def counted(*args, **kwargs):
        tries.append(1)
        return real_grad(*args, **kwargs)

    monkeypatch.setattr(fast_half, "start_scale", lambda t: 24)  # 2^24 > float16's largest, 65504
    monkeypatch.setattr(fast_half.torch.autograd, "grad", counted)
    got = explain(model, inputs, method="attnlrp", dtype=torch.float16, unverified=True)
    assert len(tries) >= 2 and torch.isfinite(got.scores).all()
    assert float((got.scores - want.scores).abs().max() / want.scores.abs().max()) <= BOUNDS["lrp", torch.float16][0]

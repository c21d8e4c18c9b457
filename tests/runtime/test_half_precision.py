"""Half-precision models and autocast give the float32 result (issue #25; docs/METHODS.md §5.9).

Every method × {float16, bfloat16, autocast-bf16} × family: the map of the half model equals the map of a
float32 copy made *from the half weights* (the same numbers; only the arithmetic could differ) within the
method's tolerance, and the model is left exactly as it was.
"""

from __future__ import annotations

import copy
import functools
import math
import os
import sys

import pytest
import torch
import torch.nn.functional as F

from lrp_core import METHODS, attention_parts, concept_target, explain
from lrp_core.runtime import precision

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "adapters"))

from by_path import root_fixtures  # noqa: E402  (the root conftest by path: tests/widgets has one too)

_perturb_norms, make_tiny_bert, make_tiny_vit = (
    root_fixtures()._perturb_norms,
    root_fixtures().make_tiny_bert,
    root_fixtures().make_tiny_vit,
)
from text_families import make, text_batch  # noqa: E402
from tiny_clip import make_clip  # noqa: E402
from vision_models import FAMILIES as VISION  # noqa: E402
from vision_models import siglip_model, siglip_pair  # noqa: E402

#: max |Δscores| / max |scores_float32| allowed per method (docs/METHODS.md §5.9: float32 round-off)
TOL = {m: 1e-6 for m in METHODS}
CASES = ("float16", "bfloat16", "autocast-bf16")


def _images(n: int = 2) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def _clip_inputs(**extra) -> dict:
    ids = torch.tensor([[1, 5, 6, 7, 98], [1, 8, 9, 98, 0], [1, 10, 98, 0, 0]])
    return {"pixel_values": _images(), "input_ids": ids, "attention_mask": (ids != 0).long(), **extra}


def _text(family: str):
    model = make(family)
    return model, text_batch(model)


#: family -> (float32 model, inputs): every adapter and readout the engine has
FAMILIES = {
    "timm_vit": lambda: (make_tiny_vit(), _images()),
    "timm_avg_registers": lambda: (VISION["timm_avg_registers"](), _images()),
    "timm_distilled": lambda: (VISION["timm_distilled"](), _images()),
    "hf_vit": lambda: (_hf_vit(), _images()),
    "hf_deit_teacher": lambda: (VISION["hf_deit_teacher"](), _images()),
    "hf_dinov2": lambda: (VISION["hf_dinov2"](), _images()),
    "hf_siglip": lambda: (VISION["hf_siglip"](), _images()),
    "hf_siglip2": lambda: (VISION["hf_siglip2"](), _images()),
    "siglip_image": lambda: (siglip_model(), siglip_pair(_images())),
    "clip_image": lambda: (make_clip(), _clip_inputs()),
    "clip_text": lambda: (make_clip(), _clip_inputs(explain="text")),
    "bert": lambda: (make_tiny_bert(), text_batch(make_tiny_bert())),
    **{
        f: functools.partial(_text, f)
        for f in ("distilbert", "roberta", "electra", "albert_groups", "mpnet", "modernbert", "modernbert_mean")
    },
}


def _hf_vit():
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(5)
    model = ViTForImageClassification(
        ViTConfig(
            image_size=32,
            patch_size=8,
            hidden_size=48,
            num_hidden_layers=2,
            num_attention_heads=3,
            intermediate_size=96,
            num_labels=5,
        )
    ).eval()
    _perturb_norms(model, 5)
    return model


def _cast(inputs, dtype: torch.dtype):
    """Float tensors of the inputs to ``dtype`` (token ids and masks stay integers)."""
    if isinstance(inputs, torch.Tensor):
        return inputs.to(dtype)
    return {k: (v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in inputs.items()}


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.double(), ref.double()
    if not torch.isfinite(got).all():
        return math.inf
    return float((got - ref).abs().max() / ref.abs().max().clamp(min=1e-30))


def _state(model: torch.nn.Module) -> dict:
    """Everything about the parameters a call could change: dtype, values, requires_grad, .grad."""
    return {n: (p.dtype, p.detach().clone(), p.requires_grad, p.grad) for n, p in model.named_parameters()}


def _assert_same_state(model: torch.nn.Module, before: dict) -> None:
    for n, p in model.named_parameters():
        dtype, value, req, grad = before[n]
        assert p.dtype == dtype and p.requires_grad == req and p.grad is grad, n
        assert torch.equal(p.detach(), value), n


@functools.lru_cache(maxsize=None)
def _models(family: str, case: str) -> tuple:
    """(the model explained under ``case``, the float32 reference model, inputs for each) — built once."""
    model, inputs = FAMILIES[family]()
    if case == "autocast-bf16":
        return model, model, inputs, inputs
    dtype = getattr(torch, case)
    half = copy.deepcopy(model).to(dtype)
    x = _cast(inputs, dtype)
    return half, copy.deepcopy(half).float(), x, _cast(x, torch.float32)


def _explain(model, inputs, method: str, case: str, **kw):
    if case == "autocast-bf16":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return explain(model, inputs, method=method, **kw)
    return explain(model, inputs, method=method, **kw)


def _check(family: str, case: str, method: str) -> None:
    """The map under ``case`` equals the float32 map within TOL[method]; the model is left as it was."""
    model, ref_model, x, ref_x = _models(family, case)
    before = _state(model)
    got = _explain(model, x, method, case)
    ref = explain(ref_model, ref_x, method=method)
    assert got.scores.dtype == torch.float32
    assert torch.equal(got.target, ref.target)
    err = _rel(got.scores, ref.scores)
    assert err <= TOL[method], f"{family} {case} {method}: relative error {err:.2e} > {TOL[method]:.0e}"
    assert _rel(got.logits, ref.logits) <= 1e-6
    if got.pixels is not None:
        assert _rel(got.pixels, ref.pixels) <= TOL[method]
    _assert_same_state(model, before)


#: one image and one text family with every method; every other family with the methods whose code paths
#: differ most (a gradient forward and an explicit pass; the pass down to pixels / embeddings; the
#: modified-gradient replay with input-space leaves) — every method and every family is covered
FULL = ("timm_vit", "bert")
PATHS = ("transformer_attribution", "lrp", "attnlrp")


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("family", FULL)
def test_every_method_in_half_precision_gives_the_float32_map(family, case, method):
    _check(family, case, method)


@pytest.mark.parametrize("method", PATHS)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("family", [f for f in FAMILIES if f not in FULL])
def test_every_family_in_half_precision_gives_the_float32_map(family, case, method):
    _check(family, case, method)


@pytest.mark.parametrize("case", CASES)
def test_attention_parts_and_concept_targets_of_half_models_are_the_float32_ones(case):
    model, ref_model, x, ref_x = _models("timm_vit", case)
    before = _state(model)
    ctx = (
        torch.autocast("cpu", dtype=torch.bfloat16) if case == "autocast-bf16" else torch.autocast("cpu", enabled=False)
    )
    with ctx:
        parts = attention_parts(model, x)
        concept = concept_target(model, x[:1])
        cdam = explain(model, x, method="cdam", target=concept)
    ref_parts = attention_parts(ref_model, ref_x)
    ref_concept = concept_target(ref_model, ref_x[:1])
    for name in ("attention", "gradient", "relevance", "logits"):
        assert _rel(getattr(parts, name), getattr(ref_parts, name)) <= 1e-6, name
    assert _rel(concept.vector, ref_concept.vector) <= 1e-6
    assert _rel(cdam.scores, explain(ref_model, ref_x, method="cdam", target=ref_concept).scores) <= TOL["cdam"]
    _assert_same_state(model, before)


def test_float32_inputs_to_a_half_model_are_not_rounded():
    """A bfloat16 model given float32 images explains those images, not their bfloat16 rounding."""
    model, _ = FAMILIES["timm_vit"]()
    half = copy.deepcopy(model).to(torch.bfloat16)
    x = _images()
    got = explain(half, x, method="lrp")
    ref = explain(copy.deepcopy(half).float(), x, method="lrp")
    rounded = explain(copy.deepcopy(half).float(), x.bfloat16().float(), method="lrp")
    assert _rel(got.scores, ref.scores) <= TOL["lrp"]
    assert _rel(got.scores, rounded.scores) > 1e-4  # the rounding of the inputs would be visible


def test_memory_estimate_counts_float32_activations_for_a_half_model():
    """The pass of a bfloat16 model holds float32 activations: the piece planner must count 4 bytes, not 2."""
    from lrp_core.adapters import get_adapter
    from lrp_core.runtime import memory

    model, _, x, _ = _models("bert", "bfloat16")
    a = get_adapter(model)
    assert memory.facts_of(a, a.check_inputs(x)).itemsize == 4
    ref = get_adapter(make_tiny_bert().double())
    assert memory.facts_of(ref, ref.check_inputs(x)).itemsize == 8


def test_float32_and_float64_models_do_not_enter_the_float32_mode():
    """Their arithmetic is exactly what it was: the mode is entered only for half models or under autocast."""
    vit = make_tiny_vit()
    assert not precision.needs_float32(vit) and not precision.needs_float32(vit.double())
    assert precision.needs_float32(copy.deepcopy(vit).half())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert precision.needs_float32(vit)
    for model in (vit, copy.deepcopy(vit).bfloat16()):
        with precision.compute_precision(model):
            active = isinstance(torch.overrides._get_current_function_mode(), precision.Float32Mode)
        assert active == precision.is_half(model)
    assert precision.compute_dtype(copy.deepcopy(vit).bfloat16()) == torch.float32
    assert precision.compute_dtype(vit.double()) == torch.float64


def test_one_call_looks_through_the_weights_once_and_nested_calls_still_see_half_models_and_autocast(monkeypatch):
    """``explain`` enters compute_precision three times (the call, the forward, the relevance pass) but walks a
    float32 model's weights once; a nested call for another (half) model, or under autocast, still enters the
    mode, and a model made half after a call is seen by the next one."""
    vit, x = make_tiny_vit(), _images(1)
    looks = []
    is_half = precision.is_half
    monkeypatch.setattr(precision, "is_half", lambda m: looks.append(m) or is_half(m))
    explain(vit, x)
    assert looks == [vit]

    def active() -> bool:
        return isinstance(torch.overrides._get_current_function_mode(), precision.Float32Mode)

    half = torch.nn.Linear(2, 2).half()
    with precision.compute_precision(vit):
        with precision.compute_precision(vit):
            assert not active()
        with precision.compute_precision(half):
            assert active()
        with torch.autocast("cpu", dtype=torch.bfloat16), precision.compute_precision(vit):
            assert active()
        assert not active()
    vit.half()
    with precision.compute_precision(vit):
        assert active()


def test_the_mode_upcasts_weights_per_operation_and_saves_the_half_parameter(monkeypatch):
    """Inside the mode a half Linear computes in float32; what autograd keeps for the backward pass is the half
    parameter (upcast again when needed), never a float32 copy of the weight; gradients reach the input, none
    the weight."""
    g = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(8, 4).to(torch.bfloat16)
    x = torch.randn(3, 8, generator=g)
    kept = []
    pack = precision._pack
    monkeypatch.setattr(precision, "_pack", lambda t: kept.append(pack(t)) or kept[-1])
    with precision.compute_precision(lin):
        xr = x.clone().requires_grad_(True)
        y = lin(xr)
        (gx,) = torch.autograd.grad(y.square().sum(), xr)
    xr = x.clone().requires_grad_(True)
    y_ref = F.linear(xr, lin.weight.detach().float(), lin.bias.detach().float())
    (gx_ref,) = torch.autograd.grad(y_ref.square().sum(), xr)
    assert y.dtype == torch.float32 and torch.equal(y, y_ref) and torch.equal(gx, gx_ref)
    assert any(isinstance(k, tuple) and k[0] is lin.weight for k in kept)  # the bfloat16 parameter itself
    assert not any(isinstance(k, torch.Tensor) and k.shape in ((4, 8), (8, 4)) for k in kept)  # no float32 copy
    assert lin.weight.grad is None and lin.weight.dtype == torch.bfloat16
    assert not precision._UPCAST  # every float32 copy is gone, and so is its entry


def test_an_in_place_write_into_a_half_tensor_is_an_error_inside_the_mode():
    """It would round a float32 result back to half precision: the mode refuses rather than lose the digits."""
    t = torch.zeros(3, dtype=torch.float16)
    with precision.compute_precision(torch.nn.Linear(2, 2).half()):
        assert (t + 1).dtype == torch.float32  # out of place: computed in float32
        assert torch.zeros(2, dtype=torch.bfloat16).dtype == torch.float32  # half dtypes are float32 here
        with pytest.raises(RuntimeError, match="in-place"):
            t.add_(1)
    assert t.dtype == torch.float16 and not t.any()


def test_bench_builds_a_half_model_in_its_dtype_and_labels_its_rows():
    """``python -m lrp_core.tools.bench --dtype bfloat16``: the weights are made in bfloat16 (never held in float32),
    images too; the rows say which dtype they measured."""
    from lrp_core.tools import bench, bench_table

    model, x = bench.prepare(bench.Case("tiny-vit", 2, 17, "bfloat16"))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16} and x.dtype == torch.bfloat16
    rows = bench.run(
        [bench.Case("tiny-bert", 1, 8, "bfloat16")],
        ["lrp"],
        bench.Settings(repeat=1, threads=1),
        isolate=False,
        printer=lambda s: None,
    )
    assert [(r["method"], r["dtype"]) for r in rows] == [(bench.BASELINE, "bfloat16"), ("lrp", "bfloat16")]
    assert rows[1]["ms_per_sample"] is not None and "tiny-bert (bfloat16)" in bench_table.markdown(rows)

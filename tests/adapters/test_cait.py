"""timm ``Cait`` (docs/METHODS.md §2v): talking-heads blocks and class-attention blocks — the replay is the model
(float32 and float64), its talking-heads mixes and class blocks matter, batch = alone, CP-LRP conservation on a
constant-free variant, input × gradient = autograd through the model, the model untouched, the layer-product
methods refused with the reason. Tiny random models, seconds each."""

from __future__ import annotations

import pytest
import torch
from untouched import assert_untouched, snapshot
from vision_models import random_images

from lrp_core import METHODS, explain
from lrp_core.adapters import get_adapter
from lrp_core.adapters.cait import REFUSED_METHODS
from lrp_core.errors import InputError, UnsupportedModelError


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


def cait(seed: int = 0, **kw) -> torch.nn.Module:
    """A tiny timm ``Cait`` (img 32, patch 8, width 32, 2 talking-heads blocks, 2 heads, 5 classes), with random
    LayerScales, q/k projections (scores far from uniform), talking-heads mixes, class token, positions, norms and
    head, so that each part matters."""
    from timm.models.cait import Cait

    torch.manual_seed(seed)
    cfg = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, depth_token_only=1, num_classes=5)
    model = Cait(**{**cfg, **kw})
    g = torch.Generator().manual_seed(seed + 3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            last = name.split(".")[-1]
            if last in ("gamma_1", "gamma_2"):
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            elif name.endswith(("qkv.weight", "q.weight", "k.weight")):  # scores far from uniform
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            elif ".proj_l." in name or ".proj_w." in name:
                p.copy_(torch.randn(p.shape, generator=g))
            elif name in ("cls_token", "pos_embed") or name.startswith("head."):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            elif ".norm" in name or name.startswith("norm."):
                p.copy_((1.0 if last == "weight" else 0.0) + 0.2 * torch.randn(p.shape, generator=g))
    return model.eval()


VARIANTS = {
    "cls": lambda: cait(),
    "two_class_blocks": lambda: cait(seed=1, depth_token_only=2),
    "avg": lambda: cait(seed=2, global_pool="avg"),
}
RUNS = [m for m in METHODS if m not in REFUSED_METHODS]


# ---------------------------------------------------------------- the replay is the model
@pytest.mark.parametrize("family", VARIANTS)
def test_replay_reproduces_the_logits(family):
    model, x = VARIANTS[family](), random_images(2)
    with torch.no_grad():
        own = model(x)
    assert own.abs().max() > 1e-2
    for method in ("attnlrp", "cp_lrp", "lrp", "input_x_gradient"):
        assert rel_err(explain(model, x, method=method).logits, own) <= 1e-5, method
    model, x = model.double(), x.double()
    with torch.no_grad():
        own = model(x)
    assert rel_err(explain(model, x, method="lrp").logits, own) <= 1e-10


@pytest.mark.parametrize("part", ["mix_scores", "mix_weights", "class_blocks"])
def test_the_replay_reads_the_talking_heads_and_the_class_blocks(part):
    """Without one of them the replay's logits move: the check above sees each."""
    model, x = cait(depth_token_only=2).double(), random_images(2).double()
    a = get_adapter(model)
    prepared = a.check_inputs(x)
    with torch.no_grad():
        own = model(x)
        assert rel_err(a.forward(prepared).logits, own) <= 1e-10
        if part == "class_blocks":
            a.readout.blocks = a.readout.blocks[:1]  # type: ignore[attr-defined]
        else:
            for spec in a.blocks:
                setattr(spec.attn, part, None)
        assert rel_err(a.forward(prepared).logits, own) > 1e-3


@pytest.mark.parametrize("family", VARIANTS)
def test_every_method_gives_one_finite_score_per_patch_or_says_why(family):
    model, x = VARIANTS[family](), random_images(2)
    for method in METHODS:
        if method in REFUSED_METHODS:
            with pytest.raises(UnsupportedModelError, match="class token"):
                explain(model, x, method=method)
            continue
        exp = explain(model, x, method=method)
        assert exp.scores.shape == (2, 16) and torch.isfinite(exp.scores).all(), method
        if exp.pixels is not None:
            assert exp.pixels.shape == (2, 32, 32) and torch.isfinite(exp.pixels).all(), method


# ---------------------------------------------------------------- batched = one by one
@pytest.mark.parametrize("method", ["lrp", "attnlrp", "cp_lrp", "cdam", "token_ablation"])
@pytest.mark.parametrize("family", ["cls", "two_class_blocks"])
def test_batch_equals_single_in_float64(family, method):
    model, x = VARIANTS[family]().double(), random_images(3).double()
    batch = explain(model, x, method=method)
    for i in range(x.shape[0]):
        one = explain(model, x[i : i + 1], method=method)
        assert rel_err(batch.scores[i : i + 1], one.scores) <= 1e-8, method
        if batch.pixels is not None:
            assert rel_err(batch.pixels[i : i + 1], one.pixels) <= 1e-8, method


# ---------------------------------------------------------------- relevance
def _without_additive_constants(model):
    """Biases (the talking-heads mixes' included), LayerNorm β, the class token and the positions zeroed."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.split(".")[-1] in ("bias", "cls_token", "pos_embed"):
                p.zero_()
    return model


@pytest.mark.parametrize("family", VARIANTS)
def test_cp_lrp_conserves_without_additive_constants(family):
    model = _without_additive_constants(VARIANTS[family]()).double()
    c = explain(model, random_images(2).double(), method="cp_lrp").conservation
    tol = 1e-8 * c.output.abs() + 1e-9
    assert (c.output.abs() > 1e-3).all()
    assert (c.absorbed().abs().max(dim=1).values < tol).all()
    assert ((c.pixels - c.output).abs() < tol).all()


@pytest.mark.parametrize("family", VARIANTS)
def test_input_x_gradient_is_autograd_through_the_model(family):
    model, x = VARIANTS[family]().double(), random_images(2).double()
    exp = explain(model, x, method="input_x_gradient", target=1)
    xr = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(model(xr)[:, 1].sum(), xr)
    assert rel_err(exp.pixels, (x * grad).sum(dim=1)) <= 1e-10


# ---------------------------------------------------------------- the model is left as it was
def test_model_is_untouched_by_calls_and_errors():
    model = cait()
    model.train()  # an unusual mode must survive too
    before = snapshot(model)
    for method in RUNS:
        explain(model, random_images(1), method=method)
    with pytest.raises(UnsupportedModelError):
        explain(model, random_images(1), method="rollout")
    with pytest.raises(InputError):
        explain(model, random_images(1, (40, 40)), method="lrp")
    assert_untouched(before, snapshot(model))


def test_other_poolings_are_refused_by_name():
    model = cait()
    model.global_pool = ""
    with pytest.raises(UnsupportedModelError, match="global_pool"):
        get_adapter(model)

"""Hugging Face ``SwinForImageClassification`` (sdpa and eager attention), ``Swinv2ForImageClassification`` and timm
``SwinTransformerV2``: the Swin replay of test_swin.py (windows as full attention with an additive bias, a shifted
stage, a patch merging, mean readout), and Swin V2's post-norm blocks, cosine attention with its clamped per-head
logit scale and continuous position bias. Tiny random models (img 32, patch 4, window 4, depths (2, 2), width 16):
stage 0 is an 8×8 grid with shifted windows in its second block, stage 1 a 4×4 grid in one window."""

from __future__ import annotations

import pytest
import torch
from untouched import assert_untouched, snapshot

from lrp_core import METHODS, explain
from lrp_core.adapters import get_adapter
from lrp_core.adapters.swin import COSINE, MAX_LOGIT_SCALE, REFUSED_METHODS, CosineNormalize, _regroup
from lrp_core.errors import InputError, UnsupportedModelError

RUNS = [m for m in METHODS if m not in REFUSED_METHODS]
FAMILIES = ("hf_v1_sdpa", "hf_v1_eager", "hf_v2", "timm_v2")
#: the projections whose weights are made 3× larger, so that attention is far from uniform
_QK = ("q_proj", "k_proj", "attention.self.query", "attention.self.key", "attn.qkv")


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


def _images(n: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def _build(family: str, **kw) -> torch.nn.Module:
    cfg = dict(image_size=32, patch_size=4, embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=4, num_labels=5)
    cfg.update(kw)
    if family == "timm_v2":
        from timm.models.swin_transformer_v2 import SwinTransformerV2

        return SwinTransformerV2(
            img_size=cfg["image_size"],
            patch_size=cfg["patch_size"],
            window_size=cfg["window_size"],
            embed_dim=cfg["embed_dim"],
            depths=tuple(cfg["depths"]),
            num_heads=tuple(cfg["num_heads"]),
            num_classes=cfg["num_labels"],
        )
    if family == "hf_v2":
        from transformers import Swinv2Config, Swinv2ForImageClassification

        return Swinv2ForImageClassification(Swinv2Config(**cfg))
    from transformers import SwinConfig, SwinForImageClassification

    return SwinForImageClassification(SwinConfig(**cfg, attn_implementation=family.rsplit("_", 1)[1]))


def make_swin(family: str, seed: int = 0, **kw) -> torch.nn.Module:
    """A tiny model of ``family`` with weights of std 1/√fan_in (q/k 3× larger), random biases, position-bias
    tables and norms, and Swin V2 logit scales around log 7 with one head's above the clamp log 100 (the clamp then
    decides that head's scale)."""
    torch.manual_seed(seed)
    model = _build(family, **kw).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "logit_scale" in name:
                p.copy_(2.0 + 0.5 * torch.randn(p.shape, generator=g))
                p.view(-1)[0] = MAX_LOGIT_SCALE + 1.0
            elif p.dim() >= 2 and name.endswith("weight"):
                big = 3.0 if any(k in name for k in _QK) else 1.0
                p.copy_(torch.randn(p.shape, generator=g) * p[0].numel() ** -0.5 * big)
            elif "relative_position_bias_table" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
    return model


def _logits(model, x):
    with torch.no_grad():
        y = model(x)
    return getattr(y, "logits", y)


def _last_layer(model):
    """The last windowed block of the model (timm: ``layers[-1].blocks[-1]``; transformers: the encoder's)."""
    base = getattr(model, "swin", None) or getattr(model, "swinv2", None)
    layers = model.layers if base is None else base.encoder.layers
    return layers[-1].blocks[-1]


# ---------------------------------------------------------------- the replay is the model
@pytest.mark.parametrize("family", FAMILIES)
def test_replay_reproduces_the_logits(family):
    model, x = make_swin(family), _images()
    for method in ("lrp", "attnlrp", "cp_lrp"):  # the plain replay and the modified-gradient ones
        assert (explain(model, x, method=method).logits - _logits(model, x)).abs().max() <= 1e-5, method
    model, x = model.double(), x.double()
    assert rel_err(explain(model, x, method="lrp").logits, _logits(model, x)) <= 1e-12


@pytest.mark.parametrize("family", FAMILIES)
def test_the_replay_sees_the_shifted_windows_and_the_logit_scale_clamp(family):
    """The logits check above would notice a wrong window layout (the unshifted windows for every block change the
    logits) and, in V2, an unclamped logit scale."""
    model, x = make_swin(family).double(), _images().double()
    a = get_adapter(model)
    right = a.window_bias
    a.window_bias = lambda b, like: right(0 if b < 2 else 2, like)
    assert rel_err(a.forward(a.check_inputs(x)).logits, _logits(model, x)) > 1e-3
    if family.endswith("v2"):
        a = get_adapter(model)
        a.logit_scale = lambda b, like: a.logit_scales[b].detach().exp().to(like.dtype)
        assert rel_err(a.forward(a.check_inputs(x)).logits, _logits(model, x)) > 1e-3


@pytest.mark.parametrize("family", ["hf_v1_sdpa", "hf_v2", "timm_v2"])
def test_patch_merging_concatenates_the_neighbours_in_the_regrouping_order(family):
    """The model's own merging module with its norm and reduction made identities gives the concatenation it feeds
    them: the replay's regrouping, element for element (transformers' order and timm's are the same)."""
    merging = _merging(family)
    x = torch.randn(2, 8 * 6, 5, dtype=torch.float64)
    merging.norm, merging.reduction = torch.nn.Identity(), torch.nn.Identity()
    got = merging(x.view(2, 8, 6, 5)).reshape(2, 12, 20) if family == "timm_v2" else merging(x, (8, 6))
    assert torch.equal(got, _regroup(x, (8, 6)))


def _merging(family: str) -> torch.nn.Module:
    if family == "timm_v2":
        from timm.models.swin_transformer_v2 import PatchMerging

        return PatchMerging(dim=5)
    if family == "hf_v2":
        from transformers.models.swinv2.modeling_swinv2 import Swinv2PatchMerging

        return Swinv2PatchMerging((8, 6), dim=5)
    from transformers.models.swin.modeling_swin import SwinPatchMerging

    return SwinPatchMerging(dim=5)


def test_cosine_normalisation_is_torchs_and_attnlrp_holds_its_divisor_constant():
    """``CosineNormalize`` gives ``F.normalize``'s values bit for bit; under AttnLRP's rule for a normalisation its
    Jacobian is ``I / ‖x‖`` (the divisor a constant), so relevance passes through it unchanged."""
    from lrp_core.rules.composites import ATTNLRP
    from lrp_core.rules.ops import LAYERNORM

    x = torch.randn(3, 2, 5, 8, dtype=torch.float64)
    assert torch.equal(COSINE(x), torch.nn.functional.normalize(x, dim=-1))
    assert isinstance(COSINE, CosineNormalize)
    rule = ATTNLRP.rule(LAYERNORM)
    v = x[0, 0, 0].clone().requires_grad_(True)
    y = rule.forward(COSINE, v, module=COSINE)
    assert torch.equal(y.detach(), torch.nn.functional.normalize(v.detach(), dim=-1))
    J = torch.stack([torch.autograd.grad(y[i], v, retain_graph=True)[0] for i in range(8)])
    assert torch.allclose(J, torch.eye(8, dtype=torch.float64) / v.detach().norm(), rtol=1e-14, atol=0)


# ---------------------------------------------------------------- methods
@pytest.mark.parametrize("family", FAMILIES)
def test_every_method_that_runs_gives_one_finite_score_per_input_patch(family):
    model, x = make_swin(family), _images()
    for method in RUNS:
        exp = explain(model, x, method=method)
        assert exp.scores.shape == (2, 64), method
        assert torch.isfinite(exp.scores).all(), method
        if exp.pixels is not None:
            assert exp.pixels.shape == (2, 32, 32) and torch.isfinite(exp.pixels).all(), method
        if exp.token_relevance is not None:
            assert exp.token_relevance.shape == (2, 4, 64), method


#: every method on Swin V2; the relevance methods on v1's eager attention (its float32 softmax) too
BATCH_CASES = [("hf_v2", m) for m in RUNS] + [("hf_v1_eager", m) for m in ("lrp", "attnlrp", "cp_lrp", "cdam")]


@pytest.mark.parametrize("family,method", BATCH_CASES)
def test_batch_equals_single_in_float64(family, method):
    model, x = make_swin(family).double(), _images(3).double()
    batch = explain(model, x, method=method)
    for i in range(x.shape[0]):
        one = explain(model, x[i : i + 1], method=method)
        assert rel_err(batch.scores[i : i + 1], one.scores) <= 1e-8, method
        if batch.pixels is not None:
            assert rel_err(batch.pixels[i : i + 1], one.pixels) <= 1e-8, method


@pytest.mark.parametrize("family", ["hf_v1_sdpa", "hf_v2"])
@pytest.mark.parametrize("method", sorted(REFUSED_METHODS))
def test_methods_without_meaning_are_refused_by_method(family, method):
    model = make_swin(family)
    before = snapshot(model)
    with pytest.raises(UnsupportedModelError) as err:
        explain(model, _images(1), method=method)
    assert f"method {method!r} is not defined on {type(model).__name__}" in str(err.value)
    assert REFUSED_METHODS[method] in str(err.value) and "attnlrp" in str(err.value)
    assert_untouched(before, snapshot(model))


@pytest.mark.parametrize("family", FAMILIES)
def test_model_is_untouched_by_calls_and_errors(family):
    model = make_swin(family)
    model.train()  # an unusual mode must survive too
    before = snapshot(model)
    for method in RUNS:
        explain(model, _images(1), method=method)
    with pytest.raises(InputError):
        explain(model, torch.randn(1, 3, 40, 40), method="lrp")
    assert_untouched(before, snapshot(model))


@pytest.mark.parametrize("family", FAMILIES)
def test_cp_lrp_conserves_without_additive_constants(family):
    """Biases and LayerNorm β 0 (the position bias stays: it is inside the softmax, which CP-LRP holds constant, as
    the cosine normalisation of q and k): the model is linear in the patches, through the windows, the post-norms
    (std constant) and the patch merging, so every stage holds the logit — the merged stage's relevance too."""
    model = make_swin(family).double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
    exp = explain(model, _images().double(), method="cp_lrp")
    c = exp.conservation
    tol = 1e-8 * c.output.abs() + 1e-9
    assert (c.absorbed().abs().max(dim=1).values < tol).all()
    assert ((c.pixels - c.output).abs() < tol).all()
    assert torch.allclose(exp.token_relevance.sum(-1), c.blocks, rtol=1e-12, atol=0)


@pytest.mark.parametrize("family", ["hf_v1_sdpa", "hf_v2"])
def test_cdam_is_gradient_times_the_last_stage_tokens_shared_by_their_patches(family):
    """The reference reads the tokens entering the model's last attention with a hook on transformers' own forward
    (v1: the last layer's layernorm_before output; v2, post-norm: the last layer's input): Σ_c h ⊙ ∂y_t/∂h per
    last-stage token, each 2×2 block of input patches sharing its token's score equally."""
    model, x = make_swin(family).double(), _images().double()
    exp = explain(model, x, method="cdam")
    layer, seen = _last_layer(model), []
    if family == "hf_v2":
        handle = layer.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    else:
        handle = layer.layernorm_before.register_forward_hook(lambda m, i, o: seen.append(o))
    try:
        y = model(x).logits
    finally:
        handle.remove()
    (h,) = seen  # (B, 16, C)
    (g,) = torch.autograd.grad(y.gather(1, exp.target[:, None]).sum(), [h])
    per_token = (h * g).sum(-1).detach().reshape(2, 4, 4)
    ref = per_token.repeat_interleave(2, dim=1).repeat_interleave(2, dim=2).reshape(2, 64) / 4
    assert rel_err(exp.scores, ref) <= 1e-10


# ---------------------------------------------------------------- what is refused, and why
def _padded_model(family: str) -> torch.nn.Module:
    """Image 40, patch 4: stage 0 a 10×10 grid, stage 1 5×5, neither a multiple of the 4×4 window — both padded to
    whole windows with zero tokens, shifted blocks included (timm v1 from vision_models.py)."""
    if family == "timm_v1":
        from vision_models import make_swin as make_timm_v1

        return make_timm_v1(img_size=40)
    return make_swin(family, image_size=40)


@pytest.mark.parametrize("family", FAMILIES + ("timm_v1",))
def test_windows_filled_with_padding_reproduce_the_logits(family):
    """The padding's zero tokens are keys and values of their windows (their k and v the projections' biases): the
    replay attends to them as the model does. Eager attention needs the per-window float32 softmax: the softmax
    over whole rows in float32 was 1.1e-7 off here."""
    model = _padded_model(family).double()
    x = torch.randn(2, 3, 40, 40, generator=torch.Generator().manual_seed(3)).double()
    for method in ("lrp", "attnlrp", "cp_lrp"):
        exp = explain(model, x, method=method)
        assert rel_err(exp.logits, _logits(model, x)) <= 1e-12, method
        assert exp.scores.shape == (2, 100) and torch.isfinite(exp.scores).all(), method


@pytest.mark.parametrize("family", ["hf_v1_eager", "timm_v2"])
def test_cp_lrp_conserves_through_the_padding_without_additive_constants(family):
    """Bias-free, the padding's values are 0: it takes attention weight (constants under CP-LRP) but passes
    nothing on, so every stage still holds the logit."""
    model = _padded_model(family).double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
    exp = explain(
        model, torch.randn(2, 3, 40, 40, generator=torch.Generator().manual_seed(3)).double(), method="cp_lrp"
    )
    c = exp.conservation
    tol = 1e-8 * c.output.abs() + 1e-9
    assert (c.absorbed().abs().max(dim=1).values < tol).all()
    assert ((c.pixels - c.output).abs() < tol).all()


@pytest.mark.parametrize("family", ["hf_v1_sdpa", "hf_v2"])
def test_odd_grids_before_a_merging_are_refused_with_the_reason(family):
    """Image 36, patch 4: a 9×9 grid, which transformers pads to 10×10 before merging 2×2 patches."""
    model = make_swin(family, image_size=36)
    before = snapshot(model)
    with pytest.raises(UnsupportedModelError) as err:
        explain(model, torch.randn(1, 3, 36, 36), method="attnlrp")
    assert "odd grid (9, 9)" in str(err.value) and "pads" in str(err.value)
    assert_untouched(before, snapshot(model))


def test_absolute_position_embeddings_are_refused():
    model = make_swin("hf_v1_sdpa", use_absolute_embeddings=True)
    with pytest.raises(UnsupportedModelError, match="use_absolute_embeddings"):
        explain(model, _images(1), method="lrp")


def test_a_swin_without_a_classification_head_is_refused_by_family():
    from transformers import SwinConfig, SwinModel

    model = SwinModel(
        SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=4)
    ).eval()
    with pytest.raises(UnsupportedModelError) as err:
        explain(model, _images(1), method="lrp")
    assert "SwinForImageClassification" in str(err.value) and "no class to explain" in str(err.value)

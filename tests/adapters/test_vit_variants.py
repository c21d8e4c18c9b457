"""ViT variants with a relative position bias (docs/METHODS.md §2v): Hugging Face BEiT and Data2Vec-vision, timm
Beit and VisionTransformerRelPos — the replay is the model, batch = alone, CP-LRP conservation on a constant-free
variant, input × gradient = autograd through the model, the model untouched, what is refused says why. Tiny
random models (tests/adapters/vit_variants.py), seconds each."""

from __future__ import annotations

import pytest
import torch
from untouched import assert_untouched, snapshot
from vision_models import random_images
from vit_variants import REGISTER_FAMILIES, VARIANTS, WITH_POSITIONS, hf_dinov2_registers, hf_relpos

from lrp_core import METHODS, explain
from lrp_core.adapters import get_adapter
from lrp_core.errors import InputError, UnsupportedModelError


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


def _logits(model, x):
    with torch.no_grad():
        out = model(x)
    return getattr(out, "logits", out)


def _explain_or_refused(model, x, method):
    """The explanation, or ``None`` where the method is refused on this model (pa_lrp without a position
    embedding: the message says why)."""
    try:
        return explain(model, x, method=method)
    except UnsupportedModelError as err:
        assert method == "pa_lrp" and "position" in str(err), (method, str(err))
        return None


# ---------------------------------------------------------------- the replay is the model
@pytest.mark.parametrize("family", VARIANTS)
def test_replay_reproduces_the_logits(family):
    model, x = VARIANTS[family](), random_images(2)
    own = _logits(model, x)
    assert own.abs().max() > 1e-2  # a head that reads something
    for method in ("raw_attention", "attnlrp", "cp_lrp", "lrp"):
        assert rel_err(explain(model, x, method=method).logits, own) <= 1e-5, method
    model, x = model.double(), x.double()
    assert rel_err(explain(model, x, method="raw_attention").logits, _logits(model, x)) <= 1e-10


@pytest.mark.parametrize("family", ["hf_beit", "data2vec", "timm_beit", "timm_relpos_post"])
def test_the_replay_reads_the_position_bias(family):
    """Without the bias the replay's logits move: the check above sees it."""
    model, x = VARIANTS[family]().double(), random_images(2).double()
    a = get_adapter(model)
    prepared = a.check_inputs(x)
    assert rel_err(a.forward(prepared).logits, _logits(model, x)) <= 1e-10
    a.block_biases = lambda like: [None] * len(a.blocks)  # type: ignore[method-assign]
    assert rel_err(a.forward(prepared).logits, _logits(model, x)) > 1e-3


@pytest.mark.parametrize("family", VARIANTS)
def test_every_method_gives_one_finite_score_per_patch_or_says_why(family):
    model, x = VARIANTS[family](), random_images(2)
    for method in METHODS:
        exp = _explain_or_refused(model, x, method)
        if exp is None:
            assert family not in WITH_POSITIONS
            continue
        assert exp.scores.shape == (2, 16) and torch.isfinite(exp.scores).all(), method
        if exp.pixels is not None:
            assert exp.pixels.shape == (2, 32, 32) and torch.isfinite(exp.pixels).all(), method


# ---------------------------------------------------------------- batched = one by one
@pytest.mark.parametrize("method", ["transformer_attribution", "lrp", "attnlrp", "cp_lrp", "token_ablation"])
@pytest.mark.parametrize("family", ["hf_beit_shared_cls", "data2vec", "timm_beit", "timm_relpos_post"])
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
    """Biases (the attention's q / v biases included), LayerNorm β, [CLS] and absolute positions zeroed; the
    relative position bias stays (under CP-LRP the attention weights are constants, so it adds no relevance)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            last = name.split(".")[-1]
            if last in ("bias", "q_bias", "v_bias", "cls_token", "position_embeddings", "pos_embed"):
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
    out = model(xr)
    logit = getattr(out, "logits", out)[:, 1].sum()
    (grad,) = torch.autograd.grad(logit, xr)
    assert rel_err(exp.pixels, (x * grad).sum(dim=1)) <= 1e-10


# ---------------------------------------------------------------- the model is left as it was
@pytest.mark.parametrize("family", ["hf_beit", "data2vec", "timm_beit", "timm_relpos_post"])
def test_model_is_untouched_by_calls_and_errors(family):
    model = VARIANTS[family]()
    model.train()  # an unusual mode must survive too
    before = snapshot(model)
    for method in METHODS:
        _explain_or_refused(model, random_images(1), method)
    with pytest.raises(InputError):
        explain(model, random_images(1, (40, 40)), method="lrp")
    with pytest.raises(InputError):
        explain(model, random_images(1), method="rollout", target=99)
    assert_untouched(before, snapshot(model))


# ---------------------------------------------------------------- token ablation keeps each token's offsets
def test_token_ablation_keeps_the_bias_rows_of_the_remaining_tokens():
    """Removing patch i: the reference runs the model's own layers on the tokens without i, with the model's own
    bias without row and column i."""
    model = VARIANTS["timm_beit"]().double()
    x = random_images(1).double()
    exp = explain(model, x, method="token_ablation")
    with torch.no_grad():
        tokens = torch.cat((model.cls_token.expand(1, -1, -1), model.patch_embed(x)), dim=1) + model.pos_embed
        shared = model.rel_pos_bias()[None]  # timm's shared table: (H, N, N)

        def run(keep):
            h = tokens[:, keep]
            for blk in model.blocks:
                own = blk.attn._get_rel_pos_bias()[:, :, keep][:, :, :, keep]
                bias = own + shared[:, :, keep][:, :, :, keep]
                h = h + blk.gamma_1 * _timm_beit_attention(blk.attn, blk.norm1(h), bias)
                h = h + blk.gamma_2 * blk.mlp(blk.norm2(h))
            return model.forward_head(model.norm(h))

        full = run(list(range(17)))
        assert rel_err(full, _logits(model, x)) <= 1e-10
        t = int(full.argmax())
        for i in (0, 7, 15):
            out = run([j for j in range(17) if j != 1 + i])
            assert abs(float(exp.scores[0, i]) - float(full[0, t] - out[0, t])) <= 1e-10 * float(full.abs().max())


def _timm_beit_attention(attn, x, bias):
    """timm BEiT's attention with a given score bias (its own arithmetic, unfused)."""
    B, N, C = x.shape
    qkv_bias = torch.cat((attn.q_bias, attn.k_bias, attn.v_bias))
    qkv = torch.nn.functional.linear(x, attn.qkv.weight, qkv_bias).reshape(B, N, 3, attn.num_heads, -1)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    a = ((q * attn.scale) @ k.transpose(-2, -1) + bias).softmax(dim=-1)
    return attn.proj((a @ v).transpose(1, 2).reshape(B, N, C))


# ---------------------------------------------------------------- what is refused says why
def _timm(name, **kw):
    import timm

    return timm.create_model(name, pretrained=False, **kw).eval()


@pytest.mark.parametrize(
    "build,words",
    [
        (
            lambda: _timm("xcit_nano_12_p16_224", img_size=32, depth=1, cls_attn_layers=1, num_classes=3),
            ("cross-covariance", "no token × token attention map"),
        ),
        (
            lambda: _timm("cait_xxs24_224", img_size=32, depth=1, depth_token_only=1, num_classes=3),
            ("class-attention", "talking-heads"),
        ),
        (lambda: _timm("naflexvit_base_patch16_gap", depth=1, num_classes=3), ("variable sets of patches",)),
        (lambda: hf_relpos("IJepaModel", "IJepaConfig"), ("IJepaForImageClassification", "no head")),
        (lambda: hf_relpos("BeitModel", "BeitConfig"), ("BeitForImageClassification", "no class")),
        (lambda: hf_relpos("Data2VecVisionModel", "Data2VecVisionConfig"), ("Data2VecVisionForImageClassification",)),
    ],
)
def test_refused_heads_say_why(build, words):
    with pytest.raises(UnsupportedModelError) as err:
        explain(build(), random_images(1), method="rollout")
    for w in words:
        assert w in str(err.value)


# ---------------------------------------------------------------- register tokens: exp.registers
RELEVANCE_METHODS = ("lrp", "attnlrp", "cp_lrp", "pa_lrp")


def _own(model, x):
    with torch.no_grad():
        out = model(pixel_values=x) if hasattr(model, "config") else model(x)
    return getattr(out, "logits", out)


@pytest.mark.parametrize("family", REGISTER_FAMILIES)
def test_registers_are_scored_apart_from_the_patch_map(family):
    build, R = REGISTER_FAMILIES[family]
    model, x = build(), random_images(2)
    own = _own(model, x)
    for method in METHODS:
        exp = explain(model, x, method=method)
        assert rel_err(exp.logits, own) <= 1e-5, method
        assert exp.scores.shape == (2, 16), method  # the patches only
        if method in RELEVANCE_METHODS:
            assert exp.registers.shape == (2, R) and torch.isfinite(exp.registers).all(), method
            assert (exp.registers.abs().sum(-1) > 0).all(), method
        else:
            assert exp.registers is None, method
    model, x = model.double(), x.double()
    assert rel_err(explain(model, x, method="raw_attention").logits, _own(model, x)) <= 1e-10


def _constant_free(model):
    """Biases (q / v biases too), LayerNorm β, [CLS] and positions zeroed; the register tokens stay."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("bias", "cls_token", "position_embeddings", "pos_embed")):
                p.zero_()
    return model


@pytest.mark.parametrize("family", REGISTER_FAMILIES)
def test_cp_lrp_conserves_with_the_registers_counted(family):
    """Σ pixels + Σ registers = y_t (the registers are inputs of their own, not constants absorbed), and the
    registers carry a share that matters."""
    build, _ = REGISTER_FAMILIES[family]
    model = _constant_free(build()).double()
    exp = explain(model, random_images(2).double(), method="cp_lrp")
    c = exp.conservation
    tol = 1e-8 * c.output.abs() + 1e-9
    assert torch.allclose(c.registers, exp.registers.sum(-1), rtol=1e-12, atol=0)
    assert (c.registers.abs() > 100 * tol).all()
    assert ((c.pixels + c.registers - c.output).abs() < tol).all()
    assert (c.absorbed().abs().max(dim=1).values < tol).all()


@pytest.mark.parametrize("method", RELEVANCE_METHODS)
def test_registers_batch_equals_single_in_float64(method):
    model, x = hf_dinov2_registers().double(), random_images(3).double()
    batch = explain(model, x, method=method)
    for i in range(3):
        one = explain(model, x[i : i + 1], method=method)
        assert rel_err(batch.registers[i : i + 1], one.registers) <= 1e-8
        assert rel_err(batch.scores[i : i + 1], one.scores) <= 1e-8


def test_dinov2_registers_input_x_gradient_is_autograd_and_the_model_untouched():
    model = hf_dinov2_registers().double()
    before = snapshot(model)
    x = random_images(2).double()
    exp = explain(model, x, method="input_x_gradient", target=3)
    xr = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(model(pixel_values=xr).logits[:, 3].sum(), xr)
    assert rel_err(exp.pixels, (x * grad).sum(dim=1)) <= 1e-10
    for method in METHODS:
        explain(model, x[:1], method=method)
    assert_untouched(before, snapshot(model))

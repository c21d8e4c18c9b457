"""timm ``Eva`` (EVA, EVA-02): rotary q/k with the prefix tokens unrotated, interleaved or half-split pairs,
SwiGLU (separate and packed, with and without a hidden norm), registers, q/k bias, LayerScale, post-norm blocks.
Tiny random models (img 32, patch 8, width 32, depth 2, 4 heads), seconds each."""

from __future__ import annotations

import pytest
import torch
from untouched import assert_untouched, snapshot
from vision_models import make_eva

from lrp_core import METHODS, explain
from lrp_core.adapters import get_adapter
from lrp_core.errors import InputError, UnsupportedModelError


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


def _images(n: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


FAMILIES = {
    # absolute positions only, [CLS], GELU MLP
    "plain": dict(),
    # rotary q/k (interleaved pairs), [CLS] unrotated, absolute positions too
    "rope": dict(use_rot_pos_emb=True),
    # EVA-02: rotary, SwiGLU with a norm on the hidden units, registers, LayerScale, average pooling
    "eva02": dict(
        use_rot_pos_emb=True,
        swiglu_mlp=True,
        scale_mlp=True,
        num_reg_tokens=2,
        init_values=0.3,
        global_pool="avg",
        scale_attn_inner=True,
    ),
    # packed SwiGLU (one gate-up Linear), half-split rotary pairs, separate q/k/v Linears, q/k norms, no abs pos
    "packed": dict(
        use_rot_pos_emb=True,
        swiglu_mlp=True,
        rope_rotate_half=True,
        qkv_fused=False,
        qk_norm=True,
        use_abs_pos_emb=False,
    ),
    # post-norm blocks, no class token, average pooling
    "post_norm": dict(use_post_norm=True, use_rot_pos_emb=True, class_token=False, global_pool="avg"),
}


def _logits(model, x):
    with torch.no_grad():
        return model(x)


# ---------------------------------------------------------------- the replay is the model
@pytest.mark.parametrize("family", FAMILIES)
def test_replay_reproduces_the_logits(family):
    model, x = make_eva(**FAMILIES[family]), _images()
    for method in ("raw_attention", "attnlrp", "cp_lrp", "lrp"):  # plain replay, modified-gradient replays
        assert (explain(model, x, method=method).logits - _logits(model, x)).abs().max() <= 1e-5, method
    model, x = model.double(), x.double()
    assert rel_err(explain(model, x, method="raw_attention").logits, _logits(model, x)) <= 1e-12


def test_qkv_bias_added_separately_is_replayed():
    model = make_eva(use_rot_pos_emb=True)
    for blk in model.blocks:
        blk.attn.qkv_bias_separate = True
    x = _images()
    assert (explain(model, x, method="attnlrp").logits - _logits(model, x)).abs().max() <= 1e-5


def test_the_replay_tells_the_rotary_pairings_apart():
    """The logits check above sees the rotary layout: replayed with the other pairing, the logits move."""
    model, x = make_eva(**FAMILIES["rope"]).double(), _images().double()
    a = get_adapter(model)
    for spec in a.blocks:
        spec.attn.rope_interleaved = False  # the tables stay in the interleaved model's order
    off = a.forward(a.check_inputs(x)).logits
    assert rel_err(off, _logits(model, x)) > 1e-3


@pytest.mark.parametrize("family", FAMILIES)
def test_every_method_gives_one_finite_score_per_patch(family):
    model, x = make_eva(**FAMILIES[family]), _images()
    for method in METHODS:
        exp = explain(model, x, method=method)
        assert exp.scores.shape == (2, 16), method
        assert torch.isfinite(exp.scores).all(), method
        if exp.pixels is not None:
            assert exp.pixels.shape == (2, 32, 32) and torch.isfinite(exp.pixels).all(), method


# ---------------------------------------------------------------- batched = one by one
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("family", ["eva02", "packed"])
def test_batch_equals_single_in_float64(family, method):
    model, x = make_eva(**FAMILIES[family]).double(), _images(3).double()
    batch = explain(model, x, method=method)
    for i in range(x.shape[0]):
        one = explain(model, x[i : i + 1], method=method)
        assert rel_err(batch.scores[i : i + 1], one.scores) <= 1e-8, method
        if batch.pixels is not None:
            assert rel_err(batch.pixels[i : i + 1], one.pixels) <= 1e-8, method


# ---------------------------------------------------------------- the model is left as it was
@pytest.mark.parametrize("family", ["eva02", "post_norm"])
def test_model_is_untouched_by_calls_and_errors(family):
    model = make_eva(**FAMILIES[family])
    model.train()  # an unusual mode must survive too
    before = snapshot(model)
    for method in METHODS:
        explain(model, _images(1), method=method)
    with pytest.raises(InputError):
        explain(model, torch.randn(1, 3, 40, 40), method="lrp")
    with pytest.raises(InputError):
        explain(model, _images(1), method="rollout", target=99)
    assert_untouched(before, snapshot(model))


# ---------------------------------------------------------------- relevance
def _without_additive_constants(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or name in ("pos_embed", "cls_token", "reg_token"):
                p.zero_()
    return model


@pytest.mark.parametrize("family", ["eva02", "packed", "post_norm"])
def test_cp_lrp_conserves_without_additive_constants(family):
    """Biases, LayerNorm β, positions, [CLS] and registers 0: under CP-LRP (q, k and the SwiGLU gate detached) the
    model is linear in the patches — the rotations included — so every stage holds the logit."""
    model = _without_additive_constants(make_eva(**FAMILIES[family])).double()
    c = explain(model, _images().double(), method="cp_lrp").conservation
    tol = 1e-8 * c.output.abs() + 1e-9
    assert (c.absorbed().abs().max(dim=1).values < tol).all()
    assert ((c.pixels - c.output).abs() < tol).all()


def test_rotary_rule_is_the_dtd_rule_of_timms_rotation():
    """The explicit rule at the rotation, through the prefix skip and the interleaved layout, equals
    ``x ⊙ ∂(Rot x)ᵀ/∂x · safe_div(R, Rot x)`` computed by autograd through timm's own ``apply_rot_embed_cat``, and
    conserves; the unrotated prefix tokens keep their relevance."""
    from timm.layers.pos_embed_sincos import apply_rot_embed_cat

    from lrp_core.adapters.attention import _rotate
    from lrp_core.adapters.replay import Replay
    from lrp_core.rules.composites import LRP_BASELINE
    from lrp_core.rules.functional import safe_div

    model = make_eva(**FAMILIES["eva02"]).double()
    a = get_adapter(model)
    spec = a.blocks[0].attn
    P0 = a.num_prefix_tokens
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 4, P0 + 16, 8, dtype=torch.float64, generator=g).requires_grad_(True)
    R = torch.randn(2, 4, P0 + 16, 8, dtype=torch.float64, generator=g)
    emb = model.rope.get_embed()
    rotated = torch.cat([x[:, :, :P0], apply_rot_embed_cat(x[:, :, P0:], emb)], dim=2)
    (grad,) = torch.autograd.grad(rotated, x, safe_div(R, rotated.detach()))
    x = x.detach()
    cos, sin = a.block_context(torch.zeros(2, P0 + 16, 32, dtype=torch.float64), None, None)[0][1]
    x = x.requires_grad_(True)  # the rotation in the explicit replay: its backward is the relevance
    (got,) = torch.autograd.grad(_rotate(spec, x, cos, sin, Replay(LRP_BASELINE)), x, R)
    assert rel_err(got[:, :, P0:], (x * grad)[:, :, P0:]) <= 1e-12
    assert torch.equal(got[:, :, :P0], R[:, :, :P0])
    assert rel_err(got.sum(dim=(1, 2, 3)), R.sum(dim=(1, 2, 3))) <= 1e-6  # up to the ε stabiliser


def test_pa_lrp_gives_the_rotary_tables_relevance_on_the_patches():
    """The rotary tables cover the patches only: their relevance (AttnLRP base: half of each rotated q, k) is
    non-zero, and all of it is on the scored patch tokens."""
    model = make_eva(**{**FAMILIES["eva02"], "use_abs_pos_emb": False}).double()
    exp = explain(model, _images().double(), method="pa_lrp")
    assert exp.positional.shape == (2, 16)
    assert (exp.positional.abs().sum(-1) > 1e-3 * exp.conservation.output.abs()).all()
    assert torch.allclose(exp.conservation.positional, exp.positional.sum(-1), rtol=1e-12, atol=0)


def test_token_ablation_keeps_the_rotary_angles_of_the_other_patches():
    """Removing patch i leaves every other patch at its own rotary angles: the reference runs the model's blocks on
    the tokens without i, with the model's rotary table without row i."""
    model = make_eva(**FAMILIES["eva02"]).double()
    x = _images(1).double()
    exp = explain(model, x, method="token_ablation")
    P0 = model.num_prefix_tokens
    with torch.no_grad():
        tokens, rope = model._pos_embed(model.patch_embed(x))
        tokens = model.norm_pre(tokens)
        full = model.forward_head(model.norm(_run(model, tokens, rope)))
        t = int(full.argmax())
        for i in (0, 5, 15):
            keep = [j for j in range(tokens.shape[1]) if j != P0 + i]
            rows = [j - P0 for j in keep[P0:]]
            out = model.forward_head(model.norm(_run(model, tokens[:, keep], rope[rows])))
            assert abs(float(exp.scores[0, i]) - float(full[0, t] - out[0, t])) <= 1e-10 * float(full.abs().max())


def _run(model, x, rope):
    for blk in model.blocks:
        x = blk(x, rope=rope)
    return x


# ---------------------------------------------------------------- what is refused says why
def _gated_attention():
    """An EvaBlock with ``gated_attn=True`` (Eva's constructor does not pass it on): a sigmoid gate on the heads."""
    from timm.models.eva import EvaBlock

    model = make_eva()
    model.blocks[1] = EvaBlock(32, 4, gated_attn=True).eval()
    return model


@pytest.mark.parametrize(
    "build,words",
    [
        (lambda: make_eva(attn_type="rope", use_rot_pos_emb=True), ("AttentionRope", "attn_type")),
        (_gated_attention, ("gated attention",)),
        (lambda: make_eva(use_rot_pos_emb=True, rope_type="mixed"), ("RotaryEmbeddingMixed", "RotaryEmbeddingCat")),
        (lambda: make_eva(use_rot_pos_emb=True, dynamic_img_size=True), ("dynamic_img_size", "patch grid")),
        (lambda: make_eva(global_pool="max"), ("global_pool='max'",)),
    ],
)
def test_refused_variants_say_why(build, words):
    model = build()
    with pytest.raises(UnsupportedModelError) as err:
        explain(model, _images(1), method="lrp")
    for w in words:
        assert w in str(err.value)

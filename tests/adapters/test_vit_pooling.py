"""timm's attention pooling (``global_pool='map'``: ``AttentionPoolLatent``, docs/METHODS.md §2v) on a
VisionTransformer (after the prefix tokens, or with them: ``pool_include_prefix``) and on Eva (every token):
an attention block with a learned query, replayed by the readout SigLIP's pooling head uses. The replay is the
model, batch = alone, CP-LRP conservation, input × gradient = autograd, untouched, the token weights are the
probe's attention. Tiny random models, seconds each."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_vit
from untouched import assert_untouched, snapshot
from vision_models import make_eva, random_images

from lrp_core import METHODS, explain
from lrp_core.adapters import get_adapter
from lrp_core.errors import InputError, UnsupportedModelError


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


def _randomised(model, seed: int = 3):
    """The pool's and the head's parameters moved off their initialisation (the latent, the MLP, the head)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith(("attn_pool", "head")):
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    return model.eval()


def _prefix_pooled():
    model = make_tiny_vit(global_pool="map", reg_tokens=2)
    model.pool_include_prefix = True  # the pool reads [CLS] and the registers too
    return model


FAMILIES = {
    "vit_map": lambda: _randomised(make_tiny_vit(global_pool="map")),
    "vit_map_no_cls": lambda: _randomised(make_tiny_vit(global_pool="map", class_token=False, fc_norm=True)),
    "vit_map_prefix": lambda: _randomised(_prefix_pooled()),
    "eva_map": lambda: _randomised(make_eva(global_pool="map", num_reg_tokens=1)),
}


def _logits(model, x):
    with torch.no_grad():
        return model(x)


@pytest.mark.parametrize("family", FAMILIES)
def test_replay_reproduces_the_logits(family):
    model, x = FAMILIES[family](), random_images(2)
    for method in ("raw_attention", "attnlrp", "cp_lrp", "lrp"):
        assert rel_err(explain(model, x, method=method).logits, _logits(model, x)) <= 1e-5, method
    model, x = model.double(), x.double()
    assert rel_err(explain(model, x, method="raw_attention").logits, _logits(model, x)) <= 1e-10


@pytest.mark.parametrize("family", FAMILIES)
def test_every_method_gives_one_finite_score_per_patch(family):
    model, x = FAMILIES[family](), random_images(2)
    for method in METHODS:
        exp = explain(model, x, method=method)
        assert exp.scores.shape == (2, 16) and torch.isfinite(exp.scores).all(), method


def test_the_token_weights_are_the_probes_attention_over_the_pooled_tokens():
    """The layer-product methods read the pool's own attention row: the model's probe attention (computed here by
    hand from its modules), head mean, 0 at the prefix tokens it does not pool."""
    model, x = FAMILIES["vit_map"]().double(), random_images(2).double()
    a = get_adapter(model)
    w = a.readout_for(a.check_inputs(x)).weights(17)
    ap = model.attn_pool
    with torch.no_grad():
        h = model.norm(_features(model, x))[:, 1:]
        B, n, D = h.shape
        q = ap.q(ap.latent).reshape(1, 1, ap.num_heads, -1).transpose(1, 2)
        k = ap.kv(h).reshape(B, n, 2, ap.num_heads, -1).permute(2, 0, 3, 1, 4)[0]
        A = ((q * ap.scale) @ k.transpose(-2, -1)).softmax(-1).mean(1)[:, 0]
    assert torch.equal(w[:, 0], torch.zeros(2, dtype=w.dtype))
    assert rel_err(w[:, 1:], A) <= 1e-12
    assert torch.allclose(w.sum(-1), torch.ones(2, dtype=w.dtype))


def _features(model, x):
    """timm's forward_features without the final norm."""
    h = model.norm_pre(model._pos_embed(model.patch_embed(x)))
    for blk in model.blocks:
        h = blk(h)
    return h


@pytest.mark.parametrize("method", ["transformer_attribution", "rollout", "lrp", "attnlrp", "cp_lrp", "token_ablation"])
@pytest.mark.parametrize("family", ["vit_map", "eva_map"])
def test_batch_equals_single_in_float64(family, method):
    model, x = FAMILIES[family]().double(), random_images(3).double()
    batch = explain(model, x, method=method)
    for i in range(x.shape[0]):
        one = explain(model, x[i : i + 1], method=method)
        assert rel_err(batch.scores[i : i + 1], one.scores) <= 1e-8, method


def _without_additive_constants(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or name.split(".")[-1] in ("pos_embed", "cls_token", "reg_token"):
                p.zero_()
    return model


@pytest.mark.parametrize("family", ["vit_map", "vit_map_no_cls", "eva_map"])
def test_cp_lrp_conserves_without_additive_constants(family):
    """Biases, LayerNorm β, positions, [CLS] and registers 0; the probe stays: under CP-LRP it only sets the
    pool's attention weights (constants), so the pool is linear in its values and the model in the patches."""
    model = _without_additive_constants(FAMILIES[family]()).double()
    c = explain(model, random_images(2).double(), method="cp_lrp").conservation
    tol = 1e-8 * c.output.abs() + 1e-9
    assert (c.output.abs() > 1e-4).all()
    assert (c.absorbed().abs().max(dim=1).values < tol).all()
    assert ((c.pixels - c.output).abs() < tol).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_input_x_gradient_is_autograd_through_the_model(family):
    model, x = FAMILIES[family]().double(), random_images(2).double()
    exp = explain(model, x, method="input_x_gradient", target=2)
    xr = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(model(xr)[:, 2].sum(), xr)
    assert rel_err(exp.pixels, (x * grad).sum(dim=1)) <= 1e-10


@pytest.mark.parametrize("family", ["vit_map", "eva_map"])
def test_model_is_untouched_by_calls_and_errors(family):
    model = FAMILIES[family]()
    model.train()
    before = snapshot(model)
    for method in METHODS:
        explain(model, random_images(1), method=method)
    with pytest.raises(InputError):
        explain(model, random_images(1), method="rollout", target=99)
    assert_untouched(before, snapshot(model))


def _two_latents():
    model = make_tiny_vit(global_pool="map")
    from timm.layers import AttentionPoolLatent

    model.attn_pool = AttentionPoolLatent(48, num_heads=3, latent_len=2, pool_type="avg", norm_layer=torch.nn.LayerNorm)
    return model.eval()


@pytest.mark.parametrize(
    "build,words",
    [(_two_latents, ("2 latent queries", "one query"))],
)
def test_refused_pools_say_why(build, words):
    with pytest.raises(UnsupportedModelError) as err:
        explain(build(), random_images(1), method="rollout")
    for w in words:
        assert w in str(err.value)

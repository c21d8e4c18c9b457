"""Modules that are not what their class or config suggests (issue #43, item 2; docs/CONTRACTS.md "Part by part").

A user's model may carry a norm of another class than its family's (``torch.nn.RMSNorm`` in a Llama, timm's
``RmsNorm`` in a ViT), a changed attention scale, pruned heads or a projection replaced by an ``nn.Identity``. The
replay reads each part from the module itself: every case here is explained exactly — the explained output equals
the model's own logits, input × gradient equals autograd through the model, CP-LRP conserves on a constant-free
model — or refused naming the module. Tiny seeded float64 models, seconds each.
"""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_bert, make_tiny_vit
from decoders import batch, make_decoder, rows
from torch import nn
from transformers.pytorch_utils import prune_linear_layer
from untouched import assert_untouched, snapshot
from vision_models import hf_classifier

from lrp_core import explain
from lrp_core.errors import UnsupportedModelError
from lrp_core.rules.composites import LRP_BASELINE
from lrp_core.rules.explicit import Identity

#: the methods whose explained output is the replay's: the explicit passes, the modified-gradient ones, a gradient
METHODS = ("transformer_attribution", "lrp", "attnlrp", "cp_lrp", "input_x_gradient")
TOL64 = 1e-10


def hf_vit() -> nn.Module:
    """A tiny Hugging Face ``ViTForImageClassification`` (3 layers of 3 heads, width 48)."""
    return hf_classifier("ViTForImageClassification", "ViTConfig")


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


def _images(n: int = 2) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(5), dtype=torch.float64)


def _text(n: int = 2) -> dict:
    ids = torch.randint(1, 60, (n, 7), generator=torch.Generator().manual_seed(6))
    mask = torch.ones(n, 7, dtype=torch.long)
    mask[1, 5:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _own_logits(model: nn.Module, inputs) -> torch.Tensor:
    with torch.no_grad():
        out = model(inputs) if isinstance(inputs, torch.Tensor) else model(**inputs)
    return out if isinstance(out, torch.Tensor) else out.logits


def _check_exact(
    model: nn.Module, inputs, methods=METHODS, tol: float = TOL64, own: torch.Tensor | None = None
) -> dict:
    """Every method's explained output equals the model's own logits ``own`` (B, C) (default: the model's output
    on ``inputs``); the model is left as found."""
    own = _own_logits(model, inputs) if own is None else own
    before = snapshot(model)
    out = {}
    for method in methods:
        e = explain(model, inputs, method)
        assert rel(e.logits, own) <= tol, (method, rel(e.logits, own))
        if e.conservation is not None and method in ("attnlrp", "cp_lrp"):  # y_t of the modified-gradient replay
            y = own[torch.arange(len(e.target)), e.target]
            assert rel(e.conservation.output, y) <= tol, (method, rel(e.conservation.output, y))
        assert torch.isfinite(e.scores).all(), method
        out[method] = e
    assert_untouched(before, snapshot(model))
    return out


def _pixel_gradient(model: nn.Module, images: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(B, H, W) input × gradient at the pixels, autograd through the model itself, summed over channels."""
    x = images.clone().requires_grad_(True)
    y = model(x)
    y = y if isinstance(y, torch.Tensor) else y.logits
    (grad,) = torch.autograd.grad(y[torch.arange(len(target)), target].sum(), x)
    return (x * grad).sum(1).detach()


def _swap(model: nn.Module, match, build) -> nn.Module:
    """Every child module for which ``match`` holds replaced by ``build(child)`` (in place), the model returned."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if match(child):
                setattr(parent, name, build(child))
    return model


def _torch_rms(affine: bool = True):
    def build(norm: nn.Module) -> nn.Module:
        weight = norm.weight
        eps = getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", 1e-6)
        new = nn.RMSNorm(weight.shape[-1], eps=eps, elementwise_affine=affine).to(weight.dtype)
        if affine:
            with torch.no_grad():
                new.weight.copy_(weight)
        return new

    return build


def _layernorm(**kw):
    def build(norm: nn.LayerNorm) -> nn.Module:
        new = nn.LayerNorm(norm.normalized_shape, eps=norm.eps, **kw).to(norm.weight.dtype)
        with torch.no_grad():
            if new.weight is not None:
                new.weight.copy_(norm.weight)
            if new.bias is not None:
                new.bias.copy_(norm.bias)
        return new

    return build


# ---------------------------------------------------------------- norms of another class (timm ViT)
def _vit_norms(kind: str) -> nn.Module:
    is_ln = lambda m: isinstance(m, nn.LayerNorm)  # noqa: E731
    if kind == "torch_rmsnorm":  # was 1.36 relative off the logits (read as Gemma's 1 + w)
        return _swap(make_tiny_vit(), is_ln, _torch_rms()).double()
    if kind == "torch_rmsnorm_no_affine":  # was a raw error (no weight)
        return _swap(make_tiny_vit(), is_ln, _torch_rms(affine=False)).double()
    if kind == "timm_rmsnorm":  # was AttributeError: 'RmsNorm' object has no attribute 'bias'
        return make_tiny_vit(norm_layer="rmsnorm").double()
    if kind == "timm_rmsnorm_qk_norm":  # the q/k norms timm's RmsNorm too (was the same AttributeError)
        return make_tiny_vit(norm_layer="rmsnorm", qk_norm=True).double()
    if kind == "timm_rmsnorm_fp32":
        return make_tiny_vit(norm_layer="rmsnormfp32").double()
    if kind == "layernorm_no_affine":  # guards (already exact): LayerNorm without weight and bias / without bias
        return _swap(make_tiny_vit(), is_ln, _layernorm(elementwise_affine=False)).double()
    if kind == "layernorm_no_bias":
        return _swap(make_tiny_vit(), is_ln, _layernorm(bias=False)).double()
    raise AssertionError(kind)


VIT_NORMS = (
    "torch_rmsnorm",
    "torch_rmsnorm_no_affine",
    "timm_rmsnorm",
    "timm_rmsnorm_qk_norm",
    "timm_rmsnorm_fp32",
    "layernorm_no_affine",
    "layernorm_no_bias",
)


@pytest.mark.parametrize("kind", VIT_NORMS)
def test_a_timm_vit_with_other_norms_is_explained_exactly(kind):
    model = _vit_norms(kind)
    images = _images()
    out = _check_exact(model, images)
    ixg = out["input_x_gradient"]
    assert rel(ixg.pixels, _pixel_gradient(model, images, ixg.target)) <= TOL64


def test_a_timm_vit_with_rmsnorm_in_float32_is_exact_to_float32():
    model = _swap(make_tiny_vit(), lambda m: isinstance(m, nn.LayerNorm), _torch_rms())
    _check_exact(model, _images().float(), methods=("attnlrp", "cp_lrp", "lrp"), tol=1e-5)


# ---------------------------------------------------------------- a changed attention scale (timm)
@pytest.mark.parametrize("fused", [True, False])
def test_a_timm_vit_with_a_changed_attention_scale_is_explained_as_it_computes(fused):
    """timm's fused path (sdpa without ``scale``) ignores ``attn.scale``, its explicit path multiplies q by it:
    the replay follows the path the module takes (the fused case was 8e-3 off the logits)."""
    model = make_tiny_vit().double()
    for blk in model.blocks:
        blk.attn.fused_attn = fused
        blk.attn.scale = blk.attn.scale * 1.7
    images = _images()
    out = _check_exact(model, images)
    ixg = out["input_x_gradient"]
    assert rel(ixg.pixels, _pixel_gradient(model, images, ixg.target)) <= TOL64


# ---------------------------------------------------------------- a projection replaced by an Identity
def test_an_identity_in_place_of_a_projection_is_explained_as_the_identity():
    """``attn.proj = nn.Identity()`` (was a raw AttributeError in the explicit passes): explained exactly; its relevance
    passes unchanged (the identity rule on ``y = x``): the model with the identity written as a Linear of the identity
    matrix, that Linear given the identity rule, gets the same map, and AttnLRP / CP-LRP (gradient × input) the same
    maps as that Linear with its own rule."""
    model = make_tiny_vit().double()
    model.blocks[1].attn.proj = nn.Identity()
    images = _images()
    out = _check_exact(model, images)
    twin = make_tiny_vit().double()
    eye = nn.Linear(48, 48).double()
    with torch.no_grad():
        eye.weight.copy_(torch.eye(48, dtype=torch.float64))
        eye.bias.zero_()
    twin.blocks[1].attn.proj = eye
    identity = LRP_BASELINE.with_rules(by_name={"blocks.1.attn.proj": Identity()})
    assert rel(out["lrp"].scores, explain(twin, images, "lrp", composite=identity).scores) <= TOL64
    for method in ("attnlrp", "cp_lrp"):
        assert rel(out[method].scores, explain(twin, images, method).scores) <= TOL64, method


# ---------------------------------------------------------------- pruned heads, a changed scaling (Hugging Face)
def _prune(holder: nn.Module, names: tuple, out_parent: nn.Module, out_name: str, head: int, d: int) -> None:
    """``prune_heads`` as transformers 4.x does it (gone in 5.x): the head's rows of q, k, v and its columns of the
    output projection removed, the head count lowered; the config unchanged."""
    H = getattr(holder, names[0]).out_features // d
    keep = torch.cat([torch.arange(h * d, (h + 1) * d) for h in range(H) if h != head])
    for n in names:
        setattr(holder, n, prune_linear_layer(getattr(holder, n), keep))
    setattr(out_parent, out_name, prune_linear_layer(getattr(out_parent, out_name), keep, dim=1))
    for attr in ("num_attention_heads", "num_heads"):
        if isinstance(getattr(holder, attr, None), int):
            setattr(holder, attr, getattr(holder, attr) - 1)
    if hasattr(holder, "all_head_size"):
        holder.all_head_size = (H - 1) * d


def _pruned_bert() -> nn.Module:
    model = make_tiny_bert()
    if hasattr(model, "prune_heads"):  # transformers 4.x
        model.prune_heads({0: [1]})
    else:
        att = model.bert.encoder.layer[0].attention
        _prune(att.self, ("query", "key", "value"), att.output, "dense", 1, att.self.attention_head_size)
    return model.double()


def _hf_vit_layers(model: nn.Module):
    base = model.vit
    return base.layers if hasattr(base, "layers") else base.encoder.layer


def _pruned_hf_vit() -> nn.Module:
    model = hf_vit()
    if hasattr(model, "prune_heads"):
        model.prune_heads({0: [1]})
    else:
        att = _hf_vit_layers(model)[0].attention
        _prune(att, ("q_proj", "k_proj", "v_proj"), att, "o_proj", 1, att.head_dim)
    return model.double()


def _embedding_gradient(model: nn.Module, inputs: dict, target: torch.Tensor) -> torch.Tensor:
    """(B, T) input × gradient at the word embeddings, autograd through the model itself."""
    emb = model.get_input_embeddings()(inputs["input_ids"]).detach().requires_grad_(True)
    logits = model(inputs_embeds=emb, attention_mask=inputs["attention_mask"]).logits
    (grad,) = torch.autograd.grad(logits[torch.arange(len(target)), target].sum(), emb)
    return (emb * grad).sum(-1).detach() * inputs["attention_mask"]


def test_a_bert_with_pruned_heads_is_explained_exactly():
    """Was a raw ``RuntimeError: shape … is invalid`` (the heads read from the config)."""
    model = _pruned_bert()
    inputs = _text()
    out = _check_exact(model, inputs)
    ixg = out["input_x_gradient"]
    assert rel(ixg.scores, _embedding_gradient(model, inputs, ixg.target)) <= TOL64
    for method in ("transformer_attribution", "attnlrp"):  # batch = single, the padded row too
        one = explain(model, {k: v[1:, :5] for k, v in inputs.items()}, method)
        assert rel(out[method].scores[1:, :5], one.scores) <= 1e-9, method


def test_a_bert_with_a_changed_scaling_is_explained_as_it_computes():
    model = make_tiny_bert().double()
    for layer in model.bert.encoder.layer:
        layer.attention.self.scaling = 0.3  # transformers 5 reads it in every attention implementation
    inputs = _text()
    out = _check_exact(model, inputs)
    ixg = out["input_x_gradient"]
    assert rel(ixg.scores, _embedding_gradient(model, inputs, ixg.target)) <= TOL64


@pytest.mark.parametrize("edit", ["pruned", "scaling"])
def test_an_hf_vit_with_pruned_heads_or_a_changed_scaling_is_explained_exactly(edit):
    """Pruned heads were a raw reshape error; a changed ``scaling`` 1.2e-3 off the logits."""
    if edit == "pruned":
        model = _pruned_hf_vit()
    else:
        model = hf_vit().double()
        for layer in _hf_vit_layers(model):
            holder = layer.attention if hasattr(layer.attention, "scaling") else layer.attention.attention
            holder.scaling = 0.2
    images = _images()
    out = _check_exact(model, images)
    ixg = out["input_x_gradient"]
    assert rel(ixg.pixels, _pixel_gradient(model, images, ixg.target)) <= TOL64


def test_projections_that_do_not_split_into_heads_are_refused_naming_the_layer():
    model = make_tiny_bert().double()
    sa = model.bert.encoder.layer[1].attention.self
    sa.query = nn.Linear(32, 24).double()  # 24 is not a multiple of the 16-wide heads, nor the key's 32
    with pytest.raises(UnsupportedModelError, match=r"layer 1 .*query 24, key 32"):
        explain(model, _text(), "lrp")


# ---------------------------------------------------------------- decoders with torch.nn.RMSNorm
def _decoder_with_torch_rms(family: str, dtype=torch.float64) -> nn.Module:
    model = make_decoder(family, dtype=dtype)
    is_hf_rms = lambda m: "RMSNorm" in type(m).__name__ and not isinstance(m, nn.RMSNorm)  # noqa: E731
    return _swap(model, is_hf_rms, _torch_rms())


@pytest.mark.parametrize("family", ["llama", "qwen3"])  # Qwen3: its per-head q/k norms swapped too
def test_a_decoder_with_torch_rmsnorms_is_explained_exactly(family):
    """A Llama whose RMSNorms are ``torch.nn.RMSNorm`` was 1.74 relative off the logits under AttnLRP / CP-LRP
    (read as Gemma's ``1 + w``)."""
    model = _decoder_with_torch_rms(family)
    inputs = batch(rows(), "right")
    mask = inputs["attention_mask"]
    at = (torch.arange(mask.shape[1]) * mask).argmax(-1)
    with torch.no_grad():
        own = model(**inputs).logits[torch.arange(3), at]
    before = snapshot(model)
    for method in METHODS:
        e = explain(model, inputs, method)
        assert rel(e.logits, own) <= TOL64, method
        if method in ("attnlrp", "cp_lrp"):
            assert rel(e.conservation.output, own[torch.arange(3), e.target]) <= TOL64, method
    assert_untouched(before, snapshot(model))
    # CP-LRP is linear in the embeddings of a model without constants (no biases, rotary q and k detached): it
    # conserves the logit exactly
    cp = explain(model, inputs, "cp_lrp")
    assert rel(cp.scores.sum(-1), own[torch.arange(3), cp.target]) <= 1e-9
    # input × gradient is autograd through the model at the token embeddings
    ixg = explain(model, inputs, "input_x_gradient")
    emb = model.get_input_embeddings()(inputs["input_ids"]).detach().requires_grad_(True)
    logits = model(inputs_embeds=emb, attention_mask=mask).logits[torch.arange(3), at]
    (grad,) = torch.autograd.grad(logits[torch.arange(3), ixg.target].sum(), emb)
    assert rel(ixg.scores, (emb * grad).sum(-1).detach() * mask) <= TOL64


def test_a_decoder_with_torch_rmsnorms_in_float32_is_exact_to_float32():
    model = _decoder_with_torch_rms("llama", torch.float32)
    inputs = batch(rows(), "left")
    mask = inputs["attention_mask"]
    with torch.no_grad():
        own = model(**inputs, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits[:, -1]
    for method in ("attnlrp", "cp_lrp"):
        e = explain(model, inputs, method)
        assert rel(e.logits, own) <= 1e-5, method
        assert rel(e.conservation.output, own[torch.arange(3), e.target]) <= 1e-5, method


class _OffsetNorm(nn.Module):
    """A norm with Llama's attributes (``variance_epsilon``, ``weight``) that computes Gemma's ``(1 + w) · x̂``: what
    its attributes suggest is not what it computes."""

    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone())
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (h * (1.0 + self.weight.float())).to(x.dtype)


def test_a_norm_that_is_not_what_its_attributes_suggest_is_refused_naming_the_module():
    """The modified-gradient rules recompute a norm from its parameters: one they would misread is refused, naming
    the module, the figure and what is accepted (before: explained 1e0 off the model); the explicit passes, which
    read no norm parameter, stay exact."""
    model = make_decoder("llama")
    layer = model.model.layers[1]
    layer.post_attention_layernorm = _OffsetNorm(layer.post_attention_layernorm.weight, 1e-6)
    inputs = batch(rows(), "right")
    for method in ("attnlrp", "cp_lrp"):
        with pytest.raises(UnsupportedModelError, match=r"model\.layers\.1\.post_attention_layernorm \(_OffsetNorm\)"):
            explain(model, inputs, method)
    mask = inputs["attention_mask"]
    with torch.no_grad():
        own = model(**inputs).logits[torch.arange(3), (torch.arange(mask.shape[1]) * mask).argmax(-1)]
    _check_exact(model, inputs, methods=("lrp", "input_x_gradient"), own=own)

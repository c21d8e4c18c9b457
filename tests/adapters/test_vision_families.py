"""Vision families beyond the [CLS]-pooled ViT: average pooling, no class token, distilled DeiT (timm and
Hugging Face), Hugging Face DINOv2 — and the families that are refused. Tiny random models, seconds each."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_vit
from untouched import assert_untouched, snapshot
from vision_models import (
    FAMILIES,
    READOUT_TOKENS,
    hf_classifier,
    hf_dinov2,
    random_images,
    siglip2_patches,
    timm_distilled,
)

from lrp_core import METHODS, explain
from lrp_core.adapters import get_adapter
from lrp_core.errors import InputError, UnsupportedModelError


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


def _logits(model, x):
    with torch.no_grad():  # SigLIP 2 takes its processor's patch vectors
        out = model(**siglip2_patches(x)) if type(model).__name__ == "Siglip2ForImageClassification" else model(x)
    return getattr(out, "logits", out)


# ---------------------------------------------------------------- the replay is the model
@pytest.mark.parametrize("family", FAMILIES)
def test_replay_reproduces_the_logits(family):
    model, x = FAMILIES[family](), random_images()
    for method in ("raw_attention", "attnlrp", "cp_lrp"):  # the plain replay and the modified-gradient one
        assert (explain(model, x, method=method).logits - _logits(model, x)).abs().max() <= 1e-5, method


def test_dinov2_replay_at_another_resolution_interpolates_like_the_model():
    model, x = hf_dinov2(), random_images(2, (48, 40))
    exp = explain(model, x, method="transformer_attribution")
    assert (exp.logits - _logits(model, x)).abs().max() <= 1e-5
    assert exp.scores.shape == (2, 6 * 5)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_method_gives_one_finite_score_per_patch(family):
    model, x = FAMILIES[family](), random_images(2)
    for method in METHODS:
        exp = explain(model, x, method=method)
        assert exp.scores.shape == (2, 16), method
        assert torch.isfinite(exp.scores).all(), method
        if exp.pixels is not None:
            assert exp.pixels.shape == (2, 32, 32) and torch.isfinite(exp.pixels).all(), method


@pytest.mark.parametrize("family", FAMILIES)
def test_layout_names_the_tokens_the_classifier_reads(family):
    a = get_adapter(FAMILIES[family]())
    layout = a.layout(a.check_inputs(random_images(1)))
    assert layout.readout_tokens == READOUT_TOKENS[family]
    # token ablation removes every patch; the classifier's own tokens are prefix tokens here
    assert layout.ablatable().tolist() == list(range(layout.output_start, layout.num_tokens))


# ---------------------------------------------------------------- batched = one by one
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("family", FAMILIES)
def test_batch_equals_single_in_float64(family, method):
    model, x = FAMILIES[family]().double(), random_images(3).double()
    batch = explain(model, x, method=method)
    for i in range(x.shape[0]):
        one = explain(model, x[i : i + 1], method=method)
        assert rel_err(batch.scores[i : i + 1], one.scores) <= 1e-8, method
        if batch.pixels is not None:
            assert rel_err(batch.pixels[i : i + 1], one.pixels) <= 1e-8, method


# ---------------------------------------------------------------- the model is left as it was
@pytest.mark.parametrize("family", FAMILIES)
def test_model_is_untouched_by_calls_and_errors(family):
    model = FAMILIES[family]()
    model.train()  # an unusual mode must survive too
    before = snapshot(model)
    for method in METHODS:
        explain(model, random_images(1), method=method)
    with pytest.raises(InputError):
        explain(model, random_images(1, (30, 30)), method="lrp")
    with pytest.raises(InputError):
        explain(model, random_images(1), method="rollout", target=99)
    assert_untouched(before, snapshot(model))


# ---------------------------------------------------------------- readouts: same function, same map
def test_mean_over_one_token_is_reading_that_token(monkeypatch):
    """No class token, one patch: the average pooling reads that token, so every map equals the [CLS]-style
    readout's (token_ablation aside: under a mean the only token may be removed, under a selection not)."""
    from lrp_core.adapters.readouts import HeadLayer, TokenReadout
    from lrp_core.adapters.vit import TimmViTAdapter
    from lrp_core.rules.ops import LAYERNORM, LINEAR

    model = make_tiny_vit(img_size=8, global_pool="avg", class_token=False).double()
    x = random_images(2, (8, 8)).double()
    methods = [m for m in METHODS if m != "token_ablation"]
    mean = {m: explain(model, x, method=m) for m in methods}
    monkeypatch.setattr(
        TimmViTAdapter,
        "_readout",
        staticmethod(
            lambda m: TokenReadout(
                norm=m.norm, head_layers=[HeadLayer(LAYERNORM, m.fc_norm), HeadLayer(LINEAR, m.head)], index=0
            )
        ),
    )
    assert type(get_adapter(model).readout) is TokenReadout
    for m in methods:
        token = explain(model, x, method=m)
        assert torch.equal(mean[m].logits, token.logits)
        assert rel_err(mean[m].scores, token.scores) <= 1e-12, m


def _symmetric_deit_pair():
    """HF DeiT with the distillation token, its position embedding and head copies of the [CLS] ones, as a
    two-head model and as the [CLS]-only model with the same weights: the same function of the image."""
    teacher = hf_classifier("DeiTForImageClassificationWithTeacher", "DeiTConfig", seed=2).double()
    plain = hf_classifier("DeiTForImageClassification", "DeiTConfig", seed=2).double()
    with torch.no_grad():
        emb = teacher.deit.embeddings
        emb.distillation_token.copy_(emb.cls_token)
        emb.position_embeddings[:, 1].copy_(emb.position_embeddings[:, 0])
        teacher.distillation_classifier.load_state_dict(teacher.cls_classifier.state_dict())
        plain.deit.load_state_dict(teacher.deit.state_dict())
        plain.classifier.load_state_dict(teacher.cls_classifier.state_dict())
    return teacher, plain


#: methods whose map is the same for the two descriptions (docs/METHODS.md §4.3), and the factor where not 1
SAME_MAP = {
    "rollout": 1.0,
    "raw_attention": 1.0,
    "attention_gradcam": 1.0,
    "cdam": 1.0,
    "lrp": 1.0,
    "token_ablation": 1.0,
    "attnlrp": 1.0,
    "cp_lrp": 1.0,
    "partial_lrp": 0.5,
}


@pytest.mark.parametrize("method", SAME_MAP)
def test_distilled_readout_with_copied_token_and_head_gives_the_plain_map(method):
    teacher, plain = _symmetric_deit_pair()
    x = random_images(2).double()
    a, b = explain(teacher, x, method=method), explain(plain, x, method=method)
    assert rel_err(a.logits, b.logits) <= 1e-12
    assert rel_err(a.scores, SAME_MAP[method] * b.scores) <= 1e-8, method
    if a.pixels is not None:
        assert rel_err(a.pixels, b.pixels) <= 1e-8, method


# ---------------------------------------------------------------- equivalences across libraries
def _copy_blocks(t, layers) -> None:
    """timm blocks (fused qkv) -> Hugging Face ViT-style layers (q, k, v, o_proj; layernorm_before/after)."""
    for blk, layer in zip(t.blocks, layers):
        D = blk.attn.qkv.weight.shape[1]
        att = layer.attention
        for lin, w, b in zip(
            (att.q_proj, att.k_proj, att.v_proj), blk.attn.qkv.weight.split(D), blk.attn.qkv.bias.split(D)
        ):
            lin.weight.copy_(w)
            lin.bias.copy_(b)
        for dst, src in (
            (att.o_proj, blk.attn.proj),
            (layer.mlp.fc1, blk.mlp.fc1),
            (layer.mlp.fc2, blk.mlp.fc2),
            (layer.layernorm_before, blk.norm1),
            (layer.layernorm_after, blk.norm2),
        ):
            dst.load_state_dict(src.state_dict())


def _hf_teacher_from_timm(t):
    h = hf_classifier("DeiTForImageClassificationWithTeacher", "DeiTConfig")
    emb = h.deit.embeddings
    with torch.no_grad():
        emb.cls_token.copy_(t.cls_token)
        emb.distillation_token.copy_(t.dist_token)
        emb.position_embeddings.copy_(t.pos_embed)
        emb.patch_embeddings.projection.load_state_dict(t.patch_embed.proj.state_dict())
        _copy_blocks(t, h.deit.layers if hasattr(h.deit, "layers") else h.deit.encoder.layer)
        h.deit.layernorm.load_state_dict(t.norm.state_dict())
        h.cls_classifier.load_state_dict(t.head.state_dict())
        h.distillation_classifier.load_state_dict(t.head_dist.state_dict())
    return h


#: lrp goes below the attention's input: Hugging Face's three Linears meet in a three-way Clone whose
#: ε-stabilised ratios x ⊙ Σ safe_div(R_i, x) differ from timm's one fused qkv Linear at O(ε/|x|) (measured 4e-8)
EQUIVALENCE_TOL = {"lrp": 1e-6}


@pytest.mark.parametrize("method", METHODS)
def test_hf_distilled_deit_matches_timm_distilled_deit(method):
    t = timm_distilled(seed=3)
    h = _hf_teacher_from_timm(t)
    x = random_images(2)
    assert (_logits(h, x) - _logits(t, x)).abs().max() <= 1e-5
    t, h, x = t.double(), h.double(), x.double()
    a, b = explain(h, x, method=method), explain(t, x, method=method)
    tol = EQUIVALENCE_TOL.get(method, 1e-8)
    assert rel_err(a.scores, b.scores) <= tol, method
    if a.pixels is not None:
        assert rel_err(a.pixels, b.pixels) <= tol, method


# ---------------------------------------------------------------- relevance through the readouts
@pytest.mark.parametrize("family", ["timm_avg", "timm_distilled", "hf_deit_teacher", "hf_dinov2", "hf_siglip"])
def test_readout_relevance_is_conserved_and_every_rule_set_covers_it(family):
    from lrp_core.rules.composites import ATTNLRP, CP_LRP, LRP_BASELINE, TRANSFORMER_ATTRIBUTION
    from lrp_core.rules.ops import POOL

    a = get_adapter(FAMILIES[family]().double())
    prepared = a.check_inputs(random_images(2).double())
    trace = a.forward(prepared)
    R_out = torch.zeros_like(trace.logits)
    R_out[:, 1] = trace.logits[:, 1]
    for composite in (TRANSFORMER_ATTRIBUTION, LRP_BASELINE, ATTNLRP, CP_LRP):
        assert composite.rule(POOL) is not None
    head = a.readout.head_layers[-1].module
    for composite in (TRANSFORMER_ATTRIBUTION, LRP_BASELINE):
        trace = a.forward(prepared, composite=composite)
        (R,) = torch.autograd.grad(trace.logits, trace.readout_record.hidden, R_out)  # the readout's rules
        assert R.shape == trace.readout_record.hidden.shape
        # what the classifier's bias absorbs aside, the pooling and selection steps conserve
        kept = R.sum(dim=(1, 2))
        assert torch.isfinite(kept).all() and (kept != 0).all()
        if family == "timm_avg":
            assert (R[:, :1] == 0).all()  # the [CLS] token is not averaged
    assert head is not None


# ---------------------------------------------------------------- refused families say why
def _tiny_swin_v2_cr():
    from timm.models.swin_transformer_v2_cr import SwinTransformerV2Cr

    return SwinTransformerV2Cr(
        img_size=32, patch_size=4, window_size=4, embed_dim=24, depths=(1, 1), num_heads=(1, 2), num_classes=3
    ).eval()


def _hf_swin_backbone():
    from transformers import SwinConfig, SwinModel

    return SwinModel(
        SwinConfig(image_size=32, patch_size=4, embed_dim=24, depths=[1, 1], num_heads=[1, 2], window_size=4)
    ).eval()


@pytest.mark.parametrize(
    "build,words",
    [
        (_tiny_swin_v2_cr, ("windows", "merged", "SwinTransformerV2Cr", "learned temperature")),
        (_hf_swin_backbone, ("windows", "merged", "no class to explain", "Captum")),
        (lambda: make_tiny_vit(global_pool="prr"), ("global_pool='prr'", "'token'", "'avg'", "'map'")),
        (lambda: make_tiny_vit(global_pool="max", fc_norm=True), ("global_pool='max'",)),
        (lambda: hf_classifier("Dinov2ForImageClassification", "Dinov2Config", use_swiglu_ffn=True), ("SwiGLU",)),
    ],
)
def test_refused_families_say_why(build, words):
    model = build()
    with pytest.raises(UnsupportedModelError) as err:
        explain(model, random_images(1), method="rollout")
    for w in words:
        assert w in str(err.value)


@pytest.mark.parametrize("method", METHODS)
def test_dynamic_img_size_vit_explains_like_the_fixed_size_one(method):
    """timm's ``dynamic_img_size=True`` keeps the patch grid (B, h, w, D): same weights, same maps, every method."""
    fixed = make_tiny_vit().double()
    dynamic = make_tiny_vit(dynamic_img_size=True).double()
    dynamic.load_state_dict(fixed.state_dict())
    x = random_images().double()
    a = explain(fixed, x, method=method)
    b = explain(dynamic, x, method=method)
    assert torch.allclose(a.scores, b.scores, rtol=1e-10, atol=1e-12)

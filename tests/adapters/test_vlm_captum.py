"""The Captum baselines on vision-language models: attributed at the pixels and the text's word embeddings at once
(docs/METHODS.md §2g). Tiny random LLaVA (tests/vlms.py), float64."""

from __future__ import annotations

import pytest
import torch
from vlms import (
    GRID,
    IMAGE,
    gemma3_prompt,
    image_types,
    inputs,
    make_gemma3,
    make_llava,
    make_paligemma,
    make_smolvlm,
    paligemma_prompt,
    prompt,
    smol_inputs,
    smol_prompt,
    with_types,
)

from lrp_core import explain
from lrp_core.adapters import get_adapter
from lrp_core.adapters.positions import position_ids


def _rows() -> list:
    return [prompt([5, 9, 12], [30, 41, 7]), prompt([17], [8, 3])]


def _state(model: torch.nn.Module) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _by_hand(model: torch.nn.Module, x: dict, target: torch.Tensor, shift: int = 0) -> tuple:
    """Σ_channels p · ∂y/∂p (B, H, W) and e · ∂y/∂e (B, T, D) by autograd through Hugging Face's own forward: the
    gradient w.r.t. ``pixel_values`` and w.r.t. the token embedding's output (a leaf put in its place by a hook)."""
    embedding = model.get_input_embeddings()
    words = embedding(x["input_ids"]).detach().clone().requires_grad_(True)
    pixels = x["pixel_values"].clone().requires_grad_(True)
    hook = embedding.register_forward_hook(lambda m, a, out: words)
    try:
        logits = model(**dict(x, pixel_values=pixels), position_ids=position_ids(x["attention_mask"]) + shift).logits
    finally:
        hook.remove()
    read = get_adapter(model).check_inputs(x).read
    y = logits[torch.arange(len(target)), read].gather(1, target[:, None]).sum()
    g_pixels, g_words = torch.autograd.grad(y, [pixels, words])
    per_pixel = (pixels * g_pixels).sum(-3).detach()  # over the channels; SmolVLM's (B, 1, 3, H, W) has one image
    return per_pixel.flatten(0, -3) if per_pixel.dim() == 4 else per_pixel, (words * g_words).detach()


def test_input_x_gradient_is_autograd_through_the_model_at_the_pixels_and_the_text():
    """Pixels: Σ_channels p · ∂y/∂p; a text token: Σ_D e · ∂y/∂e; an image token: its patch's pixel attribution
    summed — each equal (≤ 1e-10) to autograd through the model itself, which the call leaves bit-identical."""
    model = make_llava("dinov2")
    x = inputs(_rows(), side="left")
    before = _state(model)
    ours = explain(model, x, method="input_x_gradient")
    after = _state(model)
    assert all(torch.equal(before[k], after[k]) for k in before)
    pixels, words = _by_hand(model, x, ours.target)
    assert (ours.pixels - pixels).abs().max() <= 1e-10
    ids = x["input_ids"]
    text = (ids != IMAGE) & x["attention_mask"].bool()
    assert (ours.scores[text] - words.sum(-1)[text]).abs().max() <= 1e-10
    # image tokens: row b's h × w patches in raster order are its image tokens in order (one patch each)
    B, H, W = pixels.shape
    patches = pixels.reshape(B, GRID, H // GRID, GRID, W // GRID).sum(dim=(2, 4)).reshape(B, -1)
    image = ids == IMAGE
    assert (ours.scores[image].reshape(B, -1) - patches).abs().max() <= 1e-10
    assert float(ours.scores[x["attention_mask"] == 0].abs().sum()) == 0.0
    # the scores over T hold all of it: Σ scores = Σ pixels + Σ text
    total = pixels.sum(dim=(1, 2)) + (words.sum(-1) * text).sum(-1)
    assert (ours.scores.sum(-1) - total).abs().max() <= 1e-10


def test_input_x_gradient_gives_each_row_of_a_padded_batch_its_explanation_alone():
    model = make_llava("clip", strategy="full")
    rows = [prompt([5, 9, 12], [30, 41, 7], "full"), prompt([17], [8, 3], "full")]
    x = inputs(rows, side="left")
    batch = explain(model, x, method="input_x_gradient")
    for i, r in enumerate(rows):
        one = explain(
            model,
            {k: v[i : i + 1, -len(r) :] if k != "pixel_values" else v[i : i + 1] for k, v in x.items()},
            method="input_x_gradient",
        )
        assert (batch.scores[i, -len(r) :] - one.scores[0]).abs().max() <= 1e-10
        assert (batch.pixels[i] - one.pixels[0]).abs().max() <= 1e-10


def _gemma3() -> tuple:
    x = image_types(inputs([gemma3_prompt([5, 6], [7, 8, 9]), gemma3_prompt([10], [11, 12])], side="left"))
    return make_gemma3(), x, 0


def _paligemma() -> tuple:
    (r0, t0), (r1, t1) = paligemma_prompt([5, 6, 7]), paligemma_prompt([8], [9, 10])
    return make_paligemma(2), with_types(inputs([r0, r1], side="left"), [t0, t1], "left"), 1  # positions from 1


def _smolvlm() -> tuple:
    rows = [smol_prompt([5, 6], [7, 8, 9], 1, 2), smol_prompt([10], [11, 12], 1, 2)]
    return make_smolvlm("SmolVLM"), smol_inputs(rows, side="left"), 0


@pytest.mark.parametrize("build", [_gemma3, _paligemma, _smolvlm], ids=["gemma3", "paligemma2", "smolvlm"])
def test_input_x_gradient_is_autograd_through_the_other_families(build):
    """Gemma 3 (pooled: 4 patches per image token), PaliGemma 2 and SmolVLM (pixel shuffle): the pixels and the text
    tokens' scores equal autograd through the model, and the scores over T sum to Σ pixels + Σ text."""
    model, x, shift = build()
    ours = explain(model, x, method="input_x_gradient")
    pixels, words = _by_hand(model, x, ours.target, shift)
    image_id = get_adapter(model).image_token_id
    text = (x["input_ids"] != image_id) & x["attention_mask"].bool()
    scale = float(pixels.abs().max())
    assert (ours.pixels - pixels).abs().max() <= 1e-10 * scale
    assert (ours.scores[text] - words.sum(-1)[text]).abs().max() <= 1e-10 * scale
    total = pixels.sum(dim=(1, 2)) + (words.sum(-1) * text).sum(-1)
    assert (ours.scores.sum(-1) - total).abs().max() <= 1e-10 * scale


def test_integrated_gradients_is_complete_over_the_pixels_and_the_text():
    """From zero pixels and zero text embeddings: Σ pixels + Σ text scores = y(x) − y(reference), the reference's
    logit computed through the model itself (its image features are what the tower makes of zero pixels)."""
    model = make_llava("dinov2")
    x = inputs(_rows(), side="left")
    ours = explain(model, x, method="integrated_gradients", n_steps=256)
    embedding = model.get_input_embeddings()
    text = (x["input_ids"] != IMAGE) & x["attention_mask"].bool()
    words = embedding(x["input_ids"]).detach().masked_fill(text[..., None], 0.0)
    kw = dict(position_ids=position_ids(x["attention_mask"]))
    with torch.no_grad():
        y = model(**x, **kw).logits
    hook = embedding.register_forward_hook(lambda m, a, out: words)
    try:
        with torch.no_grad():
            y0 = model(**dict(x, pixel_values=torch.zeros_like(x["pixel_values"])), **kw).logits
    finally:
        hook.remove()
    rows = torch.arange(2)  # left padding: every row is read at its last position
    drop = (y[rows, -1] - y0[rows, -1]).gather(1, ours.target[:, None])[:, 0]
    total = ours.pixels.sum(dim=(1, 2)) + (ours.scores * text).sum(-1)
    # 256 Gauss–Legendre steps leave 3e-8 of |drop| (64 steps: 1e-3); Captum's delta is that remainder, measured on
    # the replay: it equals the one measured on the model
    assert (total - drop).abs().max() <= 1e-6 * float(drop.abs().max())
    assert (total - drop - ours.convergence_delta).abs().max() <= 1e-10
    assert (ours.scores.sum(-1) - total).abs().max() <= 1e-10 * float(drop.abs().max())


def test_integrated_gradients_gives_each_row_of_a_padded_batch_its_explanation_alone():
    model = make_llava("dinov2")
    rows = _rows()
    x = inputs(rows, side="right")
    batch = explain(model, x, method="integrated_gradients", n_steps=8)
    for i, r in enumerate(rows):
        one = explain(
            model,
            {k: v[i : i + 1, : len(r)] if k != "pixel_values" else v[i : i + 1] for k, v in x.items()},
            method="integrated_gradients",
            n_steps=8,
        )
        assert (batch.scores[i, : len(r)] - one.scores[0]).abs().max() <= 1e-10
        assert (batch.pixels[i] - one.pixels[0]).abs().max() <= 1e-10

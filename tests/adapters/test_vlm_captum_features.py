"""SmoothGrad, occlusion and KernelSHAP on vision-language models, and the Captum baselines on Qwen-VL's flattened
patches (docs/METHODS.md §2g.5): each checked against the model itself (Hugging Face's forward and autograd), on
tiny random models (tests/vlms.py), float64."""

from __future__ import annotations

import pytest
import torch
from vlms import (
    GRID,
    IMAGE,
    QWEN_GRID,
    QWEN_IMAGE,
    QWEN_PATCH,
    SIZE,
    inputs,
    make_gemma3,
    make_llava,
    make_qwen_vl,
    make_smolvlm,
    model_state,
    prompt,
    qwen_inputs,
    qwen_prompt,
    relative_deviation,
    smol_inputs,
    smol_prompt,
)

from lrp_core import explain
from lrp_core.adapters.positions import position_ids
from lrp_core.errors import InputError

NEW = ("smoothgrad", "occlusion", "kernel_shap")
#: SmoothGrad's pixel noise σ over the embeddings' on a VLM (METHODS §2g.5)
PIXEL_NOISE_SCALE = 30.0
QUICK = {
    "smoothgrad": {"n_samples": 3},
    "occlusion": {},
    "kernel_shap": {"n_samples": 48},
    "input_x_gradient": {},
    "integrated_gradients": {"n_steps": 8},
}
N = QWEN_GRID[0] * QWEN_GRID[1]


def _llava() -> tuple:
    rows = [prompt([5, 9, 12], [30, 41, 7]), prompt([17], [8, 3])]
    return make_llava("dinov2"), rows


def _qwen(version: str = "2.5") -> tuple:
    return make_qwen_vl(version=version), [qwen_prompt([5, 6], [7, 8, 9]), qwen_prompt([10], [11])]


def _y(model, x: dict, target: torch.Tensor, words=None, grad: bool = False) -> torch.Tensor:
    """(B,) the target logit at the last column (left padding: every row's read position) of Hugging Face's own
    forward; ``words`` (B, T, D) stand in for the token embedding's output (a hook for this call)."""
    embedding = model.get_input_embeddings()
    hook = embedding.register_forward_hook(lambda m, a, out: words) if words is not None else None
    kw = {} if "image_grid_thw" in x else {"position_ids": position_ids(x["attention_mask"])}  # Qwen: its own
    try:
        with torch.set_grad_enabled(grad):
            logits = model(**x, **kw).logits
    finally:
        if hook is not None:
            hook.remove()
    return logits[:, -1].gather(1, target[:, None])[:, 0]


def _text(x: dict, image_id: int) -> torch.Tensor:
    return (x["input_ids"] != image_id) & x["attention_mask"].bool()


def _words(model, x: dict) -> torch.Tensor:
    return model.get_input_embeddings()(x["input_ids"]).detach()


def _qwen_raster(model) -> torch.Tensor:
    """(N,) for each patch in the processor's order its raster index, from the model's own vision position ids."""
    from transformers.vision_utils import get_vision_position_ids

    pos = get_vision_position_ids(torch.tensor([[1, *QWEN_GRID]]), model.config.vision_config.spatial_merge_size)
    return pos[:, 0] * QWEN_GRID[1] + pos[:, 1]


# ---------------------------------------------------------------------------------------- occlusion by hand
def test_occlusion_of_a_patch_and_of_a_token_is_the_logit_drop_by_hand_on_llava():
    """A patch: its pixels zeroed in ``pixel_values``; a text token: its embedding zeroed — the drop of the target
    logit through the model itself equals the patch's pixels and image token, and the token's score."""
    model, rows = _llava()
    x = inputs(rows, side="left")
    e = explain(model, x, method="occlusion")
    y = _y(model, x, e.target)
    p = SIZE // GRID
    for b, (r, col) in enumerate([(0, 0), (2, 3)]):
        pixels = x["pixel_values"].clone()
        pixels[b, :, r * p : (r + 1) * p, col * p : (col + 1) * p] = 0.0
        drop = float((y - _y(model, dict(x, pixel_values=pixels), e.target))[b])
        patch = e.pixels[b, r * p : (r + 1) * p, col * p : (col + 1) * p]
        assert (patch - drop).abs().max() <= 1e-12 * max(1.0, abs(drop))  # measured 3e-15 relative
        token = torch.nonzero(x["input_ids"][b] == IMAGE).flatten()[r * GRID + col]  # one patch per image token
        assert abs(float(e.scores[b, token]) - drop) <= 1e-10 * max(1.0, abs(drop))
        t = int(torch.nonzero(_text(x, IMAGE)[b]).flatten()[-2])  # a text token before the last
        words = _words(model, x)
        words[b, t] = 0.0
        drop = float((y - _y(model, x, e.target, words))[b])
        assert abs(float(e.scores[b, t]) - drop) <= 1e-10 * max(1.0, abs(drop))
    assert float(e.scores[x["attention_mask"] == 0].abs().sum()) == 0.0


@pytest.mark.parametrize("version", ["2.5", "2"])
def test_occlusion_of_a_patch_and_of_a_token_is_the_logit_drop_by_hand_on_qwen(version):
    """Qwen-VL: one flattened patch of ``pixel_values`` zeroed; its value lies on its (row, column) of the image
    (the model's own vision position ids), its merged image token holds its four patches' values."""
    model, rows = _qwen(version)
    x = qwen_inputs(rows, side="left")
    e = explain(model, x, method="occlusion")
    y = _y(model, x, e.target)
    raster, p, w = _qwen_raster(model), QWEN_PATCH, QWEN_GRID[1]
    for b, n in [(0, 0), (1, 13)]:
        pixels = x["pixel_values"].clone()
        pixels[b * N + n] = 0.0
        drop = float((y - _y(model, dict(x, pixel_values=pixels), e.target))[b])
        r, col = divmod(int(raster[n]), w)
        assert (e.pixels[b, r * p : (r + 1) * p, col * p : (col + 1) * p] - drop).abs().max() <= 1e-10 * max(
            1.0, abs(drop)
        )
        t = int(torch.nonzero(_text(x, QWEN_IMAGE)[b]).flatten()[1])
        words = _words(model, x)
        words[b, t] = 0.0
        drop = float((y - _y(model, x, e.target, words))[b])
        assert abs(float(e.scores[b, t]) - drop) <= 1e-10 * max(1.0, abs(drop))
    # a merged image token: its 2 × 2 patches' values (raster order: tokens row by row of the 3 × 4 merged grid)
    image = e.scores[x["input_ids"] == QWEN_IMAGE].reshape(2, QWEN_GRID[0] // 2, w // 2)
    per_patch = e.pixels[:, ::p, ::p].reshape(2, QWEN_GRID[0] // 2, 2, w // 2, 2).sum(dim=(2, 4))
    relative_deviation(image, per_patch)


# ------------------------------------------------------------------------------- KernelSHAP: efficiency
def _reference_drop(model, x: dict, target: torch.Tensor, image_id: int) -> torch.Tensor:
    """y(x) − y(zero pixels, zero text embeddings), through the model itself."""
    words = _words(model, x).masked_fill(_text(x, image_id)[..., None], 0.0)
    return _y(model, x, target) - _y(model, dict(x, pixel_values=torch.zeros_like(x["pixel_values"])), target, words)


@pytest.mark.parametrize("family", ["llava", "qwen"])
def test_kernel_shap_is_efficient_over_the_patches_and_the_tokens(family):
    """Σ of the features' values (= Σ scores over T: an image token holds its patches') is y(x) − y(reference), the
    reference computed by the model; Captum fits it through its two coalitions of weight 10⁶ and a float32
    regression: measured 1.4e-6 (LLaVA) and 6e-7 (Qwen2.5-VL) of |drop|."""
    model, rows = _llava() if family == "llava" else _qwen()
    x = (inputs if family == "llava" else qwen_inputs)(rows, side="left")
    image_id = IMAGE if family == "llava" else QWEN_IMAGE
    e = explain(model, x, method="kernel_shap", n_samples=64)
    drop = _reference_drop(model, x, e.target, image_id)
    assert (e.scores.sum(-1) - drop).abs().max() <= 1e-4 * float(drop.abs().max())
    if e.pixels is not None:  # the pixels show each patch's value on all of its pixels
        p = e.pixels.shape[-1] // (GRID if family == "llava" else QWEN_GRID[1])
        assert torch.equal(e.pixels, e.pixels[:, ::p, ::p].repeat_interleave(p, 1).repeat_interleave(p, 2))


# ----------------------------------------------------------------------- IxG, IG and SmoothGrad by autograd
def _ixg_by_hand(model, x: dict, target: torch.Tensor, words: torch.Tensor) -> tuple:
    """p · ∂y/∂p (shaped as ``pixel_values``) and e · ∂y/∂e (B, T, D) by autograd through the model itself."""
    words = words.clone().requires_grad_(True)
    pixels = x["pixel_values"].clone().requires_grad_(True)
    y = _y(model, dict(x, pixel_values=pixels), target, words, grad=True).sum()
    g_pixels, g_words = torch.autograd.grad(y, [pixels, words])
    return (pixels * g_pixels).detach(), (words * g_words).detach()


def _qwen_image(model, per_patch_values: torch.Tensor) -> torch.Tensor:
    """(B · N, F) -> (B, H, W): each patch's values summed over channels and frames, laid on its (row, column)."""
    raster, p, (h, w) = _qwen_raster(model), QWEN_PATCH, QWEN_GRID
    B = per_patch_values.shape[0] // N
    v = per_patch_values.reshape(B, N, 3, 2, p, p).sum(dim=(2, 3))[:, torch.argsort(raster)]  # raster order
    return v.reshape(B, h, w, p, p).permute(0, 1, 3, 2, 4).reshape(B, h * p, w * p)


@pytest.mark.parametrize("version", ["2.5", "2"])
def test_input_x_gradient_on_qwen_is_autograd_at_its_flattened_patches(version):
    """The pixels: Σ over channels and frames of p · ∂y/∂p laid on the image; a text token Σ_D e · ∂y/∂e; the scores
    over T sum to Σ pixels + Σ text (each merged token holds its four patches)."""
    model, rows = _qwen(version)
    x = qwen_inputs(rows, side="left")
    e = explain(model, x, method="input_x_gradient")
    pixels, words = _ixg_by_hand(model, x, e.target, _words(model, x))
    text = _text(x, QWEN_IMAGE)
    # the model's backward rotates the tower's q, k in float32 (q.float()), the replay exactly: 1e-9 of the max
    relative_deviation(e.pixels, _qwen_image(model, pixels), tol=1e-8)
    relative_deviation(e.scores * text, words.sum(-1) * text)
    total = e.pixels.sum(dim=(1, 2)) + (words.sum(-1) * text).sum(-1)
    relative_deviation(e.scores.sum(-1), total, tol=1e-8)


@pytest.mark.parametrize("version", ["2.5", "2"])
def test_integrated_gradients_on_qwen_is_complete(version):
    """Σ pixels + Σ text = y(x) − y(zero pixels, zero text embeddings) through the model, within Captum's
    convergence delta (measured on the replay: it equals the model's remainder). 32 Gauss–Legendre steps leave
    9e-6 of |drop| (Qwen2.5-VL), and the remainder less the delta is 4e-16."""
    model, rows = _qwen(version)
    x = qwen_inputs(rows, side="left")
    e = explain(model, x, method="integrated_gradients", n_steps=32)
    drop = _reference_drop(model, x, e.target, QWEN_IMAGE)
    total = e.pixels.sum(dim=(1, 2)) + (e.scores * _text(x, QWEN_IMAGE)).sum(-1)
    assert (total - drop).abs().max() <= 1e-4 * float(drop.abs().max())
    assert (total - drop - e.convergence_delta).abs().max() <= 1e-12 * float(drop.abs().max())
    relative_deviation(e.scores.sum(-1), total, tol=1e-10)


def _noise(x_row_pixels: torch.Tensor, n: int, text: int, D: int, sigma: float, seed: int = 0) -> tuple:
    """SmoothGrad's draws for one row (METHODS §2g.5): float64, a generator seeded with ``seed``, the pixels'
    noise first, then the text tokens'."""
    g = torch.Generator().manual_seed(seed)
    pixels = torch.randn((n, *x_row_pixels.shape), generator=g, dtype=torch.float64)
    return PIXEL_NOISE_SCALE * sigma * pixels, sigma * torch.randn((n, text, D), generator=g, dtype=torch.float64)


@pytest.mark.parametrize("family", ["llava", "qwen"])
def test_smoothgrad_is_the_mean_of_input_x_gradient_at_the_noisy_copies(family):
    """Each row's copies x + ε (ε on every pixel value and on the text tokens' embeddings) rebuilt from the
    documented draws; (x + ε) · ∂y/∂x at each by autograd through the model, averaged, equals the result."""
    model, rows = _llava() if family == "llava" else _qwen()
    x = (inputs if family == "llava" else qwen_inputs)(rows, side="left")
    image_id = IMAGE if family == "llava" else QWEN_IMAGE
    n, sigma = 2, 0.05
    e = explain(model, x, method="smoothgrad", n_samples=n, stdevs=sigma, batch_size=1)
    text = _text(x, image_id)
    words = _words(model, x)
    per_row = N if family == "qwen" else 1
    pixels_sum, words_sum = 0.0, 0.0
    noises = [
        _noise(
            x["pixel_values"][b * per_row : (b + 1) * per_row] if family == "qwen" else x["pixel_values"][b],
            n,
            int(text[b].sum()),
            words.shape[-1],
            sigma,
        )
        for b in range(2)
    ]
    for s in range(n):
        noisy_pixels = x["pixel_values"].clone()
        noisy_words = words.clone()
        for b, (eps_pixels, eps_words) in enumerate(noises):
            if family == "qwen":
                noisy_pixels[b * N : (b + 1) * N] += eps_pixels[s]
            else:
                noisy_pixels[b] += eps_pixels[s]
            noisy_words[b, text[b]] += eps_words[s]
        p, w = _ixg_by_hand(model, dict(x, pixel_values=noisy_pixels), e.target, noisy_words)
        pixels_sum, words_sum = pixels_sum + p, words_sum + w
    want_pixels = (_qwen_image(model, pixels_sum) if family == "qwen" else pixels_sum.sum(1)) / n
    relative_deviation(e.pixels, want_pixels, tol=1e-8)
    relative_deviation(e.scores * text, words_sum.sum(-1) / n * text, tol=1e-8)


# ------------------------------------------------------------------------------- batch = single, padding
def _alone(x: dict, i: int, row: list, side: str, qwen: bool) -> dict:
    T = x["input_ids"].shape[1]
    cols = slice(T - len(row), T) if side == "left" else slice(0, len(row))
    one = {k: x[k][i : i + 1, cols] for k in ("input_ids", "attention_mask")}
    if qwen:
        return {
            **one,
            "pixel_values": x["pixel_values"][i * N : (i + 1) * N],
            "image_grid_thw": x["image_grid_thw"][i : i + 1],
            "mm_token_type_ids": x["mm_token_type_ids"][i : i + 1, cols],
        }
    return {**one, "pixel_values": x["pixel_values"][i : i + 1]}


@pytest.mark.parametrize("family", ["llava", "qwen"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_a_padded_batch_gives_each_row_its_explanation_alone(family, side):
    model, rows = _llava() if family == "llava" else _qwen()
    x = (inputs if family == "llava" else qwen_inputs)(rows, side=side)
    T = x["input_ids"].shape[1]
    methods = NEW if family == "llava" else tuple(QUICK)
    for method in methods:
        both = explain(model, x, method=method, **QUICK[method])
        for i, row in enumerate(rows):
            alone = explain(model, _alone(x, i, row, side, family == "qwen"), method=method, **QUICK[method])
            cols = slice(T - len(row), T) if side == "left" else slice(0, len(row))
            relative_deviation(both.scores[i : i + 1, cols], alone.scores)
            relative_deviation(both.pixels[i : i + 1], alone.pixels)
            padding = torch.ones(T, dtype=torch.bool)
            padding[cols] = False
            assert float(both.scores[i, padding].abs().sum()) == 0.0


@pytest.mark.parametrize("build", ["gemma3", "smolvlm"])
def test_occlusion_and_kernel_shap_run_on_pooled_and_shuffled_towers(build):
    """Gemma 3 (4 patches per image token) and SmolVLM (pixel shuffle): occlusion's image token holds its patches'
    values (Σ scores = Σ patch values + Σ text), KernelSHAP is efficient against the model's reference drop."""
    from vlms import gemma3_prompt, image_types

    if build == "gemma3":
        model, image_id = make_gemma3(), IMAGE
        x = image_types(inputs([gemma3_prompt([5, 6], [7, 8, 9]), gemma3_prompt([10], [11, 12])], side="left"))
    else:
        model = make_smolvlm("SmolVLM")
        image_id = model.config.image_token_id
        x = smol_inputs([smol_prompt([5, 6], [7, 8, 9], 1, 2), smol_prompt([10], [11, 12], 1, 2)], side="left")
    occ = explain(model, x, method="occlusion")
    h = occ.pixels.shape[-1] // (GRID if build == "gemma3" else 8)
    text = _text(x, image_id)
    patches = occ.pixels[:, ::h, ::h].sum(dim=(1, 2))
    relative_deviation(occ.scores.sum(-1), patches + (occ.scores * text).sum(-1))
    shap = explain(model, x, method="kernel_shap", n_samples=48)
    if build == "gemma3":  # the reference through the model (SmolVLM's reference also zeroes its image tiles)
        drop = _reference_drop(model, x, shap.target, image_id)
        assert (shap.scores.sum(-1) - drop).abs().max() <= 1e-4 * float(drop.abs().max())


# ------------------------------------------------------------------------ the model, the generator, bad options
def test_every_call_leaves_the_model_and_the_global_generator_as_they_were():
    for model, x in [(make_llava("dinov2"), inputs(_llava()[1])), (make_qwen_vl(), qwen_inputs(_qwen()[1]))]:
        before, rng = model_state(model), torch.random.get_rng_state()
        for method in NEW:
            explain(model, x, method=method, **QUICK[method])
        with pytest.raises(InputError, match="baseline='zeros' only"):
            explain(model, x, method="occlusion", baseline="pad")
        after = model_state(model)
        assert all(torch.equal(before["params"][k], after["params"][k]) for k in before["params"])
        assert all(before[k] == after[k] for k in ("training", "requires_grad", "hooks"))
        assert all(a is b for a, b in zip(before["grads"], after["grads"]))
        assert torch.equal(rng, torch.random.get_rng_state())

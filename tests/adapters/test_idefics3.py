"""Idefics3 / SmolVLM (``Idefics3ForConditionalGeneration``, ``SmolVLMForConditionalGeneration``, docs/METHODS.md
§2g): the replay is the model (bucketised positions, pixel shuffle), the language-model part of every method is the
decoder's, the pixel shuffle is a permutation of the relevance, CP-LRP conserves down to the pixels, a batch is its
rows, and bad inputs are refused. Tiny random models (tests/vlms.py), float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from vlms import IMAGE, SMOL_GRID, SMOL_SIZE, make_smolvlm, model_state, relative_deviation, smol_inputs, smol_prompt

import lrp_core
from lrp_core import explain
from lrp_core.adapters import get_adapter
from lrp_core.adapters.idefics3 import bucketised_position_ids, pixel_shuffle, pixel_unshuffle
from lrp_core.adapters.positions import position_ids
from lrp_core.errors import InputError, UnsupportedModelError
from lrp_core.methods.baselines import CAPTUM_METHODS

RUN = tuple(m for m in lrp_core.METHODS if m not in get_adapter(make_smolvlm()).refused_methods)
REFUSED = ("pa_lrp",)
#: the methods whose scores are the language model's alone (the Captum baselines' image tokens hold the pixels')
LM_PART = tuple(m for m in RUN if m not in CAPTUM_METHODS)
CLASSES = ("SmolVLM", "Idefics3")


def _rows(scale: int = 2, images: int = 1) -> list:
    return [smol_prompt([5, 6], [7, 8, 9], images, scale), smol_prompt([10], [11, 12], images, scale)]


_close = relative_deviation


def _replay_deviation(model, x) -> float:
    adapter = get_adapter(model)
    prepared = adapter.check_inputs(x)
    with torch.no_grad():
        ref = model(**x, position_ids=position_ids(x["attention_mask"])).logits
        got = adapter.forward(prepared).logits
    B = x["input_ids"].shape[0]
    return float((got - ref[torch.arange(B), prepared.read]).abs().max())


def test_the_refused_methods_are_those_listed():
    assert set(REFUSED) == set(get_adapter(make_smolvlm()).refused_methods)
    assert set(RUN) | set(REFUSED) == set(lrp_core.METHODS)


def test_both_classes_get_the_adapter():
    for cls in CLASSES:
        assert type(get_adapter(make_smolvlm(cls))).__name__ == "Idefics3Adapter"


# ------------------------------------------------------------------------------------------------ (a) the replay
@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("scale", [2, 4])
@pytest.mark.parametrize("side", ["left", "right"])
def test_the_replay_gives_the_models_logits(cls, scale, side):
    model = make_smolvlm(cls, scale=scale)
    assert _replay_deviation(model, smol_inputs(_rows(scale), side=side)) <= 1e-10


@pytest.mark.parametrize("size", [16, 48])
def test_images_of_another_size_read_the_bucketised_positions(size):
    """A 4 × 4 or 12 × 12 patch grid on the 8 × 8 position grid: the position ids are bucketised (skipped or
    repeated), as the model computes them; the row holds that image's (size / 8)² image tokens."""
    model = make_smolvlm()
    n = (size // 8) ** 2
    rows = [[1, 5] + [IMAGE] * n + [7, 8], [1] + [IMAGE] * n + [11]]
    assert _replay_deviation(model, smol_inputs(rows, size=size)) <= 1e-10
    ids = bucketised_position_ids(torch.ones(1, size // 4, size // 4, dtype=torch.bool), SMOL_GRID)
    side = torch.arange(size // 4) * SMOL_GRID // (size // 4)  # floor(i · 8 / n): the bucket of i / n
    assert torch.equal(ids[0], (side[:, None] * SMOL_GRID + side[None, :]).flatten())


@pytest.mark.parametrize("cls", CLASSES)
def test_the_eager_replay_gives_the_eager_models_logits(cls):
    """Eager attention (the vision softmax in float32, cast back, as the model's kernel); one unpadded row (the
    model's own eager forward gives NaN on a left-padded float64 row)."""
    model = make_smolvlm(cls, attn="eager")
    x = smol_inputs(_rows()[:1])
    adapter = get_adapter(model)
    with torch.no_grad():
        ref = model(**x).logits[:, -1]
        got = adapter.forward(adapter.check_inputs(x)).logits
    assert (got - ref).abs().max() <= 1e-10


# ------------------------------------------------------------------------------------------- the pixel shuffle
def test_the_pixel_shuffle_is_the_models_and_its_inverse_a_permutation():
    """On a 4 × 4 grid with s = 2, token 1 is patches (0, 2), (0, 3), (1, 2), (1, 3), channels in that order (hand
    check); the shuffle equals the model's; unshuffling puts every channel back (a permutation: the relevance of
    each patch is the channels its token carried for it, the sum per token preserved)."""
    model = make_smolvlm()
    x = torch.arange(16.0, dtype=torch.float64)[None, :, None].repeat(1, 1, 3) + torch.tensor(
        [0.0, 0.1, 0.2], dtype=torch.float64
    )
    got = pixel_shuffle(x, (4, 4), 2)
    assert torch.equal(got, model.model.connector.pixel_shuffle(x, 2))
    assert torch.equal(
        got[0, 1], torch.tensor([2.0, 2.1, 2.2, 3.0, 3.1, 3.2, 6.0, 6.1, 6.2, 7.0, 7.1, 7.2], dtype=torch.float64)
    )
    assert torch.equal(pixel_unshuffle(got, (4, 4), 2), x)
    R = torch.randn(2, 16, 4 * 24, dtype=torch.float64)
    back = pixel_unshuffle(R, (8, 8), 2)
    carriers = get_adapter(model).patch_tokens((8, 8))
    per_token = torch.zeros(2, 16, dtype=torch.float64).index_add_(1, carriers, back.sum(-1))
    assert torch.allclose(per_token, R.sum(-1), rtol=1e-13, atol=0)
    assert torch.equal(torch.sort(back.flatten()).values, torch.sort(R.flatten()).values)


def test_each_patch_is_carried_by_the_token_the_model_puts_it_in():
    """``patch_tokens``: features that name their patch, shuffled by the model's own connector, land in the token
    the adapter names."""
    model = make_smolvlm(scale=4)
    x = torch.arange(64.0, dtype=torch.float64)[None, :, None].repeat(1, 1, 2)
    shuffled = model.model.connector.pixel_shuffle(x, 4)  # (1, 4, 32)
    carriers = get_adapter(model).patch_tokens((8, 8))
    for p in range(64):
        assert float(p) in shuffled[0, carriers[p]].tolist()


# ------------------------------------------------------------------ (b) the language-model part is the decoder's
def _language_model_alone(model, x0: torch.Tensor):
    from transformers import LlamaForCausalLM

    lm = LlamaForCausalLM(model.config.text_config).to(torch.float64).eval()
    lm.model.load_state_dict(model.model.text_model.state_dict())
    lm.lm_head.load_state_dict(model.lm_head.state_dict())
    B, T, D = x0.shape
    with torch.no_grad():
        lm.model.embed_tokens.weight[: B * T] = x0.reshape(B * T, D)
    return lm, torch.arange(B * T).reshape(B, T)


@pytest.mark.parametrize("cls", CLASSES)
def test_every_methods_language_model_part_is_the_decoders(cls):
    """Each method's scores, per-block token relevance and layers equal the decoder's explanation of the Llama
    language model alone on the same input embeddings ``x0`` (≤ 1e-8)."""
    model = make_smolvlm(cls)
    x = smol_inputs(_rows(), side="left")
    adapter = get_adapter(model)
    with torch.no_grad():
        x0 = adapter.embed(adapter.check_inputs(x)).x0
    lm, ids = _language_model_alone(model, x0)
    text = {"input_ids": ids, "attention_mask": x["attention_mask"]}
    for method in LM_PART:
        ours, theirs = explain(model, x, method=method), explain(lm, text, method=method)
        assert torch.equal(ours.target, theirs.target), method
        _close(ours.scores, theirs.scores, 1e-8)
        for name in ("token_relevance", "layers"):
            a, b = getattr(ours, name), getattr(theirs, name)
            assert (a is None) == (b is None), (method, name)
            if a is not None:
                _close(a, b, 1e-8)


def test_the_replays_gradient_is_the_models_down_to_the_pixels():
    """With the plain gradient as every rule, the modified-gradient pass is gradient × input of the model itself:
    its scores and pixels equal autograd through Hugging Face's own forward — the tower, the bucketised positions,
    post_layernorm, the shuffle and the projection all on the replay's graph."""
    from lrp_core.rules.composites import ATTNLRP
    from lrp_core.rules.gradient import Gradient
    from lrp_core.rules.ops import OP_KINDS

    gradient = ATTNLRP.with_rules("gradient", by_kind={kind: Gradient() for kind in OP_KINDS})
    model = make_smolvlm()
    x = smol_inputs(_rows(), side="left")
    ours = explain(model, x, method="attnlrp", composite=gradient)
    caught = {}
    hook = model.model.text_model.register_forward_pre_hook(
        lambda m, args, kw: caught.update(embeds=kw["inputs_embeds"]), with_kwargs=True
    )
    pixels = x["pixel_values"].clone().requires_grad_(True)
    try:
        logits = model(**dict(x, pixel_values=pixels), position_ids=position_ids(x["attention_mask"])).logits
    finally:
        hook.remove()
    read = get_adapter(model).check_inputs(x).read
    y = logits[torch.arange(2), read].gather(1, ours.target[:, None]).sum()
    g_embeds, g_pixels = torch.autograd.grad(y, [caught["embeds"], pixels])
    _close(ours.scores, (caught["embeds"] * g_embeds).sum(-1).detach())
    _close(ours.pixels, (pixels * g_pixels).sum(2)[:, 0].detach())


def test_position_and_contrast_are_the_decoders():
    """``position=`` (teacher forcing inside the text) and a ``Contrast`` target read as for the decoder alone."""
    model = make_smolvlm()
    x = smol_inputs(_rows(), side="right")
    adapter = get_adapter(model)
    with torch.no_grad():
        x0 = adapter.embed(adapter.check_inputs(x)).x0
    lm, ids = _language_model_alone(model, x0)
    text = {"input_ids": ids, "attention_mask": x["attention_mask"]}
    for method in ("attnlrp", "lrp", "transformer_attribution", "token_ablation"):
        kw = dict(method=method, position=[len(r) - 2 for r in _rows()], target=lrp_core.Contrast(5, 6))
        ours, theirs = explain(model, x, **kw), explain(lm, text, **kw)
        _close(ours.scores, theirs.scores, 1e-8)
        assert ours.scores[0, len(_rows()[0]) - 1 :].abs().sum() == 0  # nothing after the position read


# ------------------------------------------------------------------------------------------- (c) conservation
@pytest.mark.parametrize("cls", CLASSES)
def test_cp_lrp_conserves_from_the_logit_to_the_pixels_and_the_text(cls):
    """Bias-free model (no biases, LayerNorm shifts or position embedding): y_t = Σ text tokens + Σ pixels, and the
    image tokens' scores sum to the pixels' total, up to the float32 RMSNorm of Llama and the GELU stabiliser
    (≤ 1e-6 · |y_t|); with the additive constants kept, their share is missing well beyond that."""
    x = smol_inputs(_rows(), side="left")
    image = x["input_ids"] == IMAGE
    for bias_free in (True, False):
        e = explain(make_smolvlm(cls, bias_free=bias_free), x, method="cp_lrp")
        text = (e.scores * ~image).sum(-1)
        y = e.conservation.output.abs()
        leak = ((text + e.pixels.sum(dim=(1, 2)) - e.conservation.output).abs() / y).max()
        tower_leak = ((e.scores[image].reshape(2, -1).sum(-1) - e.pixels.sum(dim=(1, 2))).abs() / y).max()
        if bias_free:
            assert leak <= 1e-6 and tower_leak <= 1e-6, (leak, tower_leak)
            assert e.pixels.abs().sum() > 0 and text.abs().sum() > 0
        else:
            assert tower_leak > 1e-3, tower_leak


# -------------------------------------------------------------------------------------------- (d) batch = single
@pytest.mark.parametrize("side", ["left", "right"])
def test_a_padded_batch_gives_each_row_its_explanation_alone(side):
    model = make_smolvlm()
    rows = _rows()
    x = smol_inputs(rows, side=side)
    T = x["input_ids"].shape[1]
    for method in RUN:
        both = explain(model, x, method=method)
        for i, row in enumerate(rows):
            alone = explain(
                model,
                {
                    "input_ids": torch.tensor([row]),
                    "attention_mask": torch.ones(1, len(row)),
                    "pixel_values": x["pixel_values"][i : i + 1],
                },
                method=method,
            )
            cols = slice(T - len(row), T) if side == "left" else slice(0, len(row))
            _close(both.scores[i : i + 1, cols], alone.scores)
            _close(both.upsample()[i : i + 1], alone.upsample())
            if alone.pixels is not None:
                _close(both.pixels[i : i + 1], alone.pixels)


# ------------------------------------------------------------------------------------------ the image's map
def test_each_patch_gets_an_equal_share_of_its_tokens_score():
    """patch_map: patch (i, j) holds its token's score / s², the token being (i // s)·(w / s) + j // s of the
    row's image tokens, wherever the padding puts them; upsample is that map brought to the image."""
    model = make_smolvlm()
    rows = _rows()
    x = smol_inputs(rows, side="left")
    e = explain(model, x, method="attnlrp")
    T = x["input_ids"].shape[1]
    for i, row in enumerate(rows):
        start = T - len(row) + row.index(IMAGE)
        tokens = e.scores[i, start : start + 16].reshape(4, 4)
        want = tokens.repeat_interleave(2, 0).repeat_interleave(2, 1) / 4
        assert torch.allclose(e.patch_map()[i], want, rtol=1e-15, atol=0)
        up = F.interpolate(want[None, None], size=(SMOL_SIZE, SMOL_SIZE), mode="bilinear", align_corners=False)
        assert torch.allclose(e.upsample()[i], up[0, 0], rtol=1e-13, atol=1e-300)
    assert e.pixels.shape == (2, SMOL_SIZE, SMOL_SIZE)


# ------------------------------------------------------------------------------------------- padded images
def _padded(x: dict, bias_free: bool = False) -> dict:
    """Row 0's image padded as the processor pads: its last 8 pixel columns zero and masked (a 32 × 24 image, an
    8 × 6 patch grid of valid patches); row 1's not."""
    pixels, mask = x["pixel_values"].clone(), x["pixel_attention_mask"].clone()
    pixels[0, 0, :, :, 24:] = 0
    mask[0, 0, :, 24:] = 0
    return dict(x, pixel_values=pixels, pixel_attention_mask=mask)


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_a_padded_image_is_replayed_with_its_positions_and_key_mask(cls, attn):
    """The padded patches take position id 0 and are masked as keys in every tower block (they still reach the
    connector); the valid 8 × 6 patches take the buckets of i / 8 and j / 6. Without the key mask the replay would
    be off (checked: the unmasked tower's logits differ by > 1e-3)."""
    model = make_smolvlm(cls, attn=attn)
    rows = _rows()[:1] if attn == "eager" else _rows()  # eager: the model's own forward is NaN on a padded row
    x = _padded(smol_inputs(rows, side="left"))
    assert _replay_deviation(model, x) <= 1e-10
    adapter = get_adapter(model)
    prepared = adapter.check_inputs(x)
    unmasked = prepared.replace(patch_mask=None)
    with torch.no_grad():
        assert (adapter.forward(unmasked).logits - adapter.forward(prepared).logits).abs().max() > 1e-3
    ids = bucketised_position_ids(prepared.patch_mask[:, 0], SMOL_GRID)[0].reshape(8, 8)
    want = torch.arange(8)[:, None] * SMOL_GRID + (torch.arange(8) * 8 // 6)[None, :]
    assert torch.equal(ids[:, :6], want[:, :6]) and bool((ids[:, 6:] == 0).all())


@pytest.mark.parametrize("method", ["attnlrp", "cp_lrp", "lrp", "rollout", "token_ablation"])
def test_a_batch_with_a_padded_image_gives_each_row_its_explanation_alone(method):
    model = make_smolvlm()
    rows = _rows()
    x = _padded(smol_inputs(rows, side="right"))
    both = explain(model, x, method=method)
    pieces = explain(model, x, method=method, chunk_size=1)  # a row at a time: its patch mask taken with it
    _close(both.scores, pieces.scores)
    for i, row in enumerate(rows):
        alone = explain(
            model,
            {
                "input_ids": torch.tensor([row]),
                "attention_mask": torch.ones(1, len(row)),
                "pixel_values": x["pixel_values"][i : i + 1],
                "pixel_attention_mask": x["pixel_attention_mask"][i : i + 1],
            },
            method=method,
        )
        _close(both.scores[i : i + 1, : len(row)], alone.scores)
        if alone.pixels is not None:
            _close(both.pixels[i : i + 1], alone.pixels)


def test_cp_lrp_conserves_on_a_padded_image():
    x = _padded(smol_inputs(_rows(), side="left"))
    image = x["input_ids"] == IMAGE
    e = explain(make_smolvlm(bias_free=True), x, method="cp_lrp")
    y = e.conservation.output.abs()
    leak = (((e.scores * ~image).sum(-1) + e.pixels.sum(dim=(1, 2)) - e.conservation.output).abs() / y).max()
    assert leak <= 1e-6, leak


# ------------------------------------------------------------------------------- (e) the model is left as it was
_state = model_state


def test_every_call_leaves_the_model_bit_identical_and_without_hooks():
    model = make_smolvlm()
    x = smol_inputs(_rows(), side="left")
    before = _state(model)
    bad = dict(x, pixel_values=x["pixel_values"][..., :28, :28])
    calls = [(x, m) for m in lrp_core.METHODS] + [(bad, "attnlrp"), ({"input_ids": x["input_ids"]}, "lrp")]
    for given, method in calls:
        try:
            explain(model, given, method=method)
        except (InputError, UnsupportedModelError):
            assert method in REFUSED or given is not x
        after = _state(model)
        for k in before["params"]:
            assert torch.equal(before["params"][k], after["params"][k]), (method, k)
        for key in ("training", "requires_grad", "hooks"):
            assert before[key] == after[key], (method, key)
        assert all(a is b for a, b in zip(before["grads"], after["grads"])), method


def test_transformers_output_capturing_hooks_are_not_taken_for_the_users():
    """The model's own forward leaves transformers' output-capturing hooks on the vision transformer (they record
    hidden states and change nothing): an explanation after it warns of no unreflected hook; a user's hook does."""
    import warnings

    from lrp_core.errors import UnreflectedHookWarning

    model = make_smolvlm()
    x = smol_inputs(_rows(), side="left")
    with torch.no_grad():
        model(**x)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnreflectedHookWarning)
        explain(model, x, method="attnlrp")
    model.model.vision_model.encoder.layers[0].register_forward_hook(lambda m, i, o: o)
    with pytest.warns(UnreflectedHookWarning, match="vision_model.encoder.layers.0"):
        explain(model, x, method="attnlrp")


def test_explain_generation_without_the_image_is_refused_with_what_to_pass():
    """explain_generation runs on SmolVLM (tests/test_generation_vlm.py); text prompts without the processor's
    image entries are an InputError that names the processor's output."""

    class Tokenizer:
        pad_token_id = 0

        def __call__(self, texts, **kw):
            return {"input_ids": torch.tensor([[1, 5, 6]]), "attention_mask": torch.ones(1, 3, dtype=torch.long)}

    with pytest.raises(InputError, match="pixel_values"):
        lrp_core.explain_generation(make_smolvlm(), Tokenizer(), ["a prompt"], max_new_tokens=1)


# ---------------------------------------------------------------------------------------------- (f) bad inputs
def _bad_cases():
    x = smol_inputs(_rows(), side="left")
    ids = x["input_ids"]
    one_less = ids.clone()
    one_less[0, (ids[0] == IMAGE).nonzero()[0, 0]] = 7
    zero = x["pixel_values"].clone()
    zero[1, 0] = 0
    padded = x["pixel_attention_mask"].clone()
    padded[0, 0, :, 24:] = 0
    holed = x["pixel_attention_mask"].clone()
    holed[0, 0, 8:12, 8:12] = 0
    return {
        "no pixel_values": ({k: v for k, v in x.items() if k != "pixel_values"}, "pixel_values"),
        "fewer image tokens than features": (dict(x, input_ids=one_less), "image tokens"),
        "not square": (dict(x, pixel_values=x["pixel_values"][..., :24], pixel_attention_mask=None), "square"),
        "a grid the scale factor does not divide": (
            dict(x, pixel_values=x["pixel_values"][..., :28, :28], pixel_attention_mask=None),
            "scale factor 2",
        ),
        "an all-zero image": (dict(x, pixel_values=zero), "all zeros"),
        "a mask that is not a top-left rectangle": (dict(x, pixel_attention_mask=holed), "rectangle"),
        "a mask with no valid patch": (dict(x, pixel_attention_mask=torch.zeros_like(padded)), "rectangle"),
        "a mask of another shape": (dict(x, pixel_attention_mask=padded[..., :16]), "pixel_attention_mask must be"),
        "pixel_values of rank 3": (dict(x, pixel_values=x["pixel_values"][0, 0]), r"\(B, k, 3, H, W\)"),
        "image_sizes": (dict(x, image_sizes=torch.tensor([[32, 32]] * 2)), "image_sizes"),
        "inputs_embeds": (dict(x, inputs_embeds=torch.zeros(2, ids.shape[1], 32)), "inputs_embeds"),
        "a tensor, not the processor's dict": (x["pixel_values"], "processor"),
    }


@pytest.mark.parametrize("case", list(_bad_cases()))
def test_bad_inputs_are_refused_with_the_reason(case):
    given, words = _bad_cases()[case]
    with pytest.raises(InputError, match=words):
        explain(make_smolvlm(), given, method="attnlrp")


def test_flat_pixel_values_and_no_mask_are_the_same_input():
    model = make_smolvlm()
    x = smol_inputs(_rows(), side="left")
    flat = {"input_ids": x["input_ids"], "attention_mask": x["attention_mask"], "pixel_values": x["pixel_values"][:, 0]}
    assert torch.equal(explain(model, flat, method="attnlrp").scores, explain(model, x, method="attnlrp").scores)


# ------------------------------------------------------------------------------- several images per row: splitting
def test_a_split_image_is_replayed_and_scored_without_a_pixel_map():
    """Image splitting gives each row k images (crops and the global image), each with its P image tokens: the
    replay gives the model's logits, every method scores every position, CP-LRP conserves to the tokens on a
    bias-free model, pixels are not given and upsample says why."""
    model = make_smolvlm(bias_free=True)
    x = smol_inputs(_rows(images=3), side="left", images=3)
    assert _replay_deviation(model, x) <= 1e-10
    for method in ("lrp", "attnlrp", "cp_lrp", "rollout"):
        e = explain(model, x, method=method)
        assert e.pixels is None and torch.isfinite(e.scores).all()
        assert e.image_tokens.shape == (2, 3 * SMOL_GRID**2)
        with pytest.raises(InputError, match="one image per row"):
            e.upsample()
    e = explain(model, x, method="cp_lrp")
    assert ((e.scores.sum(-1) - e.conservation.output).abs() / e.conservation.output.abs()).max() <= 1e-6


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("split", [False, True])
def test_the_image_processors_output_is_explained(cls, split):
    """The model's own image processor (no download: built from its defaults, sized for the tiny tower) on a
    70 × 50 image: one 32 × 32 image, or with splitting 2 × 2 crops and the global image (k = 5), its
    pixel_attention_mask all ones; with the placeholder tokens laid out, the replay gives the model's logits."""
    import numpy as np
    import transformers
    from PIL import Image

    image = Image.fromarray((np.random.RandomState(0).rand(50, 70, 3) * 255).astype("uint8"))
    processor = getattr(transformers, f"{cls}ImageProcessor")(
        do_image_splitting=split, max_image_size={"longest_edge": SMOL_SIZE}, size={"longest_edge": 2 * SMOL_SIZE}
    )
    out = processor(images=[[image], [image]], return_tensors="pt")
    k = 5 if split else 1
    assert out["pixel_values"].shape == (2, k, 3, SMOL_SIZE, SMOL_SIZE)
    assert bool((out["pixel_attention_mask"] == 1).all())
    x = dict(smol_inputs(_rows(images=k), side="left"), **out)
    assert _replay_deviation(make_smolvlm(cls), x) <= 1e-10
    e = explain(make_smolvlm(cls), x, method="attnlrp")
    assert (e.pixels is None) == split and torch.isfinite(e.scores).all()


def test_the_global_image_of_a_split_is_the_rows_last_and_its_map_reads_its_tokens():
    """With splitting the processor puts the downscaled global image last: its patches are the last h·w entries of
    ``image_tokens``; an explanation restricted to them (``dataclasses.replace``) gives its map, each patch the
    score of its token (the row's last 16 image tokens) / 4."""
    from dataclasses import replace

    model = make_smolvlm()
    rows = _rows(images=3)
    x = smol_inputs(rows, side="left", images=3)
    e = explain(model, x, method="attnlrp")
    last = replace(e, image_tokens=e.image_tokens[:, -(SMOL_GRID**2) :])
    T = x["input_ids"].shape[1]
    for i, row in enumerate(rows):
        end = T - len(row) + len(row) - 1 - row[::-1].index(IMAGE)  # the row's last image token
        tokens = e.scores[i, end - 15 : end + 1].reshape(4, 4)
        want = tokens.repeat_interleave(2, 0).repeat_interleave(2, 1) / 4
        assert torch.allclose(last.patch_map()[i], want, rtol=1e-15, atol=0)
    assert last.upsample().shape == (2, SMOL_SIZE, SMOL_SIZE)


def test_the_widgets_show_each_patch_its_share_of_its_tokens_score():
    from widgets.views import _row

    e = explain(make_smolvlm(), smol_inputs(_rows(), side="left"), method="rollout")
    for i in range(2):
        assert torch.allclose(torch.from_numpy(_row(e[i], e.scores[i])), e.patch_map()[i], rtol=1e-15, atol=0)

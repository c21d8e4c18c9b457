"""Gemma 3 with images (``Gemma3ForConditionalGeneration``) and PaliGemma 1 / 2 (``PaliGemmaForConditionalGeneration``),
docs/METHODS.md §2g.3: the replay is the model (the bidirectional image / prefix groups of ``token_type_ids`` included),
the language-model part of every method is the decoder's, the gradient through the pooling projector and the groups
is the model's, CP-LRP conserves down to the pixels, a batch is its rows, bad inputs are refused. Tiny random models
(tests/vlms.py), float64."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from vlms import (
    GEMMA3_TOKENS,
    GRID,
    IMAGE,
    SIZE,
    gemma3_prompt,
    image_types,
    inputs,
    make_gemma3,
    make_paligemma,
    model_state,
    paligemma_prompt,
    relative_deviation,
    with_types,
)

import lrp_core
from lrp_core import explain
from lrp_core.adapters import get_adapter
from lrp_core.adapters.positions import position_ids
from lrp_core.errors import InputError, UnsupportedModelError
from lrp_core.methods.baselines import CAPTUM_METHODS

REFUSED = ("pa_lrp",)
RUN = tuple(m for m in lrp_core.METHODS if m not in REFUSED)
#: the methods whose scores are the language model's alone (the Captum baselines' image tokens hold the pixels')
LM_PART = tuple(m for m in RUN if m not in CAPTUM_METHODS)


def _gemma3_rows() -> list:
    return [gemma3_prompt([5, 6], [7, 8, 9]), gemma3_prompt([10], [11, 12])]


def _gemma3_inputs(side: str = "left", types: bool = True) -> dict:
    x = inputs(_gemma3_rows(), side=side)
    return image_types(x) if types else x


def _pali_rows() -> tuple:
    """Row 0 a prompt alone (all type 0), row 1 a prompt and a suffix (type 1)."""
    (r0, t0), (r1, t1) = paligemma_prompt([5, 6, 7]), paligemma_prompt([8], [9, 10])
    return [r0, r1], [t0, t1]


def _pali_inputs(side: str = "left") -> dict:
    rows, types = _pali_rows()
    return with_types(inputs(rows, side=side), types, side)


#: family -> (builder, inputs(side), the model's default position ids for a padded batch)
FAMILIES = {
    "gemma3": (make_gemma3, _gemma3_inputs, lambda m: position_ids(m)),
    "paligemma1": (lambda **kw: make_paligemma(1, attn="sdpa", **kw), _pali_inputs, lambda m: position_ids(m) + 1),
    "paligemma2": (lambda **kw: make_paligemma(2, **kw), _pali_inputs, lambda m: position_ids(m) + 1),
}


_close = relative_deviation


def _replay_deviation(model, x: dict, positions) -> float:
    adapter = get_adapter(model)
    prepared = adapter.check_inputs(x)
    with torch.no_grad():
        ref = model(**x, position_ids=positions(x["attention_mask"])).logits
        got = adapter.forward(prepared).logits
    return float((got - ref[torch.arange(len(got)), prepared.read]).abs().max())


def test_the_refused_methods_are_those_listed():
    for build, _, _ in FAMILIES.values():
        assert set(REFUSED) == set(get_adapter(build()).refused_methods)


# ------------------------------------------------------------------------------------------------ (a) the replay
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("side", ["left", "right"])
def test_the_replay_gives_the_models_logits(family, side):
    """With the processor's token_type_ids (Gemma 3: 1 at the image tokens; PaliGemma: 0 for the prefix, 1 for the
    suffix), both paddings, against the model's own forward at the same position ids."""
    build, make_inputs, positions = FAMILIES[family]
    assert _replay_deviation(build(), make_inputs(side), positions) <= 1e-10


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_gemma3_is_replayed_with_and_without_token_type_ids(attn):
    """Without token_type_ids Gemma 3 is causal everywhere (the model's mask then): replayed too; and the groups
    matter — the model's logits with and without them differ by far more than the replay's deviation. Right-padded:
    the model's eager attention gives NaN logits for a left-padded batch (its padding rows see no key)."""
    model = make_gemma3(attn=attn)
    assert _replay_deviation(model, _gemma3_inputs("right", types=False), position_ids) <= 1e-10
    assert _replay_deviation(model, _gemma3_inputs("right", types=True), position_ids) <= 1e-10
    with torch.no_grad():
        a = model(**_gemma3_inputs("right", types=False)).logits
        b = model(**_gemma3_inputs("right", types=True)).logits
    assert (a - b).abs().max() > 1e-2


@pytest.mark.parametrize("family,window", [("gemma3", 2), ("paligemma2", None)])
def test_each_familys_window_rule_is_the_models(family, window):
    """A sliding window bounds the pairs of a group too in Gemma 3, only the causal pairs in PaliGemma 2: the other
    rule gives other logits (measured 1e-3 and more), so the replay's choice is checked by its agreement."""
    build, make_inputs, positions = FAMILIES[family]
    model = build(window=window) if window else build()
    x = make_inputs("left")
    assert _replay_deviation(model, x, positions) <= 1e-10
    adapter = get_adapter(model)
    other = copy.copy(adapter)
    other.window_bounds_groups = not adapter.window_bounds_groups
    prepared = adapter.check_inputs(x)
    with torch.no_grad():
        assert (other.forward(prepared).logits - adapter.forward(prepared).logits).abs().max() > 1e-4


def test_paligemma_1_and_2_eager_and_the_all_causal_suffix():
    """PaliGemma 1 eager; a row whose every token is of type 1 (no prefix: causal everywhere)."""
    model = make_paligemma(1, attn="eager")
    assert _replay_deviation(model, _pali_inputs("right"), FAMILIES["paligemma1"][2]) <= 1e-10
    x = _pali_inputs("right")
    x = dict(x, token_type_ids=torch.ones_like(x["token_type_ids"]))
    for version in (1, 2):
        assert _replay_deviation(make_paligemma(version), x, FAMILIES["paligemma2"][2]) <= 1e-10


# ------------------------------------------------------------------ (b) the language-model part is the decoder's
def _language_model_alone(model, x0: torch.Tensor):
    """The VLM's language model and head as a causal LM of its text family, whose token ``b·T + t`` embeds to
    ``x0[b, t]`` (Gemma's √D scale set to 1 there): explaining it on those ids gives the decoder's explanation of the
    same input embeddings."""
    import transformers

    cfg = copy.deepcopy(model.config.text_config)
    cfg.use_bidirectional_attention = False  # PaliGemma's config turns it on; its own masks decide
    name = {"gemma3_text": "Gemma3ForCausalLM", "gemma2": "Gemma2ForCausalLM", "gemma": "GemmaForCausalLM"}
    lm = getattr(transformers, name[cfg.model_type])(cfg).to(torch.float64).eval()
    lm.model.load_state_dict(model.model.language_model.state_dict())
    lm.lm_head.load_state_dict(model.lm_head.state_dict())
    B, T, D = x0.shape
    with torch.no_grad():
        lm.model.embed_tokens.embed_scale.fill_(1.0)
        lm.model.embed_tokens.weight[: B * T] = x0.reshape(B * T, D)
    return lm, torch.arange(B * T).reshape(B, T)


@pytest.mark.parametrize("family", ["gemma3", "paligemma2"])
def test_every_methods_language_model_part_is_the_decoders(family):
    """Causal rows (Gemma 3 without token_type_ids; PaliGemma with every token of type 1): each method's scores (the
    image tokens' embeddings included), per-block token relevance and layers equal the decoder's explanation of the
    language model alone on the same input embeddings ``x0``."""
    build, make_inputs, _ = FAMILIES[family]
    model = build()
    x = make_inputs("left")
    x = (
        dict(x, token_type_ids=torch.ones_like(x["token_type_ids"]))
        if family != "gemma3"
        else {k: v for k, v in x.items() if k != "token_type_ids"}
    )
    adapter = get_adapter(model)
    with torch.no_grad():
        x0 = adapter.embed(adapter.check_inputs(x)).x0
    lm, ids = _language_model_alone(model, x0)
    # the same position ids (PaliGemma counts from 1): the float32 rotary tables differ at other angles (1e-8)
    text = {
        "input_ids": ids,
        "attention_mask": x["attention_mask"],
        "position_ids": adapter.check_inputs(x).position_ids,
    }
    for method in LM_PART:
        ours, theirs = explain(model, x, method=method), explain(lm, text, method=method)
        assert torch.equal(ours.target, theirs.target), method
        _close(ours.scores, theirs.scores, 1e-8)
        for name in ("token_relevance", "layers"):
            a, b = getattr(ours, name), getattr(theirs, name)
            assert (a is None) == (b is None), (method, name)
            if a is not None:
                _close(a, b, 1e-8)


@pytest.mark.parametrize("family", ["gemma3", "paligemma2"])
def test_the_replays_gradient_is_the_models_down_to_the_pixels(family):
    """With the plain gradient as every rule, the modified-gradient pass is gradient × input of the model itself,
    groups included: its scores and pixels equal autograd through Hugging Face's own forward (the language model's
    input embeddings caught on their way in) — the tower, post_layernorm, the pooling projector, the scatter and the
    bidirectional masks are all on the replay's graph."""
    from lrp_core.rules.composites import ATTNLRP
    from lrp_core.rules.gradient import Gradient
    from lrp_core.rules.ops import OP_KINDS

    gradient = ATTNLRP.with_rules("gradient", by_kind={kind: Gradient() for kind in OP_KINDS})
    build, make_inputs, positions = FAMILIES[family]
    model = build()
    x = make_inputs("left")
    ours = explain(model, x, method="attnlrp", composite=gradient)
    caught = {}
    hook = model.model.language_model.register_forward_pre_hook(
        lambda m, args, kw: caught.update(embeds=kw["inputs_embeds"]), with_kwargs=True
    )
    pixels = x["pixel_values"].clone().requires_grad_(True)
    try:
        logits = model(**dict(x, pixel_values=pixels), position_ids=positions(x["attention_mask"])).logits
    finally:
        hook.remove()
    read = get_adapter(model).check_inputs(x).read
    y = logits[torch.arange(2), read].gather(1, ours.target[:, None]).sum()
    g_embeds, g_pixels = torch.autograd.grad(y, [caught["embeds"], pixels])
    _close(ours.scores, (caught["embeds"] * g_embeds).sum(-1).detach())
    _close(ours.pixels, (pixels * g_pixels).sum(1).detach())


def test_token_ablation_removes_a_token_and_keeps_the_others_groups():
    """Token ablation's score of a token is y − y(the model without it): the model run on its own input embeddings
    (caught on their way into the language model) with that column cut out, its token_type_ids too, the other
    tokens' position ids kept — for an image token of a bidirectional image and for a text token. (A window longer
    than the row: the replay measures a sliding window in position ids, as for every decoder, the model in columns.)"""
    model = make_gemma3(window=64)
    x = {k: v[:1] for k, v in _gemma3_inputs("left").items()}
    e = explain(model, x, method="token_ablation")
    caught = {}
    hook = model.model.language_model.register_forward_pre_hook(
        lambda m, args, kw: caught.update(embeds=kw["inputs_embeds"]), with_kwargs=True
    )
    positions = position_ids(x["attention_mask"])
    try:
        with torch.no_grad():
            y_full = model(**x, position_ids=positions).logits[0, -1, e.target[0]]
    finally:
        hook.remove()
    row, T = _gemma3_rows()[0], x["input_ids"].shape[1]
    for col in (row.index(IMAGE) + 1, 2):
        keep = [c for c in range(T) if c != col]
        with torch.no_grad():
            y = model(
                inputs_embeds=caught["embeds"][:, keep],
                attention_mask=x["attention_mask"][:, keep],
                token_type_ids=x["token_type_ids"][:, keep],
                position_ids=positions[:, keep],
            ).logits[0, -1, e.target[0]]
        assert abs(float(e.scores[0, col]) - float(y_full - y)) <= 1e-10 * float(y_full.abs())
        assert abs(float(y_full - y)) > 1e-6


# ------------------------------------------------------------------------------------------- (c) conservation
@pytest.mark.parametrize("family", FAMILIES)
def test_cp_lrp_conserves_from_the_logit_to_the_pixels_and_the_text(family):
    """Bias-free model (no Linear / Conv biases, LayerNorm shifts or position embedding): y_t = Σ over the text
    tokens + Σ over the pixels, and the image tokens' scores sum to the pixels' total — up to the float32 round-off of
    Gemma's RMSNorms (transformers computes them in float32, the projector's too) and the identity rule's stabiliser
    at the GELUs: measured ≤ 1.2e-7 · |y_t| (the tower alone ≤ 4.3e-9). With the additive constants kept, their share
    is missing well beyond that.
    PaliGemma 2's capped logit is the one explained (the final cap takes the identity rule)."""
    build, make_inputs, _ = FAMILIES[family]
    x = make_inputs("left")
    image = x["input_ids"] == IMAGE
    for bias_free in (True, False):
        e = explain(build(bias_free=bias_free), x, method="cp_lrp")
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
@pytest.mark.parametrize("family", ["gemma3", "paligemma2"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_a_padded_batch_gives_each_row_its_explanation_alone(family, side):
    build, make_inputs, _ = FAMILIES[family]
    model = build()
    x = make_inputs(side)
    T = x["input_ids"].shape[1]
    lengths = x["attention_mask"].sum(-1).tolist()
    for method in RUN:
        # the gradient methods differentiate the model's own float32 RMSNorms: a padded batch moves the gradient by
        # float32 round-off (measured 3.6e-8 of the image map's max on Gemma 3); the other methods agree to 1e-8
        tol = 1e-7 if method in ("input_x_gradient", "integrated_gradients") else 1e-8
        both = explain(model, x, method=method)
        for i, n in enumerate(lengths):
            cols = slice(T - n, T) if side == "left" else slice(0, n)
            alone = explain(
                model,
                {
                    "input_ids": x["input_ids"][i : i + 1, cols],
                    "attention_mask": torch.ones(1, n),
                    "token_type_ids": x["token_type_ids"][i : i + 1, cols],
                    "pixel_values": x["pixel_values"][i : i + 1],
                },
                method=method,
            )
            _close(both.scores[i : i + 1, cols], alone.scores, tol)
            assert both.scores[i, : T - n].abs().sum() == 0 if side == "left" else both.scores[i, n:].abs().sum() == 0
            _close(both.upsample()[i : i + 1], alone.upsample(), tol)
            if alone.pixels is not None:
                _close(both.pixels[i : i + 1], alone.pixels, tol)


# ------------------------------------------------------------------------------------------ the image's map
def test_gemma3s_pooled_token_splits_its_score_over_its_square_of_patches():
    """Each of Gemma 3's 4 image tokens carries a 2 × 2 square of the 4 × 4 patch grid: patch_map gives each patch a
    quarter of its token's score (the layer-product methods' scores stop at the tokens); the map sums to the image
    tokens' total; upsample resizes it."""
    e = explain(make_gemma3(), _gemma3_inputs("left"), method="rollout")
    T = e.scores.shape[1]
    for i, row in enumerate(_gemma3_rows()):
        start = T - len(row) + row.index(IMAGE)
        tokens = e.scores[i, start : start + GEMMA3_TOKENS].reshape(2, 2)
        want = tokens.repeat_interleave(2, 0).repeat_interleave(2, 1) / 4
        assert torch.allclose(e.patch_map()[i], want, rtol=1e-15, atol=0)
        up = F.interpolate(e.patch_map()[i][None, None], size=(SIZE, SIZE), mode="bilinear", align_corners=False)
        assert torch.equal(e.upsample()[i], up[0, 0])
    assert e.patch_map().shape == (2, GRID, GRID)


def test_gemma3s_pooling_gives_each_square_of_patches_its_tokens_relevance():
    """The explicit pass through the projector (transformer_attribution's rules: the bias-free projection's Linear
    rule and the norms' identity keep each token's total): the relevance of image token j arrives on the k × k
    patches of its square, and only there — the pooling's weighted-sum rule. And lrp, attnlrp, cp_lrp carry it on to
    the pixels."""
    from lrp_core.adapters.replay import Replay
    from lrp_core.rules.composites import TRANSFORMER_ATTRIBUTION

    model = make_gemma3()
    adapter = get_adapter(model)
    prepared = adapter.check_inputs(_gemma3_inputs("left"))
    emb = adapter.embed(prepared, Replay(TRANSFORMER_ATTRIBUTION))  # the projector's backward is its rules
    R = torch.randn(2, GEMMA3_TOKENS, 32, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    (R_patches,) = torch.autograd.grad(emb.features, emb.selected, R)
    R_patches = R_patches.sum(-1).reshape(2, 2, 2, 2, 2)
    squares = R_patches.permute(0, 1, 3, 2, 4).reshape(2, GEMMA3_TOKENS, 4).sum(-1)  # (row, token, its patches)
    _close(squares, R.sum(-1), 1e-8)
    for method in ("lrp", "attnlrp", "cp_lrp"):
        e = explain(model, _gemma3_inputs("left"), method=method)
        assert e.pixels.shape == (2, SIZE, SIZE) and torch.isfinite(e.pixels).all() and e.pixels.abs().sum() > 0


def test_paligemmas_image_tokens_are_the_patches_in_raster_order():
    e = explain(make_paligemma(2), _pali_inputs("left"), method="attnlrp")
    T = e.scores.shape[1]
    for i, row in enumerate(_pali_rows()[0]):
        start = T - len(row)
        assert torch.equal(e.patch_map()[i], e.scores[i, start : start + GRID * GRID].reshape(GRID, GRID))
    assert e.pixels.shape == (2, SIZE, SIZE)


# ------------------------------------------------------------------------------- (e) the model is left as it was
_state = model_state


@pytest.mark.parametrize("family", ["gemma3", "paligemma2"])
def test_every_call_leaves_the_model_bit_identical_and_without_hooks(family):
    build, make_inputs, _ = FAMILIES[family]
    model = build()
    x = make_inputs("left")
    before = _state(model)
    bad = dict(x, token_type_ids=x["token_type_ids"][:, 1:])
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


@pytest.mark.parametrize("family", ["gemma3", "paligemma2"])
def test_transformers_output_capturing_hooks_are_not_taken_for_the_users(family):
    import warnings

    from lrp_core.errors import UnreflectedHookWarning

    build, make_inputs, _ = FAMILIES[family]
    model = build()
    x = make_inputs("left")
    with torch.no_grad():
        model(**x)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnreflectedHookWarning)
        explain(model, x, method="attnlrp")


# ---------------------------------------------------------------------------------------------- (f) bad inputs
def _bad_cases(family: str) -> dict:
    x = FAMILIES[family][1]("left")
    ids = x["input_ids"]
    one_less = ids.clone()
    one_less[0, (ids[0] == IMAGE).nonzero()[0, 0]] = 7
    cases = {
        "token_type_ids of another shape": (dict(x, token_type_ids=x["token_type_ids"][:, 1:]), "token_type_ids"),
        "float token_type_ids": (dict(x, token_type_ids=x["token_type_ids"].double()), "token_type_ids"),
        "fewer image tokens than features": (dict(x, input_ids=one_less), "image tokens"),
        "pixels of another size": (dict(x, pixel_values=F.pad(x["pixel_values"], (0, 7, 0, 7))), "28"),
        "image_sizes": (dict(x, image_sizes=torch.tensor([[SIZE, SIZE]] * 2)), "image_sizes"),
        "inputs_embeds": (dict(x, inputs_embeds=torch.zeros(2, ids.shape[1], 32)), "inputs_embeds"),
        "no pixel_values": ({k: v for k, v in x.items() if k != "pixel_values"}, "pixel_values"),
        "a tensor, not the processor's dict": (x["pixel_values"], "processor"),
    }
    if family.startswith("paligemma"):
        cases["no token_type_ids"] = ({k: v for k, v in x.items() if k != "token_type_ids"}, "token_type_ids")
    return cases


@pytest.mark.parametrize("family,case", [(f, c) for f in ("gemma3", "paligemma2") for c in _bad_cases(f)])
def test_bad_inputs_are_refused_with_the_reason(family, case):
    given, words = _bad_cases(family)[case]
    with pytest.raises(InputError, match=words):
        explain(FAMILIES[family][0](), given, method="attnlrp")


def test_a_position_inside_a_bidirectional_group_is_refused_and_one_after_it_is_the_decoders():
    """Gemma 3: reading at an image token that has image tokens after it is refused (the prediction there reads
    them); PaliGemma: reading inside the prefix likewise. A position after the group is explained, nothing after it
    scored."""
    model = make_gemma3()
    x = _gemma3_inputs("right")
    inside = [_gemma3_rows()[0].index(IMAGE) + 1, _gemma3_rows()[1].index(IMAGE)]
    with pytest.raises(InputError, match="both directions"):
        explain(model, x, method="attnlrp", position=inside)
    after = [r.index(IMAGE) + GEMMA3_TOKENS + 1 for r in _gemma3_rows()]  # the end-of-image tokens
    e = explain(model, x, method="attnlrp", position=after)
    assert e.scores[0, after[0] + 1 :].abs().sum() == 0
    pali = make_paligemma(2)
    with pytest.raises(InputError, match="prefix"):
        explain(pali, _pali_inputs("right"), method="attnlrp", position=[3, 3])
    last_prefix = [len(r) - 1 - (2 if i else 0) for i, r in enumerate(_pali_rows()[0])]
    explain(pali, _pali_inputs("right"), method="attnlrp", position=last_prefix)


# ------------------------------------------------------------------------------------------------ (g) refusals
def test_a_pooling_that_does_not_tile_the_patch_grid_is_refused():
    model = make_gemma3()
    model.model.multi_modal_projector.tokens_per_side = 3  # a 4 × 4 grid pooled to 3 × 3 squares of 1
    with pytest.raises(UnsupportedModelError, match="tile"):
        get_adapter(model)


def test_another_language_model_or_a_capped_gemma_3_is_refused():
    model = make_paligemma(2)
    model.config.text_config.model_type = "llama"
    with pytest.raises(UnsupportedModelError, match="gemma, gemma2"):
        get_adapter(model)
    g3 = make_gemma3()
    g3.config.text_config.attn_logit_softcapping = 5.0  # Gemma 3 with capped scores: no adapter replays that
    with pytest.raises(UnsupportedModelError, match="soft-capp"):
        get_adapter(g3)


def test_the_gemma_2_and_paligemma_refusal_rows_let_these_classes_through():
    from lrp_core.adapters import REFUSED as ROWS

    for model in (make_gemma3(), make_paligemma(1), make_paligemma(2)):
        assert not any(matches(model) for _, matches, _ in ROWS), type(model).__name__


def test_a_paligemma_2_whose_forward_does_not_cap_the_logits_is_replayed_uncapped():
    """transformers 5.17's PaliGemma forward ignored its config's final_logit_softcapping (later versions apply it):
    the replay follows the forward, not the config. A subclass with such a forward stands in for 5.17 here; its
    logits differ from the capped model's by far more than the replay's deviation."""
    from transformers import PaliGemmaForConditionalGeneration
    from transformers.modeling_outputs import CausalLMOutputWithPast

    from lrp_core.adapters.paligemma import forward_caps_logits

    class UncappedPaliGemma(PaliGemmaForConditionalGeneration):
        def forward(
            self,
            input_ids=None,
            pixel_values=None,
            attention_mask=None,
            token_type_ids=None,
            position_ids=None,
            **kwargs,
        ):
            out = self.model(
                input_ids=input_ids,
                pixel_values=pixel_values,
                attention_mask=attention_mask,
                token_type_ids=token_type_ids,
                position_ids=position_ids,
                **kwargs,
            )
            return CausalLMOutputWithPast(logits=self.lm_head(out.last_hidden_state))

    UncappedPaliGemma.__module__ = PaliGemmaForConditionalGeneration.__module__  # transformers' class, as in 5.17
    capped = make_paligemma(2)
    uncapped = UncappedPaliGemma(capped.config).eval().to(torch.float64)
    uncapped.load_state_dict(capped.state_dict())
    assert forward_caps_logits(capped) and not forward_caps_logits(uncapped)
    x, positions = _pali_inputs("left"), FAMILIES["paligemma2"][2]
    with torch.no_grad():
        gap = (capped(**x).logits - uncapped(**x).logits).abs().max()
    assert gap > 1e-2
    assert _replay_deviation(uncapped, x, positions) <= 1e-10
    assert _replay_deviation(capped, x, positions) <= 1e-10

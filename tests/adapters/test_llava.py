"""LLaVA (``LlavaForConditionalGeneration``, docs/METHODS.md §2g): the replay is the model, the language-model part
of every method is the decoder's, CP-LRP conserves down to the pixels, a batch is its rows, and bad inputs are
refused. Tiny random models (tests/vlms.py), float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from vlms import GRID, IMAGE, SIZE, inputs, make_llava, model_state, prompt, relative_deviation

import lrp_core
from lrp_core import explain
from lrp_core.adapters import get_adapter
from lrp_core.adapters.positions import position_ids
from lrp_core.errors import InputError, UnsupportedModelError
from lrp_core.methods.baselines import CAPTUM_METHODS

#: the methods that run on a VLM (pa_lrp is refused by method)
RUN = tuple(m for m in lrp_core.METHODS if m not in get_adapter(make_llava()).refused_methods)
REFUSED = ("pa_lrp",)
#: the methods whose scores are the language model's alone (the Captum baselines' image tokens hold the pixels')
LM_PART = tuple(m for m in RUN if m not in CAPTUM_METHODS)
#: (tower, vision_feature_layer, strategy)
CONFIGS = [("dinov2", -1, "default"), ("dinov2", -2, "full"), ("clip", -1, "default"), ("clip", -2, "full")]


def _rows(strategy: str = "default") -> list:
    return [prompt([5, 6], [7, 8, 9], strategy), prompt([10], [11, 12], strategy)]


_close = relative_deviation


def test_the_refused_methods_are_those_listed():
    assert set(REFUSED) == set(get_adapter(make_llava()).refused_methods)
    assert set(RUN) | set(REFUSED) == set(lrp_core.METHODS)


# ------------------------------------------------------------------------------------------------ (a) the replay
@pytest.mark.parametrize("tower,layer,strategy", CONFIGS)
@pytest.mark.parametrize("side", ["left", "right"])
def test_the_replay_gives_the_models_logits(tower, layer, strategy, side):
    """The logits at each row's read position, against the model's own forward with the same position ids
    (Hugging Face counts positions from the first column, the replay from the first real token as ``generate``)."""
    model = make_llava(tower, layer=layer, strategy=strategy)
    x = inputs(_rows(strategy), side=side)
    adapter = get_adapter(model)
    prepared = adapter.check_inputs(x)
    with torch.no_grad():
        ref = model(**x, position_ids=position_ids(x["attention_mask"])).logits
        got = adapter.forward(prepared).logits
    read = prepared.read
    assert (got - ref[torch.arange(2), read]).abs().max() <= 1e-10


@pytest.mark.parametrize("family", ["mistral", "qwen2"])
def test_the_replay_gives_the_models_logits_for_the_other_language_models(family):
    """Mistral (a sliding window shorter than the rows) and Qwen2 (q/k/v biases) as the language model."""
    model = make_llava("dinov2", family=family)
    x = inputs(_rows(), side="left")
    adapter = get_adapter(model)
    prepared = adapter.check_inputs(x)
    with torch.no_grad():
        ref = model(**x, position_ids=position_ids(x["attention_mask"])).logits
        got = adapter.forward(prepared).logits
    assert (got - ref[torch.arange(2), prepared.read]).abs().max() <= 1e-10


@pytest.mark.parametrize("tower", ["dinov2", "clip"])
def test_the_eager_replay_gives_the_eager_models_logits(tower):
    """Eager attention in the tower and the language model (Llama's and CLIP's softmax in float32, cast back, as
    Hugging Face computes them: 2e-9 off in float64 if the CLIP tower's were not)."""
    model = make_llava(tower, attn="eager")
    x = inputs([_rows()[0]])
    adapter = get_adapter(model)
    with torch.no_grad():
        ref = model(**x).logits[:, -1]
        got = adapter.forward(adapter.check_inputs(x)).logits
    assert (got - ref).abs().max() <= 1e-10


# ------------------------------------------------------------------ (b) the language-model part is the decoder's
def _language_model_alone(model, x0: torch.Tensor):
    """A LlamaForCausalLM with the VLM's language model and head, whose token ``b·T + t`` embeds to ``x0[b, t]``:
    explaining it on those ids gives the decoder's explanation of the same input embeddings."""
    from transformers import LlamaForCausalLM

    lm = LlamaForCausalLM(model.config.text_config).to(torch.float64).eval()
    lm.model.load_state_dict(model.model.language_model.state_dict())
    lm.lm_head.load_state_dict(model.lm_head.state_dict())
    B, T, D = x0.shape
    with torch.no_grad():
        lm.model.embed_tokens.weight[: B * T] = x0.reshape(B * T, D)
    return lm, torch.arange(B * T).reshape(B, T)


@pytest.mark.parametrize("tower,layer,strategy", CONFIGS[:1] + CONFIGS[3:])
def test_every_methods_language_model_part_is_the_decoders(tower, layer, strategy):
    """Each method's scores (every position, the image tokens' embeddings included), per-block token relevance and
    layers equal the decoder's explanation of the language model alone on the same input embeddings ``x0``."""
    model = make_llava(tower, layer=layer, strategy=strategy)
    x = inputs(_rows(strategy), side="left")
    adapter = get_adapter(model)
    with torch.no_grad():
        x0 = adapter.embed(adapter.check_inputs(x)).x0
    lm, ids = _language_model_alone(model, x0)
    text = {"input_ids": ids, "attention_mask": x["attention_mask"]}
    for method in LM_PART:
        ours, theirs = explain(model, x, method=method), explain(lm, text, method=method)
        assert torch.equal(ours.target, theirs.target), method
        _close(ours.scores, theirs.scores)
        for name in ("token_relevance", "layers"):
            a, b = getattr(ours, name), getattr(theirs, name)
            assert (a is None) == (b is None), (method, name)
            if a is not None:
                _close(a, b)


def test_position_and_contrast_are_the_decoders():
    """``position=`` (teacher forcing inside the text) and a ``Contrast`` target read as for the decoder alone."""
    model = make_llava("dinov2")
    x = inputs(_rows(), side="right")
    adapter = get_adapter(model)
    with torch.no_grad():
        x0 = adapter.embed(adapter.check_inputs(x)).x0
    lm, ids = _language_model_alone(model, x0)
    text = {"input_ids": ids, "attention_mask": x["attention_mask"]}
    for method in ("attnlrp", "lrp", "transformer_attribution", "token_ablation"):
        kw = dict(method=method, position=[len(r) - 2 for r in _rows()], target=lrp_core.Contrast(5, 6))
        ours, theirs = explain(model, x, **kw), explain(lm, text, **kw)
        _close(ours.scores, theirs.scores)
        assert ours.scores[0, len(_rows()[0]) - 1 :].abs().sum() == 0  # nothing after the position read


@pytest.mark.parametrize("tower,layer,strategy", [CONFIGS[1], CONFIGS[2]])
def test_the_replays_gradient_is_the_models_down_to_the_pixels(tower, layer, strategy):
    """With the plain gradient as every rule, the modified-gradient pass is gradient × input of the model itself:
    its scores and pixels equal autograd through Hugging Face's own forward (the language model's input embeddings
    caught on their way in) — the tower, the projector and the scatter are all on the replay's graph."""
    from lrp_core.rules.composites import ATTNLRP
    from lrp_core.rules.gradient import Gradient
    from lrp_core.rules.ops import OP_KINDS

    gradient = ATTNLRP.with_rules("gradient", by_kind={kind: Gradient() for kind in OP_KINDS})
    model = make_llava(tower, layer=layer, strategy=strategy)
    x = inputs(_rows(strategy), side="left")
    ours = explain(model, x, method="attnlrp", composite=gradient)
    caught = {}
    hook = model.model.language_model.register_forward_pre_hook(
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
    _close(ours.pixels, (pixels * g_pixels).sum(1).detach())


# ------------------------------------------------------------------------------------------- (c) conservation
@pytest.mark.parametrize("tower", ["dinov2", "clip"])
@pytest.mark.parametrize("strategy", ["default", "full"])
def test_cp_lrp_conserves_from_the_logit_to_the_pixels_and_the_text(tower, strategy):
    """Bias-free model (no Linear / Conv biases, LayerNorm shifts, position embeddings or [CLS]): y_t = Σ over the
    text tokens + Σ over the pixels, and the image tokens' scores sum to the pixels' total (float64) — up to the
    float32 round-off of Llama's RMSNorm (Hugging Face computes it in float32, tests/adapters/test_decoders.py) and
    the identity rule's stabiliser at the tower's and the projector's GELU: measured ≤ 2e-8 · |y_t|. With the
    additive constants kept, their share is missing well beyond that."""
    x = inputs(_rows(strategy), side="left")
    image = x["input_ids"] == IMAGE
    for bias_free in (True, False):
        e = explain(make_llava(tower, strategy=strategy, bias_free=bias_free), x, method="cp_lrp")
        text = (e.scores * ~image).sum(-1)
        y = e.conservation.output.abs()
        leak = ((text + e.pixels.sum(dim=(1, 2)) - e.conservation.output).abs() / y).max()
        tower_leak = ((e.scores[image].reshape(2, -1).sum(-1) - e.pixels.sum(dim=(1, 2))).abs() / y).max()
        if bias_free:
            assert leak <= 1e-6 and tower_leak <= 1e-6, (leak, tower_leak)
            assert ((e.scores.sum(-1) - e.conservation.output).abs() / y).max() <= 1e-6
            assert e.pixels.abs().sum() > 0 and text.abs().sum() > 0
        else:
            assert tower_leak > 1e-3, tower_leak


# -------------------------------------------------------------------------------------------- (d) batch = single
@pytest.mark.parametrize("side", ["left", "right"])
def test_a_padded_batch_gives_each_row_its_explanation_alone(side):
    model = make_llava("dinov2", strategy="default")
    rows = _rows()
    x = inputs(rows, side=side)
    T = x["input_ids"].shape[1]
    # smoothgrad, occlusion and kernel_shap: tests/adapters/test_vlm_captum_features.py, with fewer samples
    for method in (m for m in RUN if m not in ("smoothgrad", "occlusion", "kernel_shap")):
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
            assert (
                both.scores[i, : T - len(row)].abs().sum() == 0
                if side == "left"
                else both.scores[i, len(row) :].abs().sum() == 0
            )
            _close(both.upsample()[i : i + 1], alone.upsample())
            if alone.pixels is not None:
                _close(both.pixels[i : i + 1], alone.pixels)


# ------------------------------------------------------------------------------------------ the image's map
@pytest.mark.parametrize("strategy", ["default", "full"])
def test_upsample_is_the_image_tokens_scores_on_the_patch_grid(strategy):
    """patch_map reads each row's image tokens ([CLS] skipped for "full"), wherever the padding puts them."""
    model = make_llava("clip", layer=-2, strategy=strategy)
    rows = _rows(strategy)
    x = inputs(rows, side="left")
    e = explain(model, x, method="attnlrp")
    T = x["input_ids"].shape[1]
    skip = 1 if strategy == "full" else 0
    for i, row in enumerate(rows):
        start = T - len(row) + row.index(IMAGE) + skip
        want = e.scores[i, start : start + GRID * GRID].reshape(GRID, GRID)
        assert torch.equal(e.patch_map()[i], want)
        up = F.interpolate(want[None, None], size=(SIZE, SIZE), mode="bilinear", align_corners=False)[0, 0]
        assert torch.equal(e.upsample()[i], up)
    assert e.upsample().shape == (2, SIZE, SIZE) and e.pixels.shape == (2, SIZE, SIZE)
    assert torch.equal(e[1].patch_map(), e.patch_map()[1:])


def test_a_token_carrying_several_patches_splits_its_score_over_them():
    """A connector that merges patches (2 × 2 here, as a layout would name it): each of a merged token's patches
    gets a quarter of its score, in the engine's map and in the widgets' view."""
    from dataclasses import replace

    from widgets.views import _row

    e = explain(make_llava(), inputs(_rows(), side="left"), method="rollout")
    r, c = torch.div(torch.arange(GRID * GRID), GRID, rounding_mode="floor"), torch.arange(GRID * GRID) % GRID
    merged = (r // 2) * (GRID // 2) + c // 2  # patch -> its 2 × 2 token
    merged_exp = replace(e, image_tokens=e.image_tokens[:, : GRID * GRID // 4].gather(1, merged[None].expand(2, -1)))
    want = e.scores.gather(1, merged_exp.image_tokens).reshape(2, GRID, GRID) / 4
    assert torch.allclose(merged_exp.patch_map(), want, rtol=1e-15, atol=0)
    assert torch.allclose(
        merged_exp.patch_map().sum(dim=(1, 2)),
        e.scores.gather(1, e.image_tokens[:, : GRID * GRID // 4]).sum(-1),
        rtol=1e-12,
        atol=0,
    )
    assert torch.allclose(torch.from_numpy(_row(merged_exp[0], e.scores[0])), want[0], rtol=1e-15, atol=0)


def test_sources_are_spans_of_the_sequence_image_tokens_included():
    """``sources=`` and ``Explanation.by_source`` sum the token scores over spans counted from each row's first
    real token, the image tokens being tokens like the others."""
    model = make_llava("dinov2")
    rows = _rows()
    x = inputs(rows, side="left")
    spans = [(0, 3), (3, 3 + GRID * GRID)]  # bos and the text before the image; the image
    e = explain(model, x, method="attnlrp", sources=spans)
    T = x["input_ids"].shape[1]
    for i, row in enumerate(rows):
        start = T - len(row)
        want = torch.stack([e.scores[i, start + a : start + b].sum() for a, b in spans])
        assert torch.allclose(e.sources[i], want, rtol=1e-12, atol=0)
    assert torch.equal(e.by_source(spans), e.sources)


@pytest.mark.parametrize("filler", [None, 7])
def test_leave_one_out_equals_running_the_model_without_each_source(filler):
    """The source methods' ablated rows keep the images: leave-one-out of a text span = y(full) − y(the model run
    with that span removed (its tokens gone, later positions following) or replaced by ``filler``), float64."""
    model = make_llava("dinov2")
    rows = _rows()  # [bos, 5, 6, image × 16, 7, 8, 9] and [bos, 10, image × 16, 11, 12]
    x = inputs(rows, side="left")
    spans = [[(1, 3), (19, 20)], [(1, 2), (18, 19)]]  # per row: the words before the image; the first after it
    e = explain(model, x, method="leave_one_out", sources=spans, filler=filler)

    def y(seq: torch.Tensor, i: int) -> float:
        one = {
            "input_ids": seq[None],
            "attention_mask": torch.ones(1, len(seq), dtype=torch.long),
            "pixel_values": x["pixel_values"][i : i + 1],
        }
        with torch.no_grad():
            logits = model(**one, position_ids=position_ids(one["attention_mask"])).logits
        return float(logits[0, -1, e.target[i]])

    for i, row in enumerate(rows):
        ids = torch.tensor(row)
        for j, (a, b) in enumerate(spans[i]):
            kept = (
                torch.cat([ids[:a], ids[b:]])
                if filler is None
                else ids.clone().index_fill_(0, torch.arange(a, b), filler)
            )
            want = y(ids, i) - y(kept, i)
            assert abs(float(e.sources[i, j]) - want) <= 1e-10 * max(1.0, abs(want)), (
                i,
                j,
                float(e.sources[i, j]),
                want,
            )


# ------------------------------------------------------------------------------- (e) the model is left as it was
_state = model_state


def test_every_call_leaves_the_model_bit_identical_and_without_hooks():
    model = make_llava("dinov2")
    x = inputs(_rows(), side="left")
    before = _state(model)
    bad = dict(x, input_ids=x["input_ids"].masked_fill(x["input_ids"] == IMAGE, 7))
    calls = [(x, m) for m in lrp_core.METHODS] + [(bad, "attnlrp"), ({"input_ids": x["input_ids"]}, "lrp")]
    for given, method in calls:
        try:
            explain(model, given, method=method)
        except (InputError, UnsupportedModelError):
            assert method in REFUSED or given is not x
        after = _state(model)
        assert before["params"].keys() == after["params"].keys()
        for k in before["params"]:
            assert torch.equal(before["params"][k], after["params"][k]), (method, k)
        for key in ("training", "requires_grad", "hooks"):
            assert before[key] == after[key], (method, key)
        assert all(a is b for a, b in zip(before["grads"], after["grads"])), method


def test_transformers_output_capturing_hooks_are_not_taken_for_the_users():
    """LLaVA's own forward leaves transformers' output-capturing hooks on the vision tower's layers (they record
    hidden states and change nothing): an explanation after it warns of no unreflected hook."""
    import warnings

    from lrp_core.errors import UnreflectedHookWarning

    model = make_llava("dinov2")
    x = inputs(_rows(), side="left")
    with torch.no_grad():
        model(**x)
    assert any(m._forward_hooks for m in model.model.vision_tower.modules())
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnreflectedHookWarning)
        explain(model, x, method="attnlrp")
    model.model.vision_tower.encoder.layer[0].register_forward_hook(lambda m, i, o: o)  # a user's hook still is
    with pytest.warns(UnreflectedHookWarning, match="vision_tower.encoder.layer.0"):
        explain(model, x, method="attnlrp")


# ---------------------------------------------------------------------------------------------- (f) bad inputs
def _bad_cases():
    x = inputs(_rows(), side="left")
    ids = x["input_ids"]
    one_less = ids.clone()
    one_less[0, (ids[0] == IMAGE).nonzero()[0, 0]] = 7
    padded_image = dict(x, attention_mask=x["attention_mask"].clone())
    padded_image["attention_mask"][1, (ids[1] == IMAGE).nonzero()[0, 0]] = 0
    return {
        "no pixel_values": ({k: v for k, v in x.items() if k != "pixel_values"}, "pixel_values"),
        "pixel_values None": (dict(x, pixel_values=None), "pixel_values"),
        "fewer image tokens than features": (dict(x, input_ids=one_less), "image tokens"),
        "two images per row, one image's tokens": (
            dict(x, pixel_values=torch.cat([x["pixel_values"]] * 2)),
            "image tokens",
        ),
        "three images for two rows": (
            dict(x, pixel_values=torch.cat([x["pixel_values"]] * 3)[:3]),
            "same number of images",
        ),
        "an image token is padding": (padded_image, "padding"),
        "image_sizes not the image's": (dict(x, image_sizes=torch.tensor([[14, 28], [28, 28]])), "image_sizes"),
        "a feature layer given": (dict(x, vision_feature_layer=-2), "vision_feature_layer"),
        "inputs_embeds": (dict(x, inputs_embeds=torch.zeros(2, ids.shape[1], 32)), "inputs_embeds"),
        "pixels of another size": (dict(x, pixel_values=x["pixel_values"][..., :21, :21]), "image tokens"),
        "a tensor, not the processor's dict": (x["pixel_values"], "processor"),
    }


@pytest.mark.parametrize("case", list(_bad_cases()))
def test_bad_inputs_are_refused_with_the_reason(case):
    model = make_llava("dinov2")
    given, words = _bad_cases()[case]
    with pytest.raises(InputError, match=words):
        explain(model, given, method="attnlrp")


def test_image_sizes_equal_to_the_images_are_accepted():
    model = make_llava("dinov2")
    x = inputs(_rows(), side="left")
    e = explain(model, dict(x, image_sizes=torch.tensor([[SIZE, SIZE]] * 2)), method="rollout")
    assert torch.equal(e.scores, explain(model, x, method="rollout").scores)


def test_a_clip_tower_needs_its_image_size():
    model = make_llava("clip")
    x = inputs(_rows(), side="left")
    with pytest.raises(InputError, match="28"):
        explain(model, dict(x, pixel_values=F.pad(x["pixel_values"], (0, 7, 0, 7))), method="rollout")


def test_several_feature_layers_are_refused():
    model = make_llava("dinov2")
    model.config.vision_feature_layer = [-2, -1]
    with pytest.raises(UnsupportedModelError, match="one layer"):
        get_adapter(model)


def test_the_widgets_show_the_image_tokens_on_the_patch_grid():
    from widgets.views import _row

    e = explain(make_llava(), inputs(_rows(), side="left"), method="rollout")
    for i in range(2):
        assert torch.equal(torch.from_numpy(_row(e[i], e.scores[i])), e.patch_map()[i])


def test_a_subclass_from_outside_transformers_is_refused():
    from transformers import LlavaForConditionalGeneration

    class Mine(LlavaForConditionalGeneration):
        pass

    model = make_llava()
    model.__class__ = Mine
    with pytest.raises(UnsupportedModelError, match="outside transformers"):
        get_adapter(model)


# ------------------------------------------------------------------------------------------ several images per row
def _two_images():
    rows = [
        [1, 5] + [IMAGE] * GRID**2 + [6] + [IMAGE] * GRID**2 + [7, 8],
        [1] + [IMAGE] * GRID**2 + [9] + [IMAGE] * GRID**2 + [10],
    ]
    x = inputs(rows, side="left")
    x["pixel_values"] = torch.randn(
        4, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(3), dtype=torch.float64
    )  # the processor's order: row 0's two images, then row 1's
    return rows, x


def test_several_images_per_row_are_replayed_and_scored_without_a_pixel_map():
    """Two images per row: the replay gives the model's logits; every method scores every position; pixels and
    upsample (one image per row) are not given, and upsample says so; CP-LRP still conserves to the tokens."""
    model = make_llava("dinov2", bias_free=True)
    rows, x = _two_images()
    adapter = get_adapter(model)
    prepared = adapter.check_inputs(x)
    with torch.no_grad():
        ref = model(**x, position_ids=position_ids(x["attention_mask"])).logits
        got = adapter.forward(prepared).logits
    assert (got - ref[torch.arange(2), prepared.read]).abs().max() <= 1e-10
    T = x["input_ids"].shape[1]
    for method in ("lrp", "attnlrp", "cp_lrp", "rollout"):
        e = explain(model, x, method=method)
        assert e.pixels is None and e.scores.shape == (2, T) and torch.isfinite(e.scores).all()
        assert e.image_tokens.shape == (2, 2 * GRID**2)
        assert bool((x["input_ids"].gather(1, e.image_tokens) == IMAGE).all())
        with pytest.raises(InputError, match="one image per row"):
            e.upsample()
    y = e.conservation.output if (e := explain(model, x, method="cp_lrp")).conservation is not None else None
    assert ((e.scores.sum(-1) - y).abs() / y.abs()).max() <= 1e-6
    for i, row in enumerate(rows):  # a row alone, with its two images
        alone = explain(
            model,
            {
                "input_ids": torch.tensor([row]),
                "attention_mask": torch.ones(1, len(row)),
                "pixel_values": x["pixel_values"][2 * i : 2 * i + 2],
            },
            method="attnlrp",
        )
        _close(explain(model, x, method="attnlrp").scores[i : i + 1, T - len(row) :], alone.scores)

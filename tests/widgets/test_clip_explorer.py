"""ClipExplorer: a tiny random CLIPModel explained against free-text prompts."""

from __future__ import annotations

import base64
import inspect

import numpy as np
import pytest
import torch
from tiny_clip import make_clip

import lrp_core
import widgets
from lrp_core import Contrast
from lrp_core.adapters import get_adapter
from widgets import _engine
from widgets.clip import NO_CONTRAST

GRID = (4, 4)


def tiny_clip(seed: int = 0) -> torch.nn.Module:
    """The shared tiny CLIPModel with end-of-text id 2, as the word tokenizer below writes it."""
    return make_clip(seed, eos_token_id=2)


class WordTokenizer:
    """Words to ids 3..98 deterministically; [1 = bos, words…, 2 = eos], right-padded with 0."""

    def __call__(
        self, texts: list[str], padding: bool = True, truncation: bool = True, return_tensors: str = "pt"
    ) -> dict[str, torch.Tensor]:
        rows = [[1] + [3 + sum(map(ord, w)) % 96 for w in t.lower().split()][:14] + [2] for t in texts]
        T = max(len(r) for r in rows)
        ids = torch.tensor([r + [0] * (T - len(r)) for r in rows])
        return {"input_ids": ids, "attention_mask": (ids != 0).long()}


PROMPTS = ["a photo of a dog", "a cat", "a red car on the road"]


@pytest.fixture(scope="module")
def clip() -> torch.nn.Module:
    return tiny_clip()


@pytest.fixture(scope="module")
def tok() -> WordTokenizer:
    return WordTokenizer()


def reference(clip, images, tok, prompts, method, target, **kw):
    """The engine's explanation of ``images`` for ``target`` over ``prompts``."""
    inputs = dict(tok(prompts), pixel_values=images)
    return lrp_core.explain(clip, inputs, method=method, target=target, **kw)


def output(ref) -> np.ndarray:
    """What the "method output" view shows of an explanation: its pixel map, else its patch grid."""
    want = ref.pixels[0] if ref.pixels is not None else ref.scores[0].reshape(GRID)
    return want.double().numpy()


def make(clip, images, tok, **kw) -> widgets.ClipExplorer:
    w = widgets.ClipExplorer(clip, images, prompts=list(PROMPTS), tokenizer=tok, **kw)
    assert w.last_error is None, w.last_error
    return w


def test_the_selector_lists_the_prompts_with_their_probabilities(clip, images, tok):
    w = make(clip, images[:1], tok)
    logits = clip(**tok(PROMPTS), pixel_values=images[:1]).logits_per_image[0]
    probs = torch.softmax(logits, 0)
    assert w.target == int(logits.argmax())
    values = [v for _, v in w.class_selector.options]
    assert values == torch.argsort(probs, descending=True).tolist()
    for label, v in w.class_selector.options:
        assert PROMPTS[v] in label and f"{probs[v].item():.1%}" in label
    torch.testing.assert_close(w.logits[0], logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method", ["transformer_attribution", "attnlrp", "cdam", "lrp"])
def test_the_map_is_the_engines_explanation_of_the_selected_prompt(clip, images, tok, method):
    w = make(clip, images[:1], tok, methods=[method])
    for p in range(len(PROMPTS)):
        w.class_selector.value = p
        w.view_selector.value = "output"
        ref = reference(clip, images[:1], tok, PROMPTS, method, p)
        np.testing.assert_allclose(w.displayed_map, output(ref), rtol=1e-5, atol=1e-9)
        assert PROMPTS[p] in w.info.value


def test_adding_a_prompt_adds_an_option_selects_it_and_recomputes(clip, images, tok, monkeypatch):
    w = make(clip, images[:1], tok)
    calls = []
    real = _engine.explain
    monkeypatch.setattr(_engine, "explain", lambda *a, **k: calls.append(k["target"]) or real(*a, **k))
    w.prompt_box.value = "  a small bird  "
    w.add_button.click()
    assert w.last_error is None, w.last_error
    assert w.prompts == PROMPTS + ["a small bird"] and w.prompt_box.value == ""
    assert sorted(v for _, v in w.class_selector.options) == [0, 1, 2, 3]
    assert w.target == 3 and calls == [3]
    new = PROMPTS + ["a small bird"]
    logits = clip(**tok(new), pixel_values=images[:1]).logits_per_image
    torch.testing.assert_close(w.logits, logits, rtol=1e-5, atol=1e-5)
    probs = torch.softmax(logits[0], 0)
    assert any("a small bird" in lab and f"{probs[3].item():.1%}" in lab for lab, _ in w.class_selector.options)
    w.view_selector.value = "output"
    ref = reference(clip, images[:1], tok, new, w.method, 3)
    np.testing.assert_allclose(w.displayed_map, output(ref), rtol=1e-5, atol=1e-9)
    assert "a small bird" in w._title()
    w.class_selector.value = 0  # the new prompt can be contrasted with
    assert [v for _, v in w.contrast_selector.options] == [NO_CONTRAST, 1, 2, 3]
    assert w.contrast_selector.options[-1][0] == "a small bird"


def test_new_prompts_drop_the_cached_explanations(clip, images, tok, monkeypatch):
    w = make(clip, images[:1], tok)
    first = w.target
    w.add_prompt("a tree")
    calls = []
    real = _engine.explain
    monkeypatch.setattr(_engine, "explain", lambda *a, **k: calls.append(k["target"]) or real(*a, **k))
    w.class_selector.value = first  # explained before the new prompt, with other logits: computed again
    assert calls == [first]
    w.add_prompt("a tree")  # already there: selected, nothing new
    assert w.prompts.count("a tree") == 1 and w.target == 3 and w.last_error is None


def test_contrast_view_is_the_engines_contrast(clip, images, tok):
    w = make(clip, images[:1], tok, methods=["attnlrp", "rollout"])
    w.class_selector.value = 0
    assert [v for _, v in w.contrast_selector.options] == [NO_CONTRAST, 1, 2]
    w.contrast_selector.value = 2
    w.view_selector.value = "output"
    ref = reference(clip, images[:1], tok, PROMPTS, "attnlrp", Contrast(positive=0, negative=2))
    np.testing.assert_allclose(w.displayed_map, output(ref), rtol=1e-5, atol=1e-9)
    assert w.explanation.options["contrast_with"] == [2]
    assert "rather than" in w._title() and PROMPTS[2] in w.info.value
    w.view_selector.value = "residual"  # per-block views of the contrast too
    w.layer_slider.value = 1
    np.testing.assert_allclose(w.displayed_map, ref.token_relevance[0, 1, 1:].reshape(GRID).numpy(), rtol=1e-5)
    w.class_selector.value = 2  # the contrast prompt itself becomes the target: no contrast
    assert w.contrast_selector.value == NO_CONTRAST and 2 not in [v for _, v in w.contrast_selector.options]
    w.contrast_selector.value = 0
    w.method_selector.value = "rollout"  # ignores the target: the contrast is off, not an error
    assert w.contrast_selector.disabled and w.last_error is None and w.negative is None


def test_an_empty_prompt_is_an_error_and_the_widget_keeps_working(clip, images, tok):
    w = make(clip, images[:1], tok)
    before = w.displayed_map.copy()
    w.prompt_box.value = "   "
    w.add_button.click()
    assert "type a prompt" in w.last_error and "trl-error" in w.message.value
    assert w.prompts == PROMPTS and len(w.class_selector.options) == 3
    np.testing.assert_array_equal(w.displayed_map, before)
    other = next(v for _, v in w.class_selector.options if v != w.target)
    w.class_selector.value = other
    assert w.last_error is None and w.target == other


def test_a_prompt_the_tokenizer_refuses_is_an_error_and_changes_nothing(clip, images, tok):
    def refusing(texts, **kw):
        if any("bad" in t for t in texts):
            raise ValueError("cannot tokenize 'bad'")
        return tok(texts, **kw)

    w = widgets.ClipExplorer(clip, images[:1], prompts=PROMPTS, tokenizer=refusing)
    assert not w.add_prompt("a bad prompt")
    assert "cannot tokenize" in w.last_error and w.prompts == PROMPTS


def test_nothing_recomputes_when_only_the_slider_head_view_or_sign_moves(clip, images, tok, monkeypatch):
    w = make(clip, images[:1], tok)
    calls = []
    real = _engine.explain
    monkeypatch.setattr(_engine, "explain", lambda *a, **k: calls.append(k["target"]) or real(*a, **k))
    for b in (0, 1, 0):
        w.layer_slider.value = b
    w.head_selector.value = 2
    w.view_selector.value = "block"
    w.sign_toggle.value = False
    w.opacity.value = 0.3
    assert calls == []
    q = next(v for _, v in w.contrast_selector.options if v != NO_CONTRAST)
    w.contrast_selector.value = q
    assert len(calls) == 1 and isinstance(calls[0], Contrast)
    w.contrast_selector.value = NO_CONTRAST  # cached
    assert len(calls) == 1


def test_batch_of_images_and_static_png(clip, images, tok, decode_png):
    w = make(clip, images, tok)
    w.sample_selector.value = 1
    w.view_selector.value = "output"
    ref = reference(clip, images[1:2], tok, PROMPTS, w.method, w.target)
    np.testing.assert_allclose(w.displayed_map, output(ref), rtol=1e-5, atol=1e-9)
    data = w._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in data
    assert decode_png(base64.b64decode(data["image/png"])).shape[1] == w.display_size


def test_the_logits_come_from_the_engines_adapter_not_the_model(clip, images, tok, monkeypatch):
    a = get_adapter(clip)
    want = a.forward(a.check_inputs(dict(tok(PROMPTS), pixel_values=images))).logits
    real = type(clip).forward

    def forward(*args, **kwargs):  # the engine's check of its replay runs the model itself; the widget must not
        if not any("own_forward" in f.filename or "verification" in f.filename for f in inspect.stack()):
            pytest.fail("the widget called the model")
        return real(*args, **kwargs)

    monkeypatch.setattr(type(clip), "forward", forward)
    w = make(clip, images, tok)
    torch.testing.assert_close(w.logits, want)


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        (dict(prompts=[]), "at least one prompt"),
        (dict(prompts=PROMPTS, tokenizer=None), "tokenizer"),
        (dict(prompts=PROMPTS, inputs=torch.randn(1, 3, 64, 64)), "32\u00d732"),
    ],
)
def test_bad_arguments_are_readable_messages(clip, images, tok, kwargs, expected):
    kw = dict(inputs=images[:1], tokenizer=tok)
    kw.update(kwargs)
    w = widgets.ClipExplorer(clip, **kw)
    assert expected in w.last_error and list(w.children) == [w.message]


def test_the_class_explorer_points_clip_to_clip_explorer_and_back(clip, vit, images, tok):
    w = widgets.RelevanceExplorer(clip, images[:1])
    assert "ClipExplorer" in w.last_error
    w = widgets.ClipExplorer(vit, images[:1], prompts=PROMPTS, tokenizer=tok)
    assert "RelevanceExplorer" in w.last_error

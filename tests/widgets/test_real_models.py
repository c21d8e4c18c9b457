"""The widgets on the course's embedded models (minilm-sentiment, toy-vit)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import lrp_core
import widgets

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def minilm():
    from lrp_core.models import load

    return load("minilm-sentiment")


def test_token_relevance_on_minilm_merges_real_word_pieces(minilm):
    w = widgets.TokenRelevance(minilm, "an unbelievably charming film", methods=["transformer_attribution", "cdam"])
    assert w.last_error is None, w.last_error
    pieces = w.displayed_tokens
    assert pieces[0] == "[CLS]" and pieces[-1] == "[SEP]"
    assert any(p.startswith("##") for p in pieces), pieces
    w.view_selector.value = "output"
    ref = lrp_core.explain(minilm.model, w.inputs, target=w.target)
    np.testing.assert_allclose(w.displayed_map, ref.scores[0].numpy(), rtol=1e-4, atol=1e-9)
    w.word_toggle.value = "words"
    assert "unbelievably" in w.displayed_tokens
    assert not any(t.startswith("##") for t in w.displayed_tokens)
    labels = [label for label, _ in w.class_selector.options]
    assert any("positive" in s for s in labels) and any("negative" in s for s in labels)


def test_token_relevance_switches_class_and_method_on_minilm(minilm):
    w = widgets.TokenRelevance(minilm, "a dull and lifeless story", methods=["cdam"])
    first = w.displayed_map.copy()
    other = next(v for _, v in w.class_selector.options if v != w.target)
    w.class_selector.value = other
    assert w.explanation.target.item() == other
    assert not np.allclose(first, w.displayed_map)  # cdam of the other logit


def test_relevance_explorer_on_toy_vit_scenes():
    from lrp_core.data import make_scenes
    from lrp_core.models import load

    try:
        model = load("toy-vit")
    except FileNotFoundError as err:  # the weights ship with the repository
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"toy-vit weights missing in CI: {err}")
        pytest.skip(f"toy-vit weights are not built here: {err}")
    scenes = make_scenes(2, seed=0)
    w = widgets.RelevanceExplorer(model, scenes.images, image=scenes.rgb)
    assert w.last_error is None, w.last_error
    h, w_ = model.model.patch_embed.grid_size
    assert w.displayed_map.shape == (h, w_)
    assert [n for n in model.labels] == w.names
    w.view_selector.value = "output"
    ref = lrp_core.explain(model.model, scenes.images[:1], target=w.target)
    np.testing.assert_allclose(w.displayed_map, ref.patch_map()[0].numpy(), rtol=1e-4, atol=1e-9)

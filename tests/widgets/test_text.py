"""TokenRelevance driven programmatically: tokens, words, views and errors."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import lrp_core
import widgets
from lrp_core.viz import merge_wordpieces

TEXTS = ["the film was unbelievably good", "a bad story"]


@pytest.fixture(scope="module")
def text_widget(bert, tokenizer):
    w = widgets.TokenRelevance(bert, texts=TEXTS, tokenizer=tokenizer)
    assert w.last_error is None, w.last_error
    return w


def test_tokens_are_the_real_word_pieces(text_widget):
    assert text_widget.displayed_tokens == ["[CLS]", "the", "film", "was", "un", "##believ", "##ably", "good", "[SEP]"]
    assert len(re.findall('class="trl-token"', text_widget.html.value)) == 9


def test_output_view_equals_the_engine_scores(bert, text_widget):
    text_widget.view_selector.value = "output"
    text_widget.word_toggle.value = "pieces"
    text_widget.sign_toggle.value = True
    ref = lrp_core.explain(bert, {k: v[:1] for k, v in text_widget.inputs.items()}, target=text_widget.target)
    np.testing.assert_allclose(text_widget.displayed_map, ref.scores[0, :9].numpy(), rtol=1e-5)


def test_words_view_merges_pieces_by_their_max(text_widget):
    text_widget.view_selector.value = "residual"
    text_widget.layer_slider.value = 1
    text_widget.word_toggle.value = "pieces"
    pieces, values = list(text_widget.displayed_tokens), text_widget.displayed_map.copy()
    text_widget.word_toggle.value = "words"
    assert text_widget.displayed_tokens == ["[CLS]", "the", "film", "was", "unbelievably", "good", "[SEP]"]
    want_words, want = merge_wordpieces(pieces, values, reduce="max")
    assert text_widget.displayed_tokens == want_words
    np.testing.assert_allclose(text_widget.displayed_map, want)
    assert text_widget.displayed_map[4] == values[4:7].max()
    text_widget.word_toggle.value = "pieces"


def test_accumulated_view_replaces_cls_by_the_row_minimum(bert, text_widget):
    text_widget.view_selector.value = "accumulated"
    text_widget.layer_slider.value = 1
    ref = lrp_core.explain(bert, {k: v[:1] for k, v in text_widget.inputs.items()}, target=text_widget.target)
    prod = lrp_core.methods.products.accumulate(ref.layers, 0, 1, norm="row")[0, 0, :9].numpy()
    want = prod.copy()
    want[0] = prod.min()
    np.testing.assert_allclose(text_widget.displayed_map, want, rtol=1e-5)
    # the full product from block 0 is the method's own output
    np.testing.assert_allclose(text_widget.displayed_map, ref.scores[0, :9].numpy(), rtol=1e-4)


def test_generic_attention_product_is_the_engines_unnormalised_one(bert, tokenizer):
    w = widgets.TokenRelevance(bert, texts=TEXTS[:1], tokenizer=tokenizer, methods=["generic_attention"])
    w.view_selector.value = "accumulated"
    w.layer_slider.value = w.layer_slider.max
    ref = lrp_core.explain(bert, w.inputs, method="generic_attention", target=w.target)
    # every token but [CLS], whose entry the view replaces by the row minimum; the tiny model's
    # Ā_b are small, so normalised factors would differ by ~3e-5 (relative) only
    np.testing.assert_allclose(w.displayed_map[1:], ref.scores[0, 1:].numpy(), rtol=1e-5, atol=0)


def test_second_sample_has_its_own_tokens(text_widget):
    text_widget.sample_selector.value = 1
    assert text_widget.displayed_tokens == ["[CLS]", "a", "bad", "story", "[SEP]"]
    assert len(text_widget.displayed_map) == 5
    text_widget.sample_selector.value = 0


def test_positive_view_clamps(text_widget):
    text_widget.method_selector.value = "cdam"  # gradient x input: both signs
    text_widget.sign_toggle.value = True
    signed = text_widget.displayed_map.copy()
    assert (signed < 0).any(), "the test needs negative relevance"
    text_widget.sign_toggle.value = False
    np.testing.assert_array_equal(text_widget.displayed_map, np.clip(signed, 0, None))
    text_widget.sign_toggle.value = True
    text_widget.method_selector.value = "transformer_attribution"


def test_typing_a_new_text_explains_it(bert, tokenizer):
    w = widgets.TokenRelevance(bert, "the film was good", tokenizer=tokenizer)
    w.text_box.value = "a story playing"
    assert w.last_error is None
    assert w.displayed_tokens == ["[CLS]", "a", "story", "play", "##ing", "[SEP]"]
    w.text_box.value = "   "
    assert "empty" in w.last_error and "trl-error" in w.message.value


def test_labels_come_from_the_config(text_widget):
    names = [label for label, _ in text_widget.class_selector.options]
    assert any("positive" in n for n in names) and any("negative" in n for n in names)


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        (dict(texts=[""]), "empty"),
        (dict(texts="hello"), "tokenizer"),
        (dict(inputs={"input_ids": torch.zeros(1, 0, dtype=torch.long)}), "empty"),
        (dict(inputs=torch.randn(1, 3, 32, 32)), "dict"),
    ],
)
def test_bad_text_input_is_a_readable_message(bert, tokenizer, kwargs, expected):
    if kwargs.get("texts") == [""]:
        kwargs = dict(kwargs, tokenizer=tokenizer)
    w = widgets.TokenRelevance(bert, **kwargs)
    assert expected in w.last_error
    assert "trl-error" in w.message.value


def test_image_model_is_refused_with_a_pointer_to_the_image_widget(vit, tokenizer):
    w = widgets.TokenRelevance(vit, "the film", tokenizer=tokenizer)
    assert "RelevanceExplorer" in w.last_error


def test_static_fallback_is_html_with_the_coloured_tokens(text_widget):
    data = text_widget._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in data
    assert "trl-token" in data["text/html"]

"""SimilarityExplorer: a thin client of lrp_core.bilrp — its table is the engine's R, its controls recompute."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

pytest.importorskip("ipywidgets")

from lrp_core import bilrp  # noqa: E402
from widgets import SimilarityExplorer  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    """A tiny BertModel over the real uncased word pieces (the embedded MiniLM tokenizer)."""
    from transformers import BertConfig, BertModel

    from lrp_core.models.minilm import load_tokenizer

    tok = load_tokenizer()
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=tok.vocab_size,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
    )
    return BertModel(cfg).eval(), tok


def _titles(html: str) -> list[float]:
    return [float(v) for v in re.findall(r'class="trl-pair" title="[^"]*: ([-+0-9.e]+)"', html)]


def test_the_table_is_the_engines_map(tiny):
    model, tok = tiny
    w = SimilarityExplorer(model, tok, "a cat sat", "the dog ran away", pooling="mean", normalise=True)
    assert w.last_error is None, w.last_error
    a, b = (dict(tok([s], return_tensors="pt")) for s in ("a cat sat", "the dog ran away"))
    R = bilrp(model, a, b, pooling="mean", normalise=True).pair(0).numpy()
    assert R.shape == (5, 6)
    got = np.array(_titles(w.html.value)).reshape(R.shape)
    assert np.allclose(got, R, rtol=1e-3, atol=1e-4 * np.abs(R).max()), "each cell's tooltip is its R_ij"
    assert "[CLS] ↔ [CLS]" in w.html.value and "cat ↔ dog" in w.html.value
    assert f"{float(R.sum()):.4g}" in w.info.value


def test_typing_a_sentence_or_choosing_a_method_recomputes(tiny):
    model, tok = tiny
    w = SimilarityExplorer(model, tok, "a cat sat", "the dog ran away", pooling="mean")
    first = w.html.value
    w.b_box.value = "birds fly"
    assert w.last_error is None and w.result.scores.shape == (1, 5, 4) and w.html.value != first
    w.method.value = "input_x_gradient"
    assert w.result.method == "input_x_gradient"


def test_an_error_is_shown_not_raised_and_the_static_view_is_the_table(tiny):
    model, tok = tiny
    w = SimilarityExplorer(model, tok, "a cat sat", "the dog", pooling="pooler")
    assert w.last_error is None
    assert "trl-pair" in w._repr_mimebundle_()["text/html"]
    w2 = SimilarityExplorer(model, tok, "a cat", "a dog", pooling="nonsense")
    assert w2.last_error is not None and "pooling" in w2.last_error and w2.result is None


def test_token_relevance_shows_a_similaritys_words(tiny):
    """TokenRelevance with a Similarity target: the map of cos(e(x), e_ref), its words, one row per text."""
    from lrp_core import Similarity, explain
    from widgets import TokenRelevance

    model, tok = tiny
    x = dict(tok(["a cat sat on the mat", "dogs run"], padding=True, return_tensors="pt"))
    ref = torch.randn(2, 16)
    w = TokenRelevance(model, x, tokenizer=tok, methods=["cp_lrp", "attnlrp"], target=Similarity(ref, "mean"))
    assert w.last_error is None, w.last_error
    assert w.class_selector.options == (("the similarity", 0),)
    want = explain(model, {k: v[:1] for k, v in x.items()}, method="cp_lrp", target=Similarity(ref[0], "mean"))
    assert np.allclose(w.displayed_map, want.scores[0].numpy(), rtol=1e-5, atol=1e-7)
    assert "for the similarity" in w.html.value
    w.sample_selector.value = 1
    n = int(x["attention_mask"][1].sum())
    want = explain(model, {k: v[1:, :n] for k, v in x.items()}, method="cp_lrp", target=Similarity(ref[1], "mean"))
    assert np.allclose(w.displayed_map, want.scores[0].numpy(), rtol=1e-5, atol=1e-7)

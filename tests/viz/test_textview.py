"""Tokens as people read them, and the self-contained generation heat map."""

import re

import numpy as np
import pytest

from lrp_core.errors import InputError
from lrp_core.viz.text import generation_html, merge_words, page, readable


@pytest.mark.parametrize(
    "piece, text",
    [("Ġcat", " cat"), ("▁Rome", " Rome"), ("Ċ", "\n"), ("##ly", "ly"), ("plain", "plain"), ("<s>", "<s>")],
)
def test_readable(piece, text):
    assert readable(piece) == text


def test_merge_byte_level_keeps_the_total():
    words, s = merge_words(["<s>", "ĠThe", "Ġcap", "ital", "Ġof", "ĠItaly"], [1.0, 2.0, 3.0, 4.0, 5.0, -6.0])
    assert words == ["<s>", " The", " capital", " of", " Italy"]
    np.testing.assert_allclose(s, [1, 2, 7, 5, -6])
    assert s.sum() == pytest.approx(9.0)


def test_merge_sentencepiece_and_wordpiece():
    assert merge_words(["▁Rome", "▁is", "▁beau", "tiful"])[0] == [" Rome", " is", " beautiful"]
    words, s = merge_words(["[CLS]", "un", "##like", "##ly", "[SEP]"], [0, 1, 5, 2, 0], reduce="max")
    assert words == ["[CLS]", "unlikely", "[SEP]"] and list(s) == [0, 5, 0]


def test_merge_word_level_pieces_stay_words():
    """A word-level tokenizer (tiny-lm's) marks no word starts: every piece is a word, none is joined."""
    from lrp_core.data.facts import make_facts
    from lrp_core.models.tiny_lm import build_tokenizer

    tok = build_tokenizer()
    record = make_facts(1, seed=3)[0]
    pieces = tok.convert_ids_to_tokens(tok(record.prompt)["input_ids"])
    scores = np.arange(len(pieces), dtype=float)
    words, s = merge_words(pieces, scores)
    assert words == ["<s>"] + record.words
    np.testing.assert_array_equal(s, scores)
    assert merge_words(["Ġa", "b"], scheme="words")[0] == [" a", "b"]  # asked for explicitly, marks are ignored


def test_merge_errors():
    with pytest.raises(InputError, match="pieces but"):
        merge_words(["a", "b"], [1.0])
    with pytest.raises(InputError, match="reduce"):
        merge_words(["a"], [1.0], reduce="mean")
    with pytest.raises(InputError, match="'words'"):
        merge_words(["a"], [1.0], scheme="bpe")


def _cells(html_text):
    return re.findall(r'<span class="c( off)?"(?: style="background:rgb\((\d+),(\d+),(\d+)\))?', html_text)


def test_heat_map_colours_and_greyed_positions():
    context = ["<s>", "ĠA", "Ġb", "Ġc", "Ġd"]  # P = 4 prompt tokens, K = 2 generated (the last is not context)
    scores = np.array([[1.0, -2.0, 3.0, 0.0, 0.0], [0.0, 0.5, -0.5, 2.0, 0.0]])
    out = generation_html(context, ["Ġd", "Ġe"], scores, clip=None)
    cells = _cells(out)
    assert len(cells) == 10
    first, second = cells[:5], cells[5:]
    assert [c[0] for c in first] == ["", "", "", "", " off"]  # step 1 sees the 4 prompt tokens
    assert [c[0] for c in second] == ["", "", "", "", ""]  # step 2 also sees the first generated token
    red = tuple(map(int, first[2][1:]))
    blue = tuple(map(int, first[1][1:]))
    assert red[0] > red[2] and blue[2] > blue[0]  # positive red, negative blue
    assert tuple(map(int, first[3][1:])) == (255, 255, 255)  # zero is white
    assert "rather than" not in out


def test_heat_map_checks_shapes_and_is_self_contained(tmp_path):
    with pytest.raises(InputError, match="expected"):
        generation_html(["a", "b"], ["c"], np.zeros((2, 2)))
    doc = page(generation_html(["a", "b", "c"], ["c", "d"], np.ones((2, 3)), contrasts=["x", None]))
    assert "rather than x" in doc
    assert not re.search(r"<script|<link|@import|https?://", doc)

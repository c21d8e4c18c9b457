"""The shipped rationale set is well-formed, balanced and self-consistent; the loader rejects bad files."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from lrp_core.data.rationales import (
    DEFAULT_PATH,
    RationaleFormatError,
    load_rationales,
    make_record,
    tokenize,
)


@pytest.fixture(scope="module")
def records():
    return load_rationales()


def test_size_and_balance(records) -> None:
    assert len(records) >= 200
    counts = Counter(r.label for r in records)
    assert set(counts) == {0, 1}
    assert abs(counts[0] - counts[1]) <= len(records) * 0.05, counts


def test_every_record_has_a_rationale_and_is_short(records) -> None:
    for r in records:
        assert len(r.words) == len(r.rationale) == len(r.offsets)
        assert any(r.rationale), r.id
        assert not all(r.rationale), r.id  # a rationale selects, it is not the whole text
        assert len(r.words) <= 60, r.id  # 1-2 sentences
        assert r.text.count(".") + r.text.count("!") + r.text.count("?") <= 3, r.id


def test_words_match_text_and_evidence_text(records) -> None:
    raw = [json.loads(line) for line in DEFAULT_PATH.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(raw) == len(records)
    for obj, r in zip(raw, records):
        assert r.id == obj["annotation_id"] and r.text == obj["text"]
        # every word sits at its offsets in the text
        for w, (a, b) in zip(r.words, r.offsets):
            assert r.text[a:b] == w
        for ev in obj["evidences"]:
            s, e = ev["start_token"], ev["end_token"]
            assert ev["text"] == r.text[r.offsets[s][0] : r.offsets[e - 1][1]]
            assert ev["text"].startswith(r.words[s]) and ev["text"].endswith(r.words[e - 1])
            assert all(r.rationale[s:e])
        # the mask is exactly the union of the evidence spans
        union = {k for ev in obj["evidences"] for k in range(ev["start_token"], ev["end_token"])}
        assert {k for k, m in enumerate(r.rationale) if m} == union


def test_texts_are_distinct_and_varied(records) -> None:
    texts = [r.text.lower() for r in records]
    assert len(set(texts)) == len(texts)
    # not a template generator: no opening of three words is shared by more than 5 % of the texts
    openings = Counter(" ".join(r.words[:3]).lower() for r in records)
    assert openings.most_common(1)[0][1] <= 0.05 * len(records), openings.most_common(3)
    # some negation is present
    assert sum(any(w.lower() in {"not", "never", "isn't", "nothing", "no"} for w in r.words) for r in records) >= 15


def test_ids_unique(records) -> None:
    assert len({r.id for r in records}) == len(records)


def _write(tmp_path: Path, lines: list[str]) -> Path:
    p = tmp_path / "r.jsonl"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def test_loader_reads_a_valid_file(tmp_path: Path) -> None:
    rec = make_record("a", "Not bad, really fun.", "positive", [(0, 2), (4, 5)])
    [r] = load_rationales(_write(tmp_path, [json.dumps(rec)]))
    assert r.words == ["Not", "bad", ",", "really", "fun", "."]
    assert r.rationale == [True, True, False, False, True, False]
    assert r.label == 1 and r.rationale_words == ["Not", "bad", "fun"]


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda o: "{not json", r"line 2: not valid JSON"),
        (lambda o: {**o, "label": "neutral"}, r"line 2: label must be 'positive' or 'negative'"),
        (lambda o: {k: v for k, v in o.items() if k != "tokens"}, r"line 2: missing key 'tokens'"),
        (lambda o: {**o, "evidences": []}, r"line 2: no evidences"),
        (lambda o: {**o, "tokens": o["tokens"][:-1]}, r"line 2: 'tokens' do not match"),
        (
            lambda o: {**o, "evidences": [{"start_token": 3, "end_token": 99, "text": "x"}]},
            r"line 2: evidence 0: need 0 <=",
        ),
        (
            lambda o: {**o, "evidences": [{"start_token": 0, "end_token": 1, "text": "Great"}]},
            r"line 2: evidence 0: text 'Great'",
        ),
        (lambda o: {**o, "annotation_id": "a"}, r"line 2: duplicate annotation_id 'a'"),
    ],
)
def test_loader_names_the_malformed_line(tmp_path: Path, mutate, message: str) -> None:
    good = make_record("a", "A dull film.", "negative", [(1, 2)])
    other = make_record("b", "A dull, slow film.", "negative", [(1, 2), (3, 4)])
    bad = mutate(other)
    line2 = bad if isinstance(bad, str) else json.dumps(bad)
    with pytest.raises(RationaleFormatError, match=message):
        load_rationales(_write(tmp_path, [json.dumps(good), line2]))


def test_loader_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="rationale file not found"):
        load_rationales(tmp_path / "nope.jsonl")


def test_tokenize_keeps_contractions_and_hyphens() -> None:
    assert [w for w, _, _ in tokenize("It isn't mean-spirited; 10/10!")] == [
        "It",
        "isn't",
        "mean-spirited",
        ";",
        "10",
        "/",
        "10",
        "!",
    ]

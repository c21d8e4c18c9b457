"""The facts task: reproducible prompts whose evidence is known exactly (docs/METHODS.md §3b)."""

import pytest

from lrp_core.data.facts import RELATIONS, evidence_tokens, make_facts, vocabulary, words_of
from lrp_core.errors import InputError


def test_same_seed_same_prompts_and_prefix_property():
    a, b = make_facts(50, seed=7), make_facts(50, seed=7)
    assert [r.prompt for r in a] == [r.prompt for r in b]
    assert [r.prompt for r in make_facts(20, seed=7)] == [r.prompt for r in a[:20]]
    assert [r.prompt for r in make_facts(50, seed=8)] != [r.prompt for r in a]


def test_evidence_is_the_asked_facts_value():
    for r in make_facts(300, seed=3):
        values = RELATIONS[r.relation][0]
        assert [r.prompt[s:e] for s, e in r.evidence] == [r.answer]
        assert [r.words[i] for i in r.evidence_words] == [r.answer]
        assert r.answer in values and all(d in values for d in r.distractors)
        assert r.answer not in r.distractors and len(set(r.distractors)) == len(r.distractors)
        # the question names the subject; the subject's fact is the only one holding the answer
        question = r.prompt.rsplit(".", 1)[1]
        assert r.subject in question and r.prompt.count(r.answer) == 1
        assert r.prompt.endswith("Answer:")


def test_every_word_is_in_the_vocabulary():
    vocab = set(vocabulary())
    for r in make_facts(500, seed=11):
        assert set(r.words) <= vocab and r.answer in vocab


def test_evidence_tokens_from_offsets():
    r = make_facts(1, seed=5)[0]
    offsets = [(s, e) for _, s, e in words_of(r.prompt)]
    assert evidence_tokens(r, offsets) == r.evidence_words
    # a special token (empty span) before the words shifts the positions by one
    assert evidence_tokens(r, [(0, 0)] + offsets) == [i + 1 for i in r.evidence_words]


@pytest.mark.parametrize("n, seed", [(-1, 0), (2.0, 0), (True, 0), (3, "a"), (3, 1.5)])
def test_bad_arguments(n, seed):
    with pytest.raises(InputError, match="must be"):
        make_facts(n, seed)


def test_fact_count_range():
    for lo, hi in [(2, 2), (1, 3), (3, 5)]:
        counts = {len(r.distractors) + 1 for r in make_facts(200, seed=4, n_facts=(lo, hi))}
        assert counts == set(range(lo, hi + 1))
    # the default is the task's own range
    assert [r.prompt for r in make_facts(30, seed=4)] == [r.prompt for r in make_facts(30, seed=4, n_facts=(3, 5))]


@pytest.mark.parametrize("n_facts", [(0, 2), (3, 2), (2, 13), (2.0, 3), [2, 3], (2,)])
def test_bad_fact_count_range(n_facts):
    with pytest.raises(InputError, match="n_facts must be"):
        make_facts(3, 0, n_facts=n_facts)

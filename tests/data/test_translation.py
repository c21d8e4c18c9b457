"""The translation task: deterministic, split by sentence, and its alignment follows the grammar's rules."""

import pytest

from lrp_core.data import translation as tr
from lrp_core.errors import InputError


def test_same_seed_same_records_and_other_seed_other_records():
    assert tr.make_translations(50, seed=3) == tr.make_translations(50, seed=3)
    assert tr.make_translations(50, seed=3) != tr.make_translations(50, seed=4)


def test_splits_share_no_sentence_and_follow_the_hash():
    train = {r.source for r in tr.make_translations(3000, seed=0)}
    held = {r.source for r in tr.make_translations(500, seed=0, split="held_out")}
    assert not train & held
    assert all(tr.split_of(s) == "held_out" for s in held) and all(tr.split_of(s) == "train" for s in train)


def test_alignment_has_one_entry_per_target_word_and_points_at_source_words():
    for r in tr.make_translations(300, seed=1):
        assert len(r.alignment) == len(r.target_words)
        for word, links in zip(r.target_words, r.alignment):
            assert all(0 <= i < len(r.source_words) for i in links)
            assert (links == ()) == (word == "wo")  # only the object marker translates nothing


def _lexicon_of(source_word: str) -> tuple[str, ...]:
    if source_word in tr.VERBS:
        return tr.VERBS[source_word]
    table = {**tr.ADJECTIVES, **tr.NOUNS, **tr.DETERMINERS, "and": "to"}
    return (table[source_word],) if table[source_word] else ()


def test_every_aligned_target_word_is_the_translation_of_its_source_word():
    for r in tr.make_translations(300, seed=2):
        for word, links in zip(r.target_words, r.alignment):
            for i in links:
                assert word in _lexicon_of(r.source_words[i])


def test_every_source_word_but_the_is_translated():
    for r in tr.make_translations(300, seed=5):
        covered = {i for links in r.alignment for i in links}
        for i, w in enumerate(r.source_words):
            assert (i in covered) == (w != "the"), (r.source, i)


def test_the_four_rules_on_a_known_sentence():
    # find a sentence with an adjective, a two-word verb and "the"
    r = next(
        r
        for r in tr.make_translations(2000, seed=7)
        if any(w in tr.ADJECTIVES for w in r.source_words)
        and any(w in tr.TWO_WORD_VERBS for w in r.source_words)
        and "the" in r.source_words
    )
    src, tgt = r.source_words, r.target_words
    verb = next(i for i, w in enumerate(src) if w in tr.VERBS)
    verb_links = [j for j, links in enumerate(r.alignment) if links == (verb,)]
    assert len(verb_links) == len(tr.VERBS[src[verb]])  # one word per target word of the verb
    assert tgt[verb_links[0] - 1] == "wo"  # the verb comes last in its clause, after the object marker
    adj = next(i for i, w in enumerate(src) if w in tr.ADJECTIVES)
    adj_t = next(j for j, links in enumerate(r.alignment) if links == (adj,))
    noun_t = next(j for j, links in enumerate(r.alignment) if links == (adj + 1,))
    assert noun_t + 1 == adj_t  # the noun before its adjective


def test_vocabularies_are_disjoint_and_complete():
    src, tgt = set(tr.source_vocabulary()), set(tr.target_vocabulary())
    assert not src & tgt
    for r in tr.make_translations(200, seed=9):
        assert set(r.source_words) <= src and set(r.target_words) <= tgt


def test_bad_arguments_are_refused():
    with pytest.raises(InputError, match="split"):
        tr.make_translations(3, split="test")
    with pytest.raises(InputError, match="n must be"):
        tr.make_translations(-1)

"""Facts and questions whose answer is fixed by known words: the language-model evidence task.

Each prompt states a few short facts of one kind about different people
("Mia lives in Oslo."), then asks about one of them ("Where does Mia live?
Answer:"). The answer is the value of that one fact, so the words that fix it
are known exactly: the *evidence* is the value word of the fact the question
asks for; the other facts of the same kind are distractors (``docs/METHODS.md``
§3b). Every prompt is generated from a seed, so a set is reproducible and a
held-out set is simply other seeds.

Text is plain words and punctuation separated as a word-level tokenizer splits
them (``\\w+`` runs and single punctuation marks), so the evidence maps onto whole
tokens and a record can give both its character spans and its token positions.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Sequence

from ..errors import InputError

NAMES = (
    "Anna",
    "Boris",
    "Carla",
    "David",
    "Elena",
    "Felix",
    "Greta",
    "Hugo",
    "Ines",
    "Jonas",
    "Karin",
    "Leo",
    "Maria",
    "Nils",
    "Olga",
    "Paul",
    "Rosa",
    "Sven",
    "Tara",
    "Umar",
    "Vera",
    "Walter",
    "Yara",
    "Zeno",
)

#: the kinds of fact: values, ways of stating a fact, ways of asking for it. ``{n}`` a name, ``{v}`` a value.
RELATIONS = {
    "city": (
        (
            "Rome",
            "Oslo",
            "Paris",
            "Lima",
            "Cairo",
            "Tokyo",
            "Delhi",
            "Berlin",
            "Madrid",
            "Vienna",
            "Dublin",
            "Quito",
            "Seoul",
            "Nairobi",
            "Prague",
            "Lisbon",
        ),
        ("{n} lives in {v}.", "{n} moved to {v}.", "The home of {n} is {v}."),
        ("Where does {n} live?", "In which city does {n} live?"),
    ),
    "colour": (
        ("red", "blue", "green", "yellow", "purple", "orange", "black", "white", "pink", "brown", "grey", "gold"),
        ("{n} likes the colour {v}.", "The favourite colour of {n} is {v}.", "{n} paints everything {v}."),
        ("Which colour does {n} like?", "What is the favourite colour of {n}?"),
    ),
    "pet": (
        ("cat", "dog", "horse", "parrot", "rabbit", "turtle", "goat", "hamster", "snake", "duck", "pony", "lizard"),
        ("{n} has a {v}.", "{n} keeps a {v} at home.", "The pet of {n} is a {v}."),
        ("Which pet does {n} have?", "What animal does {n} keep?"),
    ),
    "job": (
        (
            "baker",
            "doctor",
            "pilot",
            "farmer",
            "teacher",
            "painter",
            "lawyer",
            "nurse",
            "singer",
            "driver",
            "judge",
            "chef",
        ),
        ("{n} works as a {v}.", "{n} is a {v} by trade.", "The job of {n} is {v}."),
        ("What does {n} do for a living?", "Which job does {n} have?"),
    ),
}

ANSWER_CUE = "Answer:"
#: how many facts of the asked kind a prompt states (the asked one and its distractors)
MIN_FACTS, MAX_FACTS = 3, 5
_TOKEN = re.compile(r"\w+|[^\w\s]")


@dataclass
class FactRecord:
    """One prompt of the evidence task.

    Attributes:
        prompt: facts, the question and ``"Answer:"``.
        answer: the word the model should write next (the asked fact's value).
        evidence: character spans ``(start, end)`` of the prompt that fix the answer (the asked fact's value).
        evidence_words: indices of the evidence among :attr:`words` (the word-level tokens of the prompt).
        words: the prompt split as the word-level tokenizer splits it.
        relation: the kind of fact asked for; ``subject``: the person asked about.
        distractors: the values of the other facts of the same kind.
    """

    prompt: str
    answer: str
    evidence: list
    evidence_words: list
    words: list
    relation: str
    subject: str
    distractors: list = field(default_factory=list)


def words_of(text: str) -> list[tuple[str, int, int]]:
    """The word-level tokens of ``text`` with their character spans: ``[(word, start, end), ...]``.

    Parameters
    ----------
    text : str
        The text, a prompt of the evidence task.

    Returns
    -------
    list[tuple[str, int, int]]
        ``(word, start, end)`` per word, in order.
    """
    return [(m.group(), m.start(), m.end()) for m in _TOKEN.finditer(text)]


def vocabulary() -> list[str]:
    """Every word a prompt or an answer can contain, sorted (the tokenizer's vocabulary besides special tokens)."""
    texts = [ANSWER_CUE, *NAMES]
    for values, states, asks in RELATIONS.values():
        texts += list(values) + list(states) + list(asks)
    return sorted({w for t in texts for w, _, _ in words_of(t.replace("{n}", "").replace("{v}", ""))})


def _record(rng: random.Random, n_facts: tuple[int, int]) -> FactRecord:
    relation = rng.choice(sorted(RELATIONS))
    values, states, asks = RELATIONS[relation]
    k = rng.randint(*n_facts)
    people, vals = rng.sample(NAMES, k), rng.sample(values, k)
    asked = rng.randrange(k)
    parts, spans, pos = [], [], 0
    for person, value in zip(people, vals):
        sentence = rng.choice(states).format(n=person, v="{v}")
        start = pos + sentence.index("{v}")
        text = sentence.format(v=value)
        if person == people[asked]:
            spans.append((start, start + len(value)))
        parts.append(text)
        pos += len(text) + 1
    prompt = " ".join(parts + [rng.choice(asks).format(n=people[asked]), ANSWER_CUE])
    words = words_of(prompt)
    evidence_words = [i for i, (_, s, e) in enumerate(words) if (s, e) in spans]
    return FactRecord(
        prompt=prompt,
        answer=vals[asked],
        evidence=spans,
        evidence_words=evidence_words,
        words=[w for w, _, _ in words],
        relation=relation,
        subject=people[asked],
        distractors=[v for i, v in enumerate(vals) if i != asked],
    )


#: the most facts a prompt can hold: every fact needs its own person and its own value
_MOST_FACTS = min(len(NAMES), *(len(values) for values, _, _ in RELATIONS.values()))


def make_facts(n: int, seed: int = 0, n_facts: tuple[int, int] = (MIN_FACTS, MAX_FACTS)) -> list[FactRecord]:
    """``n`` prompts of the evidence task, the same for the same ``seed``.

    Record ``i`` depends on ``(seed, i, n_facts)`` only, so ``make_facts(n, s)[:m] == make_facts(m, s)``.
    ``n_facts = (lo, hi)``: each prompt states between ``lo`` and ``hi`` facts (inclusive). The task is
    defined with the default (3 to 5); other ranges exist for training curricula (tiny-lm starts with 2).

    Parameters
    ----------
    n : int
        Number of prompts (≥ 0).
    seed : int, optional
        Seed of the task's generator.
    n_facts : tuple[int, int], optional
        ``(lo, hi)``, the fewest and most facts a prompt states, ``1 <= lo <= hi``.

    Returns
    -------
    list[FactRecord]
        ``n`` records (prompt, answer, evidence spans).

    Raises
    ------
    InputError
        If ``n`` is not a non-negative integer, ``seed`` is not an integer, or
        ``n_facts`` is not a valid pair.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InputError(f"n must be a non-negative integer (how many prompts), got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InputError(f"seed must be an integer, got {seed!r}")
    ok = (
        isinstance(n_facts, tuple)
        and len(n_facts) == 2
        and all(isinstance(k, int) and not isinstance(k, bool) for k in n_facts)
    )
    if not ok or not 1 <= n_facts[0] <= n_facts[1] <= _MOST_FACTS:
        raise InputError(
            f"n_facts must be a pair of integers (lo, hi) with 1 <= lo <= hi <= {_MOST_FACTS}, got {n_facts!r}"
        )
    return [_record(random.Random(f"facts-{seed}-{i}"), n_facts) for i in range(n)]


def evidence_tokens(record: FactRecord, offsets: Sequence[tuple[int, int]]) -> list[int]:
    """Positions of the tokens (given by their character ``offsets``) that overlap the record's evidence spans.

    Parameters
    ----------
    record : FactRecord
        The record whose evidence spans are used.
    offsets : Sequence[tuple[int, int]]
        (T,) character ``(start, end)`` of each token in the record's prompt.

    Returns
    -------
    list[int]
        The positions of the overlapping tokens, ascending.
    """
    return [i for i, (s, e) in enumerate(offsets) if e > s and any(s < b and a < e for a, b in record.evidence)]


__all__ = ["FactRecord", "make_facts", "vocabulary", "words_of", "evidence_tokens", "RELATIONS", "NAMES", "ANSWER_CUE"]

"""A synthetic translation task whose word alignment is exact: the seq2seq evidence task (``tiny-s2s``).

The source language is a fragment of English; the target language ("Tiny") has its own words and
its own word order. Every target word is written because of known source words, so an explanation
of a generated word can be checked against the gold alignment (``docs/METHODS.md`` §3e).

Grammar (source)::

    sentence := clause [ "and" clause ]                      (the second clause with probability 0.3)
    clause   := np verb np                                   (subject, verb, object)
    np       := det [adj] noun                               (an adjective with probability 0.5)

with ``det`` ∈ :data:`DETERMINERS`, ``adj`` ∈ :data:`ADJECTIVES`, ``noun`` ∈ :data:`NOUNS`, ``verb`` ∈
:data:`VERBS`. The translation, word by word through the lexicons, with four rules:

1. **Noun before adjective** (as in French): ``det adj noun`` → ``det' noun' adj'``.
2. **Verb-final clauses** (as in Japanese): ``S V O`` → ``S' O' wo V'``.
3. **One word, two target words**: the verbs of :data:`TWO_WORD_VERBS` translate into two words, both
   aligned to the verb.
4. **Function words without counterpart**: ``the`` has no translation (a source word aligned to
   nothing); the object marker ``wo`` (rule 2) translates no source word (a target word aligned to
   nothing, left out of the scores). ``and`` → ``to``.

Every other target word is aligned to exactly one source word. Text is lower-case words separated
by single spaces, so a word-level tokenizer makes every word one token and token alignment = word
alignment. Records are drawn from a seed; the split is a property of the sentence
(:func:`split_of`: a stable hash of the source), so no held-out sentence is ever trained on.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass

from ..errors import InputError

#: source determiner → target determiner ("" = no counterpart)
DETERMINERS = {"the": "", "a": "ko", "this": "si", "every": "mon"}
ADJECTIVES = {
    "big": "grano",
    "small": "piko",
    "red": "roso",
    "old": "vetu",
    "young": "nuva",
    "happy": "felo",
    "green": "verdi",
    "quiet": "tasu",
}
NOUNS = {
    "cat": "neko",
    "dog": "inu",
    "bird": "tori",
    "fish": "sakana",
    "child": "kodo",
    "woman": "fema",
    "man": "homo",
    "farmer": "agro",
    "teacher": "sensa",
    "horse": "uma",
    "king": "rega",
    "baker": "pano",
}
#: source verb → its target words (one or two)
VERBS = {
    "sees": ("miru",),
    "likes": ("suki",),
    "finds": ("trova",),
    "follows": ("sekwa",),
    "helps": ("aida",),
    "calls": ("voka",),
    "visits": ("ide", "miru"),
    "greets": ("salu", "dona"),
}
TWO_WORD_VERBS = tuple(v for v, t in VERBS.items() if len(t) == 2)
CONJUNCTION = ("and", "to")
OBJECT_MARKER = "wo"
#: the probabilities of the optional parts
P_ADJECTIVE, P_SECOND_CLAUSE = 0.5, 0.3
#: one source sentence in HELD_OUT_EVERY is held out (by its hash), never trained on
HELD_OUT_EVERY = 10
SPLITS = ("train", "held_out")


@dataclass(frozen=True)
class TranslationRecord:
    """One sentence pair with its word alignment.

    Attributes:
        source: the source sentence (words separated by spaces).
        target: its translation.
        alignment: per target word, the indices of the source words it translates (``()``: none, the
            object marker); ``len(alignment) == len(target.split())``.
    """

    source: str
    target: str
    alignment: tuple[tuple[int, ...], ...]

    @property
    def source_words(self) -> list[str]:
        """The source words, in order (the tokens before ``</s>``)."""
        return self.source.split()

    @property
    def target_words(self) -> list[str]:
        """The target words, in order."""
        return self.target.split()


def split_of(source: str) -> str:
    """``"held_out"`` for one source sentence in :data:`HELD_OUT_EVERY` (a stable CRC-32 hash), else ``"train"``."""
    return "held_out" if zlib.crc32(source.encode()) % HELD_OUT_EVERY == 0 else "train"


def _noun_phrase(rng: random.Random, start: int) -> tuple[list[str], list[tuple[str, int]]]:
    """Source words of one noun phrase and its target words with their source indices (offset ``start``)."""
    det = rng.choice(sorted(DETERMINERS))
    adj = rng.choice(sorted(ADJECTIVES)) if rng.random() < P_ADJECTIVE else None
    noun = rng.choice(sorted(NOUNS))
    words = [det] + ([adj] if adj else []) + [noun]
    target = [(DETERMINERS[det], start)] if DETERMINERS[det] else []
    target.append((NOUNS[noun], start + len(words) - 1))  # rule 1: the noun before its adjective
    if adj:
        target.append((ADJECTIVES[adj], start + 1))
    return words, target


def _clause(rng: random.Random, start: int) -> tuple[list[str], list[tuple[str, int | None]]]:
    """Source words of one clause and its target words (rule 2: verb-final, the object marked)."""
    subject, subject_t = _noun_phrase(rng, start)
    verb = rng.choice(sorted(VERBS))
    at_verb = start + len(subject)
    obj, obj_t = _noun_phrase(rng, at_verb + 1)
    verb_t: list[tuple[str, int | None]] = [(w, at_verb) for w in VERBS[verb]]  # rule 3: one or two words
    target: list[tuple[str, int | None]] = [*subject_t, *obj_t, (OBJECT_MARKER, None), *verb_t]
    return subject + [verb] + obj, target


def _record(rng: random.Random) -> TranslationRecord:
    words, target = _clause(rng, 0)
    if rng.random() < P_SECOND_CLAUSE:
        words2, target2 = _clause(rng, len(words) + 1)
        target = [*target, (CONJUNCTION[1], len(words)), *target2]
        words = [*words, CONJUNCTION[0], *words2]
    return TranslationRecord(
        source=" ".join(words),
        target=" ".join(w for w, _ in target),
        alignment=tuple(() if i is None else (i,) for _, i in target),
    )


def make_translations(n: int, seed: int = 0, split: str = "train") -> list[TranslationRecord]:
    """``n`` sentence pairs of ``split``, the same for the same ``seed``.

    Sentences are drawn from ``random.Random(seed)`` and kept when :func:`split_of` puts them in
    ``split`` (repeats are kept: a training stream). The two splits never share a source sentence.

    Parameters
    ----------
    n : int
        Number of records (≥ 0).
    seed : int, optional
        The generator's seed.
    split : str, optional
        ``"train"`` or ``"held_out"``.

    Returns
    -------
    list[TranslationRecord]
        The records, in order.

    Raises
    ------
    InputError
        If ``n`` is negative or ``split`` is not one of :data:`SPLITS`.
    """
    if split not in SPLITS:
        raise InputError(f"split must be one of {SPLITS}, got {split!r}")
    if n < 0:
        raise InputError(f"n must be >= 0, got {n}")
    rng = random.Random(seed)
    out: list[TranslationRecord] = []
    while len(out) < n:
        record = _record(rng)
        if split_of(record.source) == split:
            out.append(record)
    return out


def source_vocabulary() -> list[str]:
    """Every source word, sorted."""
    return sorted({*DETERMINERS, *ADJECTIVES, *NOUNS, *VERBS, CONJUNCTION[0]})


def target_vocabulary() -> list[str]:
    """Every target word, sorted (``miru`` is both a verb and the second word of ``visits``: once)."""
    words = {t for t in DETERMINERS.values() if t} | set(ADJECTIVES.values()) | set(NOUNS.values())
    words |= {w for ws in VERBS.values() for w in ws} | {CONJUNCTION[1], OBJECT_MARKER}
    return sorted(words)


__all__ = [
    "TranslationRecord",
    "make_translations",
    "split_of",
    "source_vocabulary",
    "target_vocabulary",
    "DETERMINERS",
    "ADJECTIVES",
    "NOUNS",
    "VERBS",
    "TWO_WORD_VERBS",
    "HELD_OUT_EVERY",
    "SPLITS",
]

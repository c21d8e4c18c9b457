"""Text metrics: the token–word alignment, ERASER rationales and faithfulness.

- :func:`word_spans`, :func:`word_ids_from_offsets`, :func:`word_scores` —
  from word-piece scores to word scores (max over a word's pieces).
- :func:`rationale_scores`, :func:`rationale_f1_at_gold_size` — token-level
  precision / recall / F1 of the top-k words against a human rationale.
- :func:`eraser_texts`, :func:`aopc` — ERASER's comprehensiveness and
  sufficiency (AOPC over removal fractions).

Ties in a ranking are broken by word index, lowest first.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import numpy as np

from ..errors import InputError

TOP_K: tuple[int, ...] = (10, 20, 30, 40, 50, 60, 70, 80)
"""The k of the rationale token-F1 (number of top words taken)."""


def word_spans(text: str, words: Sequence[str]) -> list[tuple[int, int]]:
    """Character span (start, end) of each word, found in order in ``text``.

    Parameters
    ----------
    text : str
        The text the words were cut from.
    words : Sequence[str]
        (W,) the words, in the order they occur in ``text``.

    Returns
    -------
    list[tuple[int, int]]
        (W,) character spans ``(start, end)`` with ``text[start:end] == words[i]``.

    Raises
    ------
    InputError
        If a word is not found in ``text`` after the end of the previous one.
    """
    spans, pos = [], 0
    for w in words:
        start = text.find(w, pos)
        if start < 0:
            raise InputError(f"word {w!r} not found in the text after character {pos}")
        spans.append((start, start + len(w)))
        pos = start + len(w)
    return spans


def word_ids_from_offsets(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> list[Optional[int]]:
    """Map word-pieces to words through character offsets.

    Parameters
    ----------
    offsets : Sequence[tuple[int, int]]
        (T,) character span of each word-piece, as a fast tokenizer's
        ``offset_mapping``; special tokens and padding have (0, 0).
    spans : Sequence[tuple[int, int]]
        (W,) character span of each word (see :func:`word_spans`).

    Returns
    -------
    list[Optional[int]]
        (T,) the word index of each piece, ``None`` for specials / pieces
        outside every word (e.g. whitespace).
    """
    starts = np.array([s for s, _ in spans])
    ends = np.array([e for _, e in spans])
    out: list[Optional[int]] = []
    for a, b in offsets:
        a, b = int(a), int(b)
        if b <= a:
            out.append(None)
            continue
        hit = np.nonzero((starts < b) & (ends > a))[0]  # overlapping words
        out.append(int(hit[0]) if hit.size else None)
    return out


def word_scores(token_scores: Sequence[float], word_ids: Sequence[Optional[int]], n_words: int) -> np.ndarray:
    """Word score = max over its word-pieces.

    Parameters
    ----------
    token_scores : Sequence[float]
        (T,) relevance of each piece.
    word_ids : Sequence[Optional[int]]
        (T,) word index of each piece or ``None`` (as a HF fast
        tokenizer's ``word_ids()``, or :func:`word_ids_from_offsets`).
    n_words : int
        number of words W.

    Returns
    -------
    np.ndarray
        (W,) scores; ``-inf`` for a word with no piece (e.g. truncated away),
        so that it ranks last.

    Raises
    ------
    InputError
        If ``word_ids`` and ``token_scores`` differ in length, or a word id lies
        outside ``0 .. n_words - 1``.
    """
    ts = np.asarray(token_scores, dtype=np.float64).reshape(-1)
    if len(word_ids) != ts.shape[0]:
        raise InputError(f"{len(word_ids)} word ids for {ts.shape[0]} token scores")
    out = np.full(n_words, -np.inf)
    for s, wid in zip(ts, word_ids):
        if wid is None:
            continue
        if not 0 <= wid < n_words:
            raise InputError(f"word id {wid} outside 0..{n_words - 1}")
        out[wid] = max(out[wid], s)
    return out


def top_k_words(scores: np.ndarray, k: int) -> np.ndarray:
    """(W,) bool: the ``min(k, W)`` highest-scoring words (ties by position).

    Parameters
    ----------
    scores : np.ndarray
        (W,) word scores.
    k : int
        Number of words to pick.

    Returns
    -------
    np.ndarray
        (W,) bool, ``True`` for a picked word.
    """
    scores = np.asarray(scores, dtype=np.float64)
    order = np.argsort(-scores, kind="stable")
    pick = np.zeros(scores.shape[0], dtype=bool)
    pick[order[: min(k, scores.shape[0])]] = True
    return pick


def rationale_scores(
    scores: Sequence[np.ndarray], rationales: Sequence[Union[Sequence[bool], np.ndarray]], ks: Sequence[int] = TOP_K
) -> dict[int, dict[str, float]]:
    """Token-level precision / recall / F1 of the top-k words, per document, averaged.

    For each document and k, the top ``min(k, W)`` words are the predicted
    rationale (ERASER: a shorter document contributes all its words).
    F1 = 2PR / (P + R), 0 when P + R = 0.

    Parameters
    ----------
    scores : Sequence[np.ndarray]
        per document, (W,) word scores.
    rationales : Sequence[Sequence[bool] | np.ndarray]
        per document, (W,) bool human rationale.
    ks : Sequence[int], optional
        the k values.

    Returns
    -------
    dict[int, dict[str, float]]
        ``{k: {"precision", "recall", "f1"}}`` (means over documents).

    Raises
    ------
    InputError
        If ``scores`` and ``rationales`` differ in length, there is no document,
        a k is below 1, or a document's scores and rationale differ in length.
    """
    if len(scores) != len(rationales):
        raise InputError(f"{len(scores)} score vectors for {len(rationales)} rationales")
    if not scores:
        raise InputError("no documents to score")
    out: dict[int, dict[str, float]] = {}
    for k in ks:
        if k < 1:
            raise InputError(f"k must be >= 1, got {k}")
        p_all, r_all, f_all = [], [], []
        for doc_scores, doc_rationale in zip(scores, rationales):
            gold = np.asarray(doc_rationale, dtype=bool)
            s = np.asarray(doc_scores)
            if s.shape != gold.shape:
                raise InputError(f"scores {s.shape} and rationale {gold.shape} differ in length")
            pred = top_k_words(s, k)
            hit = int((pred & gold).sum())
            p = hit / pred.sum() if pred.sum() else 0.0
            r = hit / gold.sum() if gold.sum() else 0.0
            f = 2 * p * r / (p + r) if p + r > 0 else 0.0
            p_all.append(p)
            r_all.append(r)
            f_all.append(f)
        out[k] = {"precision": float(np.mean(p_all)), "recall": float(np.mean(r_all)), "f1": float(np.mean(f_all))}
    return out


def rationale_f1_at_gold_size(
    scores: Sequence[np.ndarray], rationales: Sequence[Union[Sequence[bool], np.ndarray]]
) -> float:
    """Token F1 with k = the size of each document's human rationale, averaged.

    At that k precision, recall and F1 are equal (the share of the top-|gold|
    words that are rationale words: R-precision). Unlike a fixed k it stays
    informative on short texts, where k >= the number of words takes every
    word. Documents without rationale words are left out.

    Parameters
    ----------
    scores : Sequence[np.ndarray]
        Per document D, (W,) word scores.
    rationales : Sequence[Sequence[bool] | np.ndarray]
        Per document D, (W,) bool human rationale.

    Returns
    -------
    float
        The mean over the documents with a rationale; NaN if none has one.
    """
    per = rationale_f1_at_gold_size_per_document(scores, rationales)
    vals = per[~np.isnan(per)]
    return float(np.mean(vals)) if len(vals) else math.nan


def rationale_f1_at_gold_size_per_document(
    scores: Sequence[np.ndarray], rationales: Sequence[Union[Sequence[bool], np.ndarray]]
) -> np.ndarray:
    """(D,) the per-document values of :func:`rationale_f1_at_gold_size`; NaN without rationale.

    Parameters
    ----------
    scores : Sequence[np.ndarray]
        Per document D, (W,) word scores.
    rationales : Sequence[Sequence[bool] | np.ndarray]
        Per document D, (W,) bool human rationale.

    Returns
    -------
    np.ndarray
        (D,) float64 top-|gold| F1 per document; NaN for a document without
        rationale words.

    Raises
    ------
    InputError
        If ``scores`` and ``rationales`` differ in length, or a document's scores
        and rationale differ in length.
    """
    if len(scores) != len(rationales):
        raise InputError(f"{len(scores)} score vectors for {len(rationales)} rationales")
    vals = []
    for s, doc_rationale in zip(scores, rationales):
        gold = np.asarray(doc_rationale, dtype=bool)
        if np.asarray(s).shape != gold.shape:
            raise InputError(f"scores {np.shape(s)} and rationale {gold.shape} differ in length")
        k = int(gold.sum())
        vals.append(int((top_k_words(s, k) & gold).sum()) / k if k else math.nan)
    return np.asarray(vals, dtype=np.float64)


ERASER_FRACTIONS: tuple[float, ...] = (0.01, 0.05, 0.1, 0.2, 0.5)
"""Removal fractions q of ERASER's comprehensiveness and sufficiency (AOPC bins)."""


def eraser_texts(
    words: Sequence[str], scores: np.ndarray, fractions: Sequence[float] = ERASER_FRACTIONS
) -> list[tuple[str, str]]:
    """The inputs of ERASER's faithfulness metrics, one pair per fraction q.

    The top ``ceil(q · W)`` words (:func:`top_k_words`, ties by position; at
    least one) are the rationale; the pair is (the text *without* them, for
    comprehensiveness; the text of *only* them, for sufficiency), the kept words
    in their original order joined by single spaces.

    Parameters
    ----------
    words : Sequence[str]
        (W,) the document's words.
    scores : np.ndarray
        (W,) the words' scores.
    fractions : Sequence[float], optional
        The fractions q, each in (0, 1].

    Returns
    -------
    list[tuple[str, str]]
        One pair ``(without_rationale, rationale_only)`` per fraction, in order.

    Raises
    ------
    InputError
        If a fraction lies outside (0, 1].
    """
    out = []
    for q in fractions:
        if not 0.0 < q <= 1.0:
            raise InputError(f"fractions must lie in (0, 1], got {q}")
        k = max(1, math.ceil(q * len(words) - 1e-9))
        top = top_k_words(np.asarray(scores, dtype=np.float64), k)
        out.append((" ".join(w for w, t in zip(words, top) if not t), " ".join(w for w, t in zip(words, top) if t)))
    return out


def aopc(p_full: float, p_perturbed: Union[Sequence[float], np.ndarray]) -> float:
    """Area over the perturbation curve: mean over the bins of ``p_full − p_q``.

    Comprehensiveness passes the class probability of the texts without the
    rationale (higher = more faithful); sufficiency of the texts of the
    rationale alone (lower = more faithful).

    Parameters
    ----------
    p_full : float
        Class probability of the full text.
    p_perturbed : Sequence[float]
        (Q,) class probability of each perturbed text, one per bin.

    Returns
    -------
    float
        The AOPC, ``mean_q(p_full − p_q)``.

    Raises
    ------
    InputError
        If ``p_perturbed`` is empty.
    """
    p = np.asarray(p_perturbed, dtype=np.float64)
    if p.size == 0:
        raise InputError("aopc needs at least one perturbed probability")
    return float(np.mean(float(p_full) - p))


__all__ = [
    "TOP_K",
    "word_spans",
    "word_ids_from_offsets",
    "word_scores",
    "top_k_words",
    "rationale_scores",
    "rationale_f1_at_gold_size",
    "rationale_f1_at_gold_size_per_document",
    "ERASER_FRACTIONS",
    "eraser_texts",
    "aopc",
]

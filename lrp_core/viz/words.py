"""Tokens as people read them: a tokenizer's pieces turned into text, and joined into words with their scores.

Language-model tokenizers mark word boundaries inside their pieces: byte-level BPE (GPT-2, Llama 3, Qwen) writes a
leading space as ``Ġ`` and a newline as ``Ċ``; SentencePiece (Llama 2, Gemma, Phi-3) writes a leading space as
``▁``; WordPiece (BERT) marks a continuation with ``##``. :func:`readable` turns a piece into the text it stands
for; :func:`merge_words` joins pieces into words (summing their scores by default, so the total is kept);
:func:`merge_wordpieces` is its WordPiece form with the rationale evaluation's maximum.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from ..errors import InputError

#: markers of a leading space (byte-level BPE, SentencePiece) and of a newline (byte-level BPE)
SPACE_MARKS = ("Ġ", "▁")
NEWLINE_MARKS = ("Ċ",)
CONTINUATION = "##"


def readable(piece: str) -> str:
    """The text a tokenizer piece stands for, its space, newline or continuation marks replaced.

    ``'Ġcat'`` → ``' cat'``, ``'▁Rome'`` → ``' Rome'``, ``'Ċ'`` → ``'\\n'``, ``'##ly'`` → ``'ly'``; other pieces
    unchanged.

    Parameters
    ----------
    piece : str
        A tokenizer piece.

    Returns
    -------
    str
        The text it stands for.
    """
    text = str(piece)
    if text.startswith(CONTINUATION) and len(text) > 2:
        return text[2:]
    for mark in SPACE_MARKS:
        text = text.replace(mark, " ")
    for mark in NEWLINE_MARKS:
        text = text.replace(mark, "\n")
    return text


def merge_words(
    pieces: Sequence[str], scores: Any = None, reduce: str = "sum", scheme: Optional[str] = None
) -> tuple[list[str], Optional[np.ndarray]]:
    """Join sub-word pieces into words, and their scores (``reduce="sum"`` keeps the total, ``"max"``).

    ``scheme``: ``"marks"`` — a piece starting with ``Ġ``/``▁`` begins a word (byte-level BPE, SentencePiece),
    ``"wordpiece"`` — a piece starting with ``##`` continues one, ``"words"`` — every piece is a word already
    (a word-level tokenizer such as tiny-lm's); ``None`` chooses from the pieces: ``##`` anywhere means
    wordpiece, a space mark anywhere means marks, neither means words (no piece says where a word starts,
    so nothing is joined). Special tokens (``<s>``, ``[CLS]``) stay words of their own.

    Parameters
    ----------
    pieces : Sequence[str]
        (T,) the tokenizer pieces.
    scores : Any, optional
        (T,) one score per piece, or ``None``.
    reduce : str, optional
        How a word's score is formed from its pieces' scores: ``"sum"`` or ``"max"``.
    scheme : Optional[str], optional
        ``"marks"``, ``"wordpiece"``, ``"words"`` or ``None`` (chosen from the pieces).

    Returns
    -------
    tuple[list[str], Optional[np.ndarray]]
        ``(words, word_scores)``: W words and their (W,) scores (``None`` without ``scores``).

    Raises
    ------
    InputError
        If ``reduce`` or ``scheme`` is not one of the accepted values, or
        ``scores`` and ``pieces`` differ in length.
    """
    if reduce not in ("sum", "max"):
        raise InputError(f"reduce must be 'sum' or 'max', got {reduce!r}")
    pieces = [str(p) for p in pieces]
    vals = None if scores is None else np.asarray(scores, dtype=np.float64).reshape(-1)
    if vals is not None and len(vals) != len(pieces):
        raise InputError(f"merge_words: {len(pieces)} pieces but {len(vals)} scores")
    if scheme is None:
        scheme = _scheme_of(pieces)
    if scheme not in ("marks", "wordpiece", "words"):
        raise InputError(f"scheme must be 'marks', 'wordpiece', 'words' or None, got {scheme!r}")
    groups: list[list[int]] = []
    for i, p in enumerate(pieces):
        if not groups or _special(p) or _special(pieces[groups[-1][0]]):
            new = True  # special tokens stand alone
        elif scheme == "words":
            new = True
        elif scheme == "wordpiece":
            new = not p.startswith(CONTINUATION)
        else:
            new = p[:1] in SPACE_MARKS + NEWLINE_MARKS
        if new:
            groups.append([i])
        else:
            groups[-1].append(i)
    words = ["".join(readable(pieces[i]) for i in g) for g in groups]
    if vals is None:
        return words, None
    agg = np.sum if reduce == "sum" else np.max
    return words, np.array([agg(vals[g]) for g in groups])


def span_text(pieces: Sequence[str], context: Optional[Sequence[str]] = None) -> str:
    """The text of a run of pieces (a source's tokens), words joined as the tokenizer marks them.

    ``context``: the row the pieces come from, to tell the sub-word scheme (:func:`merge_words`); default the
    pieces themselves.

    Parameters
    ----------
    pieces : Sequence[str]
        The run of pieces.
    context : Optional[Sequence[str]], optional
        The row the pieces come from, to tell the sub-word scheme; default the pieces.

    Returns
    -------
    str
        The run's text, stripped.
    """
    scheme = _scheme_of([str(p) for p in (pieces if context is None else context)])
    words, _ = merge_words(pieces, scheme=scheme)
    return ("".join(words) if scheme == "marks" else " ".join(words)).strip()


def _scheme_of(pieces: Sequence[str]) -> str:
    """The sub-word scheme the pieces show: ``##`` continuations, leading space marks, or whole words."""
    if any(p.startswith(CONTINUATION) for p in pieces):
        return "wordpiece"
    if any(p[:1] in SPACE_MARKS + NEWLINE_MARKS for p in pieces):
        return "marks"
    return "words"


def merge_wordpieces(tokens: Sequence[str], scores: Any, reduce: str = "max") -> tuple[list[str], np.ndarray]:
    """BERT word-pieces joined into words: :func:`merge_words` with ``scheme="wordpiece"``, by default the maximum.

    Parameters
    ----------
    tokens : Sequence[str]
        (T,) word-pieces, e.g. ``["[CLS]", "un", "##like", "##ly", "[SEP]"]``.
    scores : Any
        (T,) one score per piece.
    reduce : str, optional
        ``"max"`` (a word's score is its largest piece's, as in the rationale evaluation) or ``"sum"`` (keeps
        the total).

    Returns
    -------
    tuple[list[str], np.ndarray]
        ``(words, word_scores)``: W words and their (W,) float64 scores; special tokens stay words of their own.

    Raises
    ------
    InputError
        If ``reduce`` is neither "max" nor "sum", or ``tokens`` and ``scores`` differ in length.
    """
    words, merged = merge_words(tokens, scores, reduce=reduce, scheme="wordpiece")
    assert merged is not None  # scores were given
    return words, merged


def _special(piece: str) -> bool:
    return (piece.startswith("<") and piece.endswith(">")) or (piece.startswith("[") and piece.endswith("]"))


__all__ = ["readable", "merge_words", "merge_wordpieces", "span_text", "SPACE_MARKS", "NEWLINE_MARKS", "CONTINUATION"]

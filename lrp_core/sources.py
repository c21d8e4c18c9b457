"""Sources: token spans of a context (documents, sentences, marked passages) as the units of an explanation.

A source is a half-open token span ``(start, end)`` of a row, counted from the row's first real token (the row
as the tokenizer gives it alone, special tokens included), so padding on either side does not move it. A
relevance method's source score is the sum of its token scores over the span (``docs/METHODS.md`` §2s);
``explain(..., sources=spans)`` fills ``Explanation.sources`` (B, S), and :meth:`Explanation.by_source` sums
any explanation afterwards.

The helpers here find the spans of a text: :func:`sentences` (a text cut into sentences),
:func:`documents` (documents placed into a prompt template), each a :class:`SourceText` whose
:meth:`SourceText.token_spans` maps the character spans onto any fast Hugging Face tokenizer's tokens through
its offset mapping — and refuses a span whose edge falls inside a token.

Shapes: B batch, T tokens (padding included), S sources.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union

import torch
from torch import Tensor

from .errors import InputError

#: a span (start, end) of tokens or characters, half-open
Span = tuple[int, int]
#: what ``sources=`` accepts: one list of spans for every row, one list per row, or a tensor (S, 2) / (B, S, 2)
SourcesLike = Union[Sequence[Span], Sequence[Sequence[Span]], Tensor]

_SENTENCE_END = re.compile(r"[.!?]+(?:[\"')\]]*)(?=\s|$)")


@dataclass
class SourceText:
    """A text and the character spans of its sources.

    Attributes:
        text: the whole text (prompt).
        spans: (start, end) character spans of the sources in ``text``, in order.
        labels: a short label per source (its text by default).
    """

    text: str
    spans: list[Span]
    labels: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.labels:
            self.labels = [self.text[a:b].strip() for a, b in self.spans]

    def token_spans(self, tokenizer: Any, add_special_tokens: bool = True) -> list[Span]:
        """The sources as token spans of ``tokenizer(text)`` (a fast tokenizer: it gives offsets).

        Parameters
        ----------
        tokenizer : a Hugging Face fast tokenizer (``return_offsets_mapping`` works).
        add_special_tokens : as the tokenizer call that makes the model's input takes it.

        Returns
        -------
        list of (start, end) token spans, one per source, counted from the row's first token.
        """
        try:
            enc = tokenizer(self.text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
        except NotImplementedError as err:
            raise InputError(
                "token spans need the tokenizer's character offsets (a fast tokenizer, "
                "PreTrainedTokenizerFast); this one gives none"
            ) from err
        return token_spans(self.text, self.spans, [tuple(o) for o in enc["offset_mapping"]])


def token_spans(text: str, char_spans: Sequence[Span], offsets: Sequence[Span]) -> list[Span]:
    """Character spans of ``text`` as token spans, given each token's character ``offsets``.

    A token belongs to a span when it lies inside it; whitespace at a span's edges may fall into the
    neighbouring token (a GPT-2 token " word" carries its leading space), any other character of a token
    that overlaps the span but lies outside it makes the span misaligned: an :class:`InputError` names it.
    Special tokens (empty offsets) belong to no span.

    Parameters
    ----------
    text : str
        The tokenized text.
    char_spans : Sequence[Span]
        (start, end) per source.
    offsets : Sequence[Span]
        (start, end) per token (``return_offsets_mapping``).

    Returns
    -------
    list[Span]
        (start, end) token spans (half-open), one per character span.

    Raises
    ------
    InputError
        If a span lies outside the text, holds no text, does not align with the tokens or covers no
        run of tokens.
    """
    out = []
    for s, (a, b) in enumerate(char_spans):
        if not 0 <= a <= b <= len(text):
            raise InputError(f"source {s}: character span ({a}, {b}) is not inside the text ({len(text)} characters)")
        core = text[a:b]
        lo, hi = a + len(core) - len(core.lstrip()), b - (len(core) - len(core.rstrip()))
        if lo >= hi:
            raise InputError(f"source {s}: character span ({a}, {b}) holds no text")
        inside = [t for t, (x, y) in enumerate(offsets) if y > x and x < hi and lo < y]
        for t in inside:
            x, y = offsets[t]
            outside = (text[x:lo] if x < lo else "") + (text[hi:y] if y > hi else "")
            if outside.strip():
                raise InputError(
                    f"source {s} ({text[a:b]!r}) does not align with the tokens: token {t} "
                    f"({text[x:y]!r}, characters {x}–{y}) reaches outside it. Cut the sources at "
                    "token boundaries (e.g. at spaces or sentence ends)"
                )
        if not inside or inside != list(range(inside[0], inside[-1] + 1)):
            raise InputError(f"source {s} ({text[a:b]!r}) covers no run of tokens")
        out.append((inside[0], inside[-1] + 1))
    return out


def sentences(text: str) -> SourceText:
    """``text`` cut into sentences, each sentence one source.

    Each ends at ``.``, ``!`` or ``?`` (with closing quotes or brackets) before whitespace or the end;
    trailing text without an end mark is a sentence too. Whitespace between sentences
    belongs to none.

    Parameters
    ----------
    text : str
        The text to cut.

    Returns
    -------
    SourceText
        The text, with one source per sentence (its character span).
    """
    spans, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        spans.append((start, m.end()))
        start = m.end()
    if text[start:].strip():
        spans.append((start, len(text)))
    spans = [(a + len(text[a:b]) - len(text[a:b].lstrip()), b) for a, b in spans if text[a:b].strip()]
    return SourceText(text, spans)


def documents(docs: Sequence[str], template: str = "{documents}", separator: str = "\n\n", **fields: str) -> SourceText:
    """Documents placed into a prompt ``template``, each document one source.

    The template's ``{documents}`` field becomes the documents joined by ``separator``; the other fields
    (``{question}``, ...) are filled from ``fields``.

    Parameters
    ----------
    docs : Sequence[str]
        The documents, a non-empty list of non-empty strings.
    template : str, optional
        The prompt, with a ``{documents}`` field and any other fields.
    separator : str, optional
        What joins the documents.
    **fields
        The values of the template's other fields (``question=...``).

    Returns
    -------
    SourceText
        The filled prompt, with one source per document (its character span).

    Raises
    ------
    InputError
        If the template has no ``{documents}`` field or names a field not given,
        or ``docs`` is empty or holds an empty string.
    """
    if "{documents}" not in template:
        raise InputError("the template needs a {documents} field, where the documents go")
    if not docs or not all(isinstance(d, str) and d.strip() for d in docs):
        raise InputError("documents must be a non-empty list of non-empty strings")
    try:
        head, tail = template.split("{documents}", 1)
        head, tail = head.format(**fields), tail.format(**fields)
    except (KeyError, IndexError) as err:
        raise InputError(f"the template names a field {err} that was not given") from None
    spans, pos = [], len(head)
    for d in docs:
        spans.append((pos, pos + len(d)))
        pos += len(d) + len(separator)
    return SourceText(head + separator.join(docs) + tail, spans)


def as_spans(value: Any) -> Tensor:
    """``sources=`` as a long tensor (R, S, 2): R = 1 (the same spans for every row) or one list per row.

    Accepted: a tensor (S, 2) or (B, S, 2), a list of (start, end) pairs, or a list of such lists (one per row,
    each with the same number of sources). Every span has 0 ≤ start ≤ end.

    Parameters
    ----------
    value : Any
        The caller's ``sources=``: a tensor (S, 2) or (B, S, 2), a list of
        ``(start, end)`` pairs, or one such list per row.

    Returns
    -------
    Tensor
        (R, S, 2) long spans, R = 1 or one per row.

    Raises
    ------
    InputError
        If the value is none of these forms, has no span, a span with
        ``start > end`` or a negative start, a non-integer dtype, or rows with
        different numbers of sources.
    """
    what = (
        "sources must be token spans (start, end): a list of pairs for every row, a list of such lists (one "
        "per row, the same number of sources each) or an integer tensor (S, 2) / (B, S, 2)"
    )
    if isinstance(value, Tensor):
        t = value
        if t.dtype.is_floating_point or t.dtype == torch.bool or t.is_complex():
            raise InputError(f"{what}; got a {t.dtype} tensor")
    else:
        rows = list(value) if isinstance(value, (list, tuple)) else None
        if rows and all(_is_pair(r) for r in rows):
            rows = [rows]
        elif rows is None or not all(isinstance(r, (list, tuple)) and all(_is_pair(p) for p in r) for r in rows):
            raise InputError(f"{what}; got {value!r}")
        lengths = {len(r) for r in rows}
        if len(lengths) > 1:
            raise InputError(f"{what}; the rows have {sorted(lengths)} sources")
        t = torch.tensor([[list(p) for p in r] for r in rows], dtype=torch.long)
    if t.dim() == 2:
        t = t[None]
    if t.dim() != 3 or t.shape[-1] != 2 or t.shape[0] == 0:
        raise InputError(f"{what}; got shape {tuple(t.shape)}")
    if t.shape[1] == 0:
        raise InputError("sources: give at least one span")
    t = t.long()
    if bool((t[..., 0] < 0).any()) or bool((t[..., 1] < t[..., 0]).any()):
        raise InputError(f"{what}, 0 ≤ start ≤ end; got {t.tolist()}")
    return t


def _is_pair(p: Any) -> bool:
    return (
        isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in p)
    )


def in_columns(spans: Tensor, mask: Tensor, read: Optional[Tensor] = None) -> Tensor:
    """Row-relative spans (R, S, 2) as columns of the padded batch (B, S, 2), checked against it.

    Parameters
    ----------
    spans : Tensor
        (1 or B, S, 2) from :func:`as_spans`, counted from each row's first real token.
    mask : Tensor
        (B, T) 1 = real token.
    read : Optional[Tensor], optional
        (B,) the column each row is read at (decoders), or ``None``: a source must end before it.

    Returns
    -------
    Tensor
        (B, S, 2) long, the spans' columns.

    Raises
    ------
    InputError
        If the spans are given for another number of rows, or a source reaches past its row's tokens or
        reaches the explained position.
    """
    B, T = mask.shape
    if spans.shape[0] not in (1, B):
        raise InputError(
            f"sources gives spans for {spans.shape[0]} rows; the batch has {B}: give one list of "
            "spans for every row, or one per row"
        )
    spans = spans.to(mask.device).expand(B, -1, -1)
    first = (mask != 0).long().argmax(dim=1)
    cols = spans + first[:, None, None]
    idx = torch.arange(T, device=mask.device)
    inside = (idx[None, None, :] >= cols[..., :1]) & (idx[None, None, :] < cols[..., 1:])  # (B, S, T)
    count = spans[..., 1] - spans[..., 0]
    real = (inside & (mask[:, None, :] != 0)).sum(-1)
    bad = torch.nonzero((cols[..., 1] > T) | (real != count))
    if len(bad):
        b, s = bad[0].tolist()
        raise InputError(
            f"source {s} of row {b}, tokens {tuple(spans[b, s].tolist())}, reaches past the row's "
            f"{int(mask[b].sum())} real tokens (spans count each row's tokens from its first real one)"
        )
    if read is not None:
        late = torch.nonzero((cols[..., 1] > read[:, None]) & (count > 0))
        if len(late):
            b, s = late[0].tolist()
            raise InputError(
                f"source {s} of row {b}, tokens {tuple(spans[b, s].tolist())}, reaches the explained "
                f"token ({int(read[b] - first[b])} from the row's start): a source is context before "
                "the prediction, so it must end before it"
            )
    return cols


def membership(cols: Tensor, T: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """(B, S, T): 1 where token t lies in source s (``cols`` (B, S, 2) columns), else 0.

    Parameters
    ----------
    cols : Tensor
        (B, S, 2) the sources' token columns ``[start, end)``.
    T : int
        Number of tokens T.
    dtype : torch.dtype, optional
        dtype of the result.

    Returns
    -------
    Tensor
        (B, S, T) 1 where token t lies in source s, else 0.
    """
    idx = torch.arange(T, device=cols.device)
    return ((idx >= cols[..., :1]) & (idx < cols[..., 1:])).to(dtype)


def by_source(scores: Tensor, cols: Tensor) -> Tensor:
    """(B, S) source scores: the sum of the token ``scores`` (B, T) over each source's columns (B, S, 2).

    Parameters
    ----------
    scores : Tensor
        (B, T) token scores.
    cols : Tensor
        (B, S, 2) the sources' token columns ``[start, end)``.

    Returns
    -------
    Tensor
        (B, S) the summed scores per source.
    """
    return torch.einsum("bst,bt->bs", membership(cols, scores.shape[-1], scores.dtype), scores)


__all__ = [
    "SourceText",
    "sentences",
    "documents",
    "token_spans",
    "as_spans",
    "in_columns",
    "membership",
    "by_source",
    "Span",
    "SourcesLike",
]

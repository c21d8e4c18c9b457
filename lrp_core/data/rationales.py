"""Movie-review sentences with human word-level rationales (ERASER-style JSONL).

The data set (``lrp_core/assets/rationales.jsonl``) was written for this
project: short reviews of imaginary films, half positive and half negative,
with the words a reader marks as carrying the sentiment. One JSON object per
line, in the spirit of ERASER (DeYoung et al., 2020)::

    {"annotation_id": "rev-001", "text": "...", "label": "positive",
     "tokens": ["...", ...],
     "evidences": [{"start_token": 3, "end_token": 5, "text": "..."}]}

``tokens`` is :func:`tokenize` of ``text`` (words, with punctuation as separate
tokens); ``end_token`` is exclusive; an evidence's ``text`` is the exact
substring of ``text`` its tokens cover.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np

from ..errors import LRPError, MissingFileError

LABELS = ("negative", "positive")
DEFAULT_PATH = Path(__file__).resolve().parent.parent / "assets" / "rationales.jsonl"

# A word is letters/digits, optionally joined by an apostrophe or a hyphen
# ("isn't", "mean-spirited"); every other non-space character is its own token.
_TOKEN = re.compile(r"\w+(?:['\u2019-]\w+)*|[^\w\s]")


class RationaleFormatError(LRPError):
    """The rationale file is malformed; the message names the line and the problem."""


def tokenize(text: str) -> list[tuple[str, int, int]]:
    """Split ``text`` into (word, start_char, end_char) triples.

    Parameters
    ----------
    text : str
        The text.

    Returns
    -------
    list[tuple[str, int, int]]
        ``(word, start_char, end_char)`` per word, in order.
    """
    return [(m.group(), m.start(), m.end()) for m in _TOKEN.finditer(text)]


@dataclass(frozen=True)
class RationaleRecord:
    """One document with a human rationale per word.

    The one record type of the library: :func:`load_rationales` builds it from
    the shipped file, :mod:`lrp_core.data.folders` from user folders (ERASER,
    JSONL), and the rationale evaluation reads it.

    Attributes:
        text: the document.
        words: the tokens (W,).
        rationale: (W,) booleans, True where a word is part of the human
            rationale (a list from :func:`load_rationales`, a bool array from
            the evaluation's loaders).
        label: the class id (here 0 = negative, 1 = positive).
        offsets: (W,) (start, end) character offsets of each word in ``text``;
            ``None`` when unknown (the evaluation then finds them by search).
        id: the ``annotation_id`` (``""`` when the source has none).
        evidences: the (start_token, end_token) spans, end exclusive.
    """

    text: str
    words: list[str]
    rationale: Union[Sequence[bool], np.ndarray]  # a list, or a bool array (W,)
    label: int
    offsets: Optional[list[tuple[int, int]]] = field(default=None, repr=False)
    id: str = ""
    evidences: list[tuple[int, int]] = field(default_factory=list, repr=False)

    @property
    def label_name(self) -> str:
        return LABELS[self.label]

    @property
    def rationale_words(self) -> list[str]:
        return [w for w, r in zip(self.words, self.rationale) if r]


def _fail(path: Path, line_no: int, msg: str) -> RationaleFormatError:
    return RationaleFormatError(f"{path}, line {line_no}: {msg}")


def _parse(obj: object, path: Path, n: int) -> RationaleRecord:
    if not isinstance(obj, dict):
        raise _fail(path, n, f"expected a JSON object, got {type(obj).__name__}")
    for key, typ in (("annotation_id", str), ("text", str), ("label", str), ("tokens", list), ("evidences", list)):
        if key not in obj:
            raise _fail(path, n, f"missing key {key!r} (required: annotation_id, text, label, tokens, evidences)")
        if not isinstance(obj[key], typ):
            raise _fail(path, n, f"{key!r} must be a {typ.__name__}, got {type(obj[key]).__name__}")
    text, label = obj["text"], obj["label"]
    if label not in LABELS:
        raise _fail(path, n, f"label must be 'positive' or 'negative', got {label!r}")
    toks = tokenize(text)
    words = [w for w, _, _ in toks]
    if obj["tokens"] != words:
        raise _fail(path, n, f"'tokens' do not match the tokenised text; expected {words}")
    if not obj["evidences"]:
        raise _fail(path, n, "no evidences: every record needs at least one rationale span")
    mask = [False] * len(words)
    spans = []
    for j, ev in enumerate(obj["evidences"]):
        if not isinstance(ev, dict) or not all(k in ev for k in ("start_token", "end_token", "text")):
            raise _fail(path, n, f"evidence {j} must be an object with start_token, end_token, text")
        s, e = ev["start_token"], ev["end_token"]
        if not (isinstance(s, int) and isinstance(e, int) and 0 <= s < e <= len(words)):
            raise _fail(path, n, f"evidence {j}: need 0 <= start_token < end_token <= {len(words)}, got [{s}, {e})")
        covered = text[toks[s][1] : toks[e - 1][2]]
        if ev["text"] != covered:
            raise _fail(path, n, f"evidence {j}: text {ev['text']!r} does not match tokens [{s}, {e}) = {covered!r}")
        for k in range(s, e):
            mask[k] = True
        spans.append((s, e))
    return RationaleRecord(
        id=obj["annotation_id"],
        text=text,
        label=LABELS.index(label),
        words=words,
        rationale=mask,
        offsets=[(a, b) for _, a, b in toks],
        evidences=spans,
    )


def load_rationales(path: str | Path | None = None) -> list[RationaleRecord]:
    """Load and validate the rationale set (default: the one shipped with lrp_core).

    Parameters
    ----------
    path : str | Path | None, optional
        The JSONL file; default the one shipped with lrp_core.

    Returns
    -------
    list[RationaleRecord]
        The records, in file order.

    Raises
    ------
    MissingFileError
        ``path`` does not exist (a ``FileNotFoundError``).
    RationaleFormatError
        a line is not valid JSON or breaks the format; the
        message names the file, the line number and what was expected; also a file without
        records or with a duplicate ``annotation_id``.
    """
    path = Path(path) if path is not None else DEFAULT_PATH
    if not path.is_file():
        raise MissingFileError(f"rationale file not found: {path}")
    records: list[RationaleRecord] = []
    seen: set[str] = set()
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise _fail(path, n, f"not valid JSON ({err.msg} at column {err.colno})") from None
        rec = _parse(obj, path, n)
        if rec.id in seen:
            raise _fail(path, n, f"duplicate annotation_id {rec.id!r}")
        seen.add(rec.id)
        records.append(rec)
    if not records:
        raise RationaleFormatError(f"{path}: no records")
    return records


def make_record(annotation_id: str, text: str, label: str, evidence_spans: list[tuple[int, int]]) -> dict:
    """Build one JSONL record (a dict) from token spans; used to author the file.

    Parameters
    ----------
    annotation_id : str
        The record's id.
    text : str
        The document.
    label : str
        The class name.
    evidence_spans : list[tuple[int, int]]
        ``(start, end)`` token spans (end exclusive) of the evidence.

    Returns
    -------
    dict
        The record: ``annotation_id``, ``text``, ``label``, ``tokens`` and ``evidences``.
    """
    toks = tokenize(text)
    return {
        "annotation_id": annotation_id,
        "text": text,
        "label": label,
        "tokens": [w for w, _, _ in toks],
        "evidences": [
            {"start_token": s, "end_token": e, "text": text[toks[s][1] : toks[e - 1][2]]} for s, e in evidence_spans
        ],
    }


__all__ = ["RationaleRecord", "RationaleFormatError", "load_rationales", "tokenize", "make_record", "DEFAULT_PATH"]

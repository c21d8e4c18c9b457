"""Tokens as people read them, and the generation heat map as a self-contained HTML page.

Language-model tokenizers mark word boundaries inside their pieces: byte-level
BPE (GPT-2, Llama 3, Qwen) writes a leading space as ``Ġ`` and a newline as
``Ċ``; SentencePiece (Llama 2, Gemma, Phi-3) writes a leading space as ``▁``;
WordPiece (BERT) marks a continuation with ``##``. :func:`readable` turns a
piece into the text it stands for, :func:`merge_words` joins pieces into words
(summing relevance by default, so the total is kept), and
:func:`generation_html` draws one row per generated token over its context
with the colours of :mod:`lrp_core.viz` (zero-centred, white = 0, red for,
blue against; numpy only, no matplotlib). The page has no script, remote font
or style sheet: it opens offline and outside Jupyter.
"""

from __future__ import annotations

import html
from typing import Any, Optional, Sequence

import numpy as np

from ..errors import InputError
from .colours import DEFAULT_CLIP, DEFAULT_GAMMA, _text_colour, colorize, colour_scale

#: markers of a leading space (byte-level BPE, SentencePiece) and of a newline (byte-level BPE)
SPACE_MARKS = ("Ġ", "▁")
NEWLINE_MARKS = ("Ċ",)
CONTINUATION = "##"
SCALES = ("row", "all")


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


#: the piece a vision-language model's image tokens are shown as, one cell for all of them
IMAGE_LABEL = "[image]"


def _special(piece: str) -> bool:
    return (piece.startswith("<") and piece.endswith(">")) or (piece.startswith("[") and piece.endswith("]"))


def _cell(text: str, value: Optional[float], rgb: Optional[np.ndarray]) -> str:
    shown = html.escape(text.replace("\n", "↵")) or "&nbsp;"
    if value is None or rgb is None:  # after the step's prefix: not part of its context
        return f'<span class="c off">{shown}</span>'
    style = f"background:rgb({rgb[0]},{rgb[1]},{rgb[2]});color:{_text_colour(rgb)}"
    return f'<span class="c" style="{style}" title="{html.escape(repr(text))}: {value:.4g}">{shown}</span>'


_STYLE = (
    "body{font-family:system-ui,sans-serif;margin:12px}"
    ".trl-gen{border-collapse:collapse;font-size:13px}"
    ".trl-gen td{padding:3px 6px;vertical-align:top;border-bottom:1px solid #eee}"
    ".trl-gen td.g{font-family:monospace;font-weight:bold;white-space:nowrap}"
    ".c{font-family:monospace;display:inline-block;padding:1px 3px;margin:1px;border-radius:3px;"
    "border:1px solid #ddd;white-space:pre}"
    ".c.off{color:#bbb;border-color:#f3f3f3}"
    ".trl-gen figure.trl-thumb{margin:0;text-align:center}"
    ".trl-gen img.trl-map{display:block;border:1px solid #ddd}"
    ".trl-gen figcaption{font-size:11px;color:#555}"
    ".trl-note{color:#555;font-size:12px;margin-top:6px}"
    ".trl-src{display:flex;flex-wrap:wrap;gap:4px;margin:4px 0}"
    ".s{display:inline-block;padding:3px 6px;border-radius:4px;border:1px solid #ccc;font-size:12px;"
    "max-width:22em}"
    ".s b{font-family:monospace;margin-right:4px}"
)


def source_blocks(
    labels: Sequence[str], scores: Any, limit: Optional[float] = None, short: bool = False, gamma: float = DEFAULT_GAMMA
) -> str:
    """The sources as coloured blocks with their scores.

    The styles are :func:`generation_html`'s.

    Parameters
    ----------
    labels : Sequence[str]
        One text per source (its words).
    scores : Any
        (S,) the source scores.
    limit : Optional[float], optional
        The colour limit (default: the largest |score|).
    short : bool, optional
        Blocks show ``#j`` and the score only (the label on hover).
    gamma : float, optional
        Colour gamma in (0, 1].

    Returns
    -------
    str
        An HTML ``<div>``.
    """
    vals = np.nan_to_num(np.asarray(scores, dtype=np.float64)).reshape(-1)
    if len(vals) != len(labels):
        raise InputError(f"source_blocks: {len(vals)} scores for {len(labels)} labels")
    lim = float(np.abs(vals).max()) if limit is None else float(limit)
    rgb = colorize(vals, signed=True, limit=lim if lim > 0 else 1.0, gamma=gamma)
    cells = []
    for j, (label, v) in enumerate(zip(labels, vals)):
        style = f"background:rgb({rgb[j][0]},{rgb[j][1]},{rgb[j][2]});color:{_text_colour(rgb[j])}"
        text = "" if short else " " + html.escape(label)
        cells.append(
            f'<span class="s" style="{style}" title="{html.escape(label)}: {v:.4g}">'
            f"<b>#{j + 1} {v:+.3g}</b>{text}</span>"
        )
    return f'<div class="trl-src">{"".join(cells)}</div>'


def generation_html(
    context: Sequence[str],
    generated: Sequence[str],
    scores: Any,
    scale: str = "row",
    clip: Optional[float] = DEFAULT_CLIP,
    gamma: float = DEFAULT_GAMMA,
    title: Optional[str] = None,
    contrasts: Optional[Sequence[Optional[str]]] = None,
    sources: Any = None,
    source_labels: Optional[Sequence[str]] = None,
    probabilities: Any = None,
    images: Optional[Sequence[str]] = None,
    image_note: Optional[str] = None,
) -> str:
    """One row per generated token: the relevance of every context token for it.

    Parameters
    ----------
    context : Sequence[str]
        the P+K−1 input tokens (prompt and all but the last generated token), as pieces.
    generated : Sequence[str]
        the K generated tokens.
    scores : Any
        (K, P+K−1); row k is zero from its prefix's end on (those cells are drawn greyed).
    scale : str, optional
        ``"row"`` — each row its own colour limit (steps' logits differ in size), ``"all"`` — one limit.
    clip : Optional[float], optional
        Percentile of ``|scores|`` for the colour limits (``None``: the maximum).
    gamma : float, optional
        Colour gamma in (0, 1].
    title : Optional[str], optional
        Heading above the rows.
    contrasts : Optional[Sequence[Optional[str]]], optional
        per step, the token it was contrasted with (``None``: no contrast).
    sources : Any, optional
        (K, S) per step the score of each source (``explain_generation(..., sources=)``): drawn as
        blocks beside each row, and their sum over the steps (the whole answer) as labelled blocks below.
    source_labels : Optional[Sequence[str]], optional
        the S sources' texts (with ``sources``).
    probabilities : Any, optional
        (K,) the model's probability of each step's token, shown beside it.
    images : Optional[Sequence[str]], optional
        per step an HTML picture (a vision-language model's image map for that step, e.g. a ``<figure>`` of
        :func:`lrp_core.viz.thumbnails.step_thumbnails`), drawn in a cell between the generated token and its row.
    image_note : Optional[str], optional
        a sentence saying what the pictures show, added to the note below the rows.

    Returns
    -------
    str
        An HTML fragment (a ``<div>``) with its own ``<style>``; :func:`page` makes it a whole document.

    Raises
    ------
    InputError
        If ``scores`` is not (K, P+K−1), ``images`` does not give one picture per step, or ``scale`` is not
        ``"row"`` or ``"all"``.
    """
    vals = _step_scores(context, generated, scores, scale, images)
    K, P = len(generated), len(context) - len(generated) + 1
    limit_all = colour_scale(vals, clip).limit
    src, labels = _step_sources(sources, source_labels, K)
    src_limit = None if src is None else float(np.abs(src).max())
    rows, notes = [], []
    for k in range(K):
        visible = P + k  # the step's prefix: the prompt and the tokens generated before it
        limit = colour_scale(vals[k, :visible], clip).limit if scale == "row" else limit_all
        rgb = colorize(vals[k, :visible], signed=True, limit=limit, gamma=gamma)
        cells = [_cell(readable(t), float(vals[k, i]), rgb[i]) for i, t in enumerate(context[:visible])]
        cells += [_cell(readable(t), None, None) for t in context[visible:]]
        p_k = None if probabilities is None else float(probabilities[k])
        blocks = (
            "" if src is None else f"<td>{source_blocks(labels, src[k], limit=src_limit, short=True, gamma=gamma)}</td>"
        )
        picture = "" if images is None else f"<td>{images[k]}</td>"
        rows.append(
            f"<tr>{_step_cell(generated[k], contrasts[k] if contrasts else None, p_k)}"
            f"{picture}<td>{''.join(cells)}</td>{blocks}</tr>"
        )
        notes.append(limit)
    head = f"<h3>{html.escape(title)}</h3>" if title else ""
    whole = ""
    if src is not None:
        whole = (
            f'<div class="trl-note"><b>Sources, whole answer</b> (each source\'s score summed over the '
            f"steps; per step in the last column):</div>{source_blocks(labels, src.sum(0), gamma=gamma)}"
        )
    return (
        f'<div class="trl-generation"><style>{_STYLE}</style>{head}'
        f'<table class="trl-gen">{"".join(rows)}</table>{whole}{_reading_note(scale, limit_all, image_note)}</div>'
    )


def _step_scores(
    context: Sequence[str], generated: Sequence[str], scores: Any, scale: str, images: Optional[Sequence[str]]
) -> np.ndarray:
    """:func:`generation_html`'s scores as an array (NaN as 0), checked with its scale and pictures.

    Parameters
    ----------
    context : Sequence[str]
        The P+K−1 context pieces.
    generated : Sequence[str]
        The K generated pieces.
    scores : Any
        (K, P+K−1) the step scores.
    scale : str
        ``"row"`` or ``"all"``.
    images : Optional[Sequence[str]]
        One HTML picture per step, or ``None``.

    Returns
    -------
    np.ndarray
        (K, P+K−1) float64.

    Raises
    ------
    InputError
        If ``scores`` is not (K, P+K−1), ``scale`` is not in :data:`SCALES` or ``images`` does not give one
        picture per step.
    """
    vals = np.nan_to_num(np.asarray(scores, dtype=np.float64))
    K = len(generated)
    if vals.shape != (K, len(context)):
        raise InputError(
            f"generation_html: scores have shape {vals.shape}, expected (K, P+K−1) = "
            f"({K}, {len(context)}) for {K} generated and {len(context)} context tokens"
        )
    if scale not in SCALES:
        raise InputError(f"scale must be one of {SCALES}, got {scale!r}")
    if images is not None and len(images) != K:
        raise InputError(f"generation_html: {len(images)} images for {K} generated tokens; give one per step")
    return vals


def _step_sources(
    sources: Any, source_labels: Optional[Sequence[str]], K: int
) -> tuple[Optional[np.ndarray], list[str]]:
    """:func:`generation_html`'s source scores as an array (NaN as 0) and their labels, checked.

    Parameters
    ----------
    sources : Any
        (K, S) per step the score of each source, or ``None``.
    source_labels : Optional[Sequence[str]]
        The S sources' texts (default ``"source j"``).
    K : int
        The steps.

    Returns
    -------
    tuple[Optional[np.ndarray], list[str]]
        ``(sources (K, S) float64 or None, the labels)``.

    Raises
    ------
    InputError
        If ``sources`` is not (K, S) for the S labels.
    """
    src = None if sources is None else np.nan_to_num(np.asarray(sources, dtype=np.float64))
    labels = (
        list(source_labels)
        if source_labels is not None
        else [f"source {j + 1}" for j in range(0 if src is None else src.shape[1])]
    )
    if src is not None and (src.ndim != 2 or src.shape != (K, len(labels))):
        raise InputError(f"generation_html: sources have shape {src.shape}, expected (K, S) = ({K}, {len(labels)})")
    return src, labels


def _step_cell(generated: str, versus: Optional[str], probability: Optional[float]) -> str:
    """The cell of one generated token: the token, the one it was contrasted with and its probability.

    Parameters
    ----------
    generated : str
        The generated piece.
    versus : Optional[str]
        The piece it was contrasted with, or ``None``.
    probability : Optional[float]
        The model's probability of the generated token, or ``None``.

    Returns
    -------
    str
        An HTML ``<td>``.
    """
    rather = (
        ""
        if versus is None
        else f' <span style="font-weight:normal">rather than {html.escape(readable(versus))}</span>'
    )
    p = (
        ""
        if probability is None
        else f' <span style="font-weight:normal;color:#777">p {100 * probability:.1f} %</span>'
    )
    return f'<td class="g">{html.escape(readable(generated))}{rather}{p}</td>'


def _reading_note(scale: str, limit_all: float, image_note: Optional[str]) -> str:
    """The note below :func:`generation_html`'s rows: how to read them.

    Parameters
    ----------
    scale : str
        ``"row"`` or ``"all"``.
    limit_all : float
        The colour limit of all rows (shown with ``"all"``).
    image_note : Optional[str]
        A sentence on the pictures, added at the end.

    Returns
    -------
    str
        An HTML ``<div>``.
    """
    how = "each row has its own colour limit" if scale == "row" else f"one colour limit ±{limit_all:.3g}"
    return (
        f'<div class="trl-note">Row k: the relevance of each context token for generated token k '
        f"(red for, blue against, white 0; {how}; greyed tokens come after the step's prefix). "
        f"Hover a token for its exact score.{'' if not image_note else ' ' + html.escape(image_note)}</div>"
    )


def image_cell(
    context: Sequence[str], scores: Any, placeholder: Any, label: str = IMAGE_LABEL
) -> tuple[list[str], np.ndarray]:
    """A vision-language model's image placeholder tokens shown as one cell: each run of consecutive placeholders
    becomes one piece ``label`` whose score is the run's summed score.

    Parameters
    ----------
    context : Sequence[str]
        The T context pieces.
    scores : Any
        (K, T) the step scores over them.
    placeholder : Any
        (T,) bool, the image placeholder tokens.
    label : str, optional
        The piece shown for a run.

    Returns
    -------
    tuple[list[str], np.ndarray]
        The pieces and the (K, T') scores with every run summed into its first column.
    """
    vals = np.asarray(scores, dtype=np.float64)
    mask = np.asarray(placeholder, dtype=bool).reshape(-1)
    if vals.ndim != 2 or vals.shape[1] != len(context) or len(mask) != len(context):
        raise InputError(
            f"image_cell: scores {vals.shape} and placeholders ({len(mask)},) must cover the "
            f"{len(context)} context pieces"
        )
    pieces: list[str] = []
    columns: list[np.ndarray] = []
    for i, piece in enumerate(context):
        if mask[i] and i > 0 and mask[i - 1]:
            columns[-1] = columns[-1] + vals[:, i]  # the run goes on: its scores add up in one cell
            continue
        pieces.append(label if mask[i] else piece)
        columns.append(vals[:, i].copy())
    return pieces, np.stack(columns, 1) if columns else vals[:, :0]


def page(fragment: str, title: str = "Transformer Relevance Lab") -> str:
    """A whole HTML document around a fragment: UTF-8, no external resource.

    Parameters
    ----------
    fragment : str
        An HTML fragment, e.g. from :func:`generation_html`.
    title : str, optional
        The page title.

    Returns
    -------
    str
        The HTML document.
    """
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"</head><body>{fragment}</body></html>"
    )


__all__ = [
    "readable",
    "merge_words",
    "span_text",
    "generation_html",
    "source_blocks",
    "image_cell",
    "page",
    "IMAGE_LABEL",
    "SPACE_MARKS",
    "SCALES",
]

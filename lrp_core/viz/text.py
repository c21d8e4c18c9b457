"""Token heat maps as HTML: one row of tokens (:func:`token_html`), and the generation heat map page.

:func:`generation_html` draws one row per generated token over its context with the colours of
:mod:`lrp_core.viz` (zero-centred, white = 0, red for, blue against; numpy only, no matplotlib). The page has no
script, remote font or style sheet: it opens offline and outside Jupyter. The pieces are shown as text by
:mod:`.words` (whose names this module re-exports).
"""

from __future__ import annotations

import html
from typing import Any, Optional, Sequence

import numpy as np

from ..errors import InputError
from .colours import DEFAULT_CLIP, DEFAULT_GAMMA, _as_numpy, _fmt, _text_colour, _view, colorize, colour_scale
from .words import (
    CONTINUATION,
    NEWLINE_MARKS,
    SPACE_MARKS,
    merge_wordpieces,
    merge_words,
    readable,
    span_text,
)

SCALES = ("row", "all")

#: the piece a vision-language model's image tokens are shown as, one cell for all of them
IMAGE_LABEL = "[image]"


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


def token_html(
    tokens: Sequence[str],
    scores: Any,
    signed: bool = True,
    legend: bool = True,
    clip: Optional[float] = DEFAULT_CLIP,
    gamma: float = DEFAULT_GAMMA,
    explained: str = "the class",
) -> str:
    """Tokens as HTML spans whose background shows their relevance.

    Zero-centred diverging colours (white = 0, red > 0, blue < 0) with the same
    colour limit and gamma as the pictures (:func:`colour_scale`, :func:`colorize`);
    the text colour switches to white on dark backgrounds; each span's tooltip gives
    the exact score; the legend says when scores were clipped. ``signed=False``
    shows ``clamp(min=0)``. ``explained``: what red speaks for in the legend (an LM's map: "the token").

    Parameters
    ----------
    tokens : Sequence[str]
        (T,) the tokens' texts.
    scores : Any
        (T,) one score per token.
    signed : bool, optional
        Keep negative scores; ``False`` shows ``clamp(min=0)``.
    legend : bool, optional
        Add the legend line under the tokens.
    clip : Optional[float], optional
        Percentile of ``|scores|`` for the colour limit (``None``: the maximum).
    gamma : float, optional
        Colour gamma in (0, 1].
    explained : str, optional
        What red speaks for, in the legend.

    Returns
    -------
    str
        An HTML fragment.

    Raises
    ------
    InputError
        If ``tokens`` and ``scores`` differ in length.
    """
    vals = _view(np.nan_to_num(_as_numpy(scores)).reshape(-1), signed)
    if len(tokens) != vals.shape[0]:
        raise InputError(f"token_html: {len(tokens)} tokens but {vals.shape[0]} scores")
    scale = colour_scale(vals, clip)
    m = scale.limit
    colours = colorize(vals, signed=True, limit=m, gamma=gamma)
    spans = []
    for tok, v, rgb in zip(tokens, vals, colours):
        style = (
            f"background-color:rgb({rgb[0]},{rgb[1]},{rgb[2]});color:{_text_colour(rgb)};"
            "padding:1px 4px;margin:1px;border-radius:3px;display:inline-block;"
            "font-family:monospace;border:1px solid #ddd"
        )
        spans.append(
            f'<span class="trl-token" style="{style}" title="{html.escape(str(tok))}: '
            f'{v:.4g}">{html.escape(str(tok))}</span>'
        )
    body = " ".join(spans)
    out = f'<div class="trl-tokens" style="line-height:1.9;max-width:100%">{body}</div>'
    if legend:
        scale_text = (
            f"{_fmt(-m)} (blue, against) \u2026 0 (white) \u2026 {_fmt(m)} (red, for {explained})"
            if signed
            else f"0 (white) \u2026 {_fmt(m)} (red, for {explained}); negatives hidden"
        )
        out += (
            '<div class="trl-legend" style="font-size:85%;color:#444;margin-top:4px">'
            f"colour scale {scale_text}; {html.escape(scale.describe())}</div>"
        )
    return out


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
    "token_html",
    "readable",
    "merge_words",
    "merge_wordpieces",
    "span_text",
    "generation_html",
    "source_blocks",
    "image_cell",
    "page",
    "IMAGE_LABEL",
    "SPACE_MARKS",
    "NEWLINE_MARKS",
    "CONTINUATION",
    "SCALES",
]

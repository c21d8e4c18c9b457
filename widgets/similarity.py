"""SimilarityExplorer: two sentences, BiLRP's map over their word pairs (a thin client of :func:`lrp_core.bilrp`).

Two text boxes hold the sentences; the method and the embedding's pooling are chosen from drop-downs. The map is
an HTML table, one cell per token pair (i of the first sentence, j of the second), coloured by ``R_ij`` on the
zero-centred diverging scale of every picture (red: the pair adds to the similarity, blue: it takes away); a
cell's tooltip (hover) gives the pair and its exact ``R_ij``. Under the table: the similarity ``⟨e(a), e(b)⟩``
(the cosine where the embedding is normalised), ``Σ R_ij`` and each sentence's tokens coloured by their row /
column sums.
"""

from __future__ import annotations

import html as _html
from typing import Any, Optional, Sequence

import ipywidgets as W
import numpy as np

from lrp_core import bilrp
from lrp_core.similarity import BILRP_METHODS, SimilarityExplanation
from lrp_core.viz import colorize, colour_scale, token_html

from ._common import RelevanceWidget, error_html


def _text_colour(rgb: Sequence[int]) -> str:
    return "#fff" if 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] < 128 else "#000"


def pair_table(rows: Sequence[str], cols: Sequence[str], R: np.ndarray) -> str:
    """(n_a, n_b) ``R`` as an HTML table: row / column headers the tokens, each cell coloured by its value
    (zero-centred) with the pair and ``R_ij`` in its tooltip (class ``trl-pair``)."""
    m = colour_scale(R.reshape(-1), None).limit
    colours = colorize(R, signed=True, limit=m)
    head = "".join(
        f'<th style="writing-mode:vertical-rl;font-weight:normal;font-family:monospace">{_html.escape(c)}</th>'
        for c in cols
    )
    body = []
    for i, word in enumerate(rows):
        cells = []
        for j, other in enumerate(cols):
            rgb = colours[i, j]
            title = _html.escape(f"{word} ↔ {other}: {R[i, j]:.4g}")
            style = f"background-color:rgb({rgb[0]},{rgb[1]},{rgb[2]});width:22px;height:22px;border:1px solid #eee"
            cells.append(f'<td class="trl-pair" title="{title}" data-i="{i}" data-j="{j}" style="{style}"></td>')
        label = f'<th style="text-align:right;font-weight:normal;font-family:monospace">{_html.escape(word)}</th>'
        body.append(f"<tr>{label}{''.join(cells)}</tr>")
    return (
        f'<table class="trl-pairs" style="border-collapse:collapse"><tr><th></th>{head}</tr>{"".join(body)}</table>'
        f'<div style="font-size:85%;color:#444">colour scale ±{m:.3g} (red: the pair adds to the similarity, '
        "blue: it takes away); hover a cell for its R_ij</div>"
    )


class SimilarityExplorer(RelevanceWidget):
    """Two sentences and BiLRP's interaction map (docs/METHODS.md §2l).

    Args:
        model: an embedding model ``bilrp`` explains (a ``SentenceTransformer``, a ``BertModel``, ...).
        tokenizer: a callable like a Hugging Face tokenizer (``input_ids``, ``attention_mask``; with
            ``convert_ids_to_tokens`` the pieces are shown by name).
        a, b: the two sentences.
        methods: the methods offered (default: every method ``bilrp`` takes).
        pooling: the embedding (``None``: the model's own; ``"cls"``, ``"mean"``, ``"pooler"``).
        normalise: explain the unit embedding (``Σ R`` is the cosine).

    ``result`` is the last :class:`~lrp_core.similarity.SimilarityExplanation`; ``html`` the table,
    ``info`` the totals and the two sentences' coloured tokens.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        a: str,
        b: str,
        methods: Optional[Sequence[str]] = None,
        pooling: Optional[str] = None,
        normalise: bool = False,
    ) -> None:
        super().__init__()
        self.model, self.tokenizer, self.pooling, self.normalise = model, tokenizer, pooling, normalise
        self.result: Optional[SimilarityExplanation] = None
        self.tokens: tuple[list[str], list[str]] = ([], [])
        box = dict(continuous_update=False, layout=W.Layout(width="520px"))
        self.a_box = W.Text(value=a, description="sentence a", **box)
        self.b_box = W.Text(value=b, description="sentence b", **box)
        self.method = W.Dropdown(options=list(methods or BILRP_METHODS), description="method")
        self.html = W.HTML(value="")
        self.info = W.HTML(value="")
        for control in (self.a_box, self.b_box, self.method):
            control.observe(lambda _change: self.recompute(), names="value")
        self.children = [self.a_box, self.b_box, self.method, self.message, self.html, self.info]
        self.add_class("trl-widget")
        self.add_class("trl-similarity")
        self.recompute()

    def _pieces(self, batch: Any) -> list[str]:
        ids = batch["input_ids"][0].tolist()
        convert = getattr(self.tokenizer, "convert_ids_to_tokens", None)
        return [str(t) for t in convert(ids)] if callable(convert) else [f"[{t}]" for t in ids]

    def recompute(self) -> None:
        """Explain the two sentences now (called on every change of a control)."""

        def run() -> None:
            a = dict(self.tokenizer([self.a_box.value], return_tensors="pt"))
            b = dict(self.tokenizer([self.b_box.value], return_tensors="pt"))
            self.result = bilrp(
                self.model,
                a,
                b,
                method=self.method.value,
                pooling=self.pooling,
                normalise=self.normalise,
                progress=False,
            )
            self.tokens = (self._pieces(a), self._pieces(b))
            self.clear_error()
            self._draw()

        self._guarded("compute", run)

    def _draw(self) -> None:
        assert self.result is not None
        R = self.result.pair(0).double().numpy()
        rows, cols = self.tokens
        self.html.value = pair_table(rows, cols, R)
        sim = float(self.result.similarity[0])
        self.info.value = (
            f"<div>similarity {sim:.4g} · Σ R {R.sum():.4g} · {self.result.method}, "
            f"{self.result.calls} explain calls in {self.result.seconds:.1f} s</div>"
            + token_html(rows, R.sum(axis=1), explained="the similarity", legend=False)
            + token_html(cols, R.sum(axis=0), explained="the similarity", legend=False)
        )

    def _static_bundle(self) -> dict[str, Any]:
        if self.result is None:
            return {"text/html": error_html(self.last_error or "nothing to show")}
        return {"text/html": self.html.value + self.info.value}


__all__ = ["SimilarityExplorer", "pair_table"]

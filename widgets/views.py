"""What a widget shows for one explanation, one block and one head (pure functions).

Views (``exp`` is the explanation of one sample, a batch of one):

* ``"output"``: the method's own result, ``exp.scores`` (or ``exp.pixels`` for ``lrp``).
* ``"accumulated"``: the [CLS] row of ``accumulate(exp.layers, start, b)``, i.e. of
  (I+Ā_b)…(I+Ā_start): how the method's product looks after block b.
* ``"block"``: the [CLS] row of block b's own matrix Ā_b (``exp.layers[:, b]``).
* ``"residual"``: ``exp.token_relevance[:, b]``, the relevance of each token in the
  residual stream at block b (LRP-pass methods); its sum is the conserved total.

ViT rows keep the patch tokens only (the last h·w tokens). Text rows keep every
real token; in the accumulated view the [CLS] entry (dominated by the identity)
is replaced by the row's minimum over the real tokens, as the engine does
for BERT outputs.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from lrp_core import registry
from lrp_core.adapters import TokenLayout

from . import _engine

VIEW_LABELS = {
    "output": "method output",
    "accumulated": "product start\u2192b",
    "block": "block b only",
    "residual": "residual at b",
}


def n_blocks(exp: Any) -> int:
    """Number of blocks the explanation has per-block data for (0 if none)."""
    for t in (exp.layers, exp.token_relevance):
        if t is not None:
            return int(t.shape[1])
    return 0


def per_head(exp: Any) -> Optional[torch.Tensor]:
    """(B, L, H, N, N) per-head block matrices, where the engine kept them."""
    return exp.layers_per_head


def n_heads(exp: Any) -> int:
    t = per_head(exp)
    return 0 if t is None else int(t.shape[2])


def available_views(exp: Any) -> list[str]:
    """The views this explanation supports, ``"output"`` first."""
    views = ["output"]
    if exp.layers is not None:
        views += ["accumulated", "block"]
    if exp.token_relevance is not None:
        views.append("residual")
    return views


def rollout_norm(exp: Any) -> str:
    """The normalisation of the factors of the method's layer product, as the engine used it."""
    norm = registry.product_norm(exp.method, exp.options)
    if norm is None:
        raise ValueError(f"method {exp.method!r} has no layer product")
    return norm


def real_tokens(exp: Any) -> int:
    """Number of non-padding tokens of a one-sample text explanation."""
    if exp.attention_mask is None:
        return int(exp.scores.shape[-1])
    return int(exp.attention_mask[0].sum().item())


def _row(exp: Any, row: Any) -> np.ndarray:
    """Cut one [CLS] row (N,) to what is displayed: patches (grid) or real tokens."""
    if isinstance(row, torch.Tensor):
        row = row.detach().float().cpu().numpy()
    row = np.asarray(row, dtype=np.float64)
    if exp.grid is not None:
        h, w = exp.grid
        return row[-h * w:].reshape(h, w).copy()
    return row[:real_tokens(exp)].copy()


def product_row(exp: Any, layout: TokenLayout, row: np.ndarray) -> np.ndarray:
    """What the accumulated view shows of a product's [CLS] row (N,): the engine's readout of it.

    ``layout`` is the sample's token layout (``adapter.layout``): its scored tokens,
    with its readout-minimum rule, then the display cut of :func:`_row`.
    """
    scored = layout.readout_minimum(layout.scores(torch.as_tensor(row, dtype=torch.float64)[None]))
    return _row(exp, scored[0].numpy())  # float64 kept: the product was chained in float64


def view_map(exp: Any, view: str, block: int = 0, start: int = 0, head: Optional[int] = None,
             layout: Optional[TokenLayout] = None) -> np.ndarray:
    """The values a widget shows: (h, w) for images (or (H, W) pixels), (T,) for text.

    ``head=None`` uses the head mean (``exp.layers``); an int uses that head's
    matrix for block ``block`` (block view), or substitutes it for block
    ``block`` in the product (accumulated view; it needs the sample's ``layout``,
    see :func:`product_row`).
    """
    if view == "output":
        if exp.pixels is not None:
            return exp.pixels[0].detach().float().cpu().numpy().astype(np.float64)
        return _row(exp, exp.scores[0])
    L = n_blocks(exp)
    if not 0 <= block < max(L, 1):
        raise ValueError(f"block must be in 0..{L - 1}; got {block}")
    if view == "residual":
        if exp.token_relevance is None:
            raise ValueError(f"method {exp.method!r} has no per-block token relevance")
        return _row(exp, exp.token_relevance[0, block])
    if exp.layers is None:
        raise ValueError(f"method {exp.method!r} has no per-block matrices")
    if view == "block":
        mat = exp.layers[0, block] if head is None else per_head(exp)[0, block, head]
        return _row(exp, mat[0])
    if view == "accumulated":
        return LayerProducts(exp, layout).view(block, start, head)
    raise ValueError(f"unknown view {view!r}; choose one of {sorted(VIEW_LABELS)}")


def conservation_note(totals: np.ndarray, rtol: float = 1e-3) -> str:
    """Say whether the per-block totals are conserved (equal across the computed blocks)."""
    computed = totals[totals != 0]
    if computed.size < 2:
        return "one block computed"
    if np.allclose(computed, computed[0], rtol=rtol, atol=1e-9):
        return "conserved: equal at every block"
    return "not conserved by this method's rules"


def absorbed_note(exp: Any) -> Optional[str]:
    """Where relevance is lost on its way down (``exp.conservation``, AttnLRP / CP-LRP), as a share of y_t.

    Steps: the readout, each block from the last, and block 0 with the embedding layer below it.
    """
    c = exp.conservation
    if c is None:
        return None
    out = float(c.output[0])
    steps = (c.absorbed()[0] / (out if out != 0 else 1.0)).tolist()
    L = len(steps) - 1
    names = ["readout"] + [f"block {L - k}" for k in range(1, L)] + ["block 0 + embedding"]
    parts = ", ".join(f"{n} {100 * v:+.1f}%" for n, v in zip(names, steps))
    return f"y_t = {out:.4g} enters at the top; absorbed on the way down: {parts}"


def block_totals(exp: Any) -> Optional[np.ndarray]:
    """Σ over tokens of ``token_relevance`` for every block (the conserved total), or None."""
    if exp.token_relevance is None:
        return None
    t = exp.token_relevance[0]
    if exp.attention_mask is not None:
        t = t[:, : real_tokens(exp)]
    return t.detach().float().sum(-1).cpu().numpy().astype(np.float64)


class LayerProducts:
    """Fast accumulated views of one explanation, for sliders that must answer at once.

    Each factor (I+Ā_b) is taken from the engine (``accumulate(layers, b, b, norm)``,
    so normalisation follows ``lrp_core.rollout``); the partial products
    P_b = (I+Ā_b)…(I+Ā_start) are chained once per start block in numpy. A head
    substituted at block b then costs one vector-matrix product:
    row0(P_b with head h) = row0(I+Ā_b^h) · P_{b-1}.
    """

    def __init__(self, exp: Any, layout: Optional[TokenLayout] = None) -> None:
        self.exp, self.layout = exp, layout
        self.norm = rollout_norm(exp)
        L = n_blocks(exp)
        self.factors = [_engine.accumulate(exp.layers[:1], b, b, norm=self.norm)[0].double().numpy()
                        for b in range(L)]
        self._prefix: dict[int, list[np.ndarray]] = {}
        self._head_rows: dict[tuple[int, int], np.ndarray] = {}

    def prefix(self, start: int) -> list[np.ndarray]:
        """[P_start, …, P_{L-1}] (full N×N matrices)."""
        if start not in self._prefix:
            out = [self.factors[start]]
            for b in range(start + 1, len(self.factors)):
                out.append(self.factors[b] @ out[-1])
            self._prefix[start] = out
        return self._prefix[start]

    def head_factor_row(self, block: int, head: int) -> np.ndarray:
        """Row 0 of (I+Ā_b^h) with head h's own matrix (engine normalisation)."""
        key = (block, head)
        if key not in self._head_rows:
            heads = per_head(self.exp)
            if heads is None:
                raise ValueError("this explanation has no per-head matrices "
                                 "(explain(..., keep_heads=True))")
            one = heads[:1, block:block + 1, head]
            self._head_rows[key] = _engine.accumulate(one, 0, 0, norm=self.norm)[0, 0].double().numpy()
        return self._head_rows[key]

    def cls_row(self, block: int, start: int, head: Optional[int] = None) -> np.ndarray:
        """Row 0 of the product from ``start`` to ``block`` (head h at ``block`` if given)."""
        if block < start:  # empty product = identity
            return np.eye(len(self.factors[0]))[0]
        prefix = self.prefix(start)
        if head is None:
            return prefix[block - start][0]
        row = self.head_factor_row(block, head)
        return row if block == start else row @ prefix[block - start - 1]

    def view(self, block: int, start: int, head: Optional[int] = None) -> np.ndarray:
        """What the accumulated view shows (as :func:`view_map`; needs ``layout``)."""
        if self.layout is None:
            raise ValueError("the accumulated view needs the sample's token layout (adapter.layout)")
        return product_row(self.exp, self.layout, self.cls_row(block, start, head))

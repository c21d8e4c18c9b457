"""What a widget shows for one explanation, one block and one head (pure functions).

Views (``exp`` is the explanation of one sample, a batch of one; w the sample's
readout weights, :class:`~widgets._engine.SampleReadout`):

* ``"output"``: the method's own result, ``exp.scores`` (or ``exp.pixels`` for ``lrp``).
* ``"accumulated"``: the readout row ``wᵀ accumulate(exp.layers, start, b)``, i.e. of
  (I+Ā_b)…(I+Ā_start): how the method's product looks after block b. At the last
  block, from the method's start layer, it is ``exp.scores`` (raw attention's
  ``exp.scores`` is the block view at the last block).
* ``"block"``: the readout row ``wᵀĀ_b`` of block b's own matrix (``exp.layers[:, b]``,
  or one head's).
* ``"residual"``: ``exp.token_relevance[:, b]``, the relevance of each token in the
  residual stream at block b (LRP-pass methods); its sum is the conserved total.

The readout row is what the engine reads from a matrix (docs/METHODS.md §4):
row 0 for [CLS] pooling, the mean of the averaged rows for average pooling, half of
each of two rows for a distilled DeiT, ½ [CLS] + ½ mean for DINOv2, the
end-of-text row for CLIP's text side. Every view keeps the scored tokens only
(images: the patches, as an (h, w) grid; text: the real tokens). Where the
method replaces the scored readout tokens' entries by the row minimum
(transformer attribution on text, docs/METHODS.md §5.6), the accumulated view does too.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from lrp_core.errors import InputError
from lrp_core.methods import registry

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
        raise InputError(f"method {exp.method!r} has no layer product")
    return norm


def real_tokens(exp: Any) -> int:
    """Number of non-padding tokens of a one-sample text explanation."""
    if exp.attention_mask is None:
        return int(exp.scores.shape[-1])
    return int(exp.attention_mask[0].sum().item())


def _row(exp: Any, row: Any) -> np.ndarray:
    """Cut one token row to what is displayed: the patches as an (h, w) grid, or the real tokens (T,).

    ``row`` holds the scored tokens (``exp.scores[0]``) or every token (the patches are the last h·w).
    """
    if isinstance(row, torch.Tensor):
        row = row.detach().double().cpu().numpy()
    row = np.asarray(row, dtype=np.float64)
    if exp.grid is not None:
        h, w = exp.grid
        image = getattr(exp, "image_tokens", None)
        if image is not None:  # a vision-language model: the patches are its image tokens, wherever they lie
            idx = image[0].cpu().numpy()  # a token carrying several patches: its score split equally over them
            return (row[idx] / np.bincount(idx, minlength=row.shape[0])[idx]).reshape(h, w)
        return row[-h * w :].reshape(h, w).copy()
    return row[: real_tokens(exp)].copy()


def _as_numpy(m: Any) -> np.ndarray:
    """A tensor or array as float64 numpy (the views read the engine's tensors in float64)."""
    if isinstance(m, torch.Tensor):
        return m.detach().double().cpu().numpy()
    return np.asarray(m, dtype=np.float64)


def readout_row(readout: _engine.SampleReadout, M: Any) -> np.ndarray:
    """``wᵀM`` (N,): the readout's row of one token-mixing matrix M (N, N), in float64."""
    M = _as_numpy(M)
    if M.shape[-1] != readout.weights.shape[0]:
        raise InputError(f"the matrix has {M.shape[-1]} tokens, the sample's readout {readout.weights.shape[0]}")
    return readout.weights @ M


def scored_map(exp: Any, readout: _engine.SampleReadout, row: np.ndarray, minimum: bool = False) -> np.ndarray:
    """What a view shows of a readout row (N,): the scored tokens (padding 0), cut for display.

    ``minimum``: replace the scored readout tokens' entries by the row minimum, as the
    engine does for the methods the registry marks (``_engine.readout_minimum``).
    """
    layout = readout.layout
    scored = layout.scores(torch.as_tensor(row, dtype=torch.float64)[None])
    if minimum:
        scored = layout.readout_minimum(scored)
    return _row(exp, scored[0].numpy())  # float64 kept: the product was chained in float64


def _need_readout(readout: Optional[_engine.SampleReadout], view: str) -> _engine.SampleReadout:
    if readout is None:
        raise InputError(
            f"the {view!r} view reads the matrices through the sample's readout: pass "
            "readout=widgets._engine.sample_readout(model, inputs)"
        )
    return readout


def view_map(
    exp: Any,
    view: str,
    block: int = 0,
    start: int = 0,
    head: Optional[int] = None,
    readout: Optional[_engine.SampleReadout] = None,
) -> np.ndarray:
    """The values a widget shows: (h, w) for images (or (H, W) pixels), (T,) for text.

    ``head=None`` uses the head mean (``exp.layers``); an int uses that head's
    matrix for block ``block`` (block view), or substitutes it for block
    ``block`` in the product (accumulated view). The block and accumulated
    views need the sample's ``readout`` (:func:`widgets._engine.sample_readout`).
    """
    if view == "output":
        if exp.pixels is not None:
            return _as_numpy(exp.pixels[0])
        return _row(exp, exp.scores[0])
    L = n_blocks(exp)
    if not 0 <= block < max(L, 1):
        raise InputError(f"block must be in 0..{L - 1}; got {block}")
    if view == "residual":
        if exp.token_relevance is None:
            raise InputError(f"method {exp.method!r} has no per-block token relevance")
        return _row(exp, exp.token_relevance[0, block])
    if view not in VIEW_LABELS:
        raise InputError(f"unknown view {view!r}; choose one of {sorted(VIEW_LABELS)}")
    if exp.layers is None:
        raise InputError(f"method {exp.method!r} has no per-block matrices")
    readout = _need_readout(readout, view)
    if view == "block":
        mat = exp.layers[0, block] if head is None else _heads(exp)[0, block, head]
        return scored_map(exp, readout, readout_row(readout, mat))
    return LayerProducts(exp, readout).view(block, start, head)


def _heads(exp: Any) -> torch.Tensor:
    heads = per_head(exp)
    if heads is None:
        raise InputError("this explanation has no per-head matrices (explain(..., keep_heads=True))")
    return heads


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
    so normalisation follows ``lrp_core.methods.products``); the partial products
    P_b = (I+Ā_b)…(I+Ā_start) are chained once per start block in numpy. A view is
    the readout row wᵀP_b (one vector-matrix product); a head h substituted at
    block b costs one more: wᵀ(P_b with head h) = wᵀ(I+Ā_b^h) · P_{b-1}.
    """

    def __init__(self, exp: Any, readout: _engine.SampleReadout) -> None:
        self.exp, self.readout = exp, _need_readout(readout, "accumulated")
        self.norm = rollout_norm(exp)
        self.minimum = _engine.readout_minimum(exp.method)
        L = n_blocks(exp)
        self.factors = [_engine.accumulate(exp.layers[:1], b, b, norm=self.norm)[0].double().numpy() for b in range(L)]
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
        """wᵀ(I+Ā_b^h) (N,), with head h's own matrix (engine normalisation)."""
        key = (block, head)
        if key not in self._head_rows:
            one = _heads(self.exp)[:1, block : block + 1, head]
            factor = _engine.accumulate(one, 0, 0, norm=self.norm)[0]
            self._head_rows[key] = readout_row(self.readout, factor)
        return self._head_rows[key]

    def readout_row(self, block: int, start: int, head: Optional[int] = None) -> np.ndarray:
        """wᵀ of the product from ``start`` to ``block`` (head h at ``block`` if given), (N,)."""
        if block < start:  # empty product = identity
            return self.readout.weights.copy()
        prefix = self.prefix(start)
        if head is None:
            return readout_row(self.readout, prefix[block - start])
        row = self.head_factor_row(block, head)
        return row if block == start else row @ prefix[block - start - 1]

    def view(self, block: int, start: int, head: Optional[int] = None) -> np.ndarray:
        """What the accumulated view shows (as :func:`view_map`)."""
        return scored_map(self.exp, self.readout, self.readout_row(block, start, head), self.minimum)

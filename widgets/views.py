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

from . import _engine

VIEW_LABELS = {
    "output": "method output",
    "accumulated": "product start\u2192b",
    "block": "block b only",
    "residual": "residual at b",
}


def n_blocks(exp: Any) -> int:
    """Number of blocks the explanation has per-block data for (0 if none)."""
    for name in ("layers", "token_relevance"):
        t = getattr(exp, name, None)
        if t is not None:
            return int(t.shape[1])
    return 0


def per_head(exp: Any) -> Optional[torch.Tensor]:
    """(B, L, H, N, N) per-head block matrices, where the engine kept them."""
    return getattr(exp, "layers_per_head", None)


def n_heads(exp: Any) -> int:
    t = per_head(exp)
    return 0 if t is None else int(t.shape[2])


def available_views(exp: Any) -> list[str]:
    """The views this explanation supports, ``"output"`` first."""
    views = ["output"]
    if getattr(exp, "layers", None) is not None:
        views += ["accumulated", "block"]
    if getattr(exp, "token_relevance", None) is not None:
        views.append("residual")
    return views


def rollout_norm(exp: Any) -> str:
    """The normalisation of the layer product used by the method."""
    norm = (exp.options or {}).get("rollout_norm")
    if norm in ("none", "row"):
        return norm
    if exp.method in ("rollout", "raw_attention") or exp.grid is None:  # attention; BERT
        return "row"
    return "none"


def real_tokens(exp: Any) -> int:
    """Number of non-padding tokens of a one-sample text explanation."""
    mask = getattr(exp, "attention_mask", None)
    if mask is None:
        return int(exp.scores.shape[-1])
    return int(mask[0].sum().item())


def _row(exp: Any, row: torch.Tensor, replace_cls: bool = False) -> np.ndarray:
    """Cut one [CLS] row (N,) to what is displayed: patches (grid) or real tokens."""
    row = row.detach().float().cpu()
    if exp.grid is not None:
        h, w = exp.grid
        return row[-h * w:].reshape(h, w).numpy().astype(np.float64)
    t = real_tokens(exp)
    out = row[:t].numpy().astype(np.float64).copy()
    if replace_cls and t > 1:
        out[0] = out.min()
    return out


def layers_with_head(exp: Any, block: int, head: Optional[int]) -> torch.Tensor:
    """``exp.layers`` with block ``block``'s head mean replaced by head ``head`` (if given)."""
    layers = exp.layers
    if head is None:
        return layers
    heads = per_head(exp)
    if heads is None:
        raise ValueError("this explanation has no per-head matrices (explain(..., keep_heads=True))")
    layers = layers.clone()
    layers[:, block] = heads[:, block, head]
    return layers


def view_map(exp: Any, view: str, block: int = 0, start: int = 0,
             head: Optional[int] = None) -> np.ndarray:
    """The values a widget shows: (h, w) for images (or (H, W) pixels), (T,) for text.

    ``head=None`` uses the head mean (``exp.layers``); an int uses that head's
    matrix for block ``block`` (block view), or substitutes it for block
    ``block`` in the product (accumulated view).
    """
    if view == "output":
        if exp.pixels is not None:
            return exp.pixels[0].detach().float().cpu().numpy().astype(np.float64)
        return _row(exp, exp.scores[0])
    L = n_blocks(exp)
    if not 0 <= block < max(L, 1):
        raise ValueError(f"block must be in 0..{L - 1}; got {block}")
    if view == "residual":
        if getattr(exp, "token_relevance", None) is None:
            raise ValueError(f"method {exp.method!r} has no per-block token relevance")
        return _row(exp, exp.token_relevance[0, block])
    if getattr(exp, "layers", None) is None:
        raise ValueError(f"method {exp.method!r} has no per-block matrices")
    if view == "block":
        mat = exp.layers[0, block] if head is None else per_head(exp)[0, block, head]
        return _row(exp, mat[0])
    if view == "accumulated":
        if block < start:  # empty product = identity: no patch gets anything
            n = exp.layers.shape[-1]
            return _row(exp, torch.eye(n)[0], replace_cls=exp.grid is None)
        prod = _engine.accumulate(layers_with_head(exp, block, head), start, block,
                                  norm=rollout_norm(exp))
        return _row(exp, prod[0, 0], replace_cls=exp.grid is None)
    raise ValueError(f"unknown view {view!r}; choose one of {sorted(VIEW_LABELS)}")


def block_totals(exp: Any) -> Optional[np.ndarray]:
    """Σ over tokens of ``token_relevance`` for every block (the conserved total), or None."""
    tr = getattr(exp, "token_relevance", None)
    if tr is None:
        return None
    t = tr[0]
    mask = getattr(exp, "attention_mask", None)
    if mask is not None:
        t = t[:, : real_tokens(exp)]
    return t.detach().float().sum(-1).cpu().numpy().astype(np.float64)

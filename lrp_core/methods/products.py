"""Aggregating per-block token-mixing matrices into one map.

Every layer-product method (rollout, transformer attribution, generic
attention) multiplies (I + Ā_b) over blocks; they differ in what Ā_b (B, N, N)
is and in whether each factor is row-normalised. :func:`accumulate` forms the
(B, N, N) product (the course and the widgets' partial products);
the methods read only the readout's row of it, :func:`accumulate_row`.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from ..errors import InputError

NORMS = ("none", "row")


def _factor(layer: Tensor, norm: str) -> Tensor:
    """I + Ā (B, N, N), row-normalised with ``norm="row"``."""
    eye = torch.eye(layer.shape[-1], dtype=layer.dtype, device=layer.device)
    m = layer + eye
    if norm == "row":
        m = m / m.sum(dim=-1, keepdim=True)
    return m


def _span(layers: Sequence[Tensor] | Tensor, start: int, stop: Optional[int], norm: str) -> tuple:
    """The checked arguments of a product: the blocks as a sequence of (B, N, N) and the last block's index."""
    if norm not in NORMS:
        raise InputError(f"norm must be one of {NORMS}, got {norm!r}")
    if isinstance(layers, Tensor):
        layers = layers.unbind(dim=1)
    L = len(layers)
    stop = L - 1 if stop is None else stop
    if not 0 <= start <= stop < L:
        raise InputError(f"need 0 <= start <= stop < {L}, got start={start}, stop={stop}")
    return layers, stop


def accumulate(
    layers: Sequence[Tensor] | Tensor, start: int = 0, stop: Optional[int] = None, norm: str = "none"
) -> Tensor:
    """The product (I+Ā_stop)·…·(I+Ā_start), accumulated as ``C ← (I+Ā_b)·C``.

    Parameters
    ----------
    layers : Sequence[Tensor] | Tensor
        Ā_b per block, a list of (B, N, N) or a tensor (B, L, N, N).
    start : int, optional
        first block in the product (0-based, ``start_layer``).
    stop : Optional[int], optional
        last block in the product (inclusive); default the last block.
    norm : str, optional
        ``"none"`` or ``"row"`` (each factor divided by its row sums).

    Returns
    -------
    Tensor
        (B, N, N); its row 0 is the [CLS] token's map.
    """
    layers, stop = _span(layers, start, stop, norm)
    joint = _factor(layers[start], norm)
    for b in range(start + 1, stop + 1):
        joint = torch.bmm(_factor(layers[b], norm), joint)
    return joint


def accumulate_row(
    layers: Sequence[Tensor] | Tensor, w: Tensor, start: int = 0, stop: Optional[int] = None, norm: str = "none"
) -> Tensor:
    """The readout row ``wᵀ·(I+Ā_stop)·…·(I+Ā_start)`` of :func:`accumulate`'s product, as a vector chain.

    A map reads only the readout's row(s) of the product, so it is carried from the top as a vector,
    ``v ← v·(I+Ā_b)`` for b = stop … start: O(N²) work and O(N) state per block instead of the N×N product's
    O(N³) and N×N (which matters for 4096-token decoders). Equal to ``readout.row(accumulate(...))`` up to round-off.

    Parameters
    ----------
    layers : Sequence[Tensor] | Tensor
        Ā_b per block, a list of (B, N, N) or a tensor (B, L, N, N).
    w : Tensor
        (B or 1, N) the readout's token weights (``Readout.weights``).
    start : int, optional
        First block in the product (0-based), as in :func:`accumulate`.
    stop : Optional[int], optional
        Last block in the product (inclusive), as in :func:`accumulate`; default the last block.
    norm : str, optional
        ``"none"`` or ``"row"``, as in :func:`accumulate`.

    Returns
    -------
    Tensor
        (B, N) the readout's row.
    """
    layers, stop = _span(layers, start, stop, norm)
    B, N, _ = layers[start].shape
    v = w.to(dtype=layers[start].dtype, device=layers[start].device).expand(B, N)[:, None, :]  # (B, 1, N)
    for b in range(stop, start - 1, -1):
        layer = layers[b]
        if norm == "row":  # (I+Ā) row-normalised: v·D⁻¹(I+Ā) = (v/d)·Ā + v/d, d the rows' sums
            v = v / (layer.sum(dim=-1) + 1.0)[:, None, :]
        v = v + torch.bmm(v, layer)
    return v[:, 0]


__all__ = ["accumulate", "accumulate_row", "NORMS"]

"""Statistics of relevance maps: correlation (:func:`pearson`, :func:`pooled_correlation`) and
CDAM's :func:`sparsity`.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from ..errors import InputError
from ._common import _as_tensor


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation of two equal-length vectors.

    Returns 1.0 when both are constant and equal, NaN when one is constant
    otherwise (correlation undefined).

    Parameters
    ----------
    x : np.ndarray
        (L,) first vector (any shape; flattened).
    y : np.ndarray
        (L,) second vector, same number of values.

    Returns
    -------
    float
        The correlation in [-1, 1], 1.0 or NaN as above.

    Raises
    ------
    InputError
        If the vectors differ in length or have fewer than two values.
    """
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    if x.shape != y.shape:
        raise InputError(f"vectors of different lengths: {x.shape} and {y.shape}")
    if x.size < 2:
        raise InputError("correlation needs at least two values")
    dx, dy = x - x.mean(), y - y.mean()
    sx, sy = math.sqrt(float(dx @ dx)), math.sqrt(float(dy @ dy))
    if sx == 0 or sy == 0:
        return 1.0 if np.array_equal(x, y) else math.nan
    return float(np.clip((dx @ dy) / (sx * sy), -1.0, 1.0))


def _nanmean(x: np.ndarray) -> float:
    x = x[~np.isnan(x)]
    return float(x.mean()) if x.size else math.nan


def sparsity(scores: Tensor, rel_threshold: float = 0.05) -> float:
    """Mean fraction of tokens with ``|score| < rel_threshold · max |score|`` of their map.

    Parameters
    ----------
    scores : Tensor
        (N, T) token scores (one map per row).
    rel_threshold : float, optional
        the fraction of the map's largest magnitude.

    Returns
    -------
    float
        mean over maps; an all-zero map counts as fully sparse (1.0).

    Raises
    ------
    InputError
        If ``scores`` has fewer than two dimensions.
    """
    s = _as_tensor(scores, "scores", torch.float64)
    if s.dim() < 2:
        raise InputError(f"scores must be (N, T), got shape {tuple(s.shape)}")
    s = s.reshape(s.shape[0], -1).abs()
    peak = s.max(dim=1, keepdim=True).values
    small = torch.where(peak > 0, s < rel_threshold * peak, torch.ones_like(s, dtype=torch.bool))
    return float(small.double().mean(dim=1).mean())


def pooled_correlation(scores_a: Tensor, scores_b: Tensor) -> float:
    """Pearson correlation of two sets of maps (N, T), all tokens of all images pooled.

    Parameters
    ----------
    scores_a : Tensor
        (N, T) first set of maps.
    scores_b : Tensor
        (N, T) second set of maps, same shape.

    Returns
    -------
    float
        The correlation of the N·T pooled values (see :func:`pearson`).

    Raises
    ------
    InputError
        If the two sets differ in shape.
    """
    a = _as_tensor(scores_a, "scores_a", torch.float64)
    b = _as_tensor(scores_b, "scores_b", torch.float64)
    if a.shape != b.shape:
        raise InputError(f"maps of different shapes: {tuple(a.shape)} and {tuple(b.shape)}")
    return pearson(a.numpy(), b.numpy())


__all__ = ["pearson", "pooled_correlation", "sparsity"]

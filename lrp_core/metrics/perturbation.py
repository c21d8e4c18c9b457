"""Pixel flipping (``docs/METHODS.md`` §3): accuracy as the most / least relevant pixels are zeroed.

:func:`perturbation_curve` and :func:`perturbation_auc` (positive and negative
tests); :func:`perturbation_masks` shows which pixels each level removes.
Ties in a ranking are broken by row-major pixel index, lowest first.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from ..errors import InputError
from ..runtime.utils import logits_in_batches
from ._common import _as_tensor

FRACTIONS: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
"""Perturbation levels p of the pixel-flipping test (the x axis, without 0)."""


def _descending_rank(maps: Tensor) -> Tensor:
    """(B, P) -> (B, P) rank of each entry, 0 = highest; ties by index."""
    order = torch.argsort(-maps, dim=1, stable=True)
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(maps.shape[1]).expand_as(order).contiguous())
    return rank


def n_removed(fraction: float, n_pixels: int) -> int:
    """Number of pixels zeroed at level ``fraction``: ``floor(fraction * n_pixels)``.

    (The reference uses ``int(p * n)``; a 1e-9 guard keeps 0.3 * 10 at 3.)

    Parameters
    ----------
    fraction : float
        Perturbation level p in [0, 1].
    n_pixels : int
        Number of pixels of the image, H·W.

    Returns
    -------
    int
        The number of pixels to zero.
    """
    return int(math.floor(fraction * n_pixels + 1e-9))


def perturbation_masks(maps: Tensor, fractions: Sequence[float] = FRACTIONS, negative: bool = False) -> Tensor:
    """Which pixels are zeroed at each level.

    Parameters
    ----------
    maps : Tensor
        (B, H, W) relevance at image size.
    fractions : Sequence[float], optional
        the levels p (each in [0, 1]).
    negative : bool, optional
        zero the *least* relevant pixels (the map is negated).

    Returns
    -------
    Tensor
        (P, B, H, W) bool, ``True`` = zeroed; level i removes the top
        ``n_removed(fractions[i], H*W)`` pixels of the (negated) map.

    Raises
    ------
    InputError
        If ``maps`` is not (B, H, W) or a fraction lies outside [0, 1].
    """
    maps = _as_tensor(maps, "maps")
    if maps.dim() != 3:
        raise InputError(f"maps must be (B, H, W), got shape {tuple(maps.shape)}")
    if any(not 0.0 <= p <= 1.0 for p in fractions):
        raise InputError(f"fractions must lie in [0, 1], got {list(fractions)}")
    b, h, w = maps.shape
    flat = maps.reshape(b, h * w)
    if negative:
        flat = -flat
    flat = torch.nan_to_num(flat, nan=-math.inf)
    rank = _descending_rank(flat)
    ks = torch.tensor([n_removed(p, h * w) for p in fractions])
    return (rank.unsqueeze(0) < ks.view(-1, 1, 1)).reshape(len(fractions), b, h, w)


@torch.no_grad()
def perturbation_curve(
    model: Callable[[Tensor], Any],
    images: Tensor,
    maps: Tensor,
    labels: Tensor,
    *,
    negative: bool = False,
    fractions: Sequence[float] = FRACTIONS,
    batch_size: int = 64,
    progress: bool = False,
    return_correct: bool = False,
) -> np.ndarray:
    """Top-1 accuracy as the most (or least) relevant pixels are zeroed.

    The zeroing happens in the model's input space (the normalised images), on
    every channel of a chosen pixel.

    Parameters
    ----------
    model : Callable[[Tensor], Any]
        images (B, C, H, W) -> logits (B, K) (or an output with ``.logits``).
    images : Tensor
        (N, C, H, W) model inputs.
    maps : Tensor
        (N, H, W) relevance at image size (see :func:`upsample_maps`).
    labels : Tensor
        (N,) the true classes accuracy is measured against.
    negative : bool, optional
        negative test (remove the least relevant pixels first).
    fractions : Sequence[float], optional
        perturbation levels p.
    batch_size : int, optional
        images per forward pass (each pass holds
        ``batch_size`` perturbed copies).
    progress : bool, optional
        show a progress bar.
    return_correct : bool, optional
        return the (1 + P, N) bool matrix of correct
        predictions instead of the accuracies.

    Returns
    -------
    np.ndarray
        (1 + P,) accuracies in [0, 1]: the clean accuracy, then one per level.

    Raises
    ------
    InputError
        If ``images`` is not (N, C, H, W), ``maps`` is not (N, H, W) matching
        them, ``labels`` does not have N entries, or ``batch_size`` is below 1.
    """
    images = _as_tensor(images, "images")
    maps = _as_tensor(maps, "maps")
    labels = _as_tensor(labels, "labels", torch.long).reshape(-1)
    if images.dim() != 4:
        raise InputError(f"images must be (N, C, H, W), got shape {tuple(images.shape)}")
    n, _, h, w = images.shape
    if tuple(maps.shape) != (n, h, w):
        raise InputError(
            f"maps must be (N, H, W) = {(n, h, w)} to match the images, "
            f"got {tuple(maps.shape)}; upsample patch maps first"
        )
    if labels.shape[0] != n:
        raise InputError(f"labels must have {n} entries, got {labels.shape[0]}")
    if batch_size < 1:
        raise InputError(f"batch_size must be >= 1, got {batch_size}")
    n_lv = len(fractions) + 1
    correct = torch.zeros(n_lv, n, dtype=torch.bool)
    # every (level, image) pair is one job; batches mix levels and images
    jobs = [(lv, i) for i in range(n) for lv in range(n_lv)]

    def perturbed(chunk: list[tuple[int, int]]) -> Tensor:
        lv, idx = _job_index(chunk)
        keep = _keep_masks(maps[idx], lv, fractions, negative)  # (b, H, W)
        return images[idx] * keep.unsqueeze(1).to(images.dtype)

    for block, logits in logits_in_batches(
        model, jobs, batch_size, perturbed, progress=progress, desc="perturbation" + (" (neg)" if negative else "")
    ):
        lv, idx = _job_index(jobs[block])
        correct[lv, idx] = logits.argmax(dim=1).cpu() == labels[idx]
    if return_correct:
        return correct.numpy()
    return correct.float().mean(dim=1).numpy()


def _job_index(chunk: list[tuple[int, int]]) -> tuple[Tensor, Tensor]:
    """(levels (b,), image indices (b,)) of a block of (level, image) jobs."""
    return torch.tensor([j[0] for j in chunk]), torch.tensor([j[1] for j in chunk])


def _keep_masks(maps: Tensor, levels: Tensor, fractions: Sequence[float], negative: bool) -> Tensor:
    """(b, H, W) bool: pixels kept for each (map, level) pair; level 0 = clean."""
    b, h, w = maps.shape
    flat = maps.reshape(b, h * w)
    if negative:
        flat = -flat
    rank = _descending_rank(torch.nan_to_num(flat, nan=-math.inf))
    ks = torch.tensor([0] + [n_removed(p, h * w) for p in fractions])[levels]
    return (rank >= ks.unsqueeze(1)).reshape(b, h, w)


def perturbation_auc(accuracy: Sequence[float], fractions: Sequence[float] = FRACTIONS) -> float:
    """Area under the perturbation curve × 100.

    Trapezoid over x = [0, *fractions] of ``accuracy`` (clean accuracy first),
    e.g. with the default levels the maximum is 90 (accuracy 1 throughout).

    Parameters
    ----------
    accuracy : Sequence[float]
        (1 + P,) accuracies: the clean accuracy, then one per level (as
        :func:`perturbation_curve` returns).
    fractions : Sequence[float], optional
        The P perturbation levels the accuracies were measured at.

    Returns
    -------
    float
        The area × 100, in [0, 100·max(fractions)].

    Raises
    ------
    InputError
        If ``accuracy`` does not have ``1 + len(fractions)`` values.
    """
    acc = np.asarray(accuracy, dtype=np.float64)
    x = np.asarray([0.0, *fractions], dtype=np.float64)
    if acc.shape != x.shape:
        raise InputError(f"accuracy must have {len(x)} values (clean + one per level), got {acc.shape}")
    return float(np.sum((x[1:] - x[:-1]) * (acc[1:] + acc[:-1]) / 2.0) * 100.0)


__all__ = ["FRACTIONS", "n_removed", "perturbation_masks", "perturbation_curve", "perturbation_auc"]

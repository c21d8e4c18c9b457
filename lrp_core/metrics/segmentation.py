"""Segmentation quality of relevance maps against object masks (``docs/METHODS.md`` §3).

:func:`segmentation_scores` (pixel accuracy, background / foreground IoU,
mIoU, mAP), the per-image values behind it (:func:`segmentation_per_image`)
that the bootstrap resamples, and :func:`average_precision`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..errors import InputError
from ._common import _as_tensor, minmax_normalise


def segmentation_scores(maps: Tensor, masks: Tensor) -> dict[str, float]:
    """Segmentation quality of relevance maps against object masks.

    Each map is min–max normalised and thresholded at its own mean (pixels
    strictly above the mean are foreground). Pixel accuracy and the IoU of
    background and foreground are accumulated over the whole set (total
    intersection / total union); ``miou`` is their mean. ``map`` is the
    average precision of the soft (normalised) map against the mask, per
    image, averaged over the images whose mask has both classes.

    Parameters
    ----------
    maps : Tensor
        (N, H, W) relevance at image size (see :func:`upsample_maps`).
    masks : Tensor
        (N, H, W) bool, ``True`` = object.

    Returns
    -------
    dict[str, float]
        ``pixel_accuracy``, ``iou_background``, ``iou_foreground``, ``miou``, ``map``.
    """
    return segmentation_summary(segmentation_per_image(maps, masks))


def segmentation_summary(per: dict[str, Any]) -> dict[str, float]:
    """:func:`segmentation_scores` from the per-image values of :func:`segmentation_per_image`.

    The counts are summed before dividing (pooled IoUs); the mAP averages the defined APs.

    Parameters
    ----------
    per : dict[str, Any]
        The output of :func:`segmentation_per_image` (``iou_counts``, ``ap``, ``pixels``).

    Returns
    -------
    dict[str, float]
        ``pixel_accuracy``, ``iou_background``, ``iou_foreground``, ``miou``, ``map``,
        as :func:`segmentation_scores` returns them.
    """
    c = per["iou_counts"]
    iou_fg, iou_bg = (float(v) for v in _pooled_ious(c))
    aps = [a for a in per["ap"].tolist() if not math.isnan(a)]
    return {
        "pixel_accuracy": int(c[:, 0].sum() + c[:, 2].sum()) / (len(c) * per["pixels"]),
        "iou_background": iou_bg,
        "iou_foreground": iou_fg,
        "miou": (iou_bg + iou_fg) / 2.0,
        "map": float(np.mean(aps)) if aps else math.nan,
    }


def segmentation_per_image(maps: Tensor, masks: Tensor) -> dict[str, Any]:
    """The per-image values behind :func:`segmentation_scores` (same maps, threshold, AP).

    Parameters
    ----------
    maps : Tensor
        (N, H, W) relevance at image size.
    masks : Tensor
        (N, H, W) bool, ``True`` = object.

    Returns
    -------
    dict[str, Any]
        ``pixel_accuracy`` (N,): share of each image's pixels classified right
        (all images have H·W pixels, so their mean is the pooled pixel
        accuracy); ``iou_counts`` (N, 4) int: foreground intersection, foreground
        union, background intersection, background union per image (the IoUs
        are pooled: total intersection / total union over the images, so a
        resample of images recomputes them from these sums);
        ``ap`` (N,): average precision per image, NaN where the mask lacks
        a class (the mAP is the mean of the defined values); ``pixels``: H·W.

    Raises
    ------
    InputError
        If ``maps`` and ``masks`` are not both (N, H, W) of the same shape.
    """
    maps = _as_tensor(maps, "maps")
    masks = _as_tensor(masks, "masks", torch.bool)
    if maps.dim() != 3 or maps.shape != masks.shape:
        raise InputError(f"maps and masks must both be (N, H, W), got {tuple(maps.shape)} and {tuple(masks.shape)}")
    soft = minmax_normalise(torch.nan_to_num(maps))
    mean = soft.reshape(soft.shape[0], -1).mean(dim=1).view(-1, 1, 1)
    pred = soft > mean

    def per(x: Tensor) -> Tensor:
        return x.reshape(x.shape[0], -1).sum(dim=1)

    counts = torch.stack([per(pred & masks), per(pred | masks), per(~pred & ~masks), per(~pred | ~masks)], dim=1)
    n_pix = masks[0].numel() if len(masks) else 1
    return {
        "pixel_accuracy": ((counts[:, 0] + counts[:, 2]).double() / n_pix).numpy(),
        "iou_counts": counts.numpy().astype(np.int64),
        "ap": np.array(
            [average_precision(s.reshape(-1), m.reshape(-1)) for s, m in zip(soft, masks)], dtype=np.float64
        ),
        "pixels": n_pix,
    }


def pooled_miou(iou_counts: np.ndarray) -> np.ndarray:
    """mIoU of :func:`segmentation_scores` from per-image counts (..., N, 4) -> (...).

    The counts are those of :func:`segmentation_per_image`; the leading axes
    (e.g. bootstrap resamples) are kept. An empty union counts as IoU 1.

    Parameters
    ----------
    iou_counts : np.ndarray
        (..., N, 4) per-image counts: foreground intersection, foreground union,
        background intersection, background union.

    Returns
    -------
    np.ndarray
        (...) mean of the pooled foreground and background IoU.
    """
    fg, bg = _pooled_ious(iou_counts)
    return (bg + fg) / 2.0


def _pooled_ious(iou_counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Foreground and background IoU, total intersection / total union over the images: (..., N, 4) -> (...)."""
    c = np.asarray(iou_counts, dtype=np.float64).sum(axis=-2)
    with np.errstate(invalid="ignore", divide="ignore"):
        fg = np.where(c[..., 1] > 0, c[..., 0] / c[..., 1], 1.0)
        bg = np.where(c[..., 3] > 0, c[..., 2] / c[..., 3], 1.0)
    return fg, bg


def average_precision(scores: Tensor, truth: Tensor) -> float:
    """Average precision of ``scores`` (P,) for the positives ``truth`` (P,) bool.

    ``AP = Σ_n (R_n − R_{n−1}) P_n`` over the distinct score thresholds (tied
    scores enter together), as ``sklearn.metrics.average_precision_score``.
    NaN when there is no positive.

    Parameters
    ----------
    scores : Tensor
        (P,) scores, higher = more likely positive.
    truth : Tensor
        (P,) bool, ``True`` = positive.

    Returns
    -------
    float
        The average precision in [0, 1], or NaN without a positive.
    """
    s = _as_tensor(scores, "scores", torch.float64).reshape(-1)
    t = _as_tensor(truth, "truth", torch.bool).reshape(-1)
    n_pos = int(t.sum())
    if n_pos == 0:
        return math.nan
    order = torch.argsort(-s, stable=True)
    s, t = s[order], t[order].double()
    tp = torch.cumsum(t, 0)
    # the last index of each group of equal scores is a threshold
    last = torch.ones_like(s, dtype=torch.bool)
    last[:-1] = s[1:] != s[:-1]
    tp = tp[last]
    counted = torch.nonzero(last).reshape(-1).double() + 1.0
    precision = tp / counted
    recall = tp / n_pos
    prev = torch.cat([torch.zeros(1, dtype=recall.dtype), recall[:-1]])
    return float(((recall - prev) * precision).sum())


__all__ = ["segmentation_scores", "segmentation_summary", "segmentation_per_image", "pooled_miou", "average_precision"]

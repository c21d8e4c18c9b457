"""Metrics on scenes with two (or K) objects: class sensitivity and the deletion check.

- :func:`own_mask_share`, :func:`class_sensitivity`, :func:`class_map_correlation`
  — how class-specific the maps are.
- :func:`deletion_drops`, :func:`deletion_agreement` (:func:`deletion_cases`,
  :func:`object_mass_shares`) — does the relevance mass on each object follow
  the logit drop when that object is removed from the scene?
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor

from ..errors import InputError
from ..runtime.utils import logits_in_batches
from ._common import _as_tensor
from .statistics import _nanmean, pearson


def own_mask_share(maps: Tensor, masks: Tensor) -> np.ndarray:
    """Share of each map's positive relevance inside its mask.

    Parameters
    ----------
    maps : Tensor
        (N, H, W) relevance at image size.
    masks : Tensor
        (N, H, W) bool.

    Returns
    -------
    np.ndarray
        (N,) ``Σ max(m, 0)·mask / Σ max(m, 0)``; NaN where a map has no
        positive relevance.

    Raises
    ------
    InputError
        If ``maps`` and ``masks`` are not both (N, H, W) of the same shape.
    """
    maps = _as_tensor(maps, "maps")
    masks = _as_tensor(masks, "masks", torch.bool)
    if maps.dim() != 3 or maps.shape != masks.shape:
        raise InputError(f"maps and masks must both be (N, H, W), got {tuple(maps.shape)} and {tuple(masks.shape)}")
    pos = torch.nan_to_num(maps).clamp(min=0).double()
    total = pos.sum(dim=(1, 2))
    inside = (pos * masks).sum(dim=(1, 2))
    share = torch.where(
        total > 0, inside / torch.where(total > 0, total, torch.ones_like(total)), torch.full_like(total, math.nan)
    )
    return share.numpy()


def class_sensitivity(maps_a: Tensor, maps_b: Tensor, masks_a: Tensor, masks_b: Tensor) -> float:
    """How much of each class's positive relevance lies on that class's own object.

    On scenes with two objects of different classes a and b: the share of the
    map for target a inside a's mask and the share of the map for target b
    inside b's mask, averaged over both targets and all scenes (NaN shares of
    maps without positive relevance are left out). A class-agnostic method
    gives the same map for both targets, so its shares add up to at most 1
    (≈ 0.5 when both objects get equal relevance); 1 means every target's
    relevance lies exactly on its own object.

    Parameters
    ----------
    maps_a : Tensor
        (N, H, W) maps explaining class a.
    maps_b : Tensor
        (N, H, W) maps explaining class b, same scenes.
    masks_a : Tensor
        (N, H, W) bool masks of object a.
    masks_b : Tensor
        (N, H, W) bool masks of object b.

    Returns
    -------
    float
        Mean own-object share over both targets and all scenes, in [0, 1]; NaN if
        no map has positive relevance.
    """
    shares = np.concatenate([own_mask_share(maps_a, masks_a), own_mask_share(maps_b, masks_b)])
    shares = shares[~np.isnan(shares)]
    return float(shares.mean()) if shares.size else math.nan


def class_map_correlation(maps_a: Tensor, maps_b: Tensor) -> float:
    """Mean per-image Pearson correlation between the maps of the two targets.

    1 for a class-agnostic method (identical maps); lower = more class-specific.

    Parameters
    ----------
    maps_a : Tensor
        (N, ...) maps of the images for the first target.
    maps_b : Tensor
        (N, ...) maps of the same images for the second target.

    Returns
    -------
    float
        Mean per-image correlation in [-1, 1]; images whose correlation is
        undefined (NaN) are left out, NaN if none remains.

    Raises
    ------
    InputError
        If the two sets of maps differ in shape.
    """
    a = _as_tensor(maps_a, "maps_a").reshape(len(maps_a), -1).numpy()
    b = _as_tensor(maps_b, "maps_b").reshape(len(maps_b), -1).numpy()
    if a.shape != b.shape:
        raise InputError(f"maps of different shapes: {a.shape} and {b.shape}")
    r = np.array([pearson(x, y) for x, y in zip(a, b)])
    r = r[~np.isnan(r)]
    return float(r.mean()) if r.size else math.nan


@torch.no_grad()
def deletion_drops(
    model: Callable[[Tensor], Any], images: Tensor, removed: Tensor, classes: Tensor, batch_size: int = 64
) -> Tensor:
    """Logit drops ``Δ[i, c, k] = y_c(scene i) − y_c(scene i without object k)``.

    Parameters
    ----------
    model : Callable[[Tensor], Any]
        images -> logits (B, K) (or an output with ``.logits``).
    images : Tensor
        (N, C, H, W) the scenes.
    removed : Tensor
        (N, K, C, H, W) the same scenes, each with object k left out
        (:func:`lrp_core.data.make_scenes` with ``drop=k``).
    classes : Tensor
        (N, J) the classes c whose drops are wanted (e.g. the labels).
    batch_size : int, optional
        Number of images per forward pass.

    Returns
    -------
    Tensor
        (N, J, K) float64: one drop per scene, class and removed object.

    Raises
    ------
    InputError
        If ``removed`` is not (N, K, C, H, W) matching ``images``.
    """
    images, removed = _as_tensor(images, "images"), _as_tensor(removed, "removed")
    classes = _as_tensor(classes, "classes", torch.long)
    n, k = removed.shape[:2]
    if removed.dim() != 5 or removed.shape[0] != images.shape[0] or removed.shape[2:] != images.shape[1:]:
        raise InputError(
            f"removed must be (N, K, C, H, W) matching images {tuple(images.shape)}, got {tuple(removed.shape)}"
        )
    stack = torch.cat([images.unsqueeze(1), removed], dim=1).reshape(n * (k + 1), *images.shape[1:])
    logits = torch.cat([lg.double().cpu() for _, lg in logits_in_batches(model, stack, batch_size)])
    logits = logits.reshape(n, k + 1, -1)
    y = torch.gather(logits, 2, classes.unsqueeze(1).expand(n, k + 1, classes.shape[1]))  # (N, K+1, J)
    return (y[:, :1] - y[:, 1:]).transpose(1, 2).contiguous()


def object_mass_shares(maps: Tensor, masks: Tensor) -> np.ndarray:
    """Share of each map's positive relevance inside each object's mask.

    Parameters
    ----------
    maps : Tensor
        (M, H, W) relevance at image size.
    masks : Tensor
        (M, K, H, W) bool object masks.

    Returns
    -------
    np.ndarray
        (M, K) ``Σ max(m, 0)·mask_k / Σ max(m, 0)``; NaN rows for maps without
        positive relevance.

    Raises
    ------
    InputError
        If ``maps`` is not (M, H, W) or ``masks`` is not (M, K, H, W) on the same images.
    """
    maps = _as_tensor(maps, "maps")
    masks = _as_tensor(masks, "masks", torch.bool)
    if maps.dim() != 3 or masks.dim() != 4 or masks.shape[0] != maps.shape[0] or masks.shape[2:] != maps.shape[1:]:
        raise InputError(
            f"maps must be (M, H, W) and masks (M, K, H, W), got {tuple(maps.shape)} and {tuple(masks.shape)}"
        )
    pos = torch.nan_to_num(maps).clamp(min=0).double()
    total = pos.sum(dim=(1, 2))
    inside = (pos.unsqueeze(1) * masks).sum(dim=(2, 3))
    share = inside / torch.where(total > 0, total, torch.ones_like(total)).unsqueeze(1)
    share[total <= 0] = math.nan
    return share.numpy()


def deletion_cases(maps: Tensor, masks: Tensor, drops: Tensor, own: Tensor) -> dict[str, np.ndarray]:
    """Per-map results of the deletion check.

    Each case is one map explaining a class c on a scene with K objects, the
    logit drops of c when each object is removed, and the index of c's own object.

    Parameters
    ----------
    maps : Tensor
        (M, H, W) relevance maps.
    masks : Tensor
        (M, K, H, W) bool object masks.
    drops : Tensor
        (M, K) logit drop of the explained class per removed object.
    own : Tensor
        (M,) index of the object whose class the map explains.

    Returns
    -------
    dict[str, np.ndarray]
        ``shares`` (M, K) positive-mass shares; ``order`` (M,) 1 when the object
        with the largest drop has the largest mass, 0 when another has it, 0.5
        for a tie of the top masses (NaN when the drops tie or the map has no
        positive relevance); ``distraction`` (M,) the share on the objects
        other than ``own``.

    Raises
    ------
    InputError
        If ``drops`` is not (M, K) or ``own`` is not (M,) (and as :func:`object_mass_shares`).
    """
    shares = object_mass_shares(maps, masks)
    d = _as_tensor(drops, "drops", torch.float64).numpy()
    own_idx = _as_tensor(own, "own", torch.long).numpy()
    if d.shape != shares.shape or own_idx.shape != (shares.shape[0],):
        raise InputError(f"drops must be (M, K) = {shares.shape} and own (M,), got {d.shape} and {own_idx.shape}")
    order = np.full(len(d), math.nan)
    for i, (s, dd) in enumerate(zip(shares, d)):
        top_drop = np.flatnonzero(dd == dd.max())
        if len(top_drop) != 1 or np.isnan(s).any():
            continue
        top_mass = np.flatnonzero(s == s.max())
        order[i] = (top_drop[0] in top_mass) / len(top_mass)
    others = np.ones_like(shares, dtype=bool)
    others[np.arange(len(d)), own_idx] = False
    distraction = np.where(np.isnan(shares).any(1), math.nan, np.where(others, shares, 0.0).sum(1))
    return {"shares": shares, "order": order, "distraction": distraction}


def deletion_agreement(maps: Tensor, masks: Tensor, drops: Tensor, own: Tensor) -> dict[str, float]:
    """Does the relevance mass on each object follow what removing it does to the logit?

    Parameters
    ----------
    maps : Tensor
        (M, H, W) relevance maps, as in :func:`deletion_cases`.
    masks : Tensor
        (M, K, H, W) bool object masks.
    drops : Tensor
        (M, K) logit drop of the explained class per removed object.
    own : Tensor
        (M,) index of the object whose class the map explains.

    Returns
    -------
    dict[str, float]
        ``deletion_order``: the rate at which the object with the larger drop
        also holds the larger relevance mass (0.5 = chance for two objects);
        ``deletion_correlation``: Pearson correlation of mass share and drop
        over all (map, object) pairs; ``deletion_distraction``: mean share of
        the positive relevance on the other class's object (lower is better).
        Cases with a NaN entry are left out of each.
    """
    c = deletion_cases(maps, masks, drops, own)
    d = _as_tensor(drops, "drops", torch.float64).numpy()
    ok = ~np.isnan(c["shares"]).any(1)
    corr = pearson(c["shares"][ok].reshape(-1), d[ok].reshape(-1)) if ok.sum() >= 1 else math.nan
    return {
        "deletion_order": _nanmean(c["order"]),
        "deletion_correlation": corr,
        "deletion_distraction": _nanmean(c["distraction"]),
    }


__all__ = [
    "own_mask_share",
    "class_sensitivity",
    "class_map_correlation",
    "deletion_drops",
    "object_mass_shares",
    "deletion_cases",
    "deletion_agreement",
]

"""The vision-language evidence metrics on plain tensors (``docs/METHODS.md`` §3c): pointing, mask share, the
deciding word's rank, and the patch-deletion curves; :mod:`lrp_core.evaluation.vlm` runs them over a model."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from torch import Tensor

from ..errors import InputError

#: patches painted at the last point of the MoRF / LeRF curves
MAX_PATCHES = 16

__all__ = ["MAX_PATCHES", "pointing_hit", "mask_share", "text_rank", "patch_order", "paint_patches", "patch_curve"]


def _check_map_and_mask(image_map: Tensor, mask: Tensor) -> None:
    if image_map.dim() != 2 or tuple(image_map.shape) != tuple(mask.shape):
        raise InputError(
            f"the image map and the mask must both be (H, W) of the same size, got "
            f"{tuple(image_map.shape)} and {tuple(mask.shape)}"
        )
    if mask.dtype != torch.bool:
        raise InputError(f"the mask must be a boolean (H, W) tensor, got dtype {mask.dtype}")
    if not bool(mask.any()):
        raise InputError("the mask is empty: the deciding object covers no pixel")


def pointing_hit(image_map: Tensor, mask: Tensor) -> float:
    """Whether the map's maximum lies inside the mask (ties: every maximal pixel must lie inside).

    Parameters
    ----------
    image_map : Tensor
        (H, W) the upsampled image relevance.
    mask : Tensor
        (H, W) bool, the deciding object's pixels.

    Returns
    -------
    float
        1.0 for a hit, else 0.0 (a flat map, maximal everywhere, hits only if the mask is the whole image).
    """
    _check_map_and_mask(image_map, mask)
    top = image_map == image_map.max()
    return float(bool(mask[top].all()))


def mask_share(image_map: Tensor, mask: Tensor) -> float:
    """Positive relevance inside the mask / all positive relevance of the map.

    Parameters
    ----------
    image_map : Tensor
        (H, W) the upsampled image relevance.
    mask : Tensor
        (H, W) bool, the deciding object's pixels.

    Returns
    -------
    float
        The share in [0, 1]; 0.0 where the map has no positive value.
    """
    _check_map_and_mask(image_map, mask)
    pos = image_map.double().clamp(min=0)
    total = float(pos.sum())
    return float(pos[mask].sum()) / total if total > 0 else 0.0


def text_rank(scores: Tensor, text_positions: Tensor, word_positions: Tensor) -> int:
    """The rank of the deciding word among the prompt's text tokens (1 = the highest-scoring token).

    A word split into several tokens ranks by its best token; ties rank pessimistically (a token tied with the
    word's best counts as above it), so a constant map gives the last rank.

    Parameters
    ----------
    scores : Tensor
        (T,) one row's token scores over every input position.
    text_positions : Tensor
        Positions of the prompt's text tokens (image placeholders, padding and special tokens left out).
    word_positions : Tensor
        Positions of the deciding word's tokens (a subset of ``text_positions``).

    Returns
    -------
    int
        The rank, in 1 … number of text tokens − (word tokens − 1).
    """
    text = set(text_positions.tolist())
    word = set(word_positions.tolist())
    if not word or not word <= text:
        raise InputError(f"the deciding word's positions {sorted(word)} must be non-empty text positions of the prompt")
    s = scores.double()
    best = float(s[list(word)].max())
    others = [p for p in text if p not in word]
    return 1 + int(sum(float(s[p]) >= best for p in others))


def patch_order(patch_map: Tensor) -> Tensor:
    """Patch indices (row-major over the (h, w) grid) from the highest to the lowest score (stable).

    Parameters
    ----------
    patch_map : Tensor
        (h, w) the image relevance per patch.

    Returns
    -------
    Tensor
        (h·w,) long, the order in which MoRF paints the patches (LeRF: reversed).
    """
    flat = patch_map.detach().double().flatten().cpu()
    return torch.as_tensor(np.argsort(-flat.numpy(), kind="stable"))


def paint_patches(pixels: Tensor, patches: Tensor, patch: int, fill: Tensor) -> Tensor:
    """A copy of one image with the given patches painted with ``fill``.

    Parameters
    ----------
    pixels : Tensor
        (3, H, W) the model's input image (normalised, as the model takes it).
    patches : Tensor
        Patch indices, row-major over the (H / patch, W / patch) grid.
    patch : int
        The patch side in pixels.
    fill : Tensor
        (3,) the fill value per channel, in the same (normalised) space as ``pixels``.

    Returns
    -------
    Tensor
        (3, H, W) the painted copy.
    """
    _, H, W = pixels.shape
    if H % patch or W % patch:
        raise InputError(f"the image ({H} x {W}) is not a whole number of {patch}-pixel patches")
    w = W // patch
    out = pixels.clone()
    for p in patches.tolist():
        r, c = divmod(int(p), w)
        out[:, r * patch : (r + 1) * patch, c * patch : (c + 1) * patch] = fill.to(out)[:, None, None]
    return out


def patch_curve(
    probability: Callable[[Tensor], Tensor],
    pixels: Tensor,
    order: Tensor,
    patch: int,
    fill: Tensor,
    K: int = MAX_PATCHES,
) -> np.ndarray:
    """The answer's probability as the first k patches of ``order`` are painted, k = 0 … K.

    Parameters
    ----------
    probability : Callable[[Tensor], Tensor]
        (n, 3, H, W) images → (n,) the answer's probability for each (the question's text is fixed).
    pixels : Tensor
        (3, H, W) the model's input image.
    order : Tensor
        Patch indices in the order they are painted (:func:`patch_order`, or reversed for LeRF).
    patch : int
        The patch side in pixels.
    fill : Tensor
        (3,) the fill value per channel.
    K : int, optional
        Most patches painted (capped at ``len(order)``).

    Returns
    -------
    np.ndarray
        (K + 1,) the probabilities after k = 0 … K patches.
    """
    K = min(K, len(order))
    images = torch.stack([paint_patches(pixels, order[:k], patch, fill) for k in range(K + 1)])
    return probability(images).detach().double().cpu().numpy()

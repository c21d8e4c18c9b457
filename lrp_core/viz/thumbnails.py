"""Per-step image maps of a vision-language model's generation, as small pictures for the HTML pages.

Each step's map (the pixel relevance, or the image tokens' scores upsampled) is drawn as the project's other
image plots draw a map (:func:`lrp_core.viz.maps.overlay`): the zero-centred diverging colours (red for, blue
against, white 0; limit at the 99th percentile of ``|map|``, gamma 0.5) tinting the photo in light grey (black
drawn at :data:`PHOTO_LIGHT`, lighter than in the large plots, so that the colours show on a small dark object), or on
white without a photo. A boolean mask (the object a question asks about) is drawn as a dark outline on top, so
one sees whether the relevance lies on it. The pictures are :data:`THUMB_PX` px on their longest side and shown at
that size (no browser rescaling, which turned single-pixel relevance into noise).
"""

from __future__ import annotations

import base64
import html
from typing import Any, Optional, Sequence

import numpy as np
from PIL import Image

from ..errors import InputError
from .colours import DEFAULT_CLIP, DEFAULT_GAMMA, _as_numpy, _fmt, colour_scale
from .maps import _compose, _encode_png, grey_photo, overlay, to_rgb_uint8
from .text import SCALES

#: the longest side of a step's picture, in px
THUMB_PX = 160
#: the grey level of black in the photo under a small map (:func:`lrp_core.viz.maps.grey_photo`'s ``floor``): lighter
#: than the large plots' 0.35, so the colours stay visible on the dark objects of a picture this small
PHOTO_LIGHT = 0.6
#: the outline's colour (RGB) and width (px): dark, readable on the grey photo and on red or blue
OUTLINE_RGB = (20, 20, 20)
OUTLINE_PX = 2


def mask_outline(mask: Any, size: tuple[int, int], width: int = OUTLINE_PX) -> np.ndarray:
    """The boundary of a boolean mask, at another size.

    Parameters
    ----------
    mask : Any
        (H, W) bool (array or tensor).
    size : tuple[int, int]
        ``(h, w)`` the picture's size; the mask is resized to it (nearest neighbour).
    width : int, optional
        The outline's width in px, inside the mask's edge.

    Returns
    -------
    np.ndarray
        (h, w) bool: the mask's pixels within ``width`` px of a pixel outside it (the picture's border counts as
        outside).

    Raises
    ------
    InputError
        If ``mask`` is not 2-D or holds values other than 0 / 1.
    """
    m = _bool_mask(mask)
    h, w = int(size[0]), int(size[1])
    m = np.asarray(Image.fromarray(m).resize((w, h), Image.Resampling.NEAREST), dtype=bool)
    inner = m.copy()
    for _ in range(int(width)):  # erode by one px per round (4-neighbourhood)
        padded = np.pad(inner, 1, constant_values=False)
        inner = inner & padded[:-2, 1:-1] & padded[2:, 1:-1] & padded[1:-1, :-2] & padded[1:-1, 2:]
    return m & ~inner


def _bool_mask(mask: Any) -> np.ndarray:
    arr = _as_numpy(mask)
    if arr.ndim != 2:
        raise InputError(f"a mask must be 2-D (H, W) bool; got shape {tuple(arr.shape)}")
    if arr.dtype != bool and not np.isin(arr, (0, 1)).all():
        raise InputError("a mask must be bool (or 0 / 1): True on the object to outline")
    return arr.astype(bool)


def step_thumbnails(
    maps: Any,
    image: Any = None,
    mask: Any = None,
    scale: str = "row",
    size: int = THUMB_PX,
    clip: Optional[float] = DEFAULT_CLIP,
    gamma: float = DEFAULT_GAMMA,
) -> list[str]:
    """Each step's image map as an HTML ``<figure>``: the picture (an inline PNG) and its colour limit.

    Parameters
    ----------
    maps : Any
        (K, H, W) the steps' image maps (``GenerationExplanation.pixel_map()[row]``).
    image : Any, optional
        The photo the model read, in any form :func:`lrp_core.viz.maps.to_rgb_uint8` takes (a PIL image, (H', W', 3)
        uint8 or float in [0, 1]); drawn in light grey under the colours. ``None``: the maps on white.
    mask : Any, optional
        (H', W') bool at the photo's size (without a photo: at the maps' (H, W)), outlined on every picture.
    scale : str, optional
        ``"row"``: each step its own colour limit; ``"all"``: one limit for all steps.
    size : int, optional
        The pictures' longest side in px (at least 16).
    clip : Optional[float], optional
        Percentile of ``|map|`` for the colour limit (``None``: the maximum).
    gamma : float, optional
        Colour gamma in (0, 1].

    Returns
    -------
    list[str]
        K ``<figure class="trl-thumb">`` elements, each an ``<img class="trl-map">`` of the picture's own size and a
        caption with the limit ±m.

    Raises
    ------
    InputError
        If ``maps`` is not (K, H, W), ``scale`` is not ``"row"`` / ``"all"``, ``size`` is below 16, or the mask is
        not 2-D bool of the photo's (or the maps') size.
    """
    vals = np.nan_to_num(_as_numpy(maps).astype(np.float64))
    if vals.ndim != 3:
        raise InputError(f"step_thumbnails: maps must be (K, H, W), got shape {tuple(vals.shape)}")
    if scale not in SCALES:
        raise InputError(f"scale must be one of {SCALES}, got {scale!r}")
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 16:
        raise InputError(f"size must be an integer of at least 16 (px), got {size!r}")
    rgb = None if image is None else to_rgb_uint8(image)
    edge = _edge(mask, rgb, vals.shape[1:], size)
    shared = colour_scale(vals, clip).limit if scale == "all" else None
    return [_figure(vals[k], rgb, edge, size, shared, clip, gamma, k) for k in range(len(vals))]


def map_png(
    relmap: Any,
    image: Any = None,
    mask: Any = None,
    size: int = THUMB_PX,
    title: Optional[str] = None,
    clip: Optional[float] = DEFAULT_CLIP,
    gamma: float = DEFAULT_GAMMA,
) -> bytes:
    """One image map as :func:`step_thumbnails` draws it (over the photo in grey, the mask outlined), with a
    title above and the colour bar below (:func:`lrp_core.viz.maps.render_overlay_png`'s legend).

    Parameters
    ----------
    relmap : Any
        (H, W) the map.
    image : Any, optional
        The photo (as :func:`step_thumbnails` takes it), or ``None``: the map on white.
    mask : Any, optional
        (H', W') bool at the photo's size (without a photo: the map's), outlined.
    size : int, optional
        The picture's longest side in px.
    title : Optional[str], optional
        A title above the picture (wrapped).
    clip : Optional[float], optional
        Percentile of ``|map|`` for the colour limit (``None``: the maximum).
    gamma : float, optional
        Colour gamma in (0, 1].

    Returns
    -------
    bytes
        The PNG file's bytes.

    Raises
    ------
    InputError
        If ``relmap`` is not 2-D or the mask is not 2-D bool of the photo's (or the map's) size.
    """
    vals = np.nan_to_num(_as_numpy(relmap))
    if vals.ndim != 2:
        raise InputError(f"a relevance map must be 2-D (H, W); got shape {tuple(vals.shape)}")
    rgb = None if image is None else to_rgb_uint8(image)
    scale = colour_scale(vals, clip)
    panel, _ = _panel(vals, rgb, _edge(mask, rgb, vals.shape, size), size, scale.limit, gamma)
    return _encode_png(_compose(panel, scale, True, title, gamma))


def _edge(mask: Any, rgb: Optional[np.ndarray], map_shape: Sequence[int], size: int) -> Optional[np.ndarray]:
    """The mask's outline at the pictures' size, the mask checked against the photo's (or the maps') size."""
    if mask is None:
        return None
    shape = tuple(map_shape) if rgb is None else rgb.shape[:2]
    return mask_outline(checked_mask(mask, shape, "the photo" if rgb is not None else "the maps"), _fitted(shape, size))


def checked_mask(mask: Any, shape: Sequence[int], what: str = "the photo") -> np.ndarray:
    """A mask checked: 2-D, bool (or 0 / 1), of the size ``shape`` of ``what`` it is drawn on.

    Parameters
    ----------
    mask : Any
        (H, W) the mask (array or tensor).
    shape : Sequence[int]
        (H, W) the size it must have.
    what : str, optional
        What has that size, for the error message.

    Returns
    -------
    np.ndarray
        (H, W) bool.

    Raises
    ------
    InputError
        If the mask is not 2-D, not bool (or 0 / 1), or not of the size ``shape``.
    """
    m = _bool_mask(mask)
    if m.shape != tuple(shape):
        raise InputError(f"the mask is {m.shape}; it must have the size of {what}, {tuple(shape)}")
    return m


def _fitted(shape: Sequence[int], size: int) -> tuple[int, int]:
    """(h, w) with the longest side ``size`` and the aspect of ``shape``."""
    f = size / max(shape)
    return max(1, round(shape[0] * f)), max(1, round(shape[1] * f))


def _panel(
    relmap: np.ndarray, rgb: Optional[np.ndarray], edge: Optional[np.ndarray], size: int, limit: float, gamma: float
) -> tuple[np.ndarray, tuple[int, int]]:
    """The map over the grey photo (or white) at ``size``, coloured to ``limit``, the outline on top; its (h, w)."""
    h, w = _fitted(rgb.shape[:2] if rgb is not None else relmap.shape, size)
    light = None if rgb is None else grey_photo(rgb, PHOTO_LIGHT)
    panel = overlay(light, relmap, size=(h, w), gamma=gamma, limit=limit, grey=False)
    if edge is not None:
        panel[edge] = OUTLINE_RGB
    return panel, (h, w)


def _figure(
    relmap: np.ndarray,
    rgb: Optional[np.ndarray],
    edge: Optional[np.ndarray],
    size: int,
    limit: Optional[float],
    clip: Optional[float],
    gamma: float,
    k: int,
) -> str:
    """One step's ``<figure>``: the picture, the limit below."""
    m = colour_scale(relmap, clip).limit if limit is None else limit
    panel, (h, w) = _panel(relmap, rgb, edge, size, m, gamma)
    png = base64.b64encode(_encode_png(Image.fromarray(panel))).decode()
    return (
        f'<figure class="trl-thumb"><img class="trl-map" width="{w}" height="{h}" '
        f'alt="step {k + 1}: image map" src="data:image/png;base64,{png}">'
        f"<figcaption>\u00b1{html.escape(_fmt(m))}</figcaption></figure>"
    )


def image_note(pixels: bool, photo: bool, outline: bool) -> str:
    """What the image column of a generation page shows (a sentence for its note).

    Parameters
    ----------
    pixels : bool
        The maps are pixel relevance (else the image tokens' scores, upsampled).
    photo : bool
        They are drawn over the photo.
    outline : bool
        A mask is outlined.

    Returns
    -------
    str
        The sentence.
    """
    what = "its pixel relevance" if pixels else "its image tokens' scores, upsampled"
    return (
        f"Beside each token: the image map of its step ({what}; same colours, its limit \u00b1m below it"
        + (", over the photo in grey" if photo else "")
        + ("; outlined: the mask given" if outline else "")
        + ")."
    )


__all__ = [
    "step_thumbnails",
    "map_png",
    "mask_outline",
    "checked_mask",
    "image_note",
    "THUMB_PX",
    "OUTLINE_RGB",
    "PHOTO_LIGHT",
]

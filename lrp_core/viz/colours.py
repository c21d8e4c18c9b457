"""Relevance as colours, with numpy alone: the zero-centred colour limit, the gamma, the colour table.

The colour of a value ``v`` under the limit ``m`` is the diverging table (blue ``-m``, white ``0``, red ``+m``)
at ``sign(v) |v / m| ** gamma``; :mod:`.maps` draws figures and pictures with it, :mod:`.text` the token
heat maps. This module needs no matplotlib: its table is matplotlib's ``LinearSegmentedColormap`` through
blue, white and red with 257 entries, computed here (the same bytes, checked in the tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from ..errors import InputError

#: The colour table's ends and centre (RGB in [0, 1]): blue for negative, white for zero, red for positive.
DIVERGING_ANCHORS = ((0.0, 0.0, 1.0), (1.0, 1.0, 1.0), (1.0, 0.0, 0.0))

#: Entries of the colour table: odd, so that entry 128 is exactly the centre (white for zero relevance).
LUT_SIZE = 257


def _diverging_table(anchors: tuple = DIVERGING_ANCHORS, n: int = LUT_SIZE) -> np.ndarray:
    """(n, 3) uint8: the colours at ``i / (n - 1)``, linear between the anchors, which sit at equal spacing.

    With ``n = 257`` and three anchors every position and every weight is a binary fraction, so each entry is
    exact before the rounding (``np.round``, half to even, as the colormap's table is rounded).
    """
    pts = np.asarray(anchors, dtype=np.float64)
    x = np.linspace(0.0, 1.0, n)
    where = np.linspace(0.0, 1.0, len(pts))
    rgb = np.stack([np.interp(x, where, pts[:, c]) for c in range(3)], axis=1)
    return (rgb * 255).round().astype(np.uint8)


_LUT = _diverging_table()

#: Default colour limit: this percentile of ``|values|``. Why 99 and not the 99.9 % of
#: pixels that the CDAM authors clip at: we take the percentile over the map's own
#: values (patches, tokens), not over upsampled pixels. A ViT-B/16 map has 196
#: patches, and its 99th percentile lies between the 3rd and the 2nd largest patch,
#: so one or two extreme patches cannot set the scale for the rest (0.1 % of pixels
#: is a quarter of one patch and would not help). On short inputs (8 x 8 maps, a
#: sentence) the 99th percentile is close to the maximum, so little is clipped there.
DEFAULT_CLIP: float = 99.0

#: Default colour gamma: colour at ``sign(v) * |v / m| ** gamma`` (1.0 = linear).
DEFAULT_GAMMA: float = 0.5


def _as_numpy(values: Any) -> np.ndarray:
    """A float64 numpy copy of a numpy array, torch tensor or sequence."""
    if hasattr(values, "detach"):  # torch tensor
        values = values.detach().float().cpu().numpy()
    return np.asarray(values, dtype=np.float64)


def _fmt(v: float) -> str:
    return f"{v:.3g}"


@dataclass(frozen=True)
class ColourScale:
    """The symmetric colour limit of one picture and where it came from.

    Attributes:
        limit: ``m``: colours run over ``[-m, m]`` (> 0).
        maximum: ``max |values|`` over the finite values (0 for an all-zero map).
        percentile: the percentile of ``|values|`` that set ``limit`` (``None``: the maximum).
    """

    limit: float
    maximum: float
    percentile: Optional[float] = None

    @property
    def clipped(self) -> bool:
        """True when some values lie beyond the limit (drawn in the end colours)."""
        return self.maximum > self.limit * (1.0 + 1e-9)

    def describe(self) -> str:
        """A short legend line: ``"clipped at p99 = 0.12 (max 0.5)"`` or ``"max |R| = 0.5"``."""
        if self.clipped:
            return f"clipped at p{self.percentile:g} = {_fmt(self.limit)} (max {_fmt(self.maximum)})"
        return f"max |R| = {_fmt(self.maximum)}"


# A percentile this close to the maximum is not worth reporting as clipping.
_NOT_WORTH_CLIPPING = 0.95


def _check_clip(clip: Optional[float]) -> None:
    if clip is not None and not 0.0 < float(clip) <= 100.0:
        raise InputError(f"clip is a percentile of |values| in (0, 100], or None for the exact maximum; got {clip!r}")


def colour_scale(values: Any, clip: Optional[float] = DEFAULT_CLIP) -> ColourScale:
    """The colour limit ``m`` for ``values``: ``np.percentile(|values|, clip)`` over the finite entries.

    ``clip=None`` (or 100) uses the exact maximum. The maximum is also used when the
    percentile is 0 (most values zero) or at least 95 % of the maximum (a short
    input, e.g. a sentence: clipping 5 % changes no colour visibly and the legend
    would only report noise); an all-zero map gets ``m = 1``.

    Parameters
    ----------
    values : Any
        Relevance of any shape (array, tensor or sequence).
    clip : Optional[float], optional
        Percentile of ``|values|`` in (0, 100]; ``None`` = the exact maximum.

    Returns
    -------
    ColourScale
        The limit ``m``, the maximum, and the percentile when the limit is clipped.
    """
    _check_clip(clip)
    arr = np.abs(_as_numpy(values))
    finite = arr[np.isfinite(arr)]
    top = float(finite.max()) if finite.size else 0.0
    if top <= 0.0:
        return ColourScale(limit=1.0, maximum=top)
    if clip is None or float(clip) >= 100.0:
        return ColourScale(limit=top, maximum=top)
    lim = float(np.percentile(finite, float(clip)))
    if lim <= 0.0 or lim >= _NOT_WORTH_CLIPPING * top:
        return ColourScale(limit=top, maximum=top)
    return ColourScale(limit=lim, maximum=top, percentile=float(clip))


def symmetric_limit(values: Any, clip: Optional[float] = None) -> float:
    """``max |values|`` over finite entries (or a percentile, see :func:`colour_scale`); 1.0 when all are zero.

    Parameters
    ----------
    values : Any
        Relevance of any shape (array, tensor or sequence).
    clip : Optional[float], optional
        Percentile of ``|values|`` in (0, 100]; ``None`` (default) = the exact maximum.

    Returns
    -------
    float
        The colour limit ``m``.
    """
    return colour_scale(values, clip).limit


def _check_gamma(gamma: float) -> None:
    if not 0.0 < float(gamma) <= 1.0:
        raise InputError(f"gamma must lie in (0, 1] (1 = linear colours); got {gamma!r}")


def _power(x: np.ndarray, gamma: float) -> np.ndarray:
    """The odd power ``sign(x) |x| ** gamma`` (zero stays zero, order is kept)."""
    x = np.asarray(x, dtype=np.float64)
    return np.sign(x) * np.abs(x) ** gamma


def _view(values: np.ndarray, signed: bool) -> np.ndarray:
    """The signed values, or their positive part ``clamp(min=0)``."""
    return values if signed else np.clip(values, 0.0, None)


def colorize(
    values: Any,
    signed: bool = True,
    limit: Optional[float] = None,
    clip: Optional[float] = DEFAULT_CLIP,
    gamma: float = DEFAULT_GAMMA,
) -> np.ndarray:
    """Map relevance to RGB with the zero-centred colormap: (..., 3) uint8.

    Parameters
    ----------
    values : Any
        any-shaped relevance.
    signed : bool, optional
        keep negative values; ``False`` shows ``clamp(min=0)``.
    limit : Optional[float], optional
        colour limit ``m``; default :func:`colour_scale` of the shown view with ``clip``.
    clip : Optional[float], optional
        percentile of ``|values|`` used for the default limit (``None``: the maximum).
    gamma : float, optional
        colour at ``sign(v) |v/m| ** gamma``; values beyond ``m`` get the end colours.

    Returns
    -------
    np.ndarray
        (..., 3) uint8 RGB colours, one per value.
    """
    _check_gamma(gamma)
    arr = _view(np.nan_to_num(_as_numpy(values)), signed)
    m = colour_scale(arr, clip).limit if limit is None else float(limit)
    t = _power(np.clip(arr / m, -1.0, 1.0), float(gamma))
    idx = np.clip(np.rint((t + 1.0) * 128.0), 0, 256).astype(np.intp)
    return _LUT[idx]


def _text_colour(rgb: np.ndarray) -> str:
    lum = (0.2126 * rgb[0] + 0.7152 * rgb[1] + 0.0722 * rgb[2]) / 255.0
    return "#ffffff" if lum < 0.5 else "#111111"


__all__ = [
    "DEFAULT_CLIP",
    "DEFAULT_GAMMA",
    "DIVERGING_ANCHORS",
    "LUT_SIZE",
    "ColourScale",
    "colour_scale",
    "symmetric_limit",
    "colorize",
]

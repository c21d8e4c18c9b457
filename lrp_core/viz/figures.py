"""Matplotlib figures of relevance for the notebooks: a map over its image with a colour bar, methods side by side.

The colours are those of the pictures (:mod:`.maps`, :mod:`.colours`): zero-centred, white = 0, red for, blue
against, the same robust limit and gamma; the colour bars show the ramp at the true values. Needs matplotlib (the
``viz`` extra); pyplot is imported on first use.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any, Mapping, Optional

import numpy as np

from ..errors import InputError
from ..runtime.extras import require
from .colours import (
    DEFAULT_CLIP,
    DEFAULT_GAMMA,
    DIVERGING_ANCHORS,
    LUT_SIZE,
    _as_numpy,
    _check_gamma,
    _fmt,
    _power,
    _view,
    colour_scale,
    symmetric_limit,
)
from .maps import overlay, to_rgb_uint8

if TYPE_CHECKING:
    import matplotlib.colors as mcolors
    import matplotlib.pyplot as plt
else:
    mcolors = require("matplotlib.colors", extra="viz", what="lrp_core.viz")

__all__ = ["relevance_cmap", "signed_norm", "show_relevance", "show_methods", "render_png"]

#: Diverging colormap used for every relevance picture (blue < 0 < red). Like
#: matplotlib's "bwr", but with an odd number of entries so that zero is exactly white;
#: its table is :mod:`.colours`' (the pictures colour with that table, without matplotlib).
relevance_cmap: mcolors.Colormap = mcolors.LinearSegmentedColormap.from_list(
    "trl_relevance", list(DIVERGING_ANCHORS), N=LUT_SIZE
)


def _pyplot():
    """matplotlib's pyplot, imported on first use: only figures need it (the PIL pictures do not)."""
    return require("matplotlib.pyplot", extra="viz", what="lrp_core.viz figures")


def signed_norm(values: Any, clip: Optional[float] = None, gamma: float = 1.0) -> mcolors.Normalize:
    """Zero-centred normalisation over ``[-m, m]`` (``m``: see :func:`colour_scale`).

    The defaults (exact maximum, linear) suit small arrays of numbers; the relevance
    pictures pass :data:`DEFAULT_CLIP` and :data:`DEFAULT_GAMMA`. With ``gamma < 1``
    the norm is ``0.5 + 0.5 sign(v) |v/m| ** gamma`` (a matplotlib ``FuncNorm``), so
    colourbars place their ticks at the true values.

    Parameters
    ----------
    values : Any
        Relevance (array, tensor or sequence) whose colour limit ``m`` is taken.
    clip : Optional[float], optional
        Percentile of ``|values|`` for ``m``; ``None`` = the exact maximum.
    gamma : float, optional
        Colour gamma in (0, 1]; 1 = linear colours.

    Returns
    -------
    mcolors.Normalize
        A norm mapping ``[-m, m]`` to [0, 1] (a ``FuncNorm`` when ``gamma < 1``).
    """
    _check_gamma(gamma)
    m = symmetric_limit(values, clip)
    if float(gamma) == 1.0:
        return mcolors.Normalize(vmin=-m, vmax=m)
    g = float(gamma)
    return mcolors.FuncNorm((lambda x: _power(x, g), lambda y: _power(y, 1.0 / g)), vmin=-m, vmax=m)


def show_relevance(
    image_rgb: Any,
    relmap: Any,
    ax: Optional[plt.Axes] = None,
    alpha: float = 0.6,
    signed: bool = True,
    title: Optional[str] = None,
    colorbar: bool = True,
    clip: Optional[float] = DEFAULT_CLIP,
    gamma: float = DEFAULT_GAMMA,
    grey: bool = True,
) -> plt.Axes:
    """Draw the relevance map over the image on a matplotlib axis; returns the axis.

    The pixels are exactly :func:`overlay`'s (the widgets draw the same picture):
    grey photo tinted by the map, colour limit from :func:`colour_scale` (``clip``,
    ``None`` = exact maximum), colour gamma ``gamma``. ``image_rgb=None`` draws the
    map alone, one square per value. The colourbar has its ticks at the true values;
    when values were clipped its ends are arrows and a line under the picture says
    "clipped at p99 (max ...)".

    Parameters
    ----------
    image_rgb : Any
        The photo, in any form :func:`to_rgb_uint8` accepts, or ``None`` (the map alone).
    relmap : Any
        (h, w) relevance map.
    ax : Optional[plt.Axes], optional
        The axis to draw on; default a new figure's.
    alpha : float, optional
        Opacity of the relevance colours, in [0, 1].
    signed : bool, optional
        Keep negative relevance; ``False`` shows ``clamp(min=0)``.
    title : Optional[str], optional
        Title of the axis.
    colorbar : bool, optional
        Draw the colourbar.
    clip : Optional[float], optional
        Percentile of ``|relmap|`` for the colour limit (``None``: the maximum).
    gamma : float, optional
        Colour gamma in (0, 1].
    grey : bool, optional
        Draw the photo in light grey (see :func:`overlay`).

    Returns
    -------
    plt.Axes
        The axis drawn on.

    Raises
    ------
    InputError
        If ``image_rgb`` is ``None`` and ``relmap`` is not 2-D.
    """
    plt = _pyplot()
    if ax is None:
        _, ax = plt.subplots(figsize=(4, 4))
    rel = _view(np.nan_to_num(_as_numpy(relmap)), signed)
    if rel.ndim != 2:
        raise InputError(f"a relevance map must be 2-D (h, w); got shape {tuple(rel.shape)}")
    size = to_rgb_uint8(image_rgb).shape[:2] if image_rgb is not None else None
    pixels = overlay(image_rgb, rel, alpha=alpha, signed=signed, size=size, clip=clip, gamma=gamma, grey=grey)
    ax.imshow(pixels, interpolation="nearest" if image_rgb is None else "antialiased")
    scale = colour_scale(rel, clip)
    if colorbar:
        norm = signed_norm([scale.limit], gamma=gamma)
        mappable = plt.cm.ScalarMappable(norm=norm, cmap=relevance_cmap)
        extend = ("both" if signed else "max") if scale.clipped else "neither"
        cb = ax.figure.colorbar(mappable, ax=ax, fraction=0.046, pad=0.03, extend=extend)
        # plain numbers on each tick (no "1e-5" offset text that lands on the next title)
        ticker = require("matplotlib.ticker", extra="viz", what="lrp_core.viz figures")
        cb.ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:.2g}"))
        if not signed:
            cb.ax.set_ylim(0.0, scale.limit)
        if scale.clipped:  # under the picture, where it costs no width
            ax.text(
                0.5,
                -0.015,
                f"clipped at p{scale.percentile:g} (max {_fmt(scale.maximum)})",
                transform=ax.transAxes,
                ha="center",
                va="top",
                fontsize="small",
                color="#a30",
            )
    ax.set_axis_off()
    if title:
        ax.set_title(title)
    return ax


def show_methods(
    image: Any,
    maps: Mapping[str, Any],
    ncols: Optional[int] = None,
    alpha: float = 0.6,
    signed: bool = True,
    panel_size: float = 3.0,
    colorbar: bool = True,
    clip: Optional[float] = DEFAULT_CLIP,
    gamma: float = DEFAULT_GAMMA,
) -> plt.Figure:
    """A grid of :func:`show_relevance` panels, one per ``{name: map}``; returns the figure.

    Each panel has its own colour limit (methods differ in scale); ``clip`` and
    ``gamma`` as in :func:`show_relevance`.

    Parameters
    ----------
    image : Any
        The photo, in any form :func:`to_rgb_uint8` accepts.
    maps : Mapping[str, Any]
        ``{name: (h, w) map}``, one panel each, in order.
    ncols : Optional[int], optional
        Panels per row; default all in one row.
    alpha : float, optional
        Opacity of the relevance colours, in [0, 1].
    signed : bool, optional
        Keep negative relevance; ``False`` shows ``clamp(min=0)``.
    panel_size : float, optional
        Size of a panel in inches.
    colorbar : bool, optional
        Draw a colourbar per panel.
    clip : Optional[float], optional
        Percentile of ``|map|`` for each panel's colour limit (``None``: the maximum).
    gamma : float, optional
        Colour gamma in (0, 1].

    Returns
    -------
    plt.Figure
        The figure; unused axes are switched off.

    Raises
    ------
    InputError
        If ``maps`` is empty.
    """
    if not maps:
        raise InputError("show_methods needs at least one {name: map} entry")
    n = len(maps)
    ncols = min(ncols or n, n)
    nrows = -(-n // ncols)
    fig, axes = _pyplot().subplots(nrows, ncols, figsize=(panel_size * ncols * 1.15, panel_size * nrows), squeeze=False)
    for ax, (name, relmap) in zip(axes.flat, maps.items()):
        show_relevance(
            image, relmap, ax=ax, alpha=alpha, signed=signed, title=name, colorbar=colorbar, clip=clip, gamma=gamma
        )
    for ax in list(axes.flat)[n:]:
        ax.set_axis_off()
    fig.tight_layout()
    return fig


def render_png(fig: plt.Figure, dpi: Optional[float] = None, close: bool = False) -> bytes:
    """Encode a matplotlib figure as PNG bytes (optionally closing it).

    Parameters
    ----------
    fig : plt.Figure
        The figure.
    dpi : Optional[float], optional
        Resolution; default the figure's own.
    close : bool, optional
        Close the figure after encoding it.

    Returns
    -------
    bytes
        The PNG file's bytes.
    """
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    if close:
        _pyplot().close(fig)
    return buf.getvalue()

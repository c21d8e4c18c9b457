"""Plotting helpers shared by the widgets and the notebooks.

Relevance is signed: red speaks *for* the explained class, blue *against* it,
white is zero. Every colour scale here is zero-centred with symmetric limits
``[-m, m]``, so equal magnitudes get equal saturation. Three choices keep weak
relevance visible (a map whose few strongest patches set the scale otherwise
draws near-white everywhere else):

* **robust limit** ``m``: by default the 99th percentile of ``|values|``
  (:data:`DEFAULT_CLIP`), not the maximum; values beyond it are drawn in the
  end colour and every legend says so ("clipped at p99 = ..., max ...").
  ``clip=None`` gives the exact maximum.
* **gamma** (:data:`DEFAULT_GAMMA` = 0.5): the colour of ``v`` is the colormap
  at ``sign(v) |v / m| ** 0.5``, so a patch at a tenth of the limit gets a third
  of the full colour instead of a tenth. The colour bars show the ramp, so the
  scale stays readable.
* **grey photo** under the map: the picture is drawn in light grey and tinted by
  the map's colour (a multiply blend with opacity ``alpha``), so red and blue
  stand out on any scene, blue ones included, and zero relevance (white) leaves
  the photo as it is.

Two kinds of output, with the same defaults:

* matplotlib figures (:func:`show_relevance`, :func:`show_methods`) for the
  notebooks, with colourbars;
* a fast numpy + PIL path (:func:`colorize`, :func:`overlay`,
  :func:`render_overlay_png`) that widgets use to redraw in a few
  milliseconds, far quicker than drawing a matplotlib figure.

Text relevance is rendered as HTML (:func:`token_html`), optionally after
merging BERT word-pieces into words (:func:`merge_wordpieces`).

The colour limit, gamma and table live in :mod:`.colours` (numpy only); this
module needs matplotlib (the ``viz`` extra; pyplot only for figures) and Pillow.
"""

from __future__ import annotations

import functools
import html
import io
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence, Union

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from ..errors import InputError
from ..runtime.extras import require
from .colours import (  # noqa: F401
    _LUT,
    DEFAULT_CLIP,
    DEFAULT_GAMMA,
    DIVERGING_ANCHORS,
    LUT_SIZE,
    ColourScale,
    _as_numpy,
    _check_gamma,
    _fmt,
    _power,
    _text_colour,
    _view,
    colorize,
    colour_scale,
    symmetric_limit,
)

if TYPE_CHECKING:
    import matplotlib.colors as mcolors
    import matplotlib.pyplot as plt
else:
    mcolors = require("matplotlib.colors", extra="viz", what="lrp_core.viz")

__all__ = [
    "relevance_cmap",
    "DEFAULT_CLIP",
    "DEFAULT_GAMMA",
    "ColourScale",
    "colour_scale",
    "signed_norm",
    "symmetric_limit",
    "colorize",
    "upsample_map",
    "to_rgb_uint8",
    "PHOTO_FLOOR",
    "grey_photo",
    "overlay",
    "overlay_image",
    "render_overlay_png",
    "tile_pngs",
    "show_relevance",
    "show_methods",
    "render_png",
    "token_html",
    "merge_wordpieces",
    "denormalize",
]

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


def upsample_map(relmap: Any, size: tuple[int, int]) -> np.ndarray:
    """Bilinear upsampling of a 2-D map to ``size = (H, W)`` (float32).

    Parameters
    ----------
    relmap : Any
        (h, w) relevance map (array or tensor).
    size : tuple[int, int]
        ``(H, W)`` the target size.

    Returns
    -------
    np.ndarray
        (H, W) float32 upsampled map.

    Raises
    ------
    InputError
        If ``relmap`` is not 2-D.
    """
    arr = np.nan_to_num(_as_numpy(relmap)).astype(np.float32)
    if arr.ndim != 2:
        raise InputError(f"a relevance map must be 2-D (h, w); got shape {tuple(arr.shape)}")
    h, w = int(size[0]), int(size[1])
    if arr.shape == (h, w):
        return arr
    return np.asarray(Image.fromarray(arr, mode="F").resize((w, h), Image.Resampling.BILINEAR))


def to_rgb_uint8(image: Any) -> np.ndarray:
    """An RGB image as (H, W, 3) uint8 from float [0, 1] / uint8 / grey / PIL input.

    Parameters
    ----------
    image : Any
        (H, W, 3) float in [0, 1] or uint8, (H, W) grey, or a PIL image.

    Returns
    -------
    np.ndarray
        (H, W, 3) uint8 RGB image.

    Raises
    ------
    InputError
        If the image is not (H, W, 3) after conversion.
    """
    if isinstance(image, Image.Image):
        return np.asarray(image.convert("RGB"))
    arr = image.detach().cpu().numpy() if hasattr(image, "detach") else np.asarray(image)
    if arr.ndim == 3 and arr.shape[0] in (1, 3) and arr.shape[-1] not in (1, 3):
        arr = np.moveaxis(arr, 0, -1)  # (C, H, W) -> (H, W, C)
    if arr.ndim == 2:
        arr = arr[..., None]
    if arr.ndim != 3 or arr.shape[-1] not in (1, 3, 4):
        raise InputError(f"expected an (H, W, 3) RGB image; got shape {tuple(arr.shape)}")
    arr = arr[..., :3]
    if arr.shape[-1] == 1:
        arr = np.repeat(arr, 3, axis=-1)
    if arr.dtype != np.uint8:
        arr = np.clip(np.asarray(arr, dtype=np.float64), 0.0, 1.0) * 255.0
        arr = np.rint(arr).astype(np.uint8)
    return arr


#: In :func:`grey_photo`, black becomes this grey level (0..1), so that red and blue
#: painted over the darkest parts of a photo still show their hue.
PHOTO_FLOOR: float = 0.35


def grey_photo(image: Any, floor: float = PHOTO_FLOOR) -> np.ndarray:
    """The photo in light grey, as (H, W, 3) uint8: luminance mapped to ``[floor, 1]``.

    Relevance is painted over this, so that its red and blue never meet a red or
    blue picture (blue relevance disappears on a blue sky or a teal background).
    Luminance is Rec. 709's ``0.2126 R + 0.7152 G + 0.0722 B``.

    Parameters
    ----------
    image : Any
        The photo, in any form :func:`to_rgb_uint8` accepts.
    floor : float, optional
        Luminance of black in the grey photo, in [0, 1].

    Returns
    -------
    np.ndarray
        (H, W, 3) uint8 grey photo.
    """
    rgb = to_rgb_uint8(image).astype(np.float32) / 255.0
    lum = rgb @ np.array([0.2126, 0.7152, 0.0722], dtype=np.float32)
    lum = float(floor) + (1.0 - float(floor)) * lum
    return np.repeat(np.clip(np.rint(lum * 255.0), 0, 255).astype(np.uint8)[..., None], 3, axis=-1)


def _faded_photo(image: Any, alpha: float) -> np.ndarray:
    """The photo on its way to :func:`grey_photo`: plain at ``alpha = 0``, fully grey from 0.5 on.

    So that turning the map's opacity down to 0 gives back the photo as it is.
    """
    rgb = to_rgb_uint8(image)
    w = min(1.0, 2.0 * float(alpha))
    if w == 0.0:
        return rgb
    out = (1.0 - w) * rgb.astype(np.float32) + w * grey_photo(rgb).astype(np.float32)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def overlay(
    image_rgb: Any,
    relmap: Any,
    alpha: float = 0.6,
    signed: bool = True,
    size: Optional[tuple[int, int]] = None,
    clip: Optional[float] = DEFAULT_CLIP,
    gamma: float = DEFAULT_GAMMA,
    grey: bool = True,
    limit: Optional[float] = None,
) -> np.ndarray:
    """Tint the (grey) photo with the coloured relevance: (H, W, 3) uint8.

    The map is upsampled bilinearly to the image (or to ``size``) and coloured
    with :func:`colorize` (limit: :func:`colour_scale` of ``relmap`` itself, not
    of the upsampled pixels). Each pixel is ``photo * (1 - alpha + alpha * colour)``
    (a "multiply" blend, colours in [0, 1]): zero relevance is white and leaves
    the photo as it is, strong relevance tints it fully red or blue, and weak
    relevance tints it as much as its colour says (opacity does not also fall
    with ``|R|``, which would fade weak patches twice). The photo is drawn in
    light grey (:func:`grey_photo`) from ``alpha >= 0.5`` on, so blue relevance
    stays visible on blue scenes; lower opacities fade back to the photo's own
    colours (``alpha = 0``: the photo as it is; ``grey=False``: always its own
    colours). ``image_rgb=None`` draws the map alone.

    Parameters
    ----------
    image_rgb : Any
        The photo, in any form :func:`to_rgb_uint8` accepts, or ``None`` (the map alone).
    relmap : Any
        (h, w) relevance map.
    alpha : float, optional
        Opacity of the relevance colours, in [0, 1].
    signed : bool, optional
        Keep negative relevance; ``False`` shows ``clamp(min=0)``.
    size : Optional[tuple[int, int]], optional
        ``(H, W)`` to upsample to instead of the image's size.
    clip : Optional[float], optional
        Percentile of ``|relmap|`` for the colour limit (``None``: the maximum).
    gamma : float, optional
        Colour gamma in (0, 1].
    grey : bool, optional
        Draw the photo in light grey from ``alpha >= 0.5`` on; ``False``: its own colours.
    limit : Optional[float], optional
        The colour limit m (several maps drawn on one scale); ``None``: :func:`colour_scale` of ``relmap``
        with ``clip``.

    Returns
    -------
    np.ndarray
        (H, W, 3) uint8 tinted photo.

    Raises
    ------
    InputError
        If ``alpha`` lies outside [0, 1].
    """
    if not 0.0 <= float(alpha) <= 1.0:
        raise InputError(f"alpha must lie in [0, 1]; got {alpha}")
    if image_rgb is None:
        shape = size or _as_numpy(relmap).shape
        base = np.full((int(shape[0]), int(shape[1]), 3), 255, dtype=np.uint8)
        alpha = 1.0
    else:
        base = _faded_photo(image_rgb, alpha) if grey else to_rgb_uint8(image_rgb)
        if size is not None and base.shape[:2] != tuple(size):
            base = np.asarray(Image.fromarray(base).resize((size[1], size[0]), Image.Resampling.BICUBIC))
    shown = _view(np.nan_to_num(_as_numpy(relmap)), signed)
    m = colour_scale(shown, clip).limit if limit is None else float(limit)
    rel = _view(upsample_map(shown, base.shape[:2]), signed)
    colour = colorize(rel, signed=True, limit=m, gamma=gamma).astype(np.float32) / 255.0
    a = np.float32(alpha)
    out = base.astype(np.float32) * (1.0 - a + a * colour)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


@functools.lru_cache(maxsize=8)
def _font(size: int = 12) -> Union[ImageFont.ImageFont, ImageFont.FreeTypeFont]:
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, OSError):  # Pillow without FreeType
        return ImageFont.load_default()


#: Font sizes (px) of the PIL pictures: titles and legends stay readable in a room.
TITLE_PX, LEGEND_PX = 14, 12


def _legend(width: int, scale: ColourScale, signed: bool, gamma: float) -> Image.Image:
    """A colourbar strip (values ``-m..m`` or ``0..m``), its limits, and how ``m`` was chosen."""
    bar_h, line_h = 12, LEGEND_PX + 5
    img = Image.new("RGB", (width, bar_h + 2 * line_h + 2), "white")
    limit = scale.limit
    ramp = np.linspace(-limit if signed else 0.0, limit, max(width - 8, 2))
    bar = colorize(ramp[None, :].repeat(bar_h, 0), signed=True, limit=limit, gamma=gamma)
    img.paste(Image.fromarray(bar), (4, 0))
    draw, font = ImageDraw.Draw(img), _font(LEGEND_PX)
    y = bar_h + 2
    left = _fmt(-limit) if signed else "0"
    draw.text((4, y), left, fill="black", font=font)
    right = _fmt(limit)
    draw.text((width - 4 - draw.textlength(right, font=font), y), right, fill="black", font=font)
    if signed:
        draw.text((width / 2 - draw.textlength("0", font=font) / 2, y), "0", fill="black", font=font)
    note = _fit(draw, scale.describe(), font, width - 8)
    draw.text((4, y + line_h), note, fill="#444444" if not scale.clipped else "#aa3300", font=font)
    return img


def _fit(draw: ImageDraw.ImageDraw, text: str, font: Any, width: float) -> str:
    """``text`` cut (with an ellipsis) to fit ``width`` px: only for the legend's last line."""
    if draw.textlength(text, font=font) <= width:
        return text
    while len(text) > 1 and draw.textlength(text + "\u2026", font=font) > width:
        text = text[:-1]
    return text + "\u2026"


def _wrap(draw: ImageDraw.ImageDraw, text: str, font: Any, width: float) -> list[str]:
    """Break ``text`` into lines of at most ``width`` px, at spaces where possible (nothing is cut)."""
    lines: list[str] = []
    for word in text.split(" "):
        if lines and draw.textlength(lines[-1] + " " + word, font=font) <= width:
            lines[-1] += " " + word
            continue
        while draw.textlength(word, font=font) > width and len(word) > 1:  # a word wider than a line
            k = len(word)
            while k > 1 and draw.textlength(word[:k], font=font) > width:
                k -= 1
            lines.append(word[:k])
            word = word[k:]
        lines.append(word)
    return lines


def _compose(panel: np.ndarray, scale: ColourScale, signed: bool, title: Optional[str], gamma: float) -> Image.Image:
    """Panel + optional title (wrapped onto as many lines as it needs) above + colourbar below."""
    body = Image.fromarray(panel)
    w = body.width
    parts: list[Image.Image] = []
    if title:
        font = _font(TITLE_PX)
        probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
        lines = _wrap(probe, title, font, w - 6)
        line_h = TITLE_PX + 4
        head = Image.new("RGB", (w, line_h * len(lines) + 4), "white")
        draw = ImageDraw.Draw(head)
        for k, line in enumerate(lines):
            draw.text((3, 2 + k * line_h), line, fill="black", font=font)
        parts.append(head)
    parts += [body, _legend(w, scale, signed, gamma)]
    out = Image.new("RGB", (w, sum(p.height for p in parts)), "white")
    y = 0
    for p in parts:
        out.paste(p, (0, y))
        y += p.height
    return out


def _encode_png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def render_overlay_png(
    image_rgb: Any,
    relmap: Any,
    alpha: float = 0.6,
    signed: bool = True,
    display_size: int = 320,
    title: Optional[str] = None,
    legend: bool = True,
    clip: Optional[float] = DEFAULT_CLIP,
    gamma: float = DEFAULT_GAMMA,
) -> bytes:
    """Fast PNG of :func:`overlay` at ``display_size`` px (longest side), with colourbar.

    This is the widgets' drawing path: numpy colour lookup + PIL, a few ms. The
    title is wrapped, never cut; the legend gives the limits and says when values
    were clipped (see :func:`colour_scale`).

    Parameters
    ----------
    image_rgb : Any
        The photo, in any form :func:`to_rgb_uint8` accepts, or ``None`` (the map alone).
    relmap : Any
        (h, w) relevance map.
    alpha : float, optional
        Opacity of the relevance colours, in [0, 1].
    signed : bool, optional
        Keep negative relevance; ``False`` shows ``clamp(min=0)``.
    display_size : int, optional
        Length in pixels of the picture's longest side.
    title : Optional[str], optional
        Title above the picture (wrapped).
    legend : bool, optional
        Draw the colourbar legend.
    clip : Optional[float], optional
        Percentile of ``|relmap|`` for the colour limit (``None``: the maximum).
    gamma : float, optional
        Colour gamma in (0, 1].

    Returns
    -------
    bytes
        The PNG file's bytes.
    """
    return _encode_png(
        overlay_image(image_rgb, relmap, alpha, signed, display_size, title, legend, clip=clip, gamma=gamma)
    )


def overlay_image(
    image_rgb: Any,
    relmap: Any,
    alpha: float = 0.6,
    signed: bool = True,
    display_size: int = 320,
    title: Optional[str] = None,
    legend: bool = True,
    clip: Optional[float] = DEFAULT_CLIP,
    gamma: float = DEFAULT_GAMMA,
) -> Image.Image:
    """The PIL image that :func:`render_overlay_png` encodes.

    Parameters
    ----------
    image_rgb : Any
        The photo, in any form :func:`to_rgb_uint8` accepts, or ``None`` (the map alone).
    relmap : Any
        (h, w) relevance map.
    alpha : float, optional
        Opacity of the relevance colours, in [0, 1].
    signed : bool, optional
        Keep negative relevance; ``False`` shows ``clamp(min=0)``.
    display_size : int, optional
        Length in pixels of the picture's longest side.
    title : Optional[str], optional
        Title above the picture (wrapped).
    legend : bool, optional
        Draw the colourbar legend.
    clip : Optional[float], optional
        Percentile of ``|relmap|`` for the colour limit (``None``: the maximum).
    gamma : float, optional
        Colour gamma in (0, 1].

    Returns
    -------
    Image.Image
        The picture, with title and legend if asked for.

    Raises
    ------
    InputError
        If ``image_rgb`` is ``None`` and ``relmap`` is not 2-D.
    """
    shape = to_rgb_uint8(image_rgb).shape[:2] if image_rgb is not None else _as_numpy(relmap).shape
    scale = display_size / max(shape)
    size = (max(1, round(shape[0] * scale)), max(1, round(shape[1] * scale)))
    if image_rgb is None:  # the map alone: one flat square per value, not a blur
        rel = _as_numpy(relmap)
        if rel.ndim != 2:
            raise InputError(f"a relevance map must be 2-D (h, w); got shape {tuple(rel.shape)}")
        small = overlay(None, rel, signed=signed, clip=clip, gamma=gamma)
        panel = np.asarray(Image.fromarray(small).resize((size[1], size[0]), Image.Resampling.NEAREST))
    else:
        panel = overlay(image_rgb, relmap, alpha=alpha, signed=signed, size=size, clip=clip, gamma=gamma)
    if not legend:
        return Image.fromarray(panel)
    cscale = colour_scale(_view(np.nan_to_num(_as_numpy(relmap)), signed), clip)
    return _compose(panel, cscale, signed, title, gamma)


def tile_pngs(images: Sequence[Image.Image], ncols: Optional[int] = None, pad: int = 6) -> bytes:
    """Lay PIL images out in a grid (row-major) and encode it as one PNG.

    Parameters
    ----------
    images : Sequence[Image.Image]
        The pictures, in row-major order.
    ncols : Optional[int], optional
        Pictures per row; default all in one row.
    pad : int, optional
        Pixels of white space between and around the pictures.

    Returns
    -------
    bytes
        The PNG file's bytes.

    Raises
    ------
    InputError
        If ``images`` is empty.
    """
    if not images:
        raise InputError("tile_pngs needs at least one image")
    ncols = ncols or len(images)
    nrows = -(-len(images) // ncols)
    cw = max(im.width for im in images)
    ch = max(im.height for im in images)
    out = Image.new("RGB", (ncols * cw + (ncols - 1) * pad, nrows * ch + (nrows - 1) * pad), "white")
    for k, im in enumerate(images):
        r, c = divmod(k, ncols)
        out.paste(im, (c * (cw + pad), r * (ch + pad)))
    return _encode_png(out)


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


def token_html(
    tokens: Sequence[str],
    scores: Any,
    signed: bool = True,
    legend: bool = True,
    clip: Optional[float] = DEFAULT_CLIP,
    gamma: float = DEFAULT_GAMMA,
    explained: str = "the class",
) -> str:
    """Tokens as HTML spans whose background shows their relevance.

    Zero-centred diverging colours (white = 0, red > 0, blue < 0) with the same
    colour limit and gamma as the pictures (:func:`colour_scale`, :func:`colorize`);
    the text colour switches to white on dark backgrounds; each span's tooltip gives
    the exact score; the legend says when scores were clipped. ``signed=False``
    shows ``clamp(min=0)``. ``explained``: what red speaks for in the legend (an LM's map: "the token").

    Parameters
    ----------
    tokens : Sequence[str]
        (T,) the tokens' texts.
    scores : Any
        (T,) one score per token.
    signed : bool, optional
        Keep negative scores; ``False`` shows ``clamp(min=0)``.
    legend : bool, optional
        Add the legend line under the tokens.
    clip : Optional[float], optional
        Percentile of ``|scores|`` for the colour limit (``None``: the maximum).
    gamma : float, optional
        Colour gamma in (0, 1].
    explained : str, optional
        What red speaks for, in the legend.

    Returns
    -------
    str
        An HTML fragment.

    Raises
    ------
    InputError
        If ``tokens`` and ``scores`` differ in length.
    """
    vals = _view(np.nan_to_num(_as_numpy(scores)).reshape(-1), signed)
    if len(tokens) != vals.shape[0]:
        raise InputError(f"token_html: {len(tokens)} tokens but {vals.shape[0]} scores")
    scale = colour_scale(vals, clip)
    m = scale.limit
    colours = colorize(vals, signed=True, limit=m, gamma=gamma)
    spans = []
    for tok, v, rgb in zip(tokens, vals, colours):
        style = (
            f"background-color:rgb({rgb[0]},{rgb[1]},{rgb[2]});color:{_text_colour(rgb)};"
            "padding:1px 4px;margin:1px;border-radius:3px;display:inline-block;"
            "font-family:monospace;border:1px solid #ddd"
        )
        spans.append(
            f'<span class="trl-token" style="{style}" title="{html.escape(str(tok))}: '
            f'{v:.4g}">{html.escape(str(tok))}</span>'
        )
    body = " ".join(spans)
    out = f'<div class="trl-tokens" style="line-height:1.9;max-width:100%">{body}</div>'
    if legend:
        scale_text = (
            f"{_fmt(-m)} (blue, against) \u2026 0 (white) \u2026 {_fmt(m)} (red, for {explained})"
            if signed
            else f"0 (white) \u2026 {_fmt(m)} (red, for {explained}); negatives hidden"
        )
        out += (
            '<div class="trl-legend" style="font-size:85%;color:#444;margin-top:4px">'
            f"colour scale {scale_text}; {html.escape(scale.describe())}</div>"
        )
    return out


def merge_wordpieces(tokens: Sequence[str], scores: Any, reduce: str = "max") -> tuple[list[str], np.ndarray]:
    """Merge BERT ``##`` continuation pieces into words.

    Parameters
    ----------
    tokens : Sequence[str]
        word-pieces, e.g. ``["[CLS]", "un", "##like", "##ly", "[SEP]"]``.
    scores : Any
        one score per piece.
    reduce : str, optional
        ``"max"`` (the word's score is its largest piece score, as in
        the rationale evaluation) or ``"sum"`` (conserves the total).

    Returns
    -------
    tuple[list[str], np.ndarray]
        ``(words, word_scores)``; special tokens stay words of their own.

    Raises
    ------
    InputError
        If ``reduce`` is neither "max" nor "sum", or ``tokens`` and ``scores``
        differ in length.
    """
    if reduce not in ("max", "sum"):
        raise InputError(f'reduce must be "max" or "sum"; got {reduce!r}')
    vals = _as_numpy(scores).reshape(-1)
    if len(tokens) != vals.shape[0]:
        raise InputError(f"merge_wordpieces: {len(tokens)} tokens but {vals.shape[0]} scores")
    words: list[str] = []
    groups: list[list[float]] = []
    for tok, v in zip(tokens, vals):
        tok = str(tok)
        if tok.startswith("##") and words:
            words[-1] += tok[2:]
            groups[-1].append(float(v))
        else:
            words.append(tok)
            groups.append([float(v)])
    agg = np.max if reduce == "max" else np.sum
    return words, np.array([agg(g) for g in groups], dtype=np.float64)


def denormalize(image_tensor: Any, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """Undo ``(x - mean) / std``: (3, H, W) or (1, 3, H, W) -> (H, W, 3) float in [0, 1].

    Parameters
    ----------
    image_tensor : Any
        (3, H, W) or (1, 3, H, W) normalised image (array or tensor).
    mean : Sequence[float]
        (3,) the per-channel mean of the normalisation.
    std : Sequence[float]
        (3,) the per-channel standard deviation.

    Returns
    -------
    np.ndarray
        (H, W, 3) float image clipped to [0, 1].

    Raises
    ------
    InputError
        If the input holds more than one image or is not (3, H, W).
    """
    arr = _as_numpy(image_tensor)
    if arr.ndim == 4:
        if arr.shape[0] != 1:
            raise InputError(f"denormalize takes one image; got a batch of {arr.shape[0]}")
        arr = arr[0]
    if arr.ndim != 3 or arr.shape[0] not in (1, 3):
        raise InputError(f"expected a (3, H, W) image tensor; got shape {tuple(arr.shape)}")
    m = np.asarray(mean, dtype=np.float64).reshape(-1, 1, 1)
    s = np.asarray(std, dtype=np.float64).reshape(-1, 1, 1)
    out = np.moveaxis(arr * s + m, 0, -1)
    if out.shape[-1] == 1:
        out = np.repeat(out, 3, axis=-1)
    return np.clip(out, 0.0, 1.0)

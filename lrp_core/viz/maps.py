"""Relevance pictures with numpy and Pillow: maps upsampled and drawn over a grey photo, PNGs with a legend.

Relevance is signed: red speaks *for* the explained class, blue *against* it, white is zero. Every colour scale
is zero-centred with symmetric limits ``[-m, m]`` (:mod:`.colours`): a robust limit (by default the 99th
percentile of ``|values|``, and every legend says when values were clipped), a gamma of 0.5 that keeps weak
relevance visible, and a light-grey photo under the map, tinted by its colour (a multiply blend with opacity
``alpha``), so that red and blue stand out on any scene and zero leaves the photo as it is.

This is the widgets' drawing path (:func:`overlay`, :func:`render_overlay_png`): a few milliseconds per picture,
no matplotlib. The notebooks' matplotlib figures with colour bars are :mod:`.figures`; token heat maps
:mod:`.text`.
"""

from __future__ import annotations

import functools
import io
from typing import Any, Optional, Sequence, Union

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from ..errors import InputError
from .colours import (
    DEFAULT_CLIP,
    DEFAULT_GAMMA,
    ColourScale,
    _as_numpy,
    _fmt,
    _view,
    colorize,
    colour_scale,
)

__all__ = [
    "upsample_map",
    "to_rgb_uint8",
    "PHOTO_FLOOR",
    "grey_photo",
    "overlay",
    "overlay_image",
    "render_overlay_png",
    "tile_pngs",
    "denormalize",
]


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

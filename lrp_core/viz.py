"""Plotting helpers shared by the widgets and the notebooks.

Relevance is signed: red speaks *for* the explained class, blue *against* it,
white is zero. Every colour scale here is zero-centred with symmetric limits
``[-m, m]``, ``m = max |value|``, so equal magnitudes get equal saturation.

Two kinds of output:

* matplotlib figures (:func:`show_relevance`, :func:`show_methods`) for the
  notebooks, with colourbars;
* a fast numpy + PIL path (:func:`colorize`, :func:`overlay`,
  :func:`render_overlay_png`) that widgets use to redraw in a few
  milliseconds, far quicker than drawing a matplotlib figure.

Text relevance is rendered as HTML (:func:`token_html`), optionally after
merging BERT word-pieces into words (:func:`merge_wordpieces`).
"""
from __future__ import annotations

import functools
import html
import io
from typing import Any, Mapping, Optional, Sequence

import matplotlib.colors as mcolors
import matplotlib.pyplot as plt
import numpy as np
from PIL import Image, ImageDraw, ImageFont

__all__ = [
    "relevance_cmap", "signed_norm", "symmetric_limit", "colorize", "upsample_map",
    "to_rgb_uint8", "overlay", "overlay_image", "render_overlay_png", "tile_pngs", "show_relevance",
    "show_methods", "render_png", "token_html", "merge_wordpieces", "denormalize",
]

#: Diverging colormap used for every relevance picture (blue < 0 < red). Like
#: matplotlib's "bwr", but with an odd number of entries so that zero is exactly white.
relevance_cmap: mcolors.Colormap = mcolors.LinearSegmentedColormap.from_list(
    "trl_relevance", [(0.0, 0.0, 1.0), (1.0, 1.0, 1.0), (1.0, 0.0, 0.0)], N=257)

# 257 entries: index 128 is exactly the colormap's centre (white for zero relevance).
_LUT = (relevance_cmap(np.linspace(0.0, 1.0, 257))[:, :3] * 255).round().astype(np.uint8)


def _as_numpy(values: Any) -> np.ndarray:
    """A float64 numpy copy of a numpy array, torch tensor or sequence."""
    if hasattr(values, "detach"):  # torch tensor
        values = values.detach().float().cpu().numpy()
    return np.asarray(values, dtype=np.float64)


def symmetric_limit(values: Any) -> float:
    """``max |values|`` over finite entries, or 1.0 when all are zero/non-finite."""
    arr = _as_numpy(values)
    finite = arr[np.isfinite(arr)]
    m = float(np.abs(finite).max()) if finite.size else 0.0
    return m if m > 0 else 1.0


def signed_norm(values: Any) -> mcolors.Normalize:
    """Zero-centred normalisation with symmetric limits ``[-m, m]``, ``m = max|values|``."""
    m = symmetric_limit(values)
    return mcolors.Normalize(vmin=-m, vmax=m)


def _view(values: np.ndarray, signed: bool) -> np.ndarray:
    """The signed values, or their positive part ``clamp(min=0)``."""
    return values if signed else np.clip(values, 0.0, None)


def colorize(values: Any, signed: bool = True, limit: Optional[float] = None) -> np.ndarray:
    """Map relevance to RGB with the zero-centred colormap: (..., 3) uint8.

    Args:
        values: any-shaped relevance.
        signed: keep negative values; ``False`` shows ``clamp(min=0)``.
        limit: colour limit ``m`` (default ``max |values|`` of the shown view).
    """
    arr = _view(np.nan_to_num(_as_numpy(values)), signed)
    m = symmetric_limit(arr) if limit is None else float(limit)
    idx = np.clip(np.rint((arr / m + 1.0) * 128.0), 0, 256).astype(np.intp)
    return _LUT[idx]


def upsample_map(relmap: Any, size: tuple[int, int]) -> np.ndarray:
    """Bilinear upsampling of a 2-D map to ``size = (H, W)`` (float32)."""
    arr = np.nan_to_num(_as_numpy(relmap)).astype(np.float32)
    if arr.ndim != 2:
        raise ValueError(f"a relevance map must be 2-D (h, w); got shape {tuple(arr.shape)}")
    h, w = int(size[0]), int(size[1])
    if arr.shape == (h, w):
        return arr
    return np.asarray(Image.fromarray(arr, mode="F").resize((w, h), Image.BILINEAR))


def to_rgb_uint8(image: Any) -> np.ndarray:
    """An RGB image as (H, W, 3) uint8 from float [0, 1] / uint8 / grey / PIL input."""
    if isinstance(image, Image.Image):
        return np.asarray(image.convert("RGB"))
    arr = image.detach().cpu().numpy() if hasattr(image, "detach") else np.asarray(image)
    if arr.ndim == 3 and arr.shape[0] in (1, 3) and arr.shape[-1] not in (1, 3):
        arr = np.moveaxis(arr, 0, -1)  # (C, H, W) -> (H, W, C)
    if arr.ndim == 2:
        arr = arr[..., None]
    if arr.ndim != 3 or arr.shape[-1] not in (1, 3, 4):
        raise ValueError(f"expected an (H, W, 3) RGB image; got shape {tuple(arr.shape)}")
    arr = arr[..., :3]
    if arr.shape[-1] == 1:
        arr = np.repeat(arr, 3, axis=-1)
    if arr.dtype != np.uint8:
        arr = np.clip(np.asarray(arr, dtype=np.float64), 0.0, 1.0) * 255.0
        arr = np.rint(arr).astype(np.uint8)
    return arr


def overlay(image_rgb: Any, relmap: Any, alpha: float = 0.6, signed: bool = True,
            size: Optional[tuple[int, int]] = None) -> np.ndarray:
    """Blend the coloured relevance over the image: (H, W, 3) uint8.

    The map is upsampled bilinearly to the image (or to ``size``). Each pixel's
    opacity is ``alpha * |v| / m``: zero relevance leaves the image untouched,
    the strongest relevance is drawn with opacity ``alpha``.
    """
    if not 0.0 <= float(alpha) <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1]; got {alpha}")
    if image_rgb is None:
        shape = size or _as_numpy(relmap).shape
        base = np.full((int(shape[0]), int(shape[1]), 3), 255, dtype=np.uint8)
        alpha = 1.0
    else:
        base = to_rgb_uint8(image_rgb)
        if size is not None and base.shape[:2] != tuple(size):
            base = np.asarray(Image.fromarray(base).resize((size[1], size[0]), Image.BICUBIC))
    rel = _view(upsample_map(relmap, base.shape[:2]), signed)
    m = symmetric_limit(rel)
    colour = colorize(rel, signed=True, limit=m).astype(np.float32)
    a = (float(alpha) * np.abs(rel) / m)[..., None].astype(np.float32)
    out = base.astype(np.float32) * (1.0 - a) + colour * a
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


@functools.lru_cache(maxsize=8)
def _font(size: int = 12) -> ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, OSError):  # Pillow without FreeType
        return ImageFont.load_default()


def _fmt(v: float) -> str:
    return f"{v:.3g}"


def _legend(width: int, limit: float, signed: bool) -> Image.Image:
    """A colourbar strip with its limits written under it."""
    bar_h, text_h = 10, 16
    img = Image.new("RGB", (width, bar_h + text_h), "white")
    ramp = np.linspace(-limit if signed else 0.0, limit, max(width - 8, 2))
    bar = colorize(ramp[None, :].repeat(bar_h, 0), signed=True, limit=limit)
    img.paste(Image.fromarray(bar), (4, 0))
    draw, font = ImageDraw.Draw(img), _font(11)
    left = _fmt(-limit) if signed else "0"
    draw.text((4, bar_h + 1), left, fill="black", font=font)
    right = _fmt(limit)
    rw = draw.textlength(right, font=font)
    draw.text((width - 4 - rw, bar_h + 1), right, fill="black", font=font)
    if signed:
        draw.text((width / 2 - 3, bar_h + 1), "0", fill="black", font=font)
    return img


def _compose(panel: np.ndarray, limit: float, signed: bool, title: Optional[str]) -> Image.Image:
    """Panel + optional title line above + colourbar below."""
    body = Image.fromarray(panel)
    w = body.width
    parts: list[Image.Image] = []
    if title:
        head = Image.new("RGB", (w, 18), "white")
        draw, font = ImageDraw.Draw(head), _font(12)
        text = title
        while len(text) > 3 and draw.textlength(text, font=font) > w - 6:
            text = text[:-2]
        if text != title:
            text = text[:-1] + "\u2026"
        draw.text((3, 2), text, fill="black", font=font)
        parts.append(head)
    parts += [body, _legend(w, limit, signed)]
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


def render_overlay_png(image_rgb: Any, relmap: Any, alpha: float = 0.6, signed: bool = True,
                       display_size: int = 256, title: Optional[str] = None,
                       legend: bool = True) -> bytes:
    """Fast PNG of :func:`overlay` at ``display_size`` px (longest side), with colourbar.

    This is the widgets' drawing path: numpy colour lookup + PIL, a few ms.
    """
    return _encode_png(overlay_image(image_rgb, relmap, alpha, signed, display_size, title, legend))


def overlay_image(image_rgb: Any, relmap: Any, alpha: float = 0.6, signed: bool = True,
                  display_size: int = 256, title: Optional[str] = None,
                  legend: bool = True) -> Image.Image:
    """The PIL image that :func:`render_overlay_png` encodes."""
    shape = to_rgb_uint8(image_rgb).shape[:2] if image_rgb is not None else _as_numpy(relmap).shape
    scale = display_size / max(shape)
    size = (max(1, round(shape[0] * scale)), max(1, round(shape[1] * scale)))
    panel = overlay(image_rgb, relmap, alpha=alpha, signed=signed, size=size)
    limit = symmetric_limit(_view(upsample_map(relmap, size), signed))
    if not legend:
        return Image.fromarray(panel)
    return _compose(panel, limit, signed, title)


def tile_pngs(images: Sequence[Image.Image], ncols: Optional[int] = None, pad: int = 6) -> bytes:
    """Lay PIL images out in a grid (row-major) and encode it as one PNG."""
    if not images:
        raise ValueError("tile_pngs needs at least one image")
    ncols = ncols or len(images)
    nrows = -(-len(images) // ncols)
    cw = max(im.width for im in images)
    ch = max(im.height for im in images)
    out = Image.new("RGB", (ncols * cw + (ncols - 1) * pad, nrows * ch + (nrows - 1) * pad), "white")
    for k, im in enumerate(images):
        r, c = divmod(k, ncols)
        out.paste(im, (c * (cw + pad), r * (ch + pad)))
    return _encode_png(out)


def show_relevance(image_rgb: Any, relmap: Any, ax: Optional[plt.Axes] = None, alpha: float = 0.6,
                   signed: bool = True, title: Optional[str] = None,
                   colorbar: bool = True) -> plt.Axes:
    """Draw the relevance map over the image on a matplotlib axis.

    The map is upsampled bilinearly to the image; colours are zero-centred
    (symmetric limits) and opacity grows with ``|relevance|`` up to ``alpha``.
    ``image_rgb=None`` draws the map alone. Returns the axis.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(4, 4))
    rel = _as_numpy(relmap)
    if image_rgb is not None:
        base = to_rgb_uint8(image_rgb)
        ax.imshow(base)
        rel = upsample_map(rel, base.shape[:2])
        opacity = None
    else:
        opacity = 1.0
    rel = _view(rel, signed)
    norm = signed_norm(rel)
    if opacity is None:
        opacity = np.clip(alpha * np.abs(rel) / norm.vmax, 0.0, 1.0)
    im = ax.imshow(rel, cmap=relevance_cmap, norm=norm, alpha=opacity, interpolation="nearest")
    if colorbar:
        ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    ax.set_axis_off()
    if title:
        ax.set_title(title)
    return ax


def show_methods(image: Any, maps: Mapping[str, Any], ncols: Optional[int] = None,
                 alpha: float = 0.6, signed: bool = True, panel_size: float = 3.0,
                 colorbar: bool = True) -> plt.Figure:
    """A grid of :func:`show_relevance` panels, one per ``{name: map}``; returns the figure.

    Each panel has its own symmetric colour limits (methods differ in scale).
    """
    if not maps:
        raise ValueError("show_methods needs at least one {name: map} entry")
    n = len(maps)
    ncols = min(ncols or n, n)
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(panel_size * ncols * 1.15, panel_size * nrows),
                             squeeze=False)
    for ax, (name, relmap) in zip(axes.flat, maps.items()):
        show_relevance(image, relmap, ax=ax, alpha=alpha, signed=signed, title=name,
                       colorbar=colorbar)
    for ax in list(axes.flat)[n:]:
        ax.set_axis_off()
    fig.tight_layout()
    return fig


def render_png(fig: plt.Figure, dpi: Optional[float] = None, close: bool = False) -> bytes:
    """Encode a matplotlib figure as PNG bytes (optionally closing it)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    if close:
        plt.close(fig)
    return buf.getvalue()


def _text_colour(rgb: np.ndarray) -> str:
    lum = (0.2126 * rgb[0] + 0.7152 * rgb[1] + 0.0722 * rgb[2]) / 255.0
    return "#ffffff" if lum < 0.5 else "#111111"


def token_html(tokens: Sequence[str], scores: Any, signed: bool = True, legend: bool = True) -> str:
    """Tokens as HTML spans whose background shows their relevance.

    Zero-centred diverging colours (white = 0, red > 0, blue < 0) with symmetric
    limits; the text colour switches to white on dark backgrounds; each span's
    tooltip gives the exact score. ``signed=False`` shows ``clamp(min=0)``.
    """
    vals = _view(np.nan_to_num(_as_numpy(scores)).reshape(-1), signed)
    if len(tokens) != vals.shape[0]:
        raise ValueError(f"token_html: {len(tokens)} tokens but {vals.shape[0]} scores")
    m = symmetric_limit(vals)
    colours = colorize(vals, signed=True, limit=m)
    spans = []
    for tok, v, rgb in zip(tokens, vals, colours):
        style = (f"background-color:rgb({rgb[0]},{rgb[1]},{rgb[2]});color:{_text_colour(rgb)};"
                 "padding:1px 4px;margin:1px;border-radius:3px;display:inline-block;"
                 "font-family:monospace;border:1px solid #ddd")
        spans.append(f'<span class="trl-token" style="{style}" title="{html.escape(str(tok))}: '
                     f'{v:.4g}">{html.escape(str(tok))}</span>')
    body = " ".join(spans)
    out = f'<div class="trl-tokens" style="line-height:1.9;max-width:100%">{body}</div>'
    if legend:
        scale = (f"{_fmt(-m)} (blue, against) \u2026 0 (white) \u2026 {_fmt(m)} (red, for the class)"
                 if signed else f"0 (white) \u2026 {_fmt(m)} (red, for the class); negatives hidden")
        out += ('<div class="trl-legend" style="font-size:85%;color:#444;margin-top:4px">'
                f"colour scale {scale}</div>")
    return out


def merge_wordpieces(tokens: Sequence[str], scores: Any,
                     reduce: str = "max") -> tuple[list[str], np.ndarray]:
    """Merge BERT ``##`` continuation pieces into words.

    Args:
        tokens: word-pieces, e.g. ``["[CLS]", "un", "##like", "##ly", "[SEP]"]``.
        scores: one score per piece.
        reduce: ``"max"`` (the word's score is its largest piece score, as in
            the rationale evaluation) or ``"sum"`` (conserves the total).

    Returns:
        ``(words, word_scores)``; special tokens stay words of their own.
    """
    if reduce not in ("max", "sum"):
        raise ValueError(f'reduce must be "max" or "sum"; got {reduce!r}')
    vals = _as_numpy(scores).reshape(-1)
    if len(tokens) != vals.shape[0]:
        raise ValueError(f"merge_wordpieces: {len(tokens)} tokens but {vals.shape[0]} scores")
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
    """Undo ``(x - mean) / std``: (3, H, W) or (1, 3, H, W) -> (H, W, 3) float in [0, 1]."""
    arr = _as_numpy(image_tensor)
    if arr.ndim == 4:
        if arr.shape[0] != 1:
            raise ValueError(f"denormalize takes one image; got a batch of {arr.shape[0]}")
        arr = arr[0]
    if arr.ndim != 3 or arr.shape[0] not in (1, 3):
        raise ValueError(f"expected a (3, H, W) image tensor; got shape {tuple(arr.shape)}")
    m = np.asarray(mean, dtype=np.float64).reshape(-1, 1, 1)
    s = np.asarray(std, dtype=np.float64).reshape(-1, 1, 1)
    out = np.moveaxis(arr * s + m, 0, -1)
    if out.shape[-1] == 1:
        out = np.repeat(out, 3, axis=-1)
    return np.clip(out, 0.0, 1.0)

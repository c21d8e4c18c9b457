"""Procedural scenes with exact object masks, for the toy ViT and the evaluations.

Every scene is drawn on a coordinate grid with numpy: a cluttered background
(colour gradient, low-frequency noise, small distractor dots and thin lines
that are not class shapes), then one or two objects whose classes differ in
*shape*. Each object gets a random colour, texture, size, tilt (any
orientation for the ellipse) and position. Masks are exact: they mark the
pixels where the object is visible (an object partly hidden by another one
does not own the occluder's pixels).

>>> s = make_scenes(8, seed=0, n_objects=2)
>>> s.images.shape, s.labels.shape, s.masks.shape, s.rgb.shape
(torch.Size([8, 3, 64, 64]), torch.Size([8, 2]), torch.Size([8, 2, 64, 64]), (8, 64, 64, 3))
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..errors import InputError
from .shapes import ROTATES, SHAPES

__all__ = [
    "CLASS_NAMES",
    "IMAGE_SIZE",
    "MEAN",
    "STD",
    "Scenes",
    "make_scenes",
    "normalize",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "DINOV2_SCENE_SIZE",
    "imagenet_normalize",
]

#: Object classes, index = class id. They differ in shape; colour is random.
CLASS_NAMES: tuple[str, ...] = (
    "disc",
    "square",
    "triangle",
    "ring",
    "cross",
    "star",
    "ellipse",
    "heart",
)
#: Side of the square scenes in pixels (the toy ViT's input size).
IMAGE_SIZE = 64
#: Per-channel normalisation constants for the toy ViT (measured on 20,000 scenes).
MEAN: tuple[float, float, float] = (0.5, 0.5, 0.5)
STD: tuple[float, float, float] = (0.25, 0.25, 0.25)
#: The ImageNet normalisation of the DINOv2 models (their preprocessing; ``lrp_core.models.dinov2`` reads it here).
IMAGENET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)
#: Side of the scenes drawn for ``dinov2-scenes`` (8 x 8 patches of 14 px); chosen by measurement, see
#: docs/guide/embedded.md.
DINOV2_SCENE_SIZE = 112

_CHUNK = 128  # images rendered at once (bounds the memory of the grids)
_MIN_VISIBLE = 0.6  # least visible fraction of an occluded object's area
_TEXTURES = ("solid", "stripes", "checks", "noise")


@dataclass
class Scenes:
    """A batch of procedural scenes.

    Attributes:
        images: (n, 3, H, W) float32 tensor, normalised with :data:`MEAN` / :data:`STD`.
        labels: (n, k) int64 tensor of class ids, ``k = n_objects`` (distinct per scene).
        masks: (n, k, H, W) bool tensor, the visible pixels of each object (disjoint).
        rgb: (n, H, W, 3) float32 numpy array in [0, 1], for display.
        colors: (n, k, 3) float32 numpy array, each object's main colour.
        class_names: names of the class ids.
        seed: the seed the scenes were drawn with.
        mean, std: the normalisation constants used for ``images``.
    """

    images: torch.Tensor
    labels: torch.Tensor
    masks: torch.Tensor
    rgb: np.ndarray
    colors: np.ndarray
    class_names: tuple[str, ...] = CLASS_NAMES
    seed: int = 0
    mean: tuple[float, float, float] = MEAN
    std: tuple[float, float, float] = STD

    def __len__(self) -> int:
        return int(self.images.shape[0])

    @property
    def n_objects(self) -> int:
        """Objects per scene (1 or 2)."""
        return int(self.labels.shape[1])

    def label_names(self, i: int) -> list[str]:
        """The class names of the objects in one scene.

        Parameters
        ----------
        i : int
            The scene's index.

        Returns
        -------
        list[str]
            One name per object (k).
        """
        return [self.class_names[int(c)] for c in self.labels[i]]


def normalize(rgb: np.ndarray | torch.Tensor) -> torch.Tensor:
    """Normalise scenes for the toy ViT, channels first.

    Parameters
    ----------
    rgb : np.ndarray | torch.Tensor
        (n, H, W, 3) floats in [0, 1].

    Returns
    -------
    torch.Tensor
        (n, 3, H, W) float32, normalised with :data:`MEAN` / :data:`STD`.
    """
    x = torch.as_tensor(np.asarray(rgb, dtype=np.float32)).permute(0, 3, 1, 2)
    mean = torch.tensor(MEAN, dtype=torch.float32).view(1, 3, 1, 1)
    std = torch.tensor(STD, dtype=torch.float32).view(1, 3, 1, 1)
    return ((x - mean) / std).contiguous()


def imagenet_normalize(rgb: np.ndarray) -> torch.Tensor:
    """Normalise scenes with the ImageNet mean and std, channels first.

    Parameters
    ----------
    rgb : np.ndarray
        (N, H, W, 3) floats in [0, 1] (``Scenes.rgb``).

    Returns
    -------
    torch.Tensor
        (N, 3, H, W), ImageNet-normalised.
    """
    x = torch.as_tensor(np.asarray(rgb, dtype=np.float32)).permute(0, 3, 1, 2)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return ((x - mean) / std).contiguous()


# ---------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------


def _interp_matrix(src: int, dst: int) -> np.ndarray:
    """(dst, src) matrix of linear interpolation weights (upsampling a 1-d signal)."""
    pos = np.linspace(0, src - 1, dst)
    lo = np.clip(np.floor(pos).astype(int), 0, src - 2)
    w = pos - lo
    m = np.zeros((dst, src), dtype=np.float32)
    m[np.arange(dst), lo] = 1 - w
    m[np.arange(dst), lo + 1] = w
    return m


_LUMA = np.array([0.299, 0.587, 0.114])


def _random_colors(
    rng: np.random.Generator, avoid: list[np.ndarray], min_dist: float, n: int, min_luma: float = 0.0
) -> np.ndarray:
    """(n, 3) colours in [0, 1] at least ``min_dist`` (Euclidean) from every row of ``avoid``
    and, if ``min_luma > 0``, differing by at least ``min_luma`` in luminance from ``avoid[0]``."""

    def bad_rows(col: np.ndarray) -> np.ndarray:
        bad = np.zeros(len(col), dtype=bool)
        for a in avoid:
            bad |= np.linalg.norm(col - a, axis=1) < min_dist
        if min_luma > 0:
            bad |= np.abs((col - avoid[0]) @ _LUMA) < min_luma
        return bad

    col = rng.uniform(0.0, 1.0, (n, 3))
    for _ in range(60):
        bad = bad_rows(col)
        if not bad.any():
            break
        col[bad] = rng.uniform(0.0, 1.0, (int(bad.sum()), 3))
    else:  # rare: black or white, whichever is farther from the background
        bad = bad_rows(col)
        col[bad] = np.where((avoid[0][bad] @ _LUMA > 0.5)[:, None], 0.05, 0.95)
    return col


def _background(rng: np.random.Generator, n: int, size: int, clutter: bool) -> tuple[np.ndarray, np.ndarray]:
    """(n, H, W, 3) background and its (n, 3) base colour."""
    base = rng.uniform(0.1, 0.9, (n, 3))
    img = np.broadcast_to(base[:, None, None, :], (n, size, size, 3)).astype(np.float32)
    if not clutter:
        return img.copy(), base
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / (size - 1) - 0.5
    ang = rng.uniform(0, 2 * np.pi, n)
    amp = rng.uniform(0.0, 0.35, (n, 3))
    ramp = np.cos(ang)[:, None, None] * xx + np.sin(ang)[:, None, None] * yy  # (n, H, W)
    img = img + ramp[..., None] * amp[:, None, None, :]
    # low-frequency colour noise: a random 5x5 grid upsampled bilinearly
    m = _interp_matrix(5, size)
    grid = rng.normal(0.0, 0.08, (n, 3, 5, 5)).astype(np.float32)
    img = img + np.matmul(np.matmul(m, grid), m.T).transpose(0, 2, 3, 1)  # (n, H, W, 3)
    # distractors: small dots (radius <= 2.4 px) and thin lines (width ~1.6 px)
    k = 6
    kind = rng.integers(0, 2, (n, k))
    active = rng.uniform(size=(n, k)) < 0.6
    cx, cy = rng.uniform(2, size - 2, (2, n, k)).astype(np.float32)
    rad = rng.uniform(1.0, 2.4, (n, k)).astype(np.float32)
    length = rng.uniform(6, 18, (n, k)).astype(np.float32)
    theta = rng.uniform(0, np.pi, (n, k)).astype(np.float32)
    colors = rng.uniform(0, 1, (n, k, 3)).astype(np.float32)
    # each distractor is drawn in a 20 x 20 window around its centre (indices clipped
    # to the frame: a repeated edge index gets the same value twice)
    win = np.arange(-10, 10)
    rows = np.arange(n)[:, None, None]
    for j in range(k):
        ix = np.clip(np.round(cx[:, j]).astype(int)[:, None] + win, 0, size - 1)  # (n, 20)
        iy = np.clip(np.round(cy[:, j]).astype(int)[:, None] + win, 0, size - 1)
        dx = ix[:, None, :].astype(np.float32) - cx[:, j, None, None]  # (n, 1, 20)
        dy = iy[:, :, None].astype(np.float32) - cy[:, j, None, None]  # (n, 20, 1)
        # distance to a segment centred at (cx, cy) along theta
        c, s = np.cos(theta[:, j])[:, None, None], np.sin(theta[:, j])[:, None, None]
        along = dx * c + dy * s
        across = -dx * s + dy * c
        half = (length[:, j] / 2)[:, None, None]
        excess = np.maximum(np.abs(along) - half, 0.0)
        line = excess**2 + across**2 <= 0.8**2
        dot = dx**2 + dy**2 <= rad[:, j, None, None] ** 2
        hit = np.where((kind[:, j] == 0)[:, None, None], dot, line) & active[:, j, None, None]
        yy_, xx_ = iy[:, :, None], ix[:, None, :]
        patch = img[rows, yy_, xx_]  # (n, 20, 20, 3)
        img[rows, yy_, xx_] = np.where(hit[..., None], colors[:, j, None, None, :], patch)
    return img, base


def _object_layer(
    rng: np.random.Generator,
    classes: np.ndarray,
    cx: np.ndarray,
    cy: np.ndarray,
    radius: np.ndarray,
    size: int,
    textures: bool,
    color: np.ndarray,
    base: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Render one object per image.

    Args:
        classes: (n,) class ids; cx, cy, radius: (n,) centre and radius in pixels;
        color: (n, 3) main colour; base: (n, 3) background colour.

    Returns:
        mask (n, H, W) bool of the full object and its texture (n, H, W, 3) float32.
    """
    n: int = classes.shape[0]  # an int, not the stubs' Any: rng.uniform(.., n) then types as an array
    theta = np.where(ROTATES[classes], rng.uniform(0, 2 * np.pi, n), rng.uniform(-0.35, 0.35, n))
    X = np.arange(size, dtype=np.float32) + 0.5
    cx, cy, radius = (a.astype(np.float32) for a in (cx, cy, radius))
    dx = (X[None, None, :] - cx[:, None, None]) / radius[:, None, None]
    dy = (X[None, :, None] - cy[:, None, None]) / radius[:, None, None]
    theta = theta.astype(np.float32)
    c, s = np.cos(theta)[:, None, None], np.sin(theta)[:, None, None]
    u = dx * c + dy * s
    v = -dx * s + dy * c
    mask = np.zeros((n, size, size), dtype=bool)
    for k, fn in enumerate(SHAPES):
        idx = np.nonzero(classes == k)[0]
        if idx.size:
            mask[idx] = fn(u[idx], v[idx])

    tex = np.empty((n, size, size, 3), dtype=np.float32)
    tex[...] = color[:, None, None, :]
    if not textures:
        return mask, tex
    kind = rng.integers(0, len(_TEXTURES), n)
    away = np.sign((color - base) @ _LUMA)[:, None]  # lighter objects get a lighter texture
    second = np.clip(color + 0.3 * away, 0, 1).astype(np.float32)  # same hue, more contrast
    second = np.where(
        np.abs(second - color).sum(1, keepdims=True) < 0.3, np.clip(color - 0.3 * away, 0, 1), second
    ).astype(np.float32)
    period = rng.uniform(3.0, 7.0, n).astype(np.float32)[:, None, None]
    phase = rng.uniform(0, 2 * np.pi, n).astype(np.float32)[:, None, None]
    ang = rng.uniform(0, np.pi, n).astype(np.float32)[:, None, None]
    gx = X[None, None, :] - cx[:, None, None]  # (n, 1, W)
    gy = X[None, :, None] - cy[:, None, None]  # (n, H, 1)
    alt = np.zeros((n, size, size), dtype=bool)  # pixels in the second colour
    i = np.nonzero(kind == 1)[0]  # stripes
    if i.size:
        alt[i] = np.sin(2 * np.pi * (gx[i] * np.cos(ang[i]) + gy[i] * np.sin(ang[i])) / period[i] + phase[i]) > 0
    i = np.nonzero(kind == 2)[0]  # checks
    if i.size:
        p = period[i] / 1.2
        alt[i] = (np.floor(gx[i] / p) + np.floor(gy[i] / p)) % 2 == 0
    np.copyto(tex, second[:, None, None, :], where=alt[..., None])
    noisy = kind == 3
    if noisy.any():
        tex[noisy] += 0.12 * rng.standard_normal((int(noisy.sum()), size, size, 3), dtype=np.float32)
    return mask, tex


def _palette_colors(rng: np.random.Generator, palette: np.ndarray, base: np.ndarray, n_objects: int) -> np.ndarray:
    """(n, k, 3) colours taken from the rows of ``palette`` (m, 3), distinct within a scene.

    Each object's colour is drawn uniformly among the palette colours not yet used in its scene that are at
    least 0.45 (Euclidean) from the background's ``base`` (n, 3) and differ from it by at least 0.2 in
    luminance; where none is left, the unused colour farthest from the background is taken.
    """
    n = base.shape[0]
    far = np.linalg.norm(palette[None] - base[:, None], axis=2)  # (n, m)
    ok = (far >= 0.45) & (np.abs((palette[None] - base[:, None]) @ _LUMA) >= 0.2)
    used = np.zeros(far.shape, dtype=bool)
    out = np.zeros((n, n_objects, 3))
    for j in range(n_objects):
        key = np.where(ok, 2.0 + rng.uniform(size=far.shape), far)  # allowed ones first, in random order
        key[used] = -np.inf
        pick = key.argmax(1)
        used[np.arange(n), pick] = True
        out[:, j] = palette[pick]
    return out


def _classes_sizes_colours(
    rng: np.random.Generator,
    n: int,
    n_objects: int,
    size: int,
    base: np.ndarray,
    palette: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Class ids (n, k), radii in pixels (n, k) and colours (n, k, 3) of the objects, k = ``n_objects``.

    Colours keep away from the background's ``base`` colour (n, 3) and from each other; with a ``palette``
    (m, 3) they are rows of it (:func:`_palette_colors`).
    """
    n_cls = len(CLASS_NAMES)
    if n_objects == 1:
        labels = rng.integers(0, n_cls, (n, 1))
        r_lo, r_hi = 10.0, 18.0
    else:
        first = rng.integers(0, n_cls, n)
        second = (first + rng.integers(1, n_cls, n)) % n_cls  # always a different class
        labels = np.stack([first, second], axis=1)
        r_lo, r_hi = 8.5, 13.0
    radius = rng.uniform(r_lo, r_hi, (n, n_objects)) * (size / IMAGE_SIZE)
    if palette is not None:
        return labels, radius, _palette_colors(rng, palette, base, n_objects).astype(np.float32)
    colors = np.zeros((n, n_objects, 3))
    for j in range(n_objects):
        avoid = [base] + [colors[:, i] for i in range(j)]
        colors[:, j] = _random_colors(rng, avoid, 0.45 if j == 0 else 0.35, n, min_luma=0.3)
    return labels, radius, colors.astype(np.float32)


def _keep_apart(
    rng: np.random.Generator,
    cx: np.ndarray,
    cy: np.ndarray,
    radius: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    pending: np.ndarray,
) -> None:
    """Redraw the second object's centre (``cx``, ``cy`` (n, 2), in place) until the two are apart enough."""
    far = np.hypot(cx[pending, 0] - cx[pending, 1], cy[pending, 0] - cy[pending, 1])
    close = far < 0.75 * radius[pending].sum(1)
    while close.any():
        p = pending[close]
        cx[p, 1] = rng.uniform(lo[p, 1], hi[p, 1])
        cy[p, 1] = rng.uniform(lo[p, 1], hi[p, 1])
        far = np.hypot(cx[pending, 0] - cx[pending, 1], cy[pending, 0] - cy[pending, 1])
        close = far < 0.75 * radius[pending].sum(1)


def _occlude(masks: np.ndarray, order: np.ndarray, pending: np.ndarray) -> np.ndarray:
    """The object on top (index ``order``) hides the other one: ``masks`` (n, 2, H, W) cut in place.

    Returns (len(pending),) bool: True where too little of the hidden object stays visible.
    """
    top = order[pending]
    full = masks[pending]  # (p, 2, H, W)
    top_mask = full[np.arange(len(pending)), top]
    under = 1 - top
    under_full = full[np.arange(len(pending)), under]
    visible = under_full & ~top_mask
    frac = visible.sum((1, 2)) / np.maximum(under_full.sum((1, 2)), 1)
    masks[pending, under] = visible
    return frac < _MIN_VISIBLE


def _place_objects(
    rng: np.random.Generator,
    labels: np.ndarray,
    radius: np.ndarray,
    colors: np.ndarray,
    base: np.ndarray,
    size: int,
    textures: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Place and draw the objects: visible masks and whole shapes (n, k, H, W), pictures (n, k, H, W, 3).

    The object stays inside the frame; two objects overlap only a little (redrawn until they do).
    """
    n: int
    n_objects: int
    n, n_objects = labels.shape  # ints, not the stubs' Any: rng.integers(.., n) then types as an array
    lo, hi = radius, size - radius
    cx = rng.uniform(lo, hi)
    cy = rng.uniform(lo, hi)
    order = rng.integers(0, 2, n) if n_objects == 2 else np.zeros(n, dtype=int)
    pending = np.arange(n)
    masks = np.zeros((n, n_objects, size, size), dtype=bool)
    whole = np.zeros((n, n_objects, size, size), dtype=bool)  # shapes before occlusion
    layers = np.zeros((n, n_objects, size, size, 3), dtype=np.float32)
    for _attempt in range(100):
        if n_objects == 2:
            _keep_apart(rng, cx, cy, radius, lo, hi, pending)
        for j in range(n_objects):
            m, t = _object_layer(
                rng,
                labels[pending, j],
                cx[pending, j],
                cy[pending, j],
                radius[pending, j],
                size,
                textures,
                colors[pending, j],
                base[pending],
            )
            masks[pending, j] = m
            whole[pending, j] = m
            layers[pending, j] = t
        if n_objects == 1:
            break
        bad = _occlude(masks, order, pending)
        if not bad.any():
            break
        pending = pending[bad]
        cx[pending, 1] = rng.uniform(lo[pending, 1], hi[pending, 1])
        cy[pending, 1] = rng.uniform(lo[pending, 1], hi[pending, 1])
    else:  # pragma: no cover - the distance rule makes this practically impossible
        raise RuntimeError("could not place two objects with limited overlap")
    return masks, whole, layers


def _render_chunk(
    rng: np.random.Generator,
    n: int,
    n_objects: int,
    size: int,
    textures: bool,
    clutter: bool,
    drop: int | None = None,
    palette: np.ndarray | None = None,
) -> tuple[np.ndarray, ...]:
    """Render ``n`` scenes: rgb (n,H,W,3), labels (n,k), masks (n,k,H,W), colours (n,k,3).

    ``drop`` (an object index) leaves that object out of the picture while
    drawing exactly the same random numbers, so everything else is identical:
    its mask is empty and the other object is drawn (and masked) whole.
    """
    img, base = _background(rng, n, size, clutter)
    labels, radius, colors = _classes_sizes_colours(rng, n, n_objects, size, base, palette)
    masks, whole, layers = _place_objects(rng, labels, radius, colors, base, size, textures)
    if drop is not None:  # nothing hides the remaining object any more
        masks = whole
        masks[:, drop] = False
    for j in range(n_objects):
        np.copyto(img, layers[:, j], where=masks[:, j, :, :, None])
    if clutter:
        img += 0.02 * rng.standard_normal(img.shape, dtype=np.float32)
    np.clip(img, 0.0, 1.0, out=img)
    return img.astype(np.float32), labels.astype(np.int64), masks, colors


def make_scenes(
    n: int,
    seed: int = 0,
    n_objects: int = 1,
    *,
    size: int = IMAGE_SIZE,
    textures: bool = True,
    clutter: bool = True,
    drop: int | None = None,
    palette: np.ndarray | None = None,
) -> Scenes:
    """Draw ``n`` procedural scenes, deterministically for a given ``seed``.

    Parameters
    ----------
    n : int
        Number of scenes (at least 1).
    seed : int, optional
        Seed of the numpy generator: one seed, identical arrays.
    n_objects : int, optional
        Objects per scene, 1 or 2; the two objects of a scene always have different classes.
    size : int, optional
        Side in pixels (at least 32; the toy ViT expects :data:`IMAGE_SIZE`).
    textures : bool, optional
        Give the objects stripes, checks or noise; ``False``: solid colours.
    clutter : bool, optional
        A cluttered background (gradient, noise, distractors, pixel noise). ``False`` gives a flat background
        and pixels without noise, so that with ``textures=False`` every masked pixel is exactly the object's
        colour.
    drop : int | None, optional
        ``None``, or the index j < ``n_objects`` of an object to leave out: the same scenes (seed, background,
        noise and other object alike) drawn without object j, the counterfactual of the deletion check.
        Pixels outside the original ``masks[:, j]`` are identical; inside it the background (or the part of
        the other object that j covered) appears. ``labels`` are those of the full scenes, ``masks[:, j]`` is
        empty and the other object's mask is its whole shape.
    palette : np.ndarray | None, optional
        ``None`` (random colours), or (m, 3) colours in [0, 1], m >= ``n_objects``: each object's main colour is
        then exactly one of these rows, distinct within a scene and chosen to stand out from the background
        (the named colours of :func:`lrp_core.data.make_vqa`). Without a palette the scenes are unchanged.

    Returns
    -------
    Scenes
        ``images`` (n, 3, size, size), ``labels`` (n, k), ``masks`` (n, k, size, size), ``rgb``
        (n, size, size, 3) and ``colors`` (n, k, 3), with k = ``n_objects``.

    Raises
    ------
    InputError
        If ``n``, ``n_objects``, ``size`` or ``drop`` is out of range.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise InputError(f"n must be a positive integer, got {n!r}")
    if n_objects not in (1, 2):
        raise InputError(f"n_objects must be 1 or 2, got {n_objects!r}")
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 32:
        raise InputError(f"size must be an integer >= 32, got {size!r}")
    if drop is not None and (isinstance(drop, bool) or drop not in range(n_objects)):
        raise InputError(f"drop must be None or an object index below {n_objects}, got {drop!r}")
    if palette is not None:
        palette = np.asarray(palette, dtype=np.float64)
        if (
            palette.ndim != 2
            or palette.shape[1] != 3
            or len(palette) < n_objects
            or not (np.isfinite(palette).all() and palette.min() >= 0 and palette.max() <= 1)
        ):
            raise InputError(
                f"palette must be None or an (m, 3) array of colours in [0, 1] with m >= n_objects "
                f"= {n_objects}, got shape {np.shape(palette)}"
            )
    rng = np.random.default_rng(seed)
    parts = [
        _render_chunk(rng, min(_CHUNK, n - i), n_objects, int(size), textures, clutter, drop, palette)
        for i in range(0, int(n), _CHUNK)
    ]
    rgb, labels, masks, colors = (np.concatenate(p, axis=0) for p in zip(*parts))
    return Scenes(
        images=normalize(rgb),
        labels=torch.from_numpy(labels),
        masks=torch.from_numpy(masks),
        rgb=rgb,
        colors=colors,
        seed=seed if isinstance(seed, int) else 0,
    )


def benchmark(n: int = 4096, seed: int = 0) -> dict[str, float]:
    """Scenes per second of wall time and per second of CPU time (robust to a busy machine).

    ``python -m lrp_core.data.scenes`` prints them.
    """
    import time

    out = {}
    for k in (1, 2):
        make_scenes(64, seed, k)  # warm-up
        t, c = time.perf_counter(), time.process_time()
        make_scenes(n, seed, k)
        out[f"{k}_object_images_per_s"] = n / (time.perf_counter() - t)
        out[f"{k}_object_images_per_cpu_s"] = n / (time.process_time() - c)
    return out


if __name__ == "__main__":  # pragma: no cover
    for key, val in benchmark().items():
        print(f"{key}: {val:,.0f}")

"""The scenes' object shapes: boolean functions of an object's own coordinates ``(u, v)``, in units of its
radius (every shape fits in the unit disc), one per class of :data:`lrp_core.data.scenes.CLASS_NAMES`."""

from __future__ import annotations

from typing import Callable

import numpy as np

__all__ = ["SHAPES", "ROTATES"]


def _disc(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    return u * u + v * v <= 1.0


def _square(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    return np.maximum(np.abs(u), np.abs(v)) <= 0.7


def _triangle(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    # equilateral, circumradius 1 (inradius 0.5): three half-planes
    out = v <= 0.5
    for a in (np.pi / 6, 5 * np.pi / 6):
        out &= -(u * np.cos(a) + v * np.sin(a)) <= 0.5
    return out


def _ring(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    r2 = u * u + v * v
    return (r2 <= 1.0) & (r2 >= 0.55**2)


def _cross(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    au, av = np.abs(u), np.abs(v)
    return ((au <= 0.28) & (av <= 0.95)) | ((av <= 0.28) & (au <= 0.95))


def _star(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    # five points: the radius goes linearly from 1 at a point to 0.4 between points
    phi = np.arctan2(v, u)
    t = np.mod(5.0 * phi / (2 * np.pi) + 0.25, 1.0)
    tri = np.abs(2.0 * t - 1.0)
    return np.sqrt(u * u + v * v) <= 0.4 + 0.6 * tri


def _ellipse(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    return u * u + (v / 0.38) ** 2 <= 1.0


def _heart(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    x = 1.15 * u
    y = -1.15 * v + 0.15  # image rows grow downwards: lobes on top
    return (x * x + y * y - 1.0) ** 3 - x * x * y**3 <= 0.0


#: one function per class of :data:`~lrp_core.data.scenes.CLASS_NAMES`, in its order
SHAPES: tuple[Callable[[np.ndarray, np.ndarray], np.ndarray], ...] = (
    _disc,
    _square,
    _triangle,
    _ring,
    _cross,
    _star,
    _ellipse,
    _heart,
)
#: which shapes take any orientation (the ellipse); the others are tilted by at most 20 degrees
ROTATES = np.array([0, 0, 0, 0, 0, 0, 1, 0], dtype=bool)

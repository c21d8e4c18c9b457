"""The reference row of an image evaluation: seeded uniform random patch maps, drawn once per set."""

from __future__ import annotations

import math
from typing import Optional, TypeGuard

import torch
from torch import Tensor

from .. import metrics as M
from ..data.sets import ImageSet

Span = tuple[int, int]
"""Rows ``[start, end)`` of a set."""

__all__ = ["MapPair", "RandomDraws", "Span", "has_pairs", "random_maps"]

MapPair = tuple[Tensor, Tensor]
"""Maps (N2, H, W) of a two-object set for its first and its second class."""


def has_pairs(two: Optional[ImageSet]) -> TypeGuard[ImageSet]:
    return two is not None and two.labels is not None and two.labels.shape[1] == 2


@torch.no_grad()
def random_maps(
    one: ImageSet,
    two: Optional[ImageSet],
    cache: dict[str, Tensor],
    with_target: bool,
    seed: int = 0,
) -> tuple[dict[str, Tensor], Optional[MapPair]]:
    """Seeded uniform random patch maps for whole sets (the reference row ``random``).

    The patch grid is read from the methods' token scores (N, T) in ``cache`` (a square grid); without any,
    the maps are random per pixel. A random map knows no class, so one draw serves the predicted and the
    true class, and both classes of a two-object scene.

    Parameters
    ----------
    one : ImageSet
        The one-object set.
    two : Optional[ImageSet]
        The two-object set, or ``None``.
    cache : dict[str, Tensor]
        The methods' token scores (N, T), by method (only their shape is read).
    with_target : bool
        Also give the maps for the true class.
    seed : int, optional
        Seed of the draw.

    Returns
    -------
    tuple[dict[str, Tensor], Optional[MapPair]]
        ``{"predicted": (N, H, W)}`` (plus ``"target"``, the same maps, with ``with_target``) and the pair of the
        two-object set (one (N2, H, W) draw, twice), or ``None`` without that set.
    """
    n_two = len(two) if has_pairs(two) else 0
    draws = RandomDraws(len(one), n_two, seed)
    return draws.maps(
        cache, (one.images.shape[-2], one.images.shape[-1]), (0, len(one)), (0, n_two) if n_two else None, with_target
    )


class RandomDraws:
    """The random maps of the reference row, drawn once for the whole run and cut into blocks.

    One generator (``seed``) draws the (N, *grid) maps of the one-object set,
    then the (N2, *grid) maps of the two-object set, so a block gets the same
    rows whatever the blocks and processes are.
    """

    def __init__(self, n_one: int, n_two: int, seed: int = 0) -> None:
        self.n_one, self.n_two, self.seed = n_one, n_two, seed
        self._one: Optional[Tensor] = None
        self._two: Optional[Tensor] = None

    def _draw(self, cache: dict[str, Tensor], size: tuple[int, int]) -> None:
        g = torch.Generator().manual_seed(self.seed)
        t = next(iter(cache.values())).shape[1] if cache else 0
        side = int(round(math.sqrt(t))) if t else 0
        grid = (side, side) if side * side == t and t else size
        self._one = torch.rand(self.n_one, *grid, generator=g)
        self._two = torch.rand(self.n_two, *grid, generator=g) if self.n_two else None

    def maps(
        self,
        cache: dict[str, Tensor],
        size: tuple[int, int],
        one: Span,
        two: Optional[Span],
        with_target: bool,
    ) -> tuple[dict[str, Tensor], Optional[MapPair]]:
        """The maps at ``size`` of the one-object rows ``one`` and the two-object rows ``two``.

        Parameters
        ----------
        cache : dict[str, Tensor]
            The methods' token scores (N, T), which give the patch grid on the first call.
        size : tuple[int, int]
            (H, W) of the maps.
        one : Span
            ``(start, stop)`` of the one-object rows.
        two : Optional[Span]
            ``(start, stop)`` of the two-object rows, or ``None``.
        with_target : bool
            Also give the maps for the true class.

        Returns
        -------
        tuple[dict[str, Tensor], Optional[MapPair]]
            As :func:`random_maps`, for those rows.
        """
        if self._one is None:
            self._draw(cache, size)
        assert self._one is not None
        variants = {"predicted": M.upsample_maps(self._one[one[0] : one[1]], size)}
        if with_target:
            variants["target"] = variants["predicted"]
        pair = None
        if two is not None and self._two is not None:
            m = M.upsample_maps(self._two[two[0] : two[1]], size)
            pair = (m, m)
        return variants, pair

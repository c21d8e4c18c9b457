"""Input conversion and map resizing shared by the metric modules."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import InputError
from ..runtime.utils import minmax_rows


def _as_tensor(x: Any, name: str, dtype: torch.dtype = torch.float32) -> Tensor:
    if isinstance(x, Tensor):
        return x.detach().to("cpu", dtype)
    try:
        return torch.as_tensor(np.asarray(x), dtype=dtype)
    except (TypeError, ValueError) as err:
        raise InputError(f"{name} must be a tensor or array, got {type(x).__name__}") from err


def upsample_maps(maps: Tensor, size: tuple[int, int]) -> Tensor:
    """Bilinearly resize maps (B, h, w) to (B, *size) (``align_corners=False``)."""
    maps = _as_tensor(maps, "maps")
    if maps.dim() != 3:
        raise InputError(f"maps must be (B, h, w), got shape {tuple(maps.shape)}")
    if tuple(maps.shape[-2:]) == tuple(size):
        return maps
    return F.interpolate(maps.unsqueeze(1), size=tuple(size), mode="bilinear", align_corners=False).squeeze(1)


def minmax_normalise(maps: Tensor) -> Tensor:
    """Scale each map (B, ...) to [0, 1]; a constant map becomes all zeros."""
    return minmax_rows(maps.reshape(maps.shape[0], -1)).reshape(maps.shape)


__all__ = ["upsample_maps", "minmax_normalise"]

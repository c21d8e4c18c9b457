"""Tensor utilities of the replay: the rotary embedding, shared key/value heads, one query row per sample.

Shapes: B batch, H heads, Hkv key/value heads, N tokens, d head width."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


def rotate_half(x: Tensor) -> Tensor:
    """(…, d) -> (…, d): ``cat(-x₂, x₁)`` with x₁, x₂ the two halves — the rotary embedding's 90° turn.

    Parameters
    ----------
    x : Tensor
        (..., d) the tensor to turn, d even.

    Returns
    -------
    Tensor
        (..., d) ``cat(-x₂, x₁)``.
    """
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """``x·cos + rotate_half(x)·sin`` on the first ``cos.shape[-1]`` channels of x (B, H, N, d); the rest pass.

    ``cos``, ``sin``: (B, N, r), r ≤ d (partial rotary when r < d). Hugging Face's arithmetic, in its order.

    Parameters
    ----------
    x : Tensor
        (B, H, N, d) queries or keys.
    cos : Tensor
        (B, N, r) the rotary cosines, r ≤ d.
    sin : Tensor
        (B, N, r) the rotary sines.

    Returns
    -------
    Tensor
        (B, H, N, d) the rotated tensor.
    """
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    r = cos.shape[-1]
    if r == x.shape[-1]:
        return (x * cos) + (rotate_half(x) * sin)
    rot, rest = x[..., :r], x[..., r:]
    return torch.cat(((rot * cos) + (rotate_half(rot) * sin), rest), dim=-1)


def take_rows(x: Tensor, rows: Tensor, dim: int) -> Tensor:
    """Row ``rows[b]`` of each sample's axis ``dim`` of x, kept as an axis of length 1 (a gather: its gradient is
    scattered back, 0 at every other row).

    Parameters
    ----------
    x : Tensor
        ``(B, …)`` with the rows on axis ``dim``.
    rows : Tensor
        ``(B,)`` long, one row per sample.
    dim : int
        The axis of the rows (≥ 1).

    Returns
    -------
    Tensor
        x's shape with axis ``dim`` of length 1.
    """
    shape = [x.shape[0]] + [1] * (x.dim() - 1)
    index = rows.to(x.device).view(shape).expand(*x.shape[:dim], 1, *x.shape[dim + 1 :])
    return x.gather(dim, index)


def query_row_bias(bias: Optional[Tensor], rows: Tensor, N: int, causal: bool, like: Tensor) -> Optional[Tensor]:
    """The additive attention mask of one query row per sample, ``rows`` (B,).

    Parameters
    ----------
    bias : Tensor or None
        The mask of every row: ``(B, 1, N, N)`` (its rows are taken), ``(B, 1, 1, N)`` (kept as it is), or ``None``.
    rows : Tensor
        ``(B,)`` long, the query row of each sample.
    N : int
        The number of keys.
    causal : bool
        Whether the attention is causal: without ``bias``, row ``rows[b]`` then sees the keys j ≤ rows[b].
    like : Tensor
        A tensor of the scores' dtype and device.

    Returns
    -------
    Tensor or None
        ``(B, 1, 1, N)``, 0 where allowed and the dtype's minimum elsewhere, or ``None`` where no key is masked
        (no bias and not causal, or every row is the last, which sees every key).
    """
    if bias is not None:
        return bias if bias.shape[-2] == 1 else take_rows(bias, rows, 2)
    if not causal or bool((rows == N - 1).all()):
        return None
    allowed = torch.arange(N, device=like.device)[None, :] <= rows.to(like.device)[:, None]  # (B, N)
    zero = torch.zeros((), dtype=like.dtype, device=like.device)
    return torch.where(allowed, zero, torch.finfo(like.dtype).min)[:, None, None, :]


def repeat_kv(x: Tensor, groups: int) -> Tensor:
    """(B, Hkv, N, d) -> (B, Hkv·groups, N, d): each key/value head used by ``groups`` consecutive query heads.

    Parameters
    ----------
    x : Tensor
        (B, Hkv, N, d) key or value heads.
    groups : int
        Number of query heads sharing each key/value head.

    Returns
    -------
    Tensor
        (B, Hkv·groups, N, d); ``x`` itself when ``groups == 1``.
    """
    if groups == 1:
        return x
    B, Hkv, N, d = x.shape
    return x[:, :, None].expand(B, Hkv, groups, N, d).reshape(B, Hkv * groups, N, d)


__all__ = ["rotate_half", "apply_rotary", "repeat_kv", "take_rows", "query_row_bias"]

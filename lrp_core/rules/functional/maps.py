"""Rules of fixed linear maps: zᴮ on the patch convolution (pixels), the transpose of the rotary embedding."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..tensors import rotate_half
from .basics import EPS


def zbox_conv2d(
    x: Tensor,
    weight: Tensor,
    R: Tensor,
    stride: int | tuple[int, int],
    padding: int | tuple[int, int] = 0,
    low: Tensor | None = None,
    high: Tensor | None = None,
) -> Tensor:
    """zᴮ rule for a convolution on a bounded input (pixels).

    Bounds default to the per-sample min and max of ``x`` over (C, H, W).
    ``z = conv(x, W) − conv(l, W⁺) − conv(h, W⁻) + 1e-9``, ``s = R / z``,
    ``R_x = x ⊙ convᵀ(s, W) − l ⊙ convᵀ(s, W⁺) − h ⊙ convᵀ(s, W⁻)``.

    Parameters
    ----------
    x : Tensor
        (B, C, H, W) input.
    weight : Tensor
        (D, C, k, k) the convolution's weight.
    R : Tensor
        (B, D, h, w) relevance of the convolution's output.
    stride : int | tuple[int, int]
        The convolution's stride.
    padding : int | tuple[int, int], optional
        The convolution's padding.
    low : Tensor | None, optional
        (B, C, H, W) or broadcastable lower bound ``l`` of the input; per-sample
        minimum of ``x`` when ``None``.
    high : Tensor | None, optional
        (B, C, H, W) or broadcastable upper bound ``h`` of the input; per-sample
        maximum of ``x`` when ``None``.

    Returns
    -------
    Tensor
        (B, C, H, W) pixel relevance.
    """
    B = x.shape[0]
    if low is None:
        low = x.reshape(B, -1).min(dim=1).values.reshape(B, 1, 1, 1)
    if high is None:
        high = x.reshape(B, -1).max(dim=1).values.reshape(B, 1, 1, 1)
    low, high = low.expand_as(x), high.expand_as(x)
    wp, wn = weight.clamp(min=0), weight.clamp(max=0)
    conv = lambda inp, w: F.conv2d(inp, w, stride=stride, padding=padding)  # noqa: E731
    z = conv(x, weight) - conv(low, wp) - conv(high, wn) + EPS
    s = R / z
    # the transposed convolution must restore the input size exactly
    out_pad = _transpose_output_padding(x.shape[-2:], s.shape[-2:], weight.shape[-2:], stride, padding)
    back = lambda w: F.conv_transpose2d(s, w, stride=stride, padding=padding, output_padding=out_pad)  # noqa: E731
    return x * back(weight) - low * back(wp) - high * back(wn)


def _pair(v: int | tuple[int, int]) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _transpose_output_padding(in_hw, out_hw, k_hw, stride, padding) -> tuple[int, int]:
    st, pd = _pair(stride), _pair(padding)
    return tuple(int(in_hw[i]) - ((int(out_hw[i]) - 1) * st[i] - 2 * pd[i] + int(k_hw[i])) for i in range(2))  # type: ignore[return-value]


def rotary_transpose(s: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """The transpose of :func:`apply_rotary`'s linear map applied to s (B, H, N, d): ``Rotᵀ s``.

    ``rotate_half`` maps (x₁, x₂) to (−x₂, x₁); its transpose maps (y₁, y₂) to (y₂, −y₁) = −rotate_half(y).

    Parameters
    ----------
    s : Tensor
        (B, H, N, d) the tensor to map back (e.g. a relevance ratio).
    cos : Tensor
        (B, N, r) the rotary cosines, r ≤ d.
    sin : Tensor
        (B, N, r) the rotary sines.

    Returns
    -------
    Tensor
        (B, H, N, d) ``Rotᵀ s``.
    """
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    r = cos.shape[-1]
    rot = s[..., :r]
    out = rot * cos - rotate_half(rot * sin)
    return out if r == s.shape[-1] else torch.cat((out, s[..., r:]), dim=-1)

"""The stabilised ratio every rule divides with, and the generic Deep Taylor rule."""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

EPS = 1e-9


# --------------------------------------------------------------------------
# the stabilised ratio
# --------------------------------------------------------------------------
def safe_div(a: Tensor, b: Tensor, eps: float = EPS, signed: bool = False) -> Tensor:
    """``a / (b + eps)``, and 0 where ``b == 0``.

    The reference adds a constant ``+eps`` whatever the sign of ``b`` (a
    denominator of exactly ``-eps`` then becomes ``eps``, as in the reference);
    ``signed=True`` uses ``b + eps * sign(b)`` instead, the textbook epsilon
    rule.

    Parameters
    ----------
    a : Tensor
        Numerator, any shape.
    b : Tensor
        Denominator, broadcastable with ``a``.
    eps : float, optional
        The stabiliser added to the denominator.
    signed : bool, optional
        Add ``eps * sign(b)`` (sign of 0 taken as +) instead of ``+eps``.

    Returns
    -------
    Tensor
        ``a / (b + eps)`` broadcast, with 0 wherever ``b == 0``.
    """
    if signed:
        den = b + eps * torch.where(b >= 0, 1.0, -1.0).to(b.dtype)
    else:
        den = b + eps
        den.masked_fill_(den == 0, eps)
    return (a / den).masked_fill_(b == 0, 0.0)


def _safe_div_into(a: Tensor, b: Tensor) -> Tensor:
    """:func:`safe_div` ``(a, b)`` (unsigned, ``EPS``) written into ``b``, a temporary the caller gives up:
    the same numbers, without the two extra tensors of b's size (an (B, H, N, N) map each at attention)."""
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):  # out= takes no graph: a differentiated pass
        return safe_div(a, b)
    zero = b == 0
    b.add_(EPS).masked_fill_(b == 0, EPS)
    return torch.div(a, b, out=b).masked_fill_(zero, 0.0)


def _sum_per_sample(t: Tensor) -> Tensor:
    """Sum over every dimension but the first: (B, ...) -> (B, 1, ..., 1)."""
    return t.reshape(t.shape[0], -1).sum(dim=1).reshape((-1,) + (1,) * (t.dim() - 1))


# --------------------------------------------------------------------------
# generic Deep Taylor rule
# --------------------------------------------------------------------------
def generic(fn: Callable[[Tensor], Tensor], x: Tensor, R: Tensor) -> Tensor:
    """The generic DTD rule ``R_x = x ⊙ ∂/∂x ⟨fn(x), safe_div(R, fn(x))⟩``.

    Gradient × input of the ratio: it conserves relevance exactly when ``fn``
    is linear without bias (Euler's theorem for homogeneous functions).

    Parameters
    ----------
    fn : Callable[[Tensor], Tensor]
        the layer, (...) -> (...).
    x : Tensor
        its input.
    R : Tensor
        relevance of ``fn(x)``, same shape as ``fn(x)``.

    Returns
    -------
    Tensor
        Relevance of ``x``, same shape as ``x``.
    """
    with torch.enable_grad():
        x = x.detach().requires_grad_(True)
        z = fn(x)
        s = safe_div(R, z.detach())
        (g,) = torch.autograd.grad(z, x, grad_outputs=s)
    return x.detach() * g

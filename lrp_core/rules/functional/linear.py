"""Rules of Linear layers: x (..., D_in), weight (D_out, D_in), R (..., D_out) (docs/METHODS.md §1.1, §1.7, §1.14)."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from .basics import EPS, safe_div


def linear_signed(
    x: Tensor,
    weight: Tensor,
    R: Tensor,
    out: Tensor | None = None,
    bias: Tensor | None = None,
    cache: dict | None = None,
) -> Tensor:
    """Signed-input rule G_q (α=1, β=0) with one shared denominator.

    Only the contributions ``x_j w_ji ≥ 0`` count: ``z⁺ = x⁺W⁺ + x⁻W⁻`` (no
    bias), ``R_x = x⁺ ⊙ W⁺ᵀs + x⁻ ⊙ W⁻ᵀs`` with ``s = safe_div(R, z⁺)``.
    Relevance is conserved (``ΣR_x = ΣR`` wherever ``z⁺ > 0``).

    Parameters
    ----------
    x : Tensor
        (..., D_in) the layer's input.
    weight : Tensor
        (D_out, D_in) the layer's weight.
    R : Tensor
        (..., D_out) relevance of the output.
    out : Tensor | None, optional
        (..., D_out) the layer's forward output ``x Wᵀ + b``, if at hand.
    bias : Tensor | None, optional
        (D_out,) the layer's bias, if at hand (used with ``out``).
    cache : dict | None, optional
        a dict to keep the weight's signed parts in across calls.

    Notes
    -----
    With ``out`` and ``bias`` at hand, ``z⁺ = (x Wᵀ + |x| |W|ᵀ) / 2`` costs one
    matrix product instead of two (the same value up to float32 round-off).

    Returns
    -------
    Tensor
        (..., D_in) relevance of the input.
    """
    x2, R2 = x.reshape(-1, x.shape[-1]), R.reshape(-1, R.shape[-1])
    live = _live_outputs(R2)
    if live is not None and not live.numel():  # no relevance reaches the layer (an expert no token was sent to)
        return torch.zeros_like(x)
    if live is not None:  # a head read at a few classes: only their rows of W carry relevance (s is 0 elsewhere)
        weight, R2, cache = weight[live], R2[:, live], None
        out = None if out is None else out.reshape(-1, out.shape[-1])[:, live]
        bias = None if bias is None else bias[live]
    xp = x2.clamp(min=0)
    xn = x2 - xp  # = min(x, 0), exactly
    # z⁺ = 0 only where every term x_j·w_ji ≥ 0 is 0, and then each of those
    # products is 0: the unit passes nothing, so s needs no masking.
    if out is None:
        wp, wn = _weight_parts(weight, cache, "signed", lambda w: (w.clamp(min=0), w.clamp(max=0)))
        z = (xp @ wp.T).add_(xn @ wn.T).add_(EPS)
        s = R2 / z
        return (xp * (s @ wp)).add_(xn * (s @ wn)).reshape(x.shape)
    # x⁺W⁺ + x⁻W⁻ = (xW + |x||W|) / 2; the halving is folded into the weights: W + |W| = 2W⁺ and
    # W − |W| = 2W⁻ exactly in binary, so three weight-sized tensors suffice
    wabs, wp2, wn2 = _weight_parts(weight, cache, "doubled", _doubled_parts)
    y = (x2.abs() @ wabs.T).add_(out.reshape(-1, out.shape[-1]))
    if bias is not None:
        y.sub_(bias)
    s = R2 / y.add_(2 * EPS)  # = ½ R / (z⁺ + ε)
    return (xp * (s @ wp2)).add_(xn * (s @ wn2)).reshape(x.shape)


def _live_outputs(R: Tensor) -> Tensor | None:
    """The output units of (N, D_out) relevance that receive any, where they are few against many outputs (an LM or
    classifier head read at the target classes); ``None`` elsewhere. Leaving the others out of the rule changes
    nothing but the summation order (their ``s`` is exactly 0) and spares the weight-sized signed parts: 2 × 65 MB
    for a 32,000 × 512 head, 2 × 2.1 GB for a 128,256 × 4096 one."""
    if R.shape[0] * 8 > R.shape[1]:  # rows of many outputs each: the dense layers of the network
        return None
    live = R.ne(0).any(dim=0).nonzero().squeeze(1)
    return live if 2 * live.numel() <= R.shape[1] else None


def _doubled_parts(weight: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    wabs = weight.abs()
    return wabs, weight + wabs, weight - wabs


def _weight_parts(weight: Tensor, cache: dict | None, kind: str, make: Callable) -> tuple:
    """``make(weight)``, kept in ``cache`` (if given) for weights used again in the same pass (shared layers)."""
    key = (kind, id(weight))
    if cache is not None and key in cache:
        return cache[key]
    parts = make(weight)
    if cache is not None:
        cache[key] = parts
    return parts


def linear_baseline(x: Tensor, weight: Tensor, R: Tensor) -> Tensor:
    """The LRP baseline's α=1, β=0 rule with separate denominators.

    ``R_x = x⁺ ⊙ W⁺ᵀ safe_div(R, x⁺W⁺) + x⁻ ⊙ W⁻ᵀ safe_div(R, x⁻W⁻)``: each
    part gets all of ``R`` wherever it is non-zero, so relevance is not
    conserved (it can double).

    Parameters
    ----------
    x : Tensor
        (..., D_in) the layer's input.
    weight : Tensor
        (D_out, D_in) the layer's weight.
    R : Tensor
        (..., D_out) relevance of the output.

    Returns
    -------
    Tensor
        (..., D_in) relevance of the input; its sum can reach twice ``ΣR``.
    """
    wp, wn = weight.clamp(min=0), weight.clamp(max=0)
    x2, R2 = x.reshape(-1, x.shape[-1]), R.reshape(-1, R.shape[-1])
    xp = x2.clamp(min=0)
    xn = x2 - xp
    # as in linear_signed, a zero denominator comes with zero products: no mask needed
    out = xp * ((R2 / (xp @ wp.T).add_(EPS)) @ wp)
    out.add_(xn * ((R2 / (xn @ wn.T).add_(EPS)) @ wn))
    return out.reshape(x.shape)


def linear_generic(x: Tensor, weight: Tensor, R: Tensor) -> Tensor:
    """The generic rule for a bias-free Linear: ``R_x = x ⊙ Wᵀ safe_div(R, xWᵀ)``.

    Parameters
    ----------
    x : Tensor
        (..., D_in) the layer's input.
    weight : Tensor
        (D_out, D_in) the layer's weight (no bias).
    R : Tensor
        (..., D_out) relevance of the output.

    Returns
    -------
    Tensor
        (..., D_in) relevance of the input.
    """
    s = safe_div(R, F.linear(x, weight))
    return x * (s @ weight)


# --------------------------------------------------------------------------
# Linear layers: the ε- and (generalised) γ-rules, bias included
# --------------------------------------------------------------------------
def linear_gamma_factors(
    x: Tensor,
    weight: Tensor,
    R: Tensor,
    gamma: float,
    epsilon: float = EPS,
    bias: Tensor | None = None,
    out: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The generalised γ-rule with a sign-matched stabiliser ε, as the two factors its relevance is made of.

    With ``W⁺ = W + γ·max(W, 0)``, ``W⁻ = W + γ·min(W, 0)`` (likewise ``b⁺``, ``b⁻``) and ``z = xWᵀ + b``,
    each output unit boosts the contributions that share its sign (Montavon et al. 2019, §10.2.1, for any
    input sign as Andéol et al. 2021 and zennit's ``Gamma`` do):

    - ``z_j > 0``: ``ẑ_j = x⁺W⁺ᵀ + x⁻W⁻ᵀ + b⁺``, ``s⁺_j = R_j / (ẑ_j + ε)``;
    - ``z_j < 0``: ``ž_j = x⁺W⁻ᵀ + x⁻W⁺ᵀ + b⁻``, ``s⁻_j = R_j / (ž_j − ε)``; ``z_j = 0`` passes nothing.

    ``R_x = x⁺ ⊙ (s⁺W⁺ + s⁻W⁻) + x⁻ ⊙ (s⁺W⁻ + s⁻W⁺)``: this returns the two factors ``(g⁺, g⁻)``, each
    (..., D_in), so the explicit pass forms ``x⁺ ⊙ g⁺ + x⁻ ⊙ g⁻`` and a modified-gradient replay hands
    ``[x > 0]·g⁺ + [x < 0]·g⁻`` on as the gradient (no division by ``x``). ``ẑ ≥ z`` and ``ž ≤ z``, so
    ε never flips a denominator's sign. ``γ = 0``: :func:`linear_epsilon`'s single factor, twice.

    Parameters
    ----------
    x : Tensor
        (..., D_in) the layer's input.
    weight : Tensor
        (D_out, D_in) the layer's weight.
    R : Tensor
        (..., D_out) relevance of the output.
    gamma : float
        γ ≥ 0.
    epsilon : float, optional
        ε ≥ 0, the sign-matched stabiliser.
    bias : Tensor | None, optional
        (D_out,) the layer's bias, or ``None``; the bias is the input ``x₀ = 1``.
    out : Tensor | None, optional
        (..., D_out) the forward output ``xWᵀ + b`` if at hand (its signs choose each unit's denominator).

    Returns
    -------
    tuple[Tensor, Tensor]
        ``(g⁺, g⁻)``, each (..., D_in), the factors of the positive and negative
        parts of ``x``.
    """
    x2, R2 = x.reshape(-1, x.shape[-1]), R.reshape(-1, R.shape[-1])
    z = F.linear(x2, weight, bias) if out is None else out.reshape(-1, out.shape[-1])
    if gamma == 0:
        g = safe_div(R2, z, epsilon, signed=True) @ weight
        g = g.reshape(x.shape)
        return g, g
    xp = x2.clamp(min=0)
    xn = x2 - xp
    wp, wn = weight + gamma * weight.clamp(min=0), weight + gamma * weight.clamp(max=0)
    bp = bn = None
    if bias is not None:
        bp, bn = bias + gamma * bias.clamp(min=0), bias + gamma * bias.clamp(max=0)
    z_pos = F.linear(xp, wp, bp) + F.linear(xn, wn)  # the denominator of the units with z > 0
    z_neg = F.linear(xp, wn, bn) + F.linear(xn, wp)  # ... and of those with z < 0
    zero = R2.new_zeros(())
    s_pos = safe_div(torch.where(z > 0, R2, zero), z_pos, epsilon, signed=True)
    s_neg = safe_div(torch.where(z < 0, R2, zero), z_neg, epsilon, signed=True)
    g_pos = s_pos @ wp + s_neg @ wn
    g_neg = s_pos @ wn + s_neg @ wp
    return g_pos.reshape(x.shape), g_neg.reshape(x.shape)


def linear_gamma(
    x: Tensor,
    weight: Tensor,
    R: Tensor,
    gamma: float,
    epsilon: float = EPS,
    bias: Tensor | None = None,
    out: Tensor | None = None,
) -> Tensor:
    """The generalised γ-rule ``R_x = x⁺ ⊙ g⁺ + x⁻ ⊙ g⁻``.

    Montavon et al. 2019, §10.2.1; the factors g⁺, g⁻ come from :func:`linear_gamma_factors`.
    For ``x ≥ 0`` and ``z > 0`` this is the textbook form
    ``R_i = Σ_j x_i (w_ji + γw_ji⁺) / (Σ_i x_i (w_ji + γw_ji⁺) + b_j + γb_j⁺ + ε) · R_j``.

    Parameters
    ----------
    x : Tensor
        (..., D_in) the layer's input.
    weight : Tensor
        (D_out, D_in) the layer's weight.
    R : Tensor
        (..., D_out) relevance of the output.
    gamma : float
        γ ≥ 0.
    epsilon : float, optional
        ε ≥ 0, the sign-matched stabiliser.
    bias : Tensor | None, optional
        (D_out,) the layer's bias, or ``None``.
    out : Tensor | None, optional
        (..., D_out) the forward output ``xWᵀ + b`` if at hand.

    Returns
    -------
    Tensor
        (..., D_in) relevance of the input.
    """
    g_pos, g_neg = linear_gamma_factors(x, weight, R, gamma, epsilon, bias, out)
    xp = x.clamp(min=0)
    return xp * g_pos + (x - xp) * g_neg


def linear_epsilon(
    x: Tensor, weight: Tensor, R: Tensor, epsilon: float, bias: Tensor | None = None, out: Tensor | None = None
) -> Tensor:
    """The ε-rule with a sign-matched stabiliser (Bach et al. 2015; Montavon et al. 2019, §10.2.1).

    ``R_i = x_i Σ_j w_ji R_j / (z_j + ε·sign(z_j))``, ``z = xWᵀ + b`` (0 where ``z_j = 0``).

    The bias takes its share (``ΣR_x = Σ_j R_j (z_j − b_j) / (z_j + ε sign z_j)``): conservative only on a
    bias-free layer with ``ε = 0``, where it is the generic rule :func:`linear_generic`; ε absorbs the
    relevance of weak, contradictory units.

    Parameters
    ----------
    x : Tensor
        (..., D_in) the layer's input.
    weight : Tensor
        (D_out, D_in) the layer's weight.
    R : Tensor
        (..., D_out) relevance of the output.
    epsilon : float
        ε ≥ 0, the sign-matched stabiliser.
    bias : Tensor | None, optional
        (D_out,) the layer's bias, or ``None``; the bias takes its share.
    out : Tensor | None, optional
        (..., D_out) the forward output ``xWᵀ + b`` if at hand.

    Returns
    -------
    Tensor
        (..., D_in) relevance of the input.
    """
    return x * linear_gamma_factors(x, weight, R, 0.0, epsilon, bias, out)[0]

"""Relevance propagation rules on plain tensors.

Every rule takes the forward quantities of one operation and the relevance of
its output, and returns the relevance of its input(s). Relevance flows from the
output to the input; shapes are those of the forward tensors.

The functions are the reference formulas of ``docs/METHODS.md`` §1. The rule
objects of :mod:`lrp_core.rules.composites` wrap them, and a composite maps each
operation of a relevance pass to one of them; the course calls the functions
directly.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F
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


# --------------------------------------------------------------------------
# Linear layers (x: (..., D_in), weight: (D_out, D_in), R: (..., D_out))
# --------------------------------------------------------------------------
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


# --------------------------------------------------------------------------
# two tensors meet: addition, clone, product
# --------------------------------------------------------------------------
def add_generic(u: Tensor, v: Tensor, R: Tensor) -> tuple[Tensor, Tensor]:
    """Generic rule for ``u + v``: each operand gets its share ``u ⊙ R/(u+v)``.

    Parameters
    ----------
    u : Tensor
        First operand, any shape.
    v : Tensor
        Second operand, same shape as ``u``.
    R : Tensor
        Relevance of ``u + v``, same shape.

    Returns
    -------
    tuple[Tensor, Tensor]
        ``(R_u, R_v)``, each of the operands' shape.
    """
    s = _safe_div_into(R, u + v)
    Ru = u * s
    return Ru, s.mul_(v)  # v's share formed in s (s·v = v·s exactly): one temporary less


def add_normalized(u: Tensor, v: Tensor, R: Tensor, per_sample: bool = True) -> tuple[Tensor, Tensor]:
    """Generic rule for ``u + v`` followed by the normalisation of the paper.

    Each operand's relevance is rescaled so that (1) the two sums add up to
    ``ΣR`` (conservation) and (2) each operand's share of the total is
    ``|ΣR_u| / (|ΣR_u| + |ΣR_v|)``, bounded in [0, 1] (Lemma 2).

    Sums run per sample (over every dimension but the batch dimension 0);
    ``per_sample=False`` sums over the whole tensor as the single-image
    reference code does.

    Parameters
    ----------
    u : Tensor
        (B, ...) first operand.
    v : Tensor
        (B, ...) second operand, same shape as ``u``.
    R : Tensor
        (B, ...) relevance of ``u + v``.
    per_sample : bool, optional
        Sum per sample (over every dimension but 0); ``False`` sums over the whole tensor.

    Returns
    -------
    tuple[Tensor, Tensor]
        ``(R_u, R_v)``, each (B, ...), normalised as above.
    """
    Ru, Rv = add_generic(u, v, R)
    total = _sum_per_sample if per_sample else (lambda t: t.sum())
    su, sv, sR = total(Ru), total(Rv), total(R)
    den = su.abs() + sv.abs()
    fu = safe_div(su.abs(), den) * sR
    fv = safe_div(sv.abs(), den) * sR
    return Ru.mul_(safe_div(fu, su)), Rv.mul_(safe_div(fv, sv))  # add_generic's fresh tensors, rescaled in place


def sum_generic(parts: Tensor, tokens: Tensor, R: Tensor, out: Tensor) -> Tensor:
    """Generic rule for a per-token sum of a variable number of operands.

    A mixture-of-experts layer's ``out_t = Σ_{p: tokens_p = t} parts_p``: each operand gets its share
    ``parts_p ⊙ R_t / out_t``.

    Parameters
    ----------
    parts : Tensor
        (P, D) the operands, any number per token.
    tokens : Tensor
        (P,) long, the token each operand is added to.
    R : Tensor
        (T, D) relevance of the sums.
    out : Tensor
        (T, D) the sums.

    Returns
    -------
    Tensor
        (P, D) relevance of each operand.
    """
    return parts * safe_div(R, out)[tokens]


def sum_normalized(parts: Tensor, tokens: Tensor, R: Tensor, out: Tensor) -> Tensor:
    """:func:`sum_generic`, then :func:`add_normalized`'s normalisation generalised to each token's operands.

    Operand p of token t gets ``|ΣR_p| / Σ_{q of t} |ΣR_q|`` of ``ΣR_t`` (sums over the channels), so the
    operands of a token conserve its relevance and each one's share lies in [0, 1]. The normalisation runs per
    token (a sample's tokens are never mixed).

    Parameters
    ----------
    parts : Tensor
        (P, D) the operands, any number per token.
    tokens : Tensor
        (P,) long, the token each operand is added to.
    R : Tensor
        (T, D) relevance of the sums.
    out : Tensor
        (T, D) the sums.

    Returns
    -------
    Tensor
        (P, D) relevance of each operand, normalised per token.
    """
    Rp = sum_generic(parts, tokens, R, out)
    sp = Rp.sum(-1)  # (P,)
    den = torch.zeros(R.shape[0], dtype=sp.dtype, device=sp.device).index_add_(0, tokens, sp.abs())
    fp = safe_div(sp.abs(), den[tokens]) * R.sum(-1)[tokens]
    return Rp.mul_(safe_div(fp, sp)[:, None])


def add_generic_n(zs: Sequence[Tensor], R: Tensor, out: Tensor | None = None) -> list[Tensor]:
    """Generic rule for a sum of n operands ``z_1 + … + z_n``: each its share ``z_i ⊙ R / Σ_j z_j``.

    Parameters
    ----------
    zs : Sequence[Tensor]
        The n operands, each broadcastable to R's shape (B, ...).
    R : Tensor
        (B, ...) relevance of the sum.
    out : Tensor or None
        The sum as the forward computed it (its own order of additions); formed here where ``None``.

    Returns
    -------
    list[Tensor]
        The n shares, each of R's shape: conservative up to the stabiliser
        (``Σ_i R_i = Σ z ⊙ safe_div(R, Σ z)``).
    """
    if out is None:
        out = zs[0]
        for z in zs[1:]:
            out = out + z
    s = safe_div(R, out)
    return [z * s for z in zs]


def add_normalized_n(
    zs: Sequence[Tensor], R: Tensor, per_sample: bool = True, out: Tensor | None = None
) -> list[Tensor]:
    """:func:`add_normalized` for n operands (a parallel block's ``x + attn + mlp``): the generic shares of
    :func:`add_generic_n`, each operand's total then replaced by ``|S_i| / Σ_j |S_j| · S`` (``S_i`` its share's sum,
    ``S`` that of R; per sample unless ``per_sample=False``). For n = 2 the numbers of :func:`add_normalized`.

    Parameters
    ----------
    zs : Sequence[Tensor]
        The n operands (B, ...).
    R : Tensor
        (B, ...) relevance of the sum.
    per_sample : bool
        Sums over every axis but the batch axis (else over the whole tensor).
    out : Tensor or None
        The sum as the forward computed it, or ``None``.

    Returns
    -------
    list[Tensor]
        The n rescaled shares: their totals add up to ``S`` exactly (up to round-off), each a fraction in
        [0, 1] of it.
    """
    shares = add_generic_n(zs, R, out=out)
    total = _sum_per_sample if per_sample else (lambda t: t.sum())
    sums, sR = [total(r) for r in shares], total(R)
    den = sums[0].abs()
    for s in sums[1:]:
        den = den + s.abs()
    return [r.mul_(safe_div(safe_div(s.abs(), den) * sR, s)) for r, s in zip(shares, sums)]


def clone(*Rs: Tensor, x: Tensor | None = None) -> Tensor:
    """A tensor used by several branches receives the sum of their relevances.

    With ``x`` (the cloned tensor) the sum is formed as the generic rule of the
    copy, ``x ⊙ Σ_i safe_div(R_i, x)``, the reference's arithmetic: the same
    sum up to ``1e-9/|x|``, but relevance passes are ill-conditioned enough
    that matching the reference to float32 round-off needs its exact
    operations. (Where ``x == 0`` the product is 0 whatever the ratio, so the
    ratio needs no mask.)

    Parameters
    ----------
    *Rs
        The relevances of the branches, all of the cloned tensor's shape.
    x : Tensor | None, optional
        The cloned tensor itself, to form the sum as the reference does.

    Returns
    -------
    Tensor
        The summed relevance, of the cloned tensor's shape.
    """
    if x is None:
        out = Rs[0]
        for r in Rs[1:]:
            out = out + r
        return out
    den = x + EPS
    den.masked_fill_(den == 0, EPS)
    ratio = Rs[0] / den
    for r in Rs[1:]:
        ratio.add_(r / den)
    return ratio.mul_(x)


def select(x: Tensor, R: Tensor) -> Tensor:
    """Token selection ([CLS] pooling): ``x ⊙ safe_div(R, x)`` on the selected token (≈ R).

    Parameters
    ----------
    x : Tensor
        The tensor the token was selected from (the selected token's values).
    R : Tensor
        Relevance of the selected token, same shape as ``x``.

    Returns
    -------
    Tensor
        Relevance of the token, same shape (≈ ``R``).
    """
    return x * safe_div(R, x)


def weighted_sum(x: Tensor, w: Tensor, R: Tensor, out: Tensor | None = None) -> Tensor:
    """Generic rule for a pooled token ``out = Σ_i w_i x_i`` (average pooling; docs/METHODS.md §4.4).


    Parameters
    ----------
    x : Tensor
        (B, n, D) the pooled tokens.
    w : Tensor
        (B or 1, n) the pooling weights.
    R : Tensor
        (B, D) relevance of ``out``.
    out : Tensor | None, optional
        (B, D) the forward result, where the pass has it (formed here otherwise).

    Returns
    -------
    Tensor
        (B, n, D) relevance of the pooled tokens, ``w_i x_i ⊙ safe_div(R, out)``; for
        ``w = e_0`` the selection rule :func:`select`.
    """
    wx = w.to(device=x.device, dtype=x.dtype)[..., None] * x  # a readout's weights are built on the CPU
    if out is None:
        out = wx.sum(dim=1)
    return wx * safe_div(R, out)[:, None]


def matmul(a: Tensor, b: Tensor, R: Tensor, halve: bool = True, z: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Generic rule for the product of two activations ``Z = a @ b``.

    ``R_a = a ⊙ (S bᵀ)``, ``R_b = b ⊙ (aᵀ S)`` with ``S = safe_div(R, Z)``.
    Each operand alone already receives (about) all of ``R``, so both are
    halved to keep the total: ``ΣR_a + ΣR_b ≈ ΣR`` only with ``halve=True``.

    Parameters
    ----------
    a : Tensor
        (..., n, k) left factor.
    b : Tensor
        (..., k, m) right factor.
    R : Tensor
        (..., n, m) relevance of ``a @ b``.
    halve : bool, optional
        Halve both shares so that ``ΣR_a + ΣR_b ≈ ΣR``.
    z : Tensor | None, optional
        ``a @ b`` if the forward pass has it already.

    Returns
    -------
    tuple[Tensor, Tensor]
        ``(R_a, R_b)``, of shapes (..., n, k) and (..., k, m).
    """
    S = _safe_div_into(R, a @ b) if z is None else safe_div(R, z)  # the forward's z is not ours to overwrite
    # formed in the fresh products (x·a = a·x exactly): no extra (…, n, k) temporaries, e.g. H·N² for R^A
    Ra = (S @ b.transpose(-1, -2)).mul_(a)
    Rb = (a.transpose(-1, -2) @ S).mul_(b)
    if halve:
        Ra, Rb = Ra.div_(2), Rb.div_(2)
    return Ra, Rb


def identity(R: Tensor) -> Tensor:
    """Elementwise non-linearities and normalisations pass relevance unchanged.

    Parameters
    ----------
    R : Tensor
        Relevance of the output of the non-linearity or normalisation.

    Returns
    -------
    Tensor
        ``R`` itself.
    """
    return R


# --------------------------------------------------------------------------
# the first layer: patch-embedding convolution with the z^B (box) rule
# --------------------------------------------------------------------------
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


# ---- decoders (docs/METHODS.md §2c): the rotary embedding as a linear map, shared key/value heads
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


__all__ = [
    "EPS",
    "safe_div",
    "generic",
    "linear_signed",
    "linear_baseline",
    "linear_generic",
    "linear_gamma_factors",
    "linear_gamma",
    "linear_epsilon",
    "add_generic",
    "add_normalized",
    "add_generic_n",
    "add_normalized_n",
    "sum_generic",
    "sum_normalized",
    "clone",
    "select",
    "weighted_sum",
    "matmul",
    "identity",
    "zbox_conv2d",
    "rotate_half",
    "apply_rotary",
    "rotary_transpose",
    "repeat_kv",
    "take_rows",
    "query_row_bias",
]

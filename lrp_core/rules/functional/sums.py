"""Rules of sums and products of activations: residual Adds, per-token sums, Clones, selections, pooling, ``a @ b``."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from .basics import EPS, _safe_div_into, _sum_per_sample, safe_div


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

"""The rules of the explicit relevance passes (``relevance(op, R)``; docs/METHODS.md §1 and §2c).

Each rule object wraps a plain-tensor function of :mod:`lrp_core.rules.functional` (the course calls those directly)
and uses its one stabiliser :data:`lrp_core.rules.EPS`. A composite (:mod:`lrp_core.rules.composites`) chooses
which rule each operation gets.
"""

from __future__ import annotations

import math

from ..errors import RuleSetError, UnsupportedModelError
from . import functional as F
from .linear import effective_linear
from .ops import (
    ADD,
    ATTENTION,
    CLONE,
    EXPERT_SUM,
    GATE_MUL,
    KV_REPEAT,
    LINEAR,
    MASK_ADD,
    MATMUL_AV,
    MATMUL_QK,
    PATCH_CONV,
    POOL,
    POS_ADD,
    READOUT,
    ROPE,
    ROUTE,
    ExplicitRule,
)
from .views import check_conv, check_linear, conv_padding, effective_conv


def _linear_parts(op, cache):
    """(weight, bias) of the map the Linear ``op.module`` computes (:func:`effective_linear`: a peft adapter's
    weight added in, a quantised weight dequantised, an offloaded one loaded), checked against the output the
    forward recorded for ``op.inputs[0]`` (:func:`~lrp_core.rules.views.check_linear`). Kept in ``cache`` where
    the pass has one, so a computed weight keeps the identity that cache's weight parts are found by."""
    module = op.module
    if cache is None:
        parts = effective_linear(module)
    else:
        key = ("linear", id(module))
        if key not in cache:
            cache[key] = effective_linear(module)
        parts = cache[key]
    check_linear(module, op.inputs[0], op.output, *parts)
    return parts


class Identity(ExplicitRule):
    """Relevance passes unchanged (element-wise layers, normalisations, softmax). docs/METHODS.md §1.2."""

    name = "identity"

    def relevance(self, op, R, cache=None):
        return (R,)


class SignedLinear(ExplicitRule):
    """:func:`lrp_core.rules.linear_signed` — α=1, β=0 on signed inputs, one shared denominator. docs/METHODS.md §1.1.

    Where the pass has the layer's output it is reused: one matrix product less.
    """

    name = "signed"
    kinds = (LINEAR,)

    def relevance(self, op, R, cache=None):
        weight, bias = _linear_parts(op, cache)
        return (F.linear_signed(op.inputs[0], weight, R, out=op.output, bias=bias, cache=cache),)


class BaselineLinear(ExplicitRule):
    """:func:`lrp_core.rules.linear_baseline` — the LRP baseline's separate denominators. docs/METHODS.md §1.7."""

    name = "baseline"
    kinds = (LINEAR,)

    def relevance(self, op, R, cache=None):
        return (F.linear_baseline(op.inputs[0], _linear_parts(op, cache)[0], R),)


def check_coefficient(rule: str, name: str, value: float) -> float:
    """``value`` as a float ≥ 0 (a rule's γ or ε), else :class:`RuleSetError` naming the rule.

    Parameters
    ----------
    rule : str
        Name of the rule, for the message.
    name : str
        Name of the coefficient (e.g. ``"gamma"``), for the message.
    value : float
        The coefficient.

    Returns
    -------
    float
        ``value`` as a float.

    Raises
    ------
    RuleSetError
        If ``value`` is a bool, not a number, not finite or negative.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise RuleSetError(f"{rule}: {name} must be a finite number >= 0, got {value!r}")
    return float(value)


class GammaLinear(ExplicitRule):
    """:func:`lrp_core.rules.functional.linear_gamma` — the generalised γ-rule, bias included: the contributions
    that share each unit's sign are boosted by γ (γ = 0: :class:`EpsilonLinear`; γ → ∞: only those
    contributions count). ``epsilon``: the sign-matched stabiliser. docs/METHODS.md §1.14.
    """

    name = "gamma"
    kinds = (LINEAR,)

    def __init__(self, gamma: float = 0.25, epsilon: float = F.EPS):
        self.gamma = check_coefficient(type(self).__name__, "gamma", gamma)
        self.epsilon = check_coefficient(type(self).__name__, "epsilon", epsilon)

    def relevance(self, op, R, cache=None):
        weight, bias = _linear_parts(op, cache)
        return (F.linear_gamma(op.inputs[0], weight, R, self.gamma, self.epsilon, bias=bias, out=op.output),)

    def __repr__(self) -> str:
        eps = "" if self.epsilon == F.EPS else f", epsilon={self.epsilon:g}"
        return f"{type(self).__name__}({self.gamma:g}{eps})"


class EpsilonLinear(ExplicitRule):
    """:func:`lrp_core.rules.functional.linear_epsilon` — the ε-rule, bias included, ε sign-matched (ε = 0: the
    generic rule with the bias in the denominator). docs/METHODS.md §1.14."""

    name = "epsilon"
    kinds = (LINEAR,)

    def __init__(self, epsilon: float):
        self.epsilon = check_coefficient(type(self).__name__, "epsilon", epsilon)

    def relevance(self, op, R, cache=None):
        weight, bias = _linear_parts(op, cache)
        return (F.linear_epsilon(op.inputs[0], weight, R, self.epsilon, bias=bias, out=op.output),)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.epsilon:g})"


class NormalizedAdd(ExplicitRule):
    """:func:`lrp_core.rules.add_normalized` — generic share, then the paper's normalisation. docs/METHODS.md §1.3;
    n > 2 operands (a parallel block): :func:`lrp_core.rules.functional.add_normalized_n`, §2f."""

    name = "normalized_add"
    kinds = (ADD, MASK_ADD)

    def __init__(self, per_sample: bool = True):
        self.per_sample = per_sample

    def relevance(self, op, R, cache=None):
        if len(op.inputs) > 2:  # a parallel block's x + attn + mlp: the same normalisation over n operands
            return tuple(F.add_normalized_n(op.inputs, R, per_sample=self.per_sample, out=op.output))
        u, v = op.inputs
        return F.add_normalized(u, v, R, per_sample=self.per_sample)


class GenericAdd(ExplicitRule):
    """:func:`lrp_core.rules.add_generic` — each operand its share ``u ⊙ R / (u + v)``. docs/METHODS.md §1.7, §1.13.

    Where the pass has the sum (``op.output``), the share is formed from it.
    """

    name = "generic_add"
    kinds = (ADD, MASK_ADD, POS_ADD)

    def relevance(self, op, R, cache=None):
        if len(op.inputs) > 2:  # n operands: each its share z_i ⊙ R / Σ z
            return tuple(F.add_generic_n(op.inputs, R, out=op.output))
        u, v = op.inputs
        if op.output is None:
            return F.add_generic(u, v, R)
        s = F.safe_div(R, op.output)
        return tuple(None if t is None else t * s for t in (u, v))  # None: an operand whose share is not needed


class HalvedMatMul(ExplicitRule):
    """:func:`lrp_core.rules.matmul` with ``halve=True`` — both operands, each halved. docs/METHODS.md §1.5."""

    name = "halved_matmul"
    kinds = (MATMUL_QK, MATMUL_AV)

    def relevance(self, op, R, cache=None):
        a, b = op.inputs
        return F.matmul(a, b, R, halve=True, z=op.output)


class Clone(ExplicitRule):
    """:func:`lrp_core.rules.clone` — the branches' relevances summed as ``x ⊙ Σ R_i / x``. docs/METHODS.md §1.4."""

    name = "clone"
    kinds = (CLONE,)

    def relevance(self, op, R, cache=None):
        return (F.clone(*R, x=op.inputs[0]),)


class Select(ExplicitRule):
    """:func:`lrp_core.rules.select` — relevance to the token the classifier reads. docs/METHODS.md §1.6."""

    name = "select"
    kinds = (READOUT,)

    def relevance(self, op, R, cache=None):
        return (F.select(op.inputs[0], R),)


class WeightedSum(ExplicitRule):
    """:func:`lrp_core.rules.weighted_sum` — the generic rule on a pooled token ``Σ_i w_i h_i``. docs/METHODS.md §4.4.

    ``op.inputs`` = (tokens (B, n, D), weights (B or 1, n)); the weights are constants (relevance ``None``).
    """

    name = "weighted_sum"
    kinds = (POOL,)

    def relevance(self, op, R, cache=None):
        x, w = op.inputs
        return F.weighted_sum(x, w, R, out=op.output), None


class ZBox(ExplicitRule):
    """:func:`lrp_core.rules.zbox_conv2d` — zᴮ on the pixels, bounds per sample. docs/METHODS.md §1.8."""

    name = "zbox"
    kinds = (PATCH_CONV,)

    def relevance(self, op, R, cache=None):
        conv, x = op.module, op.inputs[0]
        # the weights its forward computes with (dequantised, loaded), checked on the first image; on a split model
        # where the pixels are (accelerate's hook moved them to the convolution inside its forward)
        weight, bias = effective_conv(conv)
        weight, bias = weight.to(x.device), None if bias is None else bias.to(x.device)
        check_conv(conv, x, weight, bias)
        # padding="valid" (SigLIP's patch convolution) is no padding; the transposed convolution needs numbers
        return (F.zbox_conv2d(x, weight, R.to(x.device), stride=conv.stride, padding=conv_padding(conv)),)


class Rotary(ExplicitRule):
    """RoPE, a bias-free linear map given the positions: the generic DTD rule ``x ⊙ Rotᵀ safe_div(R, Rot x)``.

    Conserves up to the stabiliser (docs/METHODS.md §2c). ``op.inputs`` = (x, cos, sin), ``op.output`` = Rot x.
    """

    name = "rotary"
    kinds = (ROPE,)

    def relevance(self, op, R, cache=None):
        x, cos, sin = op.inputs
        z = F.apply_rotary(x, cos, sin) if op.output is None else op.output
        return x * F.rotary_transpose(F.safe_div(R, z), cos, sin), None, None


class SharedHeads(ExplicitRule):
    """Shared key/value heads are a Clone: the relevances of the query heads sharing a head are summed into it.

    ``op.inputs`` = (kv (B, Hkv, N, d),); R (B, H, N, d) with H = Hkv·groups (consecutive query heads per kv head).
    """

    name = "shared_heads"
    kinds = (KV_REPEAT,)

    def relevance(self, op, R, cache=None):
        (kv,) = op.inputs
        B, Hkv, N, d = kv.shape
        groups = R.shape[1] // Hkv
        if groups == 1:
            return (R,)
        parts = R.reshape(B, Hkv, groups, N, d).unbind(2)
        return (F.clone(*parts, x=kv),)


class HalvedProduct(ExplicitRule):
    """An element-wise product of two activations ``z = a ⊙ b`` (gated MLP): the generic rule per operand, halved.

    ``R_a = a ⊙ ∂z/∂a ⊙ s / 2 = z ⊙ s / 2`` and likewise ``R_b``, with ``s = safe_div(R, z)`` (§1's MatMul
    rule, element-wise: each operand's share is the whole product's, so both get half of it). An operand
    broadcast in the product (a routing weight (T, 1) times its expert's output (T, D)) gets its half summed
    over the axes it was broadcast along.
    """

    name = "halved_product"
    kinds = (GATE_MUL,)

    def relevance(self, op, R, cache=None):
        a, b = op.inputs
        z = a * b if op.output is None else op.output
        half = z * F.safe_div(R, z) / 2
        return tuple(half if t.shape == half.shape else half.sum_to_size(t.shape) for t in (a, b))


class Routing(ExplicitRule):
    """A router's logits to its routing weights (softmax, top-k, renormalisation; or a shared expert's sigmoid
    gate): relevance passes unchanged, each chosen expert's weight's relevance to its logit, none to the others
    (the top-k choice itself carries none). ``op.inputs`` = (logits (T, E), chosen (T, k)) with R (T, k), or
    (logit (T, 1),) with R (T, 1). docs/METHODS.md §2c.4.
    """

    name = "routing"
    kinds = (ROUTE,)

    def relevance(self, op, R, cache=None):
        if len(op.inputs) == 1:
            return (R,)
        logits, chosen = op.inputs
        return logits.new_zeros(logits.shape).scatter_(-1, chosen, R.to(logits.dtype)), None


class NormalizedSum(ExplicitRule):
    """:func:`lrp_core.rules.functional.sum_normalized` — the normalised add of the k (+1) experts summed per token.
    docs/METHODS.md §2c.4."""

    name = "normalized_sum"
    kinds = (EXPERT_SUM,)

    def relevance(self, op, R, cache=None):
        parts, tokens = op.inputs
        return F.sum_normalized(parts, tokens, R, op.output), None


class GenericSum(ExplicitRule):
    """:func:`lrp_core.rules.functional.sum_generic` — each expert's share of the per-token sum (the LRP
    baseline). docs/METHODS.md §2c.4."""

    name = "generic_sum"
    kinds = (EXPERT_SUM,)

    def relevance(self, op, R, cache=None):
        parts, tokens = op.inputs
        return F.sum_generic(parts, tokens, R, op.output), None


class NoExplicitFusedAttention(ExplicitRule):
    """Explicit passes need the attention map A: the replay computes attention eagerly for them."""

    name = "eager_only"
    kinds = (ATTENTION,)

    def relevance(self, op, R, cache=None):
        raise UnsupportedModelError(
            "an explicit relevance pass needs the attention map: replay the attention "
            "eagerly (the fused kind is for modified-gradient rules only)"
        )


__all__ = [
    "Identity",
    "SignedLinear",
    "BaselineLinear",
    "GammaLinear",
    "EpsilonLinear",
    "check_coefficient",
    "NormalizedAdd",
    "GenericAdd",
    "HalvedMatMul",
    "Clone",
    "Select",
    "WeightedSum",
    "ZBox",
    "Rotary",
    "SharedHeads",
    "HalvedProduct",
    "Routing",
    "NormalizedSum",
    "GenericSum",
    "NoExplicitFusedAttention",
]

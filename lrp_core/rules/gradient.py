"""The rules of the modified-gradient replays (``forward(fn, *inputs)``; AttnLRP and CP-LRP, docs/METHODS.md §2b, §2c).

Each rule computes its operation's value with the gradient its paper prescribes; relevance is then
gradient × input. A composite (:mod:`lrp_core.rules.composites`) chooses which rule each operation gets.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from ..errors import UnsupportedModelError
from ..runtime.offload import resolve
from . import functional as F
from .explicit import check_coefficient
from .linear import effective_linear, is_linear
from .norms import HF_FLOAT32, HF_OFFSET, NATIVE, NATIVE_FLOAT32, T5_VARIANCE, native_rms, rms_form
from .ops import (
    ATTENTION,
    ELEMENTWISE,
    GATE_MUL,
    LAYERNORM,
    LINEAR,
    MATMUL_AV,
    MATMUL_QK,
    POS_ADD,
    RMSNORM,
    ROPE,
    GradientRule,
)
from .views import check_linear

#: the identity rule's stabiliser (a plain +1e-10, as in LXT; not sign-matched)
IDENTITY_RULE_EPS = 1e-10


class _IdentityRuleFn(torch.autograd.Function):
    """``y = f(x)`` whose backward multiplies the incoming gradient by ``f(x) / (x + 1e-10)``."""

    @staticmethod
    def forward(ctx, x: Tensor, fn: Callable[[Tensor], Tensor]) -> Tensor:
        y = fn(x)
        # x and y are kept by the replay's records anyway; a saved ratio would be one more tensor of their size
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, y = ctx.saved_tensors
        if x.dtype in (torch.float16, torch.bfloat16):  # the fast half mode: the ratio in float32 (1e-10 underflows
            # in float16, x = 0 would divide by zero), the product cast back to the gradient's dtype
            return (grad.float() * (y.float() / (x.float() + IDENTITY_RULE_EPS))).to(grad.dtype), None
        return grad * (y / (x + IDENTITY_RULE_EPS)), None


class _DivideGradientFn(torch.autograd.Function):
    """Identity forward; the backward divides the gradient by ``factor``."""

    @staticmethod
    def forward(ctx, x: Tensor, factor: float) -> Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad / ctx.factor, None


class Gradient(GradientRule):
    """The plain gradient: Linear/Conv (ε-rule with ε → 0), Add, Clone, LayerScale, softmax under AttnLRP.
    docs/METHODS.md §2b.1."""

    name = "gradient"


class IdentityRule(GradientRule):
    """Element-wise non-linearity: gradient replaced by ``f(x) / (x + 1e-10)`` (AttnLRP Prop. 3.1's identity rule).

    Relevance passes through the non-linearity unchanged: ``x ⊙ f(x)/x · ∂y/∂f = f(x) ⊙ ∂y/∂f``.
    docs/METHODS.md §2b.1.
    """

    name = "identity_rule"
    kinds = (ELEMENTWISE,)

    def forward(self, fn, x, module=None):
        return _IdentityRuleFn.apply(x, fn)


class DetachedStdLayerNorm(GradientRule):
    """LayerNorm with ``sqrt(var + eps)`` a constant: mean-centring, γ and β stay linear (AttnLRP §3.3, CP-LRP).

    A normalisation module with a ``denominator(x)`` method (CLIP's L2 normalisation) has that divisor held constant.
    docs/METHODS.md §2b.1.
    """

    name = "detached_std"
    kinds = (LAYERNORM,)

    def forward(self, fn, x, module=None):
        if hasattr(module, "denominator"):  # a normalisation that names its divisor (e.g. CLIP's L2 norm)
            return x / module.denominator(x).detach()
        if module is None or len(getattr(module, "normalized_shape", (0, 0))) != 1:
            raise UnsupportedModelError(
                f"{type(self).__name__} needs a LayerNorm over the last dimension, got {module!r}"
            )
        mean = x.mean(dim=-1, keepdim=True)
        centred = x - mean
        # the std, γ and β are constants of the pass (no parameter gradients are taken): built from
        # detached tensors, autograd keeps no activation-sized tensor for them — the same values
        std = (centred.detach().pow(2).mean(dim=-1, keepdim=True) + module.eps).sqrt()  # biased, as LayerNorm
        y = centred / std
        weight, bias = resolve(module, "weight"), resolve(module, "bias")  # elementwise_affine, bias; offloaded
        if weight is not None:
            y = y * weight.detach()
        if bias is not None:
            y = y + bias.detach()
        return y


class HalvedGradient(GradientRule):
    """A product of two activations, each operand's gradient halved: AttnLRP's uniform rule (Prop. 3.2).
    docs/METHODS.md §2b.1."""

    name = "halved_gradient"
    kinds = (MATMUL_QK, MATMUL_AV, GATE_MUL)

    def forward(self, fn, a, b, module=None):
        return fn(_DivideGradientFn.apply(a, 2.0), _DivideGradientFn.apply(b, 2.0))


class DetachedOperands(GradientRule):
    """A product of two activations taken as constants (CP-LRP: Q and K detached, the attention weights fixed).
    docs/METHODS.md §2b.1."""

    name = "detached"

    def forward(self, fn, *inputs, module=None):
        return fn(*(t.detach() for t in inputs))


class DetachedRMSNorm(GradientRule):
    """RMSNorm with ``rsqrt(mean(x²)+ε)`` a constant, γ linear — LXT's patch, in the module's own arithmetic
    (:func:`lrp_core.rules.norms.rms_form`).

    Hugging Face Llama-style modules (``variance_epsilon``; Llama, Mistral, Qwen2/3): computed in float32 and cast
    back before ``w ·`` (so a float64 model rounds here, as the model and LXT do). Gemma-style modules (``eps``,
    weight ``1 + w``): ``_norm`` on ``x.float()`` with the factor detached, times ``(1 + w)``, cast back.
    ``torch.nn.RMSNorm`` and timm's ``RmsNorm``: in the input's dtype, times ``w`` where there is one
    (:func:`lrp_core.rules.norms.native_rms`).
    """

    name = "detached_rms"
    kinds = (RMSNORM,)

    def forward(self, fn, x, module=None):
        form = rms_form(module) if module is not None else None
        if form in (NATIVE, NATIVE_FLOAT32):
            return native_rms(module, x, float32=form == NATIVE_FLOAT32)
        weight = resolve(module, "weight")  # an offloaded norm's loaded weight
        if form == HF_FLOAT32:
            assert weight is not None, "a Hugging Face RMSNorm has a weight"
            w = weight.detach()
            dtype = x.dtype
            h = x.to(torch.float32)
            variance = h.pow(2).mean(-1, keepdim=True)
            h = h * torch.rsqrt(variance + module.variance_epsilon).detach()
            return w * h.to(dtype)
        if form == T5_VARIANCE:
            assert weight is not None, "a T5 norm has a weight"
            variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
            h = x * torch.rsqrt(variance + module.variance_epsilon).detach()
            w = weight.detach()
            return w * (h.to(w.dtype) if w.dtype in (torch.float16, torch.bfloat16) else h)
        if form == HF_OFFSET:
            assert weight is not None, "a Gemma RMSNorm has a weight"
            w = weight.detach()
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + module.eps).detach()
            return (h * (1.0 + w.float())).type_as(x)
        raise UnsupportedModelError(
            f"{type(self).__name__}: {type(module).__name__} is not an RMSNorm (expected torch.nn.RMSNorm, timm's "
            "RmsNorm, or a Hugging Face RMSNorm with variance_epsilon or eps)"
        )


class DetachedGate(GradientRule):
    """CP-LRP's gated product: the gate (first operand) a constant, no halving."""

    name = "detached_gate"
    kinds = (GATE_MUL,)

    def forward(self, fn, a, b, module=None):
        return fn(a.detach(), b)


class FusedAttentionLRP(GradientRule):
    """AttnLRP on a fused attention (sdpa): the gradient into q and k ÷4, into v ÷2, then the plain kernel.

    The same gradient as the ÷2 rules at ``q·kᵀ`` and ``A·v`` with the plain softmax gradient between them
    (powers of two commute with every step), without the N×N attention in memory.
    """

    name = "fused_attnlrp"
    kinds = (ATTENTION,)

    def forward(self, fn, q, k, v, module=None):
        return fn(_DivideGradientFn.apply(q, 4.0), _DivideGradientFn.apply(k, 4.0), _DivideGradientFn.apply(v, 2.0))


class FusedAttentionCP(GradientRule):
    """CP-LRP on a fused attention: q and k detached (the attention weights constant), linear in v."""

    name = "fused_cp"
    kinds = (ATTENTION,)

    def forward(self, fn, q, k, v, module=None):
        return fn(q.detach(), k.detach(), v)


class FusedAttentionCPHalved(GradientRule):
    """The PA-LRP authors' ViT rule on a fused attention: q and k detached, the gradient into v ÷2 (``A·V``'s
    uniform rule with the attention weights' half dropped; ``pa_lrp``'s ``base="cp_halved"``, §2e.4)."""

    name = "fused_cp_halved"
    kinds = (ATTENTION,)

    def forward(self, fn, q, k, v, module=None):
        return fn(q.detach(), k.detach(), _DivideGradientFn.apply(v, 2.0))


class _LinearRuleFn(torch.autograd.Function):
    """``z = layer(x)`` whose backward hands on the γ/ε-rule's relevance as a gradient.

    The relevance arriving at z is ``z ⊙ g`` (gradient × input); the rule's relevance of x is
    ``x⁺ ⊙ g⁺ + x⁻ ⊙ g⁻`` (:func:`~lrp_core.rules.functional.linear_gamma_factors`), so the gradient of x is
    ``[x > 0]·g⁺ + [x < 0]·g⁻``: x ⊙ it is the rule's relevance, with no division by x.
    """

    @staticmethod
    def forward(ctx, x: Tensor, layer: torch.nn.Module, gamma: float, epsilon: float) -> Tensor:
        z = layer(x)
        check_linear(layer, x, z, *effective_linear(layer))  # the map the backward reads is the layer's
        ctx.save_for_backward(x, z)
        ctx.layer, ctx.gamma, ctx.epsilon = layer, gamma, epsilon
        return z

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, z = ctx.saved_tensors
        # the map the layer computes (a peft adapter's weight added in), in z's dtype: a half-precision model's
        # weights are computed with in float32 (runtime.precision)
        weight, bias = effective_linear(ctx.layer)
        bias = None if bias is None else bias.detach().to(z.dtype)
        g_pos, g_neg = F.linear_gamma_factors(
            x, weight.detach().to(z.dtype), z * grad, ctx.gamma, ctx.epsilon, bias=bias, out=z
        )
        zero = g_pos.new_zeros(())
        return torch.where(x > 0, g_pos, torch.where(x < 0, g_neg, zero)), None, None, None


def _linear_rule(rule: GradientRule, x: Tensor, module, gamma: float, epsilon: float) -> Tensor:
    """``module(x)`` under the γ/ε-rule ``rule``; the module must be Linear-like (a 2-D ``weight`` (D_out, D_in))."""
    if not is_linear(module):
        raise UnsupportedModelError(
            f"{rule!r} is a Linear rule: it needs a layer with a 2-D weight (D_out, D_in), got {module!r}"
        )
    return _LinearRuleFn.apply(x, module, gamma, epsilon)


class GammaGradient(GradientRule):
    """The generalised γ-rule as a modified gradient (the LXT/zennit way: ``R = z ⊙ g`` at the output, the rule's
    relevance at the input, handed on as relevance ÷ input): :func:`~lrp_core.rules.functional.linear_gamma`,
    bias included, ε sign-matched. γ = 0 with ε = 0 is the plain gradient. docs/METHODS.md §1.14, §2b.1.
    """

    name = "gamma"
    kinds = (LINEAR,)

    def __init__(self, gamma: float = 0.25, epsilon: float = F.EPS):
        self.gamma = check_coefficient(type(self).__name__, "gamma", gamma)
        self.epsilon = check_coefficient(type(self).__name__, "epsilon", epsilon)

    def forward(self, fn, x, module=None):
        return _linear_rule(self, x, module, self.gamma, self.epsilon)

    def __repr__(self) -> str:
        eps = "" if self.epsilon == F.EPS else f", epsilon={self.epsilon:g}"
        return f"{type(self).__name__}({self.gamma:g}{eps})"


class EpsilonGradient(GradientRule):
    """The ε-rule as a modified gradient: the gradient of x is ``Wᵀ (z ⊙ g / (z + ε·sign z))`` — the plain
    gradient scaled per unit by ``z / (z + ε sign z)``, so ε = 0 is the plain gradient (:class:`Gradient`).
    docs/METHODS.md §1.14, §2b.1."""

    name = "epsilon"
    kinds = (LINEAR,)

    def __init__(self, epsilon: float):
        self.epsilon = check_coefficient(type(self).__name__, "epsilon", epsilon)

    def forward(self, fn, x, module=None):
        return _linear_rule(self, x, module, 0.0, self.epsilon)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.epsilon:g})"


# ----------------------------------------------------------------------------
# PA-LRP (Bakish et al., 2025): the position encodings as inputs of their own (docs/METHODS.md §2e)
# ----------------------------------------------------------------------------
class PositionLeaves:
    """The position tensors one PA-LRP replay took as inputs, each made a leaf that gradients are read at.

    One leaf per distinct tensor (the same rotary table feeds q and k of every block: their gradients add up
    there, which is the sum over blocks the paper takes). A leaf is the tensor expanded to the batch, so a
    (1, N, D) position table gets one gradient per sample. Make a fresh one per call (:func:`pa_lrp_composite`).
    """

    def __init__(self) -> None:
        self._leaves: dict[int, tuple[Tensor, Tensor, str]] = {}

    def leaf(self, t: Tensor, batch: int, kind: str) -> Tensor:
        """The leaf standing for ``t`` (…, N, C) with its first axis expanded to ``batch``; ``kind``: "rope" | "add"."""
        got = self._leaves.get(id(t))
        if got is None:
            shape = (batch,) + tuple(t.shape[1:])
            leaf = t.detach().expand(shape).clone().requires_grad_(True)
            got = self._leaves[id(t)] = (t, leaf, kind)  # t kept: its id stays unique while we hold it
        return got[1]

    @property
    def leaves(self) -> list[Tensor]:
        """Every leaf made, in the order first met."""
        return [leaf for _, leaf, _ in self._leaves.values()]


class PositionalRotary(GradientRule):
    """PA-LRP's RoPE rule: ``x·cos + rotate_half(x)·sin`` with ``cos`` and ``sin`` inputs, each product under the
    uniform rule (gradient ÷2 into x and into cos / sin; the authors' ``lf.mul2``); the sum gets the plain
    gradient (their ``lf.add2``). So half of the rotated q's (k's) relevance stays with q (k), half goes to the
    position tables. Partial rotary: the channels not rotated pass unchanged, undivided."""

    name = "positional_rotary"
    kinds = (ROPE,)

    def __init__(self, positions: PositionLeaves):
        self.positions = positions

    def forward(self, fn, x, cos, sin, module=None):
        c = self.positions.leaf(cos, x.shape[0], "rope")
        s = self.positions.leaf(sin, x.shape[0], "rope")

        def half(t: Tensor) -> Tensor:
            return _DivideGradientFn.apply(t, 2.0)

        r = cos.shape[-1]
        if r == x.shape[-1]:
            return fn(half(x), half(c), half(s))
        return torch.cat((fn(half(x[..., :r]), half(c), half(s)), x[..., r:]), dim=-1)


class PositionalAdd(GradientRule):
    """PA-LRP's rule for an added position embedding ``tokens + pos``: the position embedding is an input too;
    the sum passes the plain gradient (the ε-rule of an Add, ε → 0), so ``R_tokens + R_pos = R_sum``."""

    name = "positional_add"
    kinds = (POS_ADD,)

    def __init__(self, positions: PositionLeaves):
        self.positions = positions

    def forward(self, fn, tokens, pos, module=None):
        return fn(tokens, self.positions.leaf(pos, tokens.shape[0], "add"))


__all__ = [
    "IDENTITY_RULE_EPS",
    "Gradient",
    "GammaGradient",
    "EpsilonGradient",
    "IdentityRule",
    "DetachedStdLayerNorm",
    "HalvedGradient",
    "DetachedOperands",
    "DetachedRMSNorm",
    "DetachedGate",
    "FusedAttentionLRP",
    "FusedAttentionCP",
    "FusedAttentionCPHalved",
    "PositionLeaves",
    "PositionalRotary",
    "PositionalAdd",
]

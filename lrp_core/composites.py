"""Rule objects and composites: the one place where a relevance rule is chosen.

A relevance pass is made of a handful of operation kinds (:data:`OP_KINDS`).
Every step of the pass — the engine's block drivers, the readout, the input
layer — asks a :class:`Composite` for the rule of its kind and calls it, so a
new rule set is a new composite and nothing else (zennit's design).

One rule contract (:class:`Rule`), with two faces:

* ``relevance(op, R)``: the explicit backward step of the Deep Taylor
  Decomposition passes (``transformer_attribution``, ``lrp``, ``partial_lrp``):
  the relevance of the operation's output → one relevance per input.
* ``forward(fn, *inputs, module=None)``: the forward computation as the
  replay runs it. Plain rules compute ``fn(*inputs)``; modified-gradient rules
  (AttnLRP, CP-LRP: gradient × input with modified gradients) compute the same
  value with the gradient their paper prescribes.

Every rule uses the one stabiliser :data:`lrp_core.rules.EPS` through the
functions of :mod:`lrp_core.rules` (``docs/METHODS.md`` §1).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence, Union

import torch
from torch import Tensor, nn

from . import rules as F
from .errors import UnknownNameError, UnsupportedModelError

# ----------------------------------------------------------------------------
# operation kinds
# ----------------------------------------------------------------------------
LINEAR = "linear"  # nn.Linear: x (..., D_in) -> (..., D_out)
PATCH_CONV = "patch_conv"  # the patch embedding's Conv2d on pixels
LAYERNORM = "layernorm"  # LayerNorm (and RMSNorm-like normalisations)
ELEMENTWISE = "elementwise"  # element-wise non-linearities: GELU, tanh, ReLU, SiLU
SCALE = "scale"  # LayerScale: x ⊙ γ, linear and element-wise
SOFTMAX = "softmax"  # attention scores -> A
MATMUL_QK = "matmul_qk"  # q · kᵀ -> scores
MATMUL_AV = "matmul_av"  # A · v -> context
ADD = "add"  # residual Add u + v
CLONE = "clone"  # a tensor used by several branches
MASK_ADD = "mask_add"  # attention scores + additive padding mask
POS_ADD = "pos_add"  # tokens + position embedding
READOUT = "readout"  # selecting the token(s) the classifier reads
POOL = "pool"  # a weighted sum of tokens the classifier reads (average pooling): Σ_i w_i h_i

OP_KINDS = (LINEAR, PATCH_CONV, LAYERNORM, ELEMENTWISE, SCALE, SOFTMAX, MATMUL_QK, MATMUL_AV, ADD, CLONE, MASK_ADD,
            POS_ADD, READOUT, POOL)

RelevanceIn = Union[Tensor, Sequence[Tensor]]


@dataclass
class Op:
    """One operation of the replayed forward pass, as a rule sees it.

    Attributes:
        kind: one of :data:`OP_KINDS`.
        inputs: the forward inputs (e.g. ``(x,)`` for a Linear, ``(u, v)`` for an Add,
            ``(a, b)`` for a product ``a @ b``, ``(x,)`` for a Clone).
        output: the forward output, where the pass has it (rules may reuse it).
        module: the model's own submodule, for kinds that have one (Linear, Conv, norms).
    """

    kind: str
    inputs: tuple
    output: Optional[Tensor] = None
    module: Optional[nn.Module] = None


# ----------------------------------------------------------------------------
# the rule contract
# ----------------------------------------------------------------------------
class Rule:
    """A relevance rule. Subclasses override :meth:`relevance`, :meth:`forward`, or both."""

    name = "rule"

    def relevance(self, op: Op, R: RelevanceIn, cache: Optional[dict] = None) -> tuple[Tensor, ...]:
        """Relevance of ``op.inputs`` from the relevance ``R`` of its output (one tensor per input)."""
        raise NotImplementedError(f"{type(self).__name__} defines no explicit relevance step; it is a "
                                  "modified-gradient rule (use it through a replay with gradients)")

    def forward(self, fn: Callable[..., Tensor], *inputs: Tensor, module: Optional[nn.Module] = None) -> Tensor:
        """The operation's output as the replay computes it; plain rules just call ``fn``."""
        return fn(*inputs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Identity(Rule):
    """Relevance passes unchanged (element-wise layers, normalisations, softmax). docs/METHODS.md §1.2."""

    name = "identity"

    def relevance(self, op, R, cache=None):
        return (R,)


class SignedLinear(Rule):
    """:func:`lrp_core.rules.linear_signed` — α=1, β=0 on signed inputs, one shared denominator. docs/METHODS.md §1.1.

    Where the pass has the layer's output it is reused: one matrix product less.
    """

    name = "signed"

    def relevance(self, op, R, cache=None):
        m = op.module
        return (F.linear_signed(op.inputs[0], m.weight, R, out=op.output,
                                bias=getattr(m, "bias", None), cache=cache),)


class BaselineLinear(Rule):
    """:func:`lrp_core.rules.linear_baseline` — the LRP baseline's separate denominators. docs/METHODS.md §1.7."""

    name = "baseline"

    def relevance(self, op, R, cache=None):
        return (F.linear_baseline(op.inputs[0], op.module.weight, R),)


class NormalizedAdd(Rule):
    """:func:`lrp_core.rules.add_normalized` — generic share, then the paper's normalisation. docs/METHODS.md §1.3."""

    name = "normalized_add"

    def __init__(self, per_sample: bool = True):
        self.per_sample = per_sample

    def relevance(self, op, R, cache=None):
        u, v = op.inputs
        return F.add_normalized(u, v, R, per_sample=self.per_sample)


class GenericAdd(Rule):
    """:func:`lrp_core.rules.add_generic` — each operand its share ``u ⊙ R / (u + v)``.

    Where the pass has the sum (``op.output``), the share is formed from it.
    """

    name = "generic_add"

    def relevance(self, op, R, cache=None):
        u, v = op.inputs
        if op.output is None:
            return F.add_generic(u, v, R)
        s = F.safe_div(R, op.output)
        return tuple(None if t is None else t * s for t in (u, v))  # None: an operand whose share is not needed


class HalvedMatMul(Rule):
    """:func:`lrp_core.rules.matmul` with ``halve=True`` — both operands, each halved. docs/METHODS.md §1.5."""

    name = "halved_matmul"

    def relevance(self, op, R, cache=None):
        a, b = op.inputs
        return F.matmul(a, b, R, halve=True, z=op.output)


class Clone(Rule):
    """:func:`lrp_core.rules.clone` — the branches' relevances summed as ``x ⊙ Σ R_i / x``. docs/METHODS.md §1.4."""

    name = "clone"

    def relevance(self, op, R, cache=None):
        return (F.clone(*R, x=op.inputs[0]),)


class Select(Rule):
    """:func:`lrp_core.rules.select` — relevance to the token the classifier reads. docs/METHODS.md §1.6."""

    name = "select"

    def relevance(self, op, R, cache=None):
        return (F.select(op.inputs[0], R),)


class WeightedSum(Rule):
    """:func:`lrp_core.rules.weighted_sum` — the generic rule on a pooled token ``Σ_i w_i h_i``. docs/METHODS.md §4.4.

    ``op.inputs`` = (tokens (B, n, D), weights (B or 1, n)); the weights are constants (relevance ``None``).
    """

    name = "weighted_sum"

    def relevance(self, op, R, cache=None):
        x, w = op.inputs
        return F.weighted_sum(x, w, R, out=op.output), None


class ZBox(Rule):
    """:func:`lrp_core.rules.zbox_conv2d` — zᴮ on the pixels, bounds per sample. docs/METHODS.md §1.8."""

    name = "zbox"

    def relevance(self, op, R, cache=None):
        conv = op.module
        return (F.zbox_conv2d(op.inputs[0], conv.weight, R, stride=conv.stride, padding=conv.padding),)


# ----------------------------------------------------------------------------
# composites
# ----------------------------------------------------------------------------
@dataclass
class Composite:
    """Maps operation kinds (and, optionally, module types) to rules.

    ``rules`` maps every kind of :data:`OP_KINDS` the pass meets to a rule;
    ``modules`` overrides it for submodules of a given type (looked up along
    the MRO, so a subclass of ``nn.Linear`` gets the ``nn.Linear`` entry).
    """

    name: str
    rules: Mapping[str, Rule]
    modules: Mapping[type, Rule] = field(default_factory=dict)

    def rule(self, kind: str, module: Optional[nn.Module] = None) -> Rule:
        if module is not None:
            for cls in type(module).__mro__:
                if cls in self.modules:
                    return self.modules[cls]
        try:
            return self.rules[kind]
        except KeyError:
            raise UnknownNameError(f"composite {self.name!r} has no rule for operation {kind!r}; "
                           f"it covers {', '.join(self.rules)}") from None

    def with_rules(self, name: str, **rules: Rule) -> "Composite":
        """A copy with some kinds' rules replaced (``name`` names the new rule set)."""
        return Composite(name=name, rules={**self.rules, **rules}, modules=dict(self.modules))


class Propagation:
    """One explicit relevance pass: a composite, and a cache for the weights' signed parts.

    ``cache=True`` keeps each weight's parts for the rest of the pass: worth it only when a
    weight is used again (ALBERT's shared layer). Otherwise the parts are made and dropped
    layer by layer, so the pass never holds more than one layer's (BERT-base: about 1 GB less).
    """

    def __init__(self, composite: Composite, cache: bool = False):
        self.composite = composite
        self.cache: Optional[dict] = {} if cache else None

    def __call__(self, kind: str, inputs: tuple, R: RelevanceIn, output: Optional[Tensor] = None,
                 module: Optional[nn.Module] = None) -> tuple[Tensor, ...]:
        op = Op(kind, inputs, output, module)
        return self.composite.rule(kind, module).relevance(op, R, self.cache)

    # one-input shorthands
    def linear(self, module: nn.Module, x: Tensor, R: Tensor, out: Optional[Tensor] = None) -> Tensor:
        return self(LINEAR, (x,), R, out, module)[0]

    def unary(self, kind: str, x: Tensor, R: Tensor, module: Optional[nn.Module] = None) -> Tensor:
        return self(kind, (x,), R, None, module)[0]

    def clone(self, x: Tensor, *Rs: Tensor) -> Tensor:
        return self(CLONE, (x,), Rs)[0]


def _identities() -> dict[str, Rule]:
    return {LAYERNORM: Identity(), ELEMENTWISE: Identity(), SCALE: Identity(), SOFTMAX: Identity()}


#: The rules of Chefer et al. (CVPR 2021), used by ``transformer_attribution``.
TRANSFORMER_ATTRIBUTION = Composite(
    name="transformer_attribution",
    rules={LINEAR: SignedLinear(), PATCH_CONV: ZBox(), **_identities(), ADD: NormalizedAdd(),
           MASK_ADD: NormalizedAdd(), POS_ADD: GenericAdd(), MATMUL_QK: HalvedMatMul(),
           MATMUL_AV: HalvedMatMul(), CLONE: Clone(), READOUT: Select(), POOL: WeightedSum()},
)

#: The LRP baseline (``lrp``, ``partial_lrp``): no Add normalisation, separate denominators.
LRP_BASELINE = TRANSFORMER_ATTRIBUTION.with_rules(
    "lrp_baseline", **{LINEAR: BaselineLinear(), ADD: GenericAdd(), MASK_ADD: GenericAdd()})

# ----------------------------------------------------------------------------
# modified-gradient rules: AttnLRP and CP-LRP as gradient × input (docs/METHODS.md §2b)
# ----------------------------------------------------------------------------
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


class Gradient(Rule):
    """The plain gradient: Linear/Conv (ε-rule with ε → 0), Add, Clone, LayerScale, softmax under AttnLRP."""

    name = "gradient"


class IdentityRule(Rule):
    """Element-wise non-linearity: gradient replaced by ``f(x) / (x + 1e-10)`` (AttnLRP Prop. 3.1's identity rule).

    Relevance passes through the non-linearity unchanged: ``x ⊙ f(x)/x · ∂y/∂f = f(x) ⊙ ∂y/∂f``.
    """

    name = "identity_rule"

    def forward(self, fn, x, module=None):
        return _IdentityRuleFn.apply(x, fn)


class DetachedStdLayerNorm(Rule):
    """LayerNorm with ``sqrt(var + eps)`` a constant: mean-centring, γ and β stay linear (AttnLRP §3.3, CP-LRP).

    A normalisation module with a ``denominator(x)`` method (CLIP's L2 normalisation) has that divisor held constant.
    """

    name = "detached_std"

    def forward(self, fn, x, module=None):
        if hasattr(module, "denominator"):  # a normalisation that names its divisor (e.g. CLIP's L2 norm)
            return x / module.denominator(x).detach()
        if module is None or len(getattr(module, "normalized_shape", (0, 0))) != 1:
            raise UnsupportedModelError(f"{type(self).__name__} needs a LayerNorm over the last dimension, got {module!r}")
        mean = x.mean(dim=-1, keepdim=True)
        centred = x - mean
        # the std, γ and β are constants of the pass (no parameter gradients are taken): built from
        # detached tensors, autograd keeps no activation-sized tensor for them — the same values
        std = (centred.detach().pow(2).mean(dim=-1, keepdim=True) + module.eps).sqrt()  # biased, as LayerNorm
        y = centred / std
        if module.weight is not None:
            y = y * module.weight.detach()
        if module.bias is not None:
            y = y + module.bias.detach()
        return y


class HalvedGradient(Rule):
    """A product of two activations, each operand's gradient halved: AttnLRP's uniform rule (Prop. 3.2)."""

    name = "halved_gradient"

    def forward(self, fn, a, b, module=None):
        return fn(_DivideGradientFn.apply(a, 2.0), _DivideGradientFn.apply(b, 2.0))


class DetachedOperands(Rule):
    """A product of two activations taken as constants (CP-LRP: Q and K detached, the attention weights fixed)."""

    name = "detached"

    def forward(self, fn, *inputs, module=None):
        return fn(*(t.detach() for t in inputs))


def _gradient_everywhere() -> dict[str, Rule]:
    return {kind: Gradient() for kind in OP_KINDS}


#: AttnLRP (Achtibat et al., ICML 2024), LXT 2.1's efficient mode: ``attnlrp``.
ATTNLRP = Composite(
    name="attnlrp",
    rules={**_gradient_everywhere(), LAYERNORM: DetachedStdLayerNorm(), ELEMENTWISE: IdentityRule(),
           MATMUL_QK: HalvedGradient(), MATMUL_AV: HalvedGradient()},
)

#: CP-LRP (Ali et al., ICML 2022): AttnLRP's rules, but Q and K detached and no halving: ``cp_lrp``.
CP_LRP = ATTNLRP.with_rules("cp_lrp", **{MATMUL_QK: DetachedOperands(), MATMUL_AV: Gradient()})


__all__ = [
    "OP_KINDS", "LINEAR", "PATCH_CONV", "LAYERNORM", "ELEMENTWISE", "SCALE", "SOFTMAX", "MATMUL_QK", "MATMUL_AV", "ADD",
    "CLONE", "MASK_ADD", "POS_ADD", "READOUT", "POOL", "Op", "Rule", "Identity", "SignedLinear", "BaselineLinear",
    "NormalizedAdd", "GenericAdd", "HalvedMatMul", "Clone", "Select", "WeightedSum", "ZBox", "Composite",
    "Propagation", "TRANSFORMER_ATTRIBUTION", "LRP_BASELINE", "IDENTITY_RULE_EPS", "Gradient", "IdentityRule",
    "DetachedStdLayerNorm", "HalvedGradient", "DetachedOperands", "ATTNLRP", "CP_LRP",
]


# ----------------------------------------------------------------------------
# decoder operations (issue #22: Llama, Mistral, Qwen2/3, Gemma 3, GPT-2, Phi-3; docs/METHODS.md §2c)
# ----------------------------------------------------------------------------
RMSNORM = "rmsnorm"  # RMSNorm x·rsqrt(mean(x²)+ε)·w (Gemma: ·(1+w)); also per-head q/k norms
ROPE = "rope"  # rotary position embedding of q or k: inputs (x, cos, sin), rotating the first cos.shape[-1] channels
KV_REPEAT = "kv_repeat"  # key/value heads shared by several query heads (GQA/MQA): (B, Hkv, N, d) -> (B, H, N, d)
GATE_MUL = "gate_mul"  # the gated MLP's product act(gate(x)) ⊙ up(x): inputs (act(gate), up)
ATTENTION = "attention"  # fused softmax(q·kᵀ·scale + bias)·v (sdpa), inputs (q, k, v) with k, v not repeated

DECODER_KINDS = (RMSNORM, ROPE, KV_REPEAT, GATE_MUL, ATTENTION)
OP_KINDS = OP_KINDS + DECODER_KINDS


def norm_kind(module: nn.Module) -> str:
    """The operation kind of a normalisation module: RMSNORM for RMSNorm-like modules, else LAYERNORM."""
    if "RMSNorm" in type(module).__name__ or hasattr(module, "variance_epsilon"):
        return RMSNORM
    return LAYERNORM


class Rotary(Rule):
    """RoPE, a bias-free linear map given the positions: the generic DTD rule ``x ⊙ Rotᵀ safe_div(R, Rot x)``.

    Conserves up to the stabiliser (docs/METHODS.md §2c). ``op.inputs`` = (x, cos, sin), ``op.output`` = Rot x.
    """

    name = "rotary"

    def relevance(self, op, R, cache=None):
        x, cos, sin = op.inputs
        z = F.apply_rotary(x, cos, sin) if op.output is None else op.output
        return x * F.rotary_transpose(F.safe_div(R, z), cos, sin), None, None


class SharedHeads(Rule):
    """Shared key/value heads are a Clone: the relevances of the query heads sharing a head are summed into it.

    ``op.inputs`` = (kv (B, Hkv, N, d),); R (B, H, N, d) with H = Hkv·groups (consecutive query heads per kv head).
    """

    name = "shared_heads"

    def relevance(self, op, R, cache=None):
        (kv,) = op.inputs
        B, Hkv, N, d = kv.shape
        groups = R.shape[1] // Hkv
        if groups == 1:
            return (R,)
        parts = R.reshape(B, Hkv, groups, N, d).unbind(2)
        return (F.clone(*parts, x=kv),)


class HalvedProduct(Rule):
    """An element-wise product of two activations ``z = a ⊙ b`` (gated MLP): the generic rule per operand, halved.

    ``R_a = a ⊙ ∂z/∂a ⊙ s / 2 = z ⊙ s / 2`` and likewise ``R_b``, with ``s = safe_div(R, z)`` (§1's MatMul
    rule, element-wise: each operand's share is the whole product's, so both get half of it).
    """

    name = "halved_product"

    def relevance(self, op, R, cache=None):
        a, b = op.inputs
        z = a * b if op.output is None else op.output
        half = z * F.safe_div(R, z) / 2
        return half, half


class DetachedRMSNorm(Rule):
    """RMSNorm with ``rsqrt(mean(x²)+ε)`` a constant, γ linear — LXT's patch, in LXT's arithmetic.

    Llama-style modules (``variance_epsilon``; Llama, Mistral, Qwen2/3): computed in float32 and cast back
    before ``w ·`` (so a float64 model rounds here, as the model and LXT do). Gemma-style modules (``eps``,
    weight ``1 + w``): ``_norm`` on ``x.float()`` with the factor detached, times ``(1 + w)``, cast back.
    """

    name = "detached_rms"

    def forward(self, fn, x, module=None):
        w = module.weight.detach()
        if hasattr(module, "variance_epsilon"):
            dtype = x.dtype
            h = x.to(torch.float32)
            variance = h.pow(2).mean(-1, keepdim=True)
            h = h * torch.rsqrt(variance + module.variance_epsilon).detach()
            return w * h.to(dtype)
        if hasattr(module, "eps"):
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + module.eps).detach()
            return (h * (1.0 + w.float())).type_as(x)
        raise UnsupportedModelError(f"{type(self).__name__}: {type(module).__name__} is not an RMSNorm "
                                    "(expected variance_epsilon or eps)")


class DetachedGate(Rule):
    """CP-LRP's gated product: the gate (first operand) a constant, no halving."""

    name = "detached_gate"

    def forward(self, fn, a, b, module=None):
        return fn(a.detach(), b)


class FusedAttentionLRP(Rule):
    """AttnLRP on a fused attention (sdpa): the gradient into q and k ÷4, into v ÷2, then the plain kernel.

    The same gradient as the ÷2 rules at ``q·kᵀ`` and ``A·v`` with the plain softmax gradient between them
    (powers of two commute with every step), without the N×N attention in memory.
    """

    name = "fused_attnlrp"

    def forward(self, fn, q, k, v, module=None):
        return fn(_DivideGradientFn.apply(q, 4.0), _DivideGradientFn.apply(k, 4.0), _DivideGradientFn.apply(v, 2.0))


class FusedAttentionCP(Rule):
    """CP-LRP on a fused attention: q and k detached (the attention weights constant), linear in v."""

    name = "fused_cp"

    def forward(self, fn, q, k, v, module=None):
        return fn(q.detach(), k.detach(), v)


class NoExplicitFusedAttention(Rule):
    """Explicit passes need the attention map A: the replay computes attention eagerly for them."""

    name = "eager_only"

    def relevance(self, op, R, cache=None):
        raise UnsupportedModelError("an explicit relevance pass needs the attention map: replay the attention "
                                    "eagerly (the fused kind is for modified-gradient rules only)")


_DECODER_EXPLICIT = {RMSNORM: Identity(), ROPE: Rotary(), KV_REPEAT: SharedHeads(), GATE_MUL: HalvedProduct(),
                     ATTENTION: NoExplicitFusedAttention()}
TRANSFORMER_ATTRIBUTION = TRANSFORMER_ATTRIBUTION.with_rules("transformer_attribution", **_DECODER_EXPLICIT)
LRP_BASELINE = LRP_BASELINE.with_rules("lrp_baseline", **_DECODER_EXPLICIT)
ATTNLRP = ATTNLRP.with_rules("attnlrp", **{RMSNORM: DetachedRMSNorm(), ROPE: Gradient(), KV_REPEAT: Gradient(),
                                           GATE_MUL: HalvedGradient(), ATTENTION: FusedAttentionLRP()})
CP_LRP = CP_LRP.with_rules("cp_lrp", **{RMSNORM: DetachedRMSNorm(), ROPE: Gradient(), KV_REPEAT: Gradient(),
                                        GATE_MUL: DetachedGate(), ATTENTION: FusedAttentionCP()})

__all__ += ["RMSNORM", "ROPE", "KV_REPEAT", "GATE_MUL", "ATTENTION", "DECODER_KINDS", "norm_kind", "Rotary", "SharedHeads", "HalvedProduct",
            "DetachedRMSNorm", "DetachedGate", "FusedAttentionLRP", "FusedAttentionCP", "NoExplicitFusedAttention"]

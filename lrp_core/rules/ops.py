"""The vocabulary of a relevance pass: operation kinds, the two kinds of pass, and their rule contracts.

A relevance pass is made of a handful of operation kinds (:data:`OP_KINDS`). Two kinds of pass, one rule
contract each (:data:`PASS_KINDS`):

* :class:`ExplicitRule` — ``relevance(op, R)``: the explicit backward step of the Deep Taylor Decomposition
  passes (``transformer_attribution``, ``lrp``, ``partial_lrp``; docs/METHODS.md §1), driven by
  as the backward of the operation in the replay (:class:`lrp_core.adapters.replay.Replay`): the relevance of the
  operation's output → one relevance per input.
  The rules are in :mod:`lrp_core.rules.explicit`.
* :class:`GradientRule` — ``forward(fn, *inputs, module=None)``: the forward computation with the gradient a
  modified-gradient method prescribes (AttnLRP, CP-LRP: gradient × input; docs/METHODS.md §2b), driven by
  :class:`lrp_core.adapters.replay.Replay`. The rules are in :mod:`lrp_core.rules.gradient`.

Which rule each operation gets is chosen in one place: :mod:`lrp_core.rules.composites`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

from torch import Tensor, nn

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
# decoders (docs/METHODS.md §2c)
RMSNORM = "rmsnorm"  # RMSNorm x·rsqrt(mean(x²)+ε)·w (Gemma: ·(1+w)); also per-head q/k norms
ROPE = "rope"  # rotary position embedding of q or k: inputs (x, cos, sin), rotating the first cos.shape[-1] channels
KV_REPEAT = "kv_repeat"  # key/value heads shared by several query heads (GQA/MQA): (B, Hkv, N, d) -> (B, H, N, d)
GATE_MUL = "gate_mul"  # the gated MLP's product act(gate(x)) ⊙ up(x): inputs (act(gate), up)
ATTENTION = "attention"  # fused softmax(q·kᵀ·scale + bias)·v (sdpa), inputs (q, k, v) with k, v not repeated
# mixture-of-experts MLPs (docs/METHODS.md §2c.4); the product w_e · expert_e(x) is a GATE_MUL
ROUTE = "route"  # router logits -> routing weights: inputs (logits (T, E), chosen experts (T, k)) for softmax, top-k
#                  (renormalised where configured); (logit (T, 1),) for a shared expert's sigmoid gate
EXPERT_SUM = "expert_sum"  # Σ of the weighted experts' outputs per token: inputs (parts (P, D), their tokens (P,))

#: every operation kind, encoders' then decoders'
OP_KINDS = (
    LINEAR,
    PATCH_CONV,
    LAYERNORM,
    ELEMENTWISE,
    SCALE,
    SOFTMAX,
    MATMUL_QK,
    MATMUL_AV,
    ADD,
    CLONE,
    MASK_ADD,
    POS_ADD,
    READOUT,
    POOL,
    RMSNORM,
    ROPE,
    KV_REPEAT,
    GATE_MUL,
    ATTENTION,
    ROUTE,
    EXPERT_SUM,
)
DECODER_KINDS = (RMSNORM, ROPE, KV_REPEAT, GATE_MUL, ATTENTION, ROUTE, EXPERT_SUM)
#: the kinds whose operations are modules of the model (layers): those a ``first`` entry can name
LAYER_KINDS = (LINEAR, PATCH_CONV, LAYERNORM, RMSNORM, ELEMENTWISE, SCALE)

# ----------------------------------------------------------------------------
# kinds of pass
# ----------------------------------------------------------------------------
EXPLICIT = "explicit"  # an explicit relevance pass (the replay's backward): rule.relevance(op, R)
MODIFIED_GRADIENT = "modified_gradient"  # a replay with modified gradients (Replay): rule.forward(fn, *inputs)
PASS_KINDS = (EXPLICIT, MODIFIED_GRADIENT)

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
# the rule contracts
# ----------------------------------------------------------------------------
class Rule:
    """What every rule has: a name, the kind of pass it serves (``serves``, one of :data:`PASS_KINDS`) and the
    operation kinds it can serve (``kinds``; ``None``: any, the rule takes what it is given).

    A rule derives from :class:`ExplicitRule` or :class:`GradientRule`, never from ``Rule`` itself:
    a composite refuses a rule that serves no kind of pass, and a rule mapped to an operation kind outside
    its ``kinds``.
    """

    name = "rule"
    serves = ""
    kinds: Optional[tuple[str, ...]] = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class ExplicitRule(Rule):
    """A rule of the explicit relevance passes (docs/METHODS.md §1): the backward of its operation in the replay.

    Subclasses define :meth:`relevance`.
    """

    serves = EXPLICIT

    def relevance(self, op: Op, R: RelevanceIn, cache: Optional[dict] = None) -> tuple[Tensor, ...]:
        """Relevance of ``op.inputs`` from the relevance ``R`` of its output (one tensor per input, ``None`` for
        an input whose relevance is not needed). ``cache``: the pass's store for the weights' parts."""
        raise NotImplementedError(f"{type(self).__name__} must define relevance(op, R, cache)")


class GradientRule(Rule):
    """A rule of the modified-gradient replays (docs/METHODS.md §2b.1), driven by
    :class:`lrp_core.adapters.replay.Replay`: the operation's forward value, with the gradient the rule prescribes.

    Subclasses override :meth:`forward`; the default is the operation itself (the plain gradient).
    """

    serves = MODIFIED_GRADIENT

    def forward(self, fn: Callable[..., Tensor], *inputs: Tensor, module: Optional[nn.Module] = None) -> Tensor:
        """The operation's output ``fn(*inputs)`` as the replay computes it (``module``: the model's own, if any)."""
        return fn(*inputs)


__all__ = [
    "LINEAR",
    "PATCH_CONV",
    "LAYERNORM",
    "ELEMENTWISE",
    "SCALE",
    "SOFTMAX",
    "MATMUL_QK",
    "MATMUL_AV",
    "ADD",
    "CLONE",
    "MASK_ADD",
    "POS_ADD",
    "READOUT",
    "POOL",
    "RMSNORM",
    "ROPE",
    "KV_REPEAT",
    "GATE_MUL",
    "ATTENTION",
    "ROUTE",
    "EXPERT_SUM",
    "OP_KINDS",
    "DECODER_KINDS",
    "LAYER_KINDS",
    "EXPLICIT",
    "MODIFIED_GRADIENT",
    "PASS_KINDS",
    "RelevanceIn",
    "Op",
    "Rule",
    "ExplicitRule",
    "GradientRule",
]

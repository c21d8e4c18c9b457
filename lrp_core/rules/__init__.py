"""The rules and the rule sets.

- :mod:`.functional` — every rule as a plain-tensor function (the course calls them directly)
- :mod:`.ops` — the operation kinds of a pass and the two rule contracts (explicit, modified-gradient)
- :mod:`.explicit`, :mod:`.gradient` — the rule objects of each kind of pass
- :mod:`.composites` — the rule sets: the one place a rule is chosen for an operation

A user's rule set is one line from here, passed to ``explain(..., composite=...)``::

    from lrp_core.rules import ATTNLRP, GammaGradient
    gamma_mlps = ATTNLRP.with_rules(by_name={"blocks.*.mlp.*": GammaGradient(0.25)})
"""

from .composites import ATTNLRP, CP_LRP, LRP_BASELINE, TRANSFORMER_ATTRIBUTION, Composite
from .explicit import EpsilonLinear, GammaLinear
from .gradient import EpsilonGradient, GammaGradient, Gradient
from .ops import (
    ADD,
    ATTENTION,
    CLONE,
    ELEMENTWISE,
    EXPERT_SUM,
    GATE_MUL,
    KV_REPEAT,
    LAYERNORM,
    LINEAR,
    MASK_ADD,
    MATMUL_AV,
    MATMUL_QK,
    OP_KINDS,
    PATCH_CONV,
    POOL,
    POS_ADD,
    READOUT,
    RMSNORM,
    ROPE,
    ROUTE,
    SCALE,
    SOFTMAX,
    ExplicitRule,
    GradientRule,
)

__all__ = [
    "Composite",
    "TRANSFORMER_ATTRIBUTION",
    "LRP_BASELINE",
    "ATTNLRP",
    "CP_LRP",
    "GammaLinear",
    "EpsilonLinear",
    "GammaGradient",
    "EpsilonGradient",
    "Gradient",
    "ExplicitRule",
    "GradientRule",
    "OP_KINDS",
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
]

"""The rule boundary of the fast half-precision mode (:mod:`lrp_core.runtime.fast_half`).

In a modified-gradient replay of a float16 / bfloat16 model computed in its own dtype, each operation's rule
runs either

* **in half precision** (:data:`HALF_RULES`), when every step of it is a product, a sum, a detach or a division
  by a power of two (exact in any binary dtype), or when the rule already computes its ill-conditioned steps in
  float32 as the model does: the plain gradient (Linear, Add, the embedding, ``q·kᵀ`` and ``A·v`` under CP-LRP),
  AttnLRP's ÷2 / ÷4 splits, CP-LRP's detached operands and gate, the fused attention rules, PA-LRP's position
  rules, the RMSNorm rule (its statistics and detached divisor in float32, cast back, as Hugging Face and torch
  compute an RMSNorm) and the identity rule (the element-wise function in half as the model computes it; the
  ratio ``f(x) / (x + 1e-10)`` of its backward in float32: in float16 the 1e-10 would underflow and ``x = 0``
  divide by zero) — the matrix products, where the time goes, keep the half kernels; or
* **in float32** (:data:`LIFTED_RULES`: the LayerNorm rule, which computes its mean and std by hand): the half
  inputs upcast, the rule computed on them, the output cast back (no activation-sized float32 tensor is kept for
  the backward: the std is a constant);
* the **softmax** under the plain gradient: its forward in half, as the model's (:class:`_SoftmaxFloat32Grad`);
  its gradient ``A ⊙ (g − Σ A g)``, a difference that cancels, recomputed in float32 from the saved half scores
  (a transient float32 map per block in the backward, none kept between).

Any other rule (a user's ``composite=`` with γ / ε Linear rules, whose divisions are ill-conditioned) is refused
in the fast mode with the rules it runs named.

Shapes: as the operation's (the rule sees its usual inputs, in float32 where lifted).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor, nn

from ..errors import InputError
from .gradient import (
    DetachedGate,
    DetachedOperands,
    DetachedRMSNorm,
    DetachedStdLayerNorm,
    FusedAttentionCP,
    FusedAttentionCPHalved,
    FusedAttentionLRP,
    Gradient,
    HalvedGradient,
    IdentityRule,
    PositionalAdd,
    PositionalRotary,
)
from .ops import SOFTMAX, GradientRule

#: rules run in half precision: products, sums, detaches, divisions by powers of two; the RMSNorm and identity
#: rules compute their divisions in float32 themselves
HALF_RULES: tuple[type, ...] = (
    Gradient,
    DetachedRMSNorm,
    IdentityRule,
    HalvedGradient,
    DetachedOperands,
    DetachedGate,
    FusedAttentionLRP,
    FusedAttentionCP,
    FusedAttentionCPHalved,
    PositionalRotary,
    PositionalAdd,
)
#: rules computed in float32 on upcast inputs: the LayerNorm rule's mean and std, computed by hand
LIFTED_RULES: tuple[type, ...] = (DetachedStdLayerNorm,)
_HALF = (torch.float16, torch.bfloat16)


def half_dtype(inputs: tuple) -> Optional[torch.dtype]:
    """The half dtype of the first float16 / bfloat16 tensor among ``inputs`` (``None``: none is half).

    Only the fast mode hands a rule half tensors: the float32 mode shows every half tensor as float32."""
    for t in inputs:
        if isinstance(t, Tensor) and t.dtype in _HALF:
            return t.dtype
    return None


class _SoftmaxFloat32Grad(torch.autograd.Function):
    """``A = fn(s)`` in the scores' dtype (the model's softmax), whose backward is the gradient of ``fn`` computed in
    float32 from the saved half scores ``s`` (B, H, N, M): ``fn`` run again on ``s`` upcast, differentiated there."""

    @staticmethod
    def forward(ctx, s: Tensor, fn: Callable[[Tensor], Tensor]) -> Tensor:
        ctx.fn = fn
        ctx.save_for_backward(s)
        return fn(s)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (s,) = ctx.saved_tensors
        with torch.enable_grad():
            up = s.detach().float().requires_grad_(True)
            A = ctx.fn(up)
            (g,) = torch.autograd.grad(A, up, grad.to(A.dtype))
        return g.to(s.dtype), None


def lifted(kind: str, rule: GradientRule) -> bool:
    """Whether ``rule`` at an operation of ``kind`` is computed in float32 in the fast mode."""
    return type(rule) in LIFTED_RULES


def half_forward(
    rule: GradientRule,
    kind: str,
    fn: Callable[..., Tensor],
    inputs: tuple,
    module: Optional[nn.Module],
    dtype: torch.dtype,
) -> Tensor:
    """``rule.forward(fn, *inputs)`` in the fast mode: in half, or in float32 and cast back to ``dtype`` (see the
    module docstring).

    Parameters
    ----------
    rule : GradientRule
        The operation's rule.
    kind : str
        The operation kind.
    fn : callable
        The operation (the model's module or function).
    inputs : tuple
        Its inputs (half tensors, and others).
    module : nn.Module, optional
        The model's module, if any.
    dtype : torch.dtype
        The model's half dtype.

    Returns
    -------
    Tensor
        The operation's output, in ``dtype`` (or as ``fn`` gives it, for a rule run in half).

    Raises
    ------
    InputError
        For a rule the fast mode does not run.
    """
    if kind == SOFTMAX and type(rule) is Gradient and len(inputs) == 1:
        return _SoftmaxFloat32Grad.apply(inputs[0], fn)
    if lifted(kind, rule):
        up = tuple(t.float() if isinstance(t, Tensor) and t.dtype in _HALF else t for t in inputs)
        out = rule.forward(fn, *up, module=module)
        return out.to(dtype)
    if type(rule) in HALF_RULES:
        return rule.forward(fn, *inputs, module=module)
    runs = ", ".join(r.__name__ for r in HALF_RULES + LIFTED_RULES)
    raise InputError(
        f"the fast half-precision mode (dtype=torch.{str(dtype).replace('torch.', '')}) does not run the rule "
        f"{rule!r} (operation {kind!r}): its steps were not checked in half precision (γ / ε rules divide by sums "
        f"that nearly cancel). It runs {runs}; explain this rule set with dtype=None (float32 from the same "
        "half weights)"
    )


__all__ = ["HALF_RULES", "LIFTED_RULES", "half_dtype", "lifted", "half_forward"]

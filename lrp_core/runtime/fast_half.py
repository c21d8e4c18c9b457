"""The fast half-precision mode: a float16 / bfloat16 model explained in its own dtype where that is safe.

``explain(model, inputs, method=..., dtype=torch.bfloat16)`` on a bfloat16 model (``torch.float16`` on a float16
one) enters :func:`fast_half` instead of the float32 mode of :mod:`lrp_core.runtime.precision`:

* no operation is upcast: the replay's matrix products (Linear, ``q·kᵀ``, ``A·v``, sdpa, the embedding look-up)
  and their backward run in the model's dtype, on the model's own weights — the half kernels (float32
  accumulation where the kernel has it: torch's CPU and CUDA half matmuls do), with no Python dispatch per
  operation and no float32 copy of any weight;
* the ill-conditioned steps of the rules are lifted to float32 at the rule boundary
  (:func:`lrp_core.rules.half.half_forward`): the norms' statistics and their detached divisors, the identity
  rule's ratio ``f(x) / (x + 1e-10)``, the softmax and its gradient; the explained logit, the start relevance and
  the per-token sums of relevance are float32 (:func:`lift`);
* autocast is switched off inside, as in the float32 mode.

Which methods run so (:data:`FAST_METHODS`), which refuse (:func:`check_method`), the tolerance the verification
uses (:data:`lrp_core.adapters.verification.TOLERANCE`) and the deviations measured: ``docs/METHODS.md`` §5.9.
The float32 mode (``dtype=None``) stays the default and the exact reference.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Optional

import torch
from torch import Tensor, nn

#: the dtypes the fast mode computes in (the model's own)
FAST = (torch.float16, torch.bfloat16)

#: the methods the fast mode runs: the modified-gradient replays and input × gradient (their steps are products,
#: sums, detaches and powers of two, exact enough in half; the rest is lifted to float32)
FAST_METHODS = ("attnlrp", "cp_lrp", "pa_lrp", "input_x_gradient")

#: why the other methods are refused in the fast mode, by method (default: :data:`_OTHER`)
_WHY = {
    "lrp": "its explicit ε / z-rules divide by sums that nearly cancel at every layer (ill-conditioned even in "
    "float32, docs/METHODS.md §5.10)",
    "partial_lrp": "its explicit rules divide by sums that nearly cancel (docs/METHODS.md §5.10)",
    "transformer_attribution": "its explicit rules divide by sums that nearly cancel (docs/METHODS.md §5.10)",
}
_OTHER = "it is not among the methods whose steps were checked in half precision"


def name(dtype: torch.dtype) -> str:
    """``"bfloat16"`` for ``torch.bfloat16``: a dtype as messages name it."""
    return str(dtype).replace("torch.", "")


def model_dtype(model: nn.Module) -> Optional[torch.dtype]:
    """The half dtype of ``model``'s floating parameters, if they are all of one half dtype (float32 parameters
    beside them allowed: modules transformers keeps in float32); else ``None``.

    Parameters
    ----------
    model : nn.Module
        The model.

    Returns
    -------
    torch.dtype or None
        ``torch.float16`` or ``torch.bfloat16``, or ``None`` (a float32 / float64 model, or both half dtypes).
    """
    halves = {p.dtype for p in model.parameters() if p.dtype in FAST}
    return halves.pop() if len(halves) == 1 else None


def check_model(model: nn.Module, dtype: torch.dtype) -> None:
    """Refuse the fast mode ``dtype`` for a model whose weights are not in that half dtype.

    Raises
    ------
    InputError
        Naming the model's dtype and the ``dtype=`` values accepted for it.
    """
    from ..errors import InputError

    own = model_dtype(model)
    if own == dtype:
        return
    if own is None:
        first = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.get_default_dtype())
        have = name(first)
        accepted = "None (its own precision) or torch.float64" if first == torch.float32 else "None"
        cast = f" (or cast the model: model.to(torch.{name(dtype)}))"
    else:
        have, accepted, cast = name(own), f"torch.{name(own)} (the fast mode), None (float32) or torch.float64", ""
    raise InputError(
        f"dtype=torch.{name(dtype)} is the fast half-precision mode: it computes a {name(dtype)} model in its own "
        f"dtype, but this model is {have}; for it dtype may be {accepted}{cast}"
    )


def check_method(method: str, dtype: torch.dtype) -> None:
    """Refuse a method the fast mode does not run.

    Raises
    ------
    InputError
        Naming the method, why, and the methods that run in the fast mode.
    """
    from ..errors import InputError

    if method in FAST_METHODS:
        return
    raise InputError(
        f"method {method!r} does not run in the fast half-precision mode (dtype=torch.{name(dtype)}): "
        f"{_WHY.get(method, _OTHER)}. The fast mode runs {', '.join(FAST_METHODS)}; explain {method!r} with "
        "dtype=None (computed in float32 from the same half weights, exact) or dtype=torch.float64"
    )


def lift(t: Tensor) -> Tensor:
    """``t`` in float32 if it is float16 / bfloat16 (a graph through the cast), else ``t`` itself (so the float32
    and float64 passes are unchanged, bit for bit)."""
    return t.float() if t.dtype in FAST else t


#: float16's start scales are powers of two 2^k, k ≤ this (bfloat16 has float32's range and needs none)
_MOST_SCALE = 24
#: how much a start scale is lowered after an overflow (2^-this), and the fewest tries before giving up
_STEP = 6


def start_scale(t: Tensor) -> int:
    """The exponent k of the first start scale 2^k for a float16 backward whose input-side leaf is ``t`` (B, N, D):
    2^k ≈ N·D / 4, the elements of one row — relevance spread over them, divided by activations of order one, is
    a gradient of order 1 / (N·D), below float16's smallest normal (6e-5) from 16k elements on. 0 for any other
    dtype."""
    if t.dtype != torch.float16:
        return 0
    per_row = t[0].numel() if t.dim() else 1
    return max(0, min(_MOST_SCALE, per_row.bit_length() - 3))


def gradients(y: Tensor, wrt: list, leaf: Tensor) -> tuple:
    """``torch.autograd.grad(y.sum(), wrt, allow_unused=True)``; in float16 (``leaf``: the embeddings), as
    float32 gradients of a start scaled by 2^k and divided by it after (exactly: powers of two), lowered by 2^6
    while the scaled pass overflows (inf / NaN at a leaf) — float16's loss scaling, applied to the start relevance.

    Raises
    ------
    UnsupportedModelError
        When even the unscaled float16 pass overflows.
    """
    k = start_scale(leaf)
    if k == 0 and leaf.dtype != torch.float16:
        return torch.autograd.grad(y.sum(), wrt, allow_unused=True)
    while True:
        scale = float(2**k)
        grads = torch.autograd.grad(y.sum() * scale, wrt, allow_unused=True, retain_graph=k > 0)
        if all(g is None or bool(torch.isfinite(g).all()) for g in grads):
            return tuple(None if g is None else g.float() / scale for g in grads)
        if k == 0:
            from ..errors import UnsupportedModelError

            raise UnsupportedModelError(
                "the float16 relevance pass overflows (inf / NaN gradients) even with an unscaled start: explain "
                "this model with dtype=None (float32 from the same weights) or in bfloat16"
            )
        k = max(0, k - _STEP)


def sum_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype relevance is summed in: float32 for float16 / bfloat16 (the fast mode), else ``dtype``."""
    return torch.float32 if dtype in FAST else dtype


def lifted_fields(result: Any) -> Any:
    """``result`` (a dataclass of tensors, :class:`~lrp_core.methods.call.MethodResult`) with its float16 /
    bfloat16 tensor fields in float32 (exact): a fast-mode call returns float32 tensors, as the float32 mode does."""
    for f in fields(result):
        value = getattr(result, f.name)
        if isinstance(value, Tensor) and value.dtype in FAST:
            setattr(result, f.name, value.float())
    return result


__all__ = [
    "FAST",
    "FAST_METHODS",
    "model_dtype",
    "check_model",
    "check_method",
    "lift",
    "sum_dtype",
    "start_scale",
    "gradients",
    "lifted_fields",
]

"""What a normalisation module computes, read from what it is (docs/METHODS.md §4, "Part by part").

The modified-gradient rules (AttnLRP, CP-LRP) recompute every norm from its parameters, its divisor held
constant. They must recompute the function the module's own forward computes, whatever its class name or
attributes suggest; three RMSNorm arithmetics are in use, told apart by the module's class:

* :data:`HF_FLOAT32` — Hugging Face's Llama-style ``*RMSNorm`` (``variance_epsilon``): ``x`` in float32,
  ``x · rsqrt(mean(x²) + ε)`` cast back to ``x``'s dtype, then ``w ·``;
* :data:`HF_OFFSET` — Hugging Face's Gemma-style ``*RMSNorm`` (``eps``): in float32, ``· (1 + w)``, cast back;
* :data:`NATIVE` — ``torch.nn.RMSNorm`` and timm's ``RmsNorm``: ``x · rsqrt(mean(x²) + ε)`` in ``x``'s dtype
  (float32 for half precision, as torch computes it), then ``· w`` where the module has a weight
  (``elementwise_affine=False``: none); ``eps=None`` is ``torch.finfo(x.dtype).eps``; timm's ``RmsNormFp32``:
  the same in float32, cast back at the end;
* :data:`T5_VARIANCE` — T5's ``T5LayerNorm`` (and mT5's): the variance of ``x`` in float32, ``x · rsqrt(…)`` in
  ``x``'s dtype (a float64 ``x`` times the float32 factor), then ``w ·``.

A class recognised by name only (an RMSNorm of another library) is read as the attribute it has suggests,
and every norm the rules recompute is checked against the module's own output on the input the forward gave
it (:func:`check_norm_value`): a norm the rules misread is refused naming the module, never explained.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import Tensor, nn

from ..errors import UnsupportedModelError
from ..runtime.offload import resolve
from .ops import LAYERNORM, RMSNORM

#: Hugging Face Llama-style: float32, cast back, then ``w ·``
HF_FLOAT32 = "hf_float32"
#: Hugging Face Gemma-style: float32, ``· (1 + w)``, cast back
HF_OFFSET = "hf_offset"
#: torch's ``nn.RMSNorm``, timm's ``RmsNorm``: in the input's dtype, then ``· w``
NATIVE = "native"
#: timm's ``RmsNormFp32``: the native arithmetic in float32, cast back at the end
NATIVE_FLOAT32 = "native_float32"
#: T5's ``T5LayerNorm``: the variance in float32, the product in the input's dtype, then ``w ·``
T5_VARIANCE = "t5_variance"
RMS_FORMS = (HF_FLOAT32, HF_OFFSET, NATIVE, NATIVE_FLOAT32, T5_VARIANCE)

#: the largest relative deviation (max |rule − module| / max |module|) of a recomputed norm, by dtype (half: the
#: fast half mode, whose rules compute the norm in float32 and round once, the module in its own arithmetic)
NORM_TOLERANCE = {torch.float64: 1e-10, torch.bfloat16: 2e-2, torch.float16: 4e-3}
#: for any other dtype (float32; half-precision models are replayed in float32)
NORM_TOLERANCE_DEFAULT = 1e-5


def _timm_class(module: nn.Module) -> Optional[str]:
    """The class name of a timm module (``None`` for any other)."""
    return type(module).__name__ if type(module).__module__.split(".")[0] == "timm" else None


def rms_form(module: nn.Module) -> Optional[str]:
    """The arithmetic of an RMSNorm module, one of :data:`RMS_FORMS` (``None``: not an RMSNorm it knows).

    Parameters
    ----------
    module : nn.Module
        A normalisation module.

    Returns
    -------
    str or None
        :data:`NATIVE` for ``torch.nn.RMSNorm`` and timm's ``RmsNorm``, :data:`NATIVE_FLOAT32` for timm's
        ``RmsNormFp32``, :data:`HF_FLOAT32` for a module with ``variance_epsilon``, :data:`HF_OFFSET` for
        another with ``eps``; ``None`` otherwise.
    """
    if isinstance(module, nn.RMSNorm) or _timm_class(module) == "RmsNorm":
        return NATIVE
    if _timm_class(module) == "RmsNormFp32":
        return NATIVE_FLOAT32
    if type(module).__name__.endswith("T5LayerNorm") and hasattr(module, "variance_epsilon"):
        return T5_VARIANCE
    if hasattr(module, "variance_epsilon"):
        return HF_FLOAT32
    if hasattr(module, "eps"):
        return HF_OFFSET
    return None


def norm_kind(module: nn.Module) -> str:
    """The operation kind of a normalisation module: ``RMSNORM`` or ``LAYERNORM``.

    Parameters
    ----------
    module : nn.Module
        The normalisation module.

    Returns
    -------
    str
        ``RMSNORM`` for ``torch.nn.RMSNorm``, timm's ``RmsNorm`` / ``RmsNormFp32``, a module whose class name
        contains "RMSNorm" or that has a ``variance_epsilon`` attribute; else ``LAYERNORM``.
    """
    if "RMSNorm" in type(module).__name__ or hasattr(module, "variance_epsilon"):
        return RMSNORM
    if _timm_class(module) in ("RmsNorm", "RmsNormFp32"):
        return RMSNORM
    return LAYERNORM


def native_rms(module: Any, x: Tensor, float32: bool = False) -> Tensor:
    """``torch.nn.RMSNorm`` / timm ``RmsNorm`` on ``x`` (…, n), the divisor ``rsqrt(mean(x²) + ε)`` detached.

    ``module`` is read by attribute name (``normalized_shape``, ``eps``, ``weight``), as a model's parts are.
    Computed in ``x``'s dtype (float32 for half precision, or with ``float32`` = timm's ``RmsNormFp32``), cast
    back, then times the weight where the module has one (``elementwise_affine=False``: none).

    Raises
    ------
    UnsupportedModelError
        When the module normalises over more than the last dimension.
    """
    shape = tuple(getattr(module, "normalized_shape", ()))
    if len(shape) != 1:
        raise UnsupportedModelError(
            f"{type(module).__name__} normalises over {shape}: the rules recompute an RMSNorm over the last dimension"
        )
    low = x.dtype not in (torch.float32, torch.float64)
    h = x.float() if low or float32 else x
    eps = module.eps if module.eps is not None else torch.finfo(x.dtype).eps
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps).detach()
    w = resolve(module, "weight")  # an offloaded norm's loaded weight
    if float32:
        return (h if w is None else h * w.detach().float()).to(x.dtype)
    h = h.type_as(x)
    return h if w is None else h * w.detach()


def check_norm_value(module: nn.Module, x: Tensor, got: Tensor, where: Callable[[nn.Module], str], rule: str) -> None:
    """Refuse a norm the rules recompute otherwise than the module's own forward does, on the input ``x``.

    ``module.forward(x)`` (its forward hooks aside: see ``UnreflectedHookWarning``) is computed without gradient
    (one norm, a small fraction of the pass) and compared with the rule's value ``got``: relative max deviation at
    most :data:`NORM_TOLERANCE` (float64: 1e-10; else 1e-5).

    Parameters
    ----------
    module : nn.Module
        The model's norm.
    x : Tensor
        The input the forward gave it.
    got : Tensor
        The rule's value at ``x``.
    where : callable
        module -> its qualified name in the model, for the message.
    rule : str
        The rule's name, for the message.

    Raises
    ------
    UnsupportedModelError
        Naming the module, its class, the deviation and what the rules read it as.
    """
    with torch.no_grad():
        # its own computation: forward hooks, reflected or warned about elsewhere, aside
        want = getattr(module, "forward", module)(x)
    want = want if isinstance(want, Tensor) else want[0]
    if want.shape != got.shape:
        dev = float("inf")
    else:
        dev = float((got.detach() - want).abs().max() / want.abs().max().clamp(min=1e-30))
    tol = NORM_TOLERANCE.get(want.dtype, NORM_TOLERANCE_DEFAULT)
    if not dev <= tol:
        form = rms_form(module) if norm_kind(module) == RMSNORM else "layernorm"
        raise UnsupportedModelError(
            f"{where(module)} ({type(module).__name__}) does not compute what the {rule} rule recomputes from "
            f"its parameters (read as {form}): they differ by {dev:.1e} relative on this input (accepted: "
            f"{tol:.0e}). The norms the rules read: torch.nn.LayerNorm (with or without weight / bias), "
            "torch.nn.RMSNorm, timm's LayerNorm / RmsNorm / RmsNormFp32, and Hugging Face's RMSNorms "
            "(Llama-style w·x̂, Gemma-style (1 + w)·x̂)"
        )


__all__ = [
    "HF_FLOAT32",
    "HF_OFFSET",
    "T5_VARIANCE",
    "NATIVE",
    "NATIVE_FLOAT32",
    "RMS_FORMS",
    "NORM_TOLERANCE",
    "NORM_TOLERANCE_DEFAULT",
    "rms_form",
    "norm_kind",
    "native_rms",
    "check_norm_value",
]

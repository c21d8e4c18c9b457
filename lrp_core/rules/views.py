"""The check that a rule's picture of a layer is the layer: its view reproduces the module's own output.

A relevance rule that reads a layer's weights reads a *view* of it: ``(W, b)`` of a Linear
(:func:`~lrp_core.rules.linear.effective_linear`: peft adapters added in, a quantised weight dequantised, an
offloaded one loaded), ``(W, b, stride, padding)`` of a patch convolution (:func:`effective_conv`). The view is
the layer only if ``x Wᵀ + b`` is what the module's forward returned for the input the forward gave it. That is
checked here, on the recorded activation, where a rule reads the view:

* :func:`check_linear` — on up to :data:`ROWS` rows of the recorded input and output (evenly spaced over the
  flattened rows), ``x_r Wᵀ + b`` against ``y_r``;
* :func:`check_conv` — the convolution of the first image against the module's own output on it.

The deviation is measured against the size of the sum, ``max |x Wᵀ + b − y| / max (|x| |W|ᵀ + |b|)`` (the scale
round-off grows with), and must stay within :func:`tolerance` of the dtype the two are compared in: 1e-10
(float64), 1e-5 (float32; 2e-3 where CUDA computes float32 products in TF32), 2e-2 (float16 / bfloat16).
Round-off is far below (dequantised weights: 1e-7 in float32); an activation quantised to 8 bits is 4e-3 and
above, a swapped or hooked layer O(1). A view that departs is refused, naming the module (its qualified name
within the model being explained), the measured figure and, for a quantised layer, its quantisation.

The cost: two products of :data:`ROWS` rows with the weight per Linear read (one image's convolution per
patch convolution), next to the rule's own products over every row.

In a modified-gradient replay a quantised Linear's gradient is its view's, ``g W`` (:func:`linear_call`): the
forward is the module's own (checked against the view), the backward never differentiates through packed
integers.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as TF
from torch import Tensor, nn

from ..errors import UnsupportedModelError
from ..runtime.offload import explained_model, resolve
from ..runtime.precision import UpcastMode, active_dtype
from . import quantised
from .linear import effective_linear

#: rows of a Linear's recorded input the view is checked on
ROWS = 4


def tolerance(dtype: torch.dtype, device: Optional[torch.device] = None, conv: bool = False) -> float:
    """The largest relative deviation of a view from its module that round-off explains, in ``dtype``.

    Parameters
    ----------
    dtype : torch.dtype
        The dtype the view and the module's output are compared in.
    device : torch.device, optional
        Where they were computed (CUDA may compute float32 products in TF32).
    conv : bool, optional
        A convolution (its TF32 switch is cuDNN's).

    Returns
    -------
    float
        1e-10 (float64), 1e-5 (float32; 2e-3 under TF32), 2e-2 (half precision).
    """
    if dtype == torch.float64:
        return 1e-10
    if dtype == torch.float32:
        tf32 = device is not None and device.type == "cuda"
        tf32 = tf32 and (torch.backends.cudnn.allow_tf32 if conv else torch.backends.cuda.matmul.allow_tf32)
        return 2e-3 if tf32 else 1e-5
    return 2e-2


def _rows(n: int, k: int = ROWS) -> Tensor:
    return torch.linspace(0, n - 1, min(n, k)).round().long().unique()


def check_linear(
    module: nn.Module,
    x: Tensor,
    y: Optional[Tensor],
    weight: Tensor,
    bias: Optional[Tensor],
) -> None:
    """Refuse a Linear whose view ``(weight, bias)`` does not give the output ``y`` its forward gave for ``x``.

    Parameters
    ----------
    module : nn.Module
        The model's layer (for the message).
    x : Tensor
        (..., D_in) the input the forward gave it.
    y : Tensor, optional
        (..., D_out) what its forward returned; ``None``: nothing to check against (the check is skipped).
    weight, bias : Tensor, Tensor or None
        The view: (D_out, D_in), (D_out,).
    Raises
    ------
    UnsupportedModelError
        Naming the module, the measured deviation and the tolerance.
    """
    if y is None or x.shape[:-1] != y.shape[:-1] or not x.numel():
        return
    with torch.no_grad():
        rows = _rows(x[..., 0].numel()).to(x.device)
        xr = x.detach().reshape(-1, x.shape[-1])[rows]
        yr = y.detach().reshape(-1, y.shape[-1])[rows]
        dtype = torch.promote_types(xr.dtype, yr.dtype)
        w = weight.detach().to(device=xr.device, dtype=dtype)
        b = None if bias is None else bias.detach().to(device=xr.device, dtype=dtype)
        xr = xr.to(dtype)
        view = TF.linear(xr, w, b)
        scale = TF.linear(xr.abs(), w.abs(), None if b is None else b.abs())
        dev = float((view - yr.to(dtype)).abs().max() / scale.max().clamp_min(torch.finfo(dtype).tiny))
    tol = tolerance(dtype, xr.device)
    if not dev <= tol:  # NaN too
        raise UnsupportedModelError(_departs(module, "x·Wᵀ + b", dev, tol))


def check_output(module: nn.Module, x: Tensor, y: Optional[Tensor]) -> None:
    """:func:`check_linear` of the Linear ``module``'s view (:func:`~lrp_core.rules.linear.effective_linear`) on
    its recorded input ``x`` and output ``y``: for a pass whose rule is handed no output (a head's layers).

    Parameters
    ----------
    module : nn.Module
        A Linear-like layer of the model.
    x, y : Tensor, Tensor or None
        (..., D_in) its input and (..., D_out) its output in the forward.
    """
    if y is not None:
        check_linear(module, x, y, *effective_linear(module))


def effective_conv(module: nn.Module) -> tuple[Tensor, Optional[Tensor]]:
    """The weight (C_out, C_in, kh, kw) and bias (C_out,) or ``None`` of the convolution ``module`` computes:
    its parameters, dequantised for a quantised layer, loaded for an offloaded one.

    Parameters
    ----------
    module : nn.Module
        A convolution (``weight``, ``bias``, ``stride``, ``padding``).

    Returns
    -------
    tuple[Tensor, Optional[Tensor]]
        ``(weight, bias)``.
    """
    weight = quantised.conv_weight(module)
    if weight is None:
        weight = resolve(module, "weight")
    assert weight is not None, "a convolution has a weight"
    return weight, resolve(module, "bias")


def conv_padding(module: Any) -> Any:
    """The convolution's padding as numbers (``"valid"``, SigLIP's, is no padding)."""
    return 0 if module.padding == "valid" else module.padding


def _plain_conv(module: nn.Module) -> bool:
    """Whether ``module``'s forward is by construction ``conv2d(x, weight, bias, stride, padding)`` of its own
    parameters: exactly an ``nn.Conv2d`` (zeros padding, no dilation or groups), no hook, no forward of its own."""
    m: Any = module
    return (
        type(module) is nn.Conv2d
        and m.padding_mode == "zeros"
        and tuple(m.dilation) == (1, 1)
        and m.groups == 1
        and "forward" not in vars(module)
        and not (module._forward_hooks or module._forward_pre_hooks)
        and not (nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks)
        and not any(t.is_meta or type(t) is not nn.Parameter for t in module.parameters(recurse=False))
    )


def check_conv(module: nn.Module, x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> None:
    """Refuse a patch convolution whose view is not its forward, on the first image of ``x`` (B, C, H, W).

    A plain ``nn.Conv2d`` (:func:`_plain_conv`) is its view by construction and is not run again; any other
    module (quantised, offloaded, hooked, grouped, dilated, a subclass) is run on the first image and compared.

    Parameters
    ----------
    module : nn.Module
        The model's convolution.
    x : Tensor
        (B, C, H, W) its input.
    weight, bias : Tensor, Tensor or None
        The view (:func:`effective_conv`).
    Raises
    ------
    UnsupportedModelError
        Naming the module, the measured deviation and the tolerance.
    """
    if not isinstance(module, nn.Module) or _plain_conv(module) or not x.shape[0]:
        return  # a stand-in that is no module (Qwen2.5-VL's Conv3d read as a Conv2d) is built from the weights
    m: Any = module
    with torch.no_grad():
        first = x[:1].detach()
        y = module(first)
        dtype = torch.promote_types(first.dtype, y.dtype)
        w, b = weight.to(device=y.device, dtype=dtype), None if bias is None else bias.to(device=y.device, dtype=dtype)
        first = first.to(device=y.device, dtype=dtype)
        view = TF.conv2d(first, w, b, stride=m.stride, padding=conv_padding(m))
        if view.shape != y.shape:
            dev = float("inf")
        else:
            scale = TF.conv2d(
                first.abs(), w.abs(), None if b is None else b.abs(), stride=m.stride, padding=conv_padding(m)
            )
            dev = float((view - y.to(dtype)).abs().max() / scale.max().clamp_min(torch.finfo(dtype).tiny))
    tol = tolerance(dtype, y.device, conv=True)
    if not dev <= tol:
        raise UnsupportedModelError(_departs(module, "conv2d(x, W, b, stride, padding)", dev, tol))


def _departs(module: nn.Module, form: str, dev: float, tol: float) -> str:
    """The refusal of a view that is not its module: which module (named within the model being explained),
    by how much, and the likely reason."""
    model = explained_model()
    name = None if model is None else next((n for n, m in model.named_modules() if m is module), None)
    where = f"{name} ({type(module).__name__})" if name else f"a {type(module).__module__}.{type(module).__name__}"
    what = quantised.scheme(module)
    if what is not None:
        why = (
            f"it is quantised ({what}) and its forward computes another function than its dequantised weights "
            "(it quantises its activations, or computes in a lower precision)"
        )
    elif module._forward_hooks or module._forward_pre_hooks:
        why = "a forward hook or pre-hook on it changes what it computes"
    else:
        why = f"{type(module).__name__} is not the Linear map its class and weights suggest"
    return (
        f"{where}: its output departs from {form} of the weights the relevance rules read by {dev:.2g} "
        f"(relative to the size of the sum; round-off stays below {tol:g}) — {why}. The rules would explain "
        f"another function than the model's; {quantised.FLOAT_HINT if what else 'explain the model without it'}"
    )


class _ViewLinearFn(torch.autograd.Function):
    """``y = module(x)`` (the module's own forward, checked against its view) with the view's gradient ``g W``."""

    @staticmethod
    def forward(ctx, x: Tensor, module: nn.Module) -> Tensor:
        weight, bias = effective_linear(module)
        if quantised.repacks_in_place(module, x):  # calling it would rewrite its weight: its product, computed here
            dtype = getattr(module, "compute_dtype", None) or x.dtype
            b = None if bias is None else bias.to(dtype)
            y = TF.linear(x.to(dtype), weight.to(dtype), b).to(x.dtype)
        else:
            y = module(x)
            check_linear(module, x, y, weight, bias)
        ctx.module = module
        ctx.target = active_dtype()
        return y

    @staticmethod
    def backward(ctx, grad: Tensor):
        # dequantised again (nothing the size of W kept in between), in the precision the forward computed in:
        # autograd runs a backward outside the torch-function modes (on CUDA on another thread), and a half
        # model's 4-bit weight would otherwise dequantise to bfloat16 — 2e-3 off the weight its forward used
        with UpcastMode(ctx.target) if ctx.target is not None else nullcontext():
            weight, _ = effective_linear(ctx.module)
        return grad @ weight.detach().to(grad.dtype), None


def linear_call(module: nn.Module) -> Callable[[Tensor], Tensor]:
    """What a replay calls for the Linear ``module``: the module itself, or for a quantised layer its forward
    with its view's gradient (:class:`_ViewLinearFn`).

    Parameters
    ----------
    module : nn.Module
        A Linear-like layer of the model.

    Returns
    -------
    Callable[[Tensor], Tensor]
        ``x (..., D_in) -> (..., D_out)``.
    """
    if not quantised.is_quantised(module):
        return module
    return lambda x: _ViewLinearFn.apply(x, module)


__all__ = [
    "ROWS",
    "tolerance",
    "check_linear",
    "check_output",
    "effective_conv",
    "conv_padding",
    "check_conv",
    "linear_call",
]

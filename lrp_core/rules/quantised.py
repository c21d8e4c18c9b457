"""Quantised layers, as the function their forward computes.

A quantised Linear's forward multiplies its input with a weight stored in a few bits. Where the input stays
in floating point (weight-only schemes), the forward is ``x ↦ x Ŵᵀ + b`` with ``Ŵ`` the *dequantised* weight,
and that is what the relevance rules must read — not a float weight the model keeps beside it (optimum-quanto
before ``freeze()`` keeps the float weight and quantises it on every forward), nor the packed integers. Where
the forward quantises its input too (dynamic or static activation quantisation), it is another function, a
staircase in ``x``; the engine refuses such a layer, naming the quantisation.

=====================================  =================================  ======================================
scheme                                 recognised by                      read as
=====================================  =================================  ======================================
optimum-quanto ``quantize`` (frozen    ``optimum.quanto`` ``QLinear`` /   ``qweight.dequantize()``; refused with
or not)                                ``QConv2d``                        ``activations=`` (quantised inputs)
torchao ``quantize_`` (Linear weight   the weight's class module          ``weight.dequantize()``; refused where
a ``torchao`` tensor subclass)         ``torchao.*``                      it quantises activations
bitsandbytes ``Linear4bit``            ``bitsandbytes`` ``Linear4bit``    ``dequantize_4bit`` of the packed weight
bitsandbytes ``Linear8bitLt``          ``bitsandbytes`` ``Linear8bitLt``  int8 rows × their scales / 127
torch ``quantize_dynamic``             ``torch.ao.nn.quantized``          float16 weights: ``weight()``; int8:
                                                                          refused (it quantises activations)
=====================================  =================================  ======================================

Whether a layer's forward really is ``x Ŵᵀ + b`` is checked on every call where a rule reads it
(:mod:`lrp_core.rules.views`): bitsandbytes' 8-bit layers, for instance, dequantise on the CPU but quantise their
inputs on CUDA (LLM.int8()), and are refused there by that check.

None of these packages is imported here: a layer is recognised by its class's module (or its weight's), and
its values are read through the packages' own methods where it has them.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor, nn

from ..errors import UnsupportedModelError

#: the advice every refusal of an activation-quantising layer ends with
FLOAT_HINT = (
    "explain the floating-point model, or one quantised with weights only (its dequantised weights are read "
    "exactly: optimum-quanto quantize(model, weights=...), torchao Int8WeightOnlyConfig, bitsandbytes 4-bit)"
)


#: bitsandbytes' quantised Linear classes
BNB_LINEARS = ("Linear4bit", "LinearNF4", "LinearFP4", "Linear8bitLt")
#: optimum-quanto's layers whose weight the rules read (a Linear, a convolution)
QUANTO_READ = ("QLinear", "QConv2d")


def _root(obj: Any) -> str:
    return type(obj).__module__.split(".")[0]


def _is_quanto(module: nn.Module) -> bool:
    return type(module).__module__.startswith("optimum.quanto") and hasattr(module, "weight_qtype")


def _is_bnb(module: nn.Module) -> bool:
    return _root(module) == "bitsandbytes" and type(module).__name__ in BNB_LINEARS


def _is_torch_ao(module: nn.Module) -> bool:
    """A module of torch's own quantisation (``torch.ao.nn.quantized``), not one of its parameter holders."""
    return type(module).__module__.startswith("torch.ao.nn.quantized") and not type(module).__name__.endswith(
        "PackedParams"
    )


def _torchao_weight(module: nn.Module) -> Optional[Tensor]:
    w = module.__dict__.get("_parameters", {}).get("weight")
    return w if w is not None and _root(w) == "torchao" else None


def scheme(module: nn.Module) -> Optional[str]:
    """The quantisation of ``module``'s own weight, in words, or ``None`` for a module that is not quantised.

    Parameters
    ----------
    module : nn.Module
        Any module.

    Returns
    -------
    str or None
        E.g. ``"optimum-quanto (qint8 weights)"``, ``"bitsandbytes 4-bit (nf4)"``, ``"torchao Int8Tensor"``,
        ``"torch.ao.quantization.quantize_dynamic (qint8)"``.
    """
    m: Any = module
    if _is_quanto(module):
        acts = f", {m.activation_qtype} activations" if m.activation_qtype is not None else ""
        return f"optimum-quanto ({m.weight_qtype} weights{acts})"
    if _is_bnb(module):
        if type(module).__name__ == "Linear8bitLt":
            return "bitsandbytes 8-bit (LLM.int8())"
        state = getattr(m.weight, "quant_state", None)
        return f"bitsandbytes 4-bit ({getattr(state, 'quant_type', 'fp4/nf4')})"
    if _is_torch_ao(module):
        if ".dynamic" in type(module).__module__:
            dtype = getattr(getattr(m, "_packed_params", None), "dtype", None)
            return f"torch.ao.quantization.quantize_dynamic ({str(dtype).replace('torch.', '')})"
        return "torch static quantisation (torch.ao.quantization.convert)"
    w = _torchao_weight(module)
    if w is not None:
        return f"torchao {type(w).__name__}"
    return None


def is_quantised(module: nn.Module) -> bool:
    """Whether ``module`` computes with a quantised weight of one of the schemes of the module docstring.

    Parameters
    ----------
    module : nn.Module
        Any module.

    Returns
    -------
    bool
        ``True`` for a quantised layer.
    """
    return scheme(module) is not None


def activation_quantisation(module: nn.Module) -> Optional[str]:
    """How ``module``'s forward quantises its input, where that is known beforehand; ``None`` otherwise.

    Parameters
    ----------
    module : nn.Module
        Any module.

    Returns
    -------
    str or None
        E.g. ``"its activations to int8 on every call"``.
    """
    m: Any = module
    if _is_quanto(module) and m.activation_qtype is not None:
        return f"its activations to {m.activation_qtype} (quantize(..., activations=...))"
    if _is_torch_ao(module):
        if ".dynamic" not in type(module).__module__:
            return "its inputs: it computes on quantised tensors"
        if getattr(getattr(m, "_packed_params", None), "dtype", None) != torch.float16:
            return "its activations to int8 on every call"
    w = _torchao_weight(module)
    if w is not None:
        quantises = (
            getattr(w, "act_quant_kwargs", None) is not None
            or getattr(w, "input_quant_func", None) is not None
            or "Activation" in type(w).__name__
        )
        if quantises:
            return "its activations on every call (dynamic activation quantisation)"
    return None


def repacks_in_place(module: nn.Module, x: Tensor) -> bool:
    """Whether calling ``module`` on ``x`` would rewrite its weight: bitsandbytes' 4-bit layers, in eval mode on a
    CPU with AVX512-BF16, repack their weight in place for a bfloat16 kernel on a call without gradients.

    Parameters
    ----------
    module : nn.Module
        A layer of the model.
    x : Tensor
        The input it would be called on.

    Returns
    -------
    bool
        ``True`` where the call would change the model (the replay then computes the layer's dequantised
        product itself, which is what its forward computes with gradients or in training mode).
    """
    m: Any = module
    return (
        _is_bnb(module)
        and type(module).__name__ != "Linear8bitLt"
        and x.device.type == "cpu"
        and bool(getattr(m, "support_avx512bf16_for_cpu", False))
        and not m.training
        and not x.requires_grad
    )


def packed(module: nn.Module) -> bool:
    """Whether a bitsandbytes 4-bit layer's weight was already repacked for its CPU bfloat16 kernel."""
    return _is_bnb(module) and bool(
        getattr(getattr(module.weight, "quant_state", None), "packing_format_for_cpu", False)
    )


def linear_parts(module: nn.Module) -> Optional[tuple[Tensor, Optional[Tensor]]]:
    """The dequantised (weight (D_out, D_in), bias (D_out,) or ``None``) of a quantised Linear, ``None`` for a
    module that is not one.

    Parameters
    ----------
    module : nn.Module
        Any module.

    Returns
    -------
    tuple[Tensor, Optional[Tensor]] or None
        New tensors outside autograd (the weight in the dtype the scheme dequantises to).
    """
    m: Any = module
    with torch.no_grad():
        if _is_quanto(module):
            return _dequantised(m.qweight), m.bias
        if _is_bnb(module):
            return _bnb_weight(m), m.bias
        if _is_torch_ao(module) and activation_quantisation(module) is None:
            return m.weight().dequantize() if m.weight().is_quantized else m.weight(), m.bias()
        w = _torchao_weight(module)
        if w is not None:
            return w.dequantize(), m.bias
    return None


def conv_weight(module: nn.Module) -> Optional[Tensor]:
    """The dequantised weight (C_out, C_in, kh, kw) of a quantised convolution (optimum-quanto ``QConv2d``, a
    torchao weight), ``None`` for a convolution that is not quantised.

    Parameters
    ----------
    module : nn.Module
        A convolution.

    Returns
    -------
    Tensor or None
        A new tensor outside autograd.
    """
    m: Any = module
    with torch.no_grad():
        if _is_quanto(module):
            return _dequantised(m.qweight)
        w = _torchao_weight(module)
        if w is not None:
            return w.dequantize()
    return None


def _dequantised(w: Tensor) -> Tensor:
    return w.dequantize() if hasattr(w, "dequantize") and type(w) is not torch.Tensor else w


def _bnb_weight(module: Any) -> Tensor:
    """bitsandbytes' weight as its CPU forward dequantises it: 4-bit blocks × their absmax, or int8 rows × their
    scale / 127 (the scales are on the weight until the first forward, on the layer's state after it)."""
    import bitsandbytes.functional as bnbF  # a bitsandbytes layer: the package is there

    w = module.weight
    if type(module).__name__ == "Linear8bitLt":
        scales = getattr(w, "SCB", None)
        if scales is None:
            scales = module.state.SCB
        if w.dtype != torch.int8 or scales is None:  # not quantised yet (fp16 weights kept for training)
            return w.detach()
        return bnbF.int8_vectorwise_dequant(w.data, scales)
    state = getattr(w, "quant_state", None)
    if state is None:
        return w.detach()
    return bnbF.dequantize_4bit(w.data, state)


def check_quantised_layers(model: nn.Module) -> None:
    """Refuse a model holding a quantised layer the relevance rules cannot read as its forward computes it.

    Parameters
    ----------
    model : nn.Module
        The model to explain.

    Raises
    ------
    UnsupportedModelError
        Naming the first such layer, its quantisation and why: its forward quantises its activations, or it is
        a quantised layer of another kind than a Linear or a patch convolution (an embedding, a norm).
    """
    for name, module in model.named_modules():
        what = scheme(module)
        if what is None:
            continue
        if packed(module):
            raise UnsupportedModelError(
                f"{name} ({type(module).__name__}) is quantised with {what} and its weight was repacked in place "
                "for bitsandbytes' CPU bfloat16 kernel (a call without gradients in eval mode on a CPU with "
                "AVX512-BF16 does this): that forward computes in bfloat16 from a layout the relevance rules do not "
                "read. Load the model again and explain it before calling it without gradients (the engine never "
                f"triggers the repacking); or {FLOAT_HINT}"
            )
        how = activation_quantisation(module)
        if how is not None:
            raise UnsupportedModelError(
                f"{name} ({type(module).__name__}) is quantised with {what}, which quantises {how}: its output is "
                "a staircase in its input, not a function the relevance rules read (they read a fixed weight "
                f"times floating-point inputs); {FLOAT_HINT}"
            )
        if not _read(module):
            raise UnsupportedModelError(
                f"{name} ({type(module).__name__}) is quantised with {what}: the relevance rules read quantised "
                f"Linear layers and convolutions only; {FLOAT_HINT}"
            )


def _read(module: nn.Module) -> bool:
    """Whether :func:`linear_parts` or :func:`conv_weight` reads ``module`` (told by its kind, nothing computed)."""
    if _is_quanto(module):
        return type(module).__name__ in QUANTO_READ
    if _is_bnb(module) or _is_torch_ao(module):
        return True
    return isinstance(module, (nn.Linear, nn.Conv2d))  # a torchao weight on a Linear or a convolution


__all__ = [
    "FLOAT_HINT",
    "scheme",
    "is_quantised",
    "activation_quantisation",
    "repacks_in_place",
    "packed",
    "linear_parts",
    "conv_weight",
    "check_quantised_layers",
]

"""The function a Linear-like layer computes, as the relevance rules read it: ``y = x W_effᵀ + b_eff``.

The replay calls the model's own modules (so its logits are the model's), while the explicit relevance rules
read a Linear's weight and bias. For a plain ``nn.Linear`` those are its parameters; for a layer that computes
something else around them they are not, and the rules would explain another function than the one the
forward ran. :func:`effective_linear` is the one place the rules ask; it knows

* ``nn.Linear`` (and Linear-like views such as GPT-2's ``Conv1DLinear``: :class:`LinearView`);
* transformers' ``Conv1D`` (GPT-2: ``y = x W + b`` with ``W`` stored (D_in, D_out));
* peft's LoRA ``Linear`` (``W + Σ_active scaling·B·A``; DoRA's ``m ⊙ (W + ΔW) / ‖W + ΔW‖``), IA³ ``Linear``
  (the scaling vector on the input or the output features) and ``ModulesToSaveWrapper`` around a Linear,
  each over an ``nn.Linear`` or a ``Conv1D``, exactly as the layer's own forward combines them (merged
  adapters already in the base weight, disabled adapters read as the base layer);
* a quantised Linear (optimum-quanto, torchao, bitsandbytes, torch dynamic quantisation with float16
  weights): its dequantised weight (:mod:`lrp_core.rules.quantised`);
* an offloaded layer (accelerate): the weights its hook loads for its forward (:mod:`lrp_core.runtime.offload`).

Any other peft layer (LoKr, LoHa, a LoRA on an Embedding or a convolution, LoRA variants other than DoRA, …)
is refused (:func:`check_peft_layers`, run when the adapter is chosen) with a hint to merge the adapters.
peft is optional: its layers are recognised by their class's module, and peft is never imported here. So
its layers (and transformers' ``Conv1D``) are read by attribute name, through values typed ``Any``: their
classes cannot be named without importing them.

Shapes: ``weight`` (D_out, D_in), ``bias`` (D_out,) or ``None``.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor, nn

from ..errors import UnsupportedModelError
from ..runtime.offload import resolve
from . import quantised

MERGE_HINT = (
    "merge the adapters into the model first (model = peft_model.merge_and_unload(): the same "
    "function, plain Linear layers)"
)


class LinearView(nn.Module):
    """A module that shows another layer to the engine as a Linear: subclasses define :meth:`linear_parts`."""

    def linear_parts(self) -> tuple[Tensor, Optional[Tensor]]:
        """(weight (D_out, D_in), bias (D_out,) or ``None``) of the function ``forward`` computes."""
        raise NotImplementedError


def is_peft(module: nn.Module) -> bool:
    """Whether ``module`` is of one of peft's classes: a tuner layer, a wrapper or a ``PeftModel``.

    Parameters
    ----------
    module : nn.Module
        Any module.

    Returns
    -------
    bool
        ``True`` when the class comes from peft (found without importing peft).
    """
    return type(module).__module__.split(".")[0] == "peft"


def is_conv1d(module: nn.Module) -> bool:
    """Whether ``module`` is transformers' ``Conv1D``: GPT-2's Linear, whose weight is stored (D_in, D_out).

    Parameters
    ----------
    module : nn.Module
        Any module.

    Returns
    -------
    bool
        ``True`` for a ``Conv1D``.
    """
    weight = getattr(module, "weight", None)
    return type(module).__name__ == "Conv1D" and isinstance(weight, Tensor) and weight.dim() == 2


def _kind(module: nn.Module) -> Optional[str]:
    """ "lora", "ia3" or "modules_to_save" for the peft layers :func:`effective_linear` reads, else ``None``."""
    if not is_peft(module):
        return None
    path, name = type(module).__module__, type(module).__name__
    if name == "ModulesToSaveWrapper":
        return "modules_to_save"
    if name == "Linear":  # exactly these classes: peft's quantised and parallel Linears are other functions
        return {"peft.tuners.lora.layer": "lora", "peft.tuners.ia3.layer": "ia3"}.get(path)
    return None


def is_linear(module: Optional[nn.Module]) -> bool:
    """Whether ``module`` computes a Linear map the rules can read with :func:`effective_linear`.

    Parameters
    ----------
    module : Optional[nn.Module]
        Any module, or ``None``.

    Returns
    -------
    bool
        ``True`` for an ``nn.Linear``, a :class:`LinearView`, or one of the peft layers listed in the module
        docstring over an ``nn.Linear`` or a ``Conv1D``.
    """
    if isinstance(module, (nn.Linear, LinearView)):
        return True
    if isinstance(module, nn.Module) and quantised.is_quantised(module) and not isinstance(module, nn.Conv2d):
        return quantised.activation_quantisation(module) is None  # torch's dynamic Linear is no nn.Linear
    kind = _kind(module) if isinstance(module, nn.Module) else None
    if kind == "modules_to_save":
        wrapper: Any = module
        return is_linear(wrapper.original_module)
    if kind in ("lora", "ia3"):
        base = getattr(module, "base_layer", None)  # directly a Linear: not a peft layer over another
        return isinstance(base, nn.Linear) or (isinstance(base, nn.Module) and is_conv1d(base))
    return False


def effective_linear(module: nn.Module) -> tuple[Tensor, Optional[Tensor]]:
    """The weight and bias of the Linear map that ``module``'s forward computes (see the module docstring).

    Parameters
    ----------
    module : nn.Module
        An ``nn.Linear``, a :class:`LinearView`, a ``Conv1D``, or a supported peft layer over one of these.

    Returns
    -------
    tuple[Tensor, Optional[Tensor]]
        ``(weight, bias)``: weight (D_out, D_in), bias (D_out,) or ``None``. For a plain layer these are the
        module's own tensors; otherwise new tensors outside autograd (the rules take no parameter gradients,
        so no graph is kept).

    Raises
    ------
    UnsupportedModelError
        If the module is a peft layer the relevance rules do not read as its forward computes it.
    """
    if isinstance(module, LinearView):
        return module.linear_parts()
    if is_conv1d(module):
        weight = resolve(module, "weight")
        assert weight is not None, "a Conv1D has a weight"
        return weight.t(), resolve(module, "bias")
    kind = _kind(module)
    if kind is None:
        if is_peft(module):
            raise UnsupportedModelError(_refusal(module, "", "is not a layer the relevance rules read"))
        dequantised = quantised.linear_parts(module)
        if dequantised is not None:
            return dequantised
        weight = resolve(module, "weight")
        assert weight is not None, "a Linear has a weight"
        return weight, resolve(module, "bias")
    layer: Any = module
    if kind == "modules_to_save":
        return effective_linear(_saved_module(module))
    _check_layer(module)
    weight, bias = effective_linear(layer.base_layer)
    if layer.disable_adapters or layer.merged:  # the forward runs the base layer alone
        return weight, bias
    active = [a for a in layer.active_adapters if a in (layer.lora_A if kind == "lora" else layer.ia3_l)]
    with torch.no_grad():
        return (_ia3 if kind == "ia3" else _lora)(module, active, weight, bias)


def _saved_module(wrapper: Any) -> nn.Module:
    """The module a ``ModulesToSaveWrapper``'s forward runs: the active adapter's copy, or the original."""
    active = wrapper.active_adapters
    if wrapper.disable_adapters or not active or any(a not in wrapper._adapters for a in active):
        return wrapper.original_module
    return wrapper.modules_to_save[active[0]]


def _lora(module: Any, active: list, weight: Tensor, bias: Optional[Tensor]) -> tuple[Tensor, Optional[Tensor]]:
    """LoRA's forward, adapter after adapter: ``y += scaling · B(A(x))`` (vanilla), or DoRA's
    ``y += (m/‖W + s·BA‖ − 1) ⊙ (y − b) + m/‖W + s·BA‖ ⊙ s·B(A(x))`` with ``W``, ``b`` the base layer's and the
    norm per output row (peft ``DoraLinearLayer.forward``, dropout off)."""
    base_weight, base_bias = weight, bias
    for name in active:
        A, B, s = module.lora_A[name], module.lora_B[name], module.scaling[name]
        delta = s * (B.weight @ A.weight).to(weight.dtype)  # (D_out, D_in)
        b_delta = None if B.bias is None else s * B.bias.to(weight.dtype)
        if _dora(module, name):  # the only variant _check_layer lets through
            norm = torch.linalg.norm(base_weight + delta, dim=1)  # (D_out,): ‖W + s·BA‖ per output row
            scale = module.lora_magnitude_vector[name].weight.to(weight.dtype) / norm  # (D_out,)
            weight = scale[:, None] * (weight + delta)
            if bias is not None:  # (y − b): b the base layer's bias, 0 where it has none
                bias = bias + (scale - 1) * (bias if base_bias is None else bias - base_bias)
            if b_delta is not None:
                bias = scale * b_delta if bias is None else bias + scale * b_delta
        else:
            weight = weight + delta
            if b_delta is not None:
                bias = b_delta if bias is None else bias + b_delta
    return weight, bias


def _dora(module: nn.Module, name: str) -> bool:
    return name in getattr(module, "lora_variant", {}) or bool(getattr(module, "use_dora", {}).get(name, False))


def _ia3(module: Any, active: list, weight: Tensor, bias: Optional[Tensor]) -> tuple[Tensor, Optional[Tensor]]:
    """IA³'s forward: ``x ⊙ l`` into the base layer (``is_feedforward``: scales W's columns) or the base layer's
    output ``⊙ l`` (scales W's rows and the bias), ``l`` the product of the active adapters' vectors."""
    if not active:
        return weight, bias
    scale = module.ia3_l[active[0]].flatten().to(weight.dtype)
    for name in active[1:]:
        scale = scale * module.ia3_l[name].flatten().to(weight.dtype)
    if module.is_feedforward:
        return weight * scale[None, :], bias
    return weight * scale[:, None], None if bias is None else bias * scale


def _check_layer(module: Any, where: str = "") -> None:
    """Refuse what :func:`effective_linear` cannot read as the forward computes it (``where``: its name)."""
    if not is_linear(module):
        raise UnsupportedModelError(
            _refusal(module, where, f"wraps a {type(module.base_layer).__name__}, not a Linear")
        )
    if module.disable_adapters and module.merged:
        raise UnsupportedModelError(
            _refusal(
                module,
                where,
                "has its adapters disabled while they are merged (its "
                "forward would unmerge them, changing the model); "
                "unmerge them (peft_model.unmerge_adapter()) or enable "
                "them, or",
            )
        )
    if _kind(module) == "lora":
        other = sorted({type(v).__name__ for v in getattr(module, "lora_variant", {}).values()} - {"DoraLinearVariant"})
        if other:
            raise UnsupportedModelError(
                _refusal(
                    module,
                    where,
                    f"uses the LoRA variant {', '.join(other)}, whose "
                    "function the rules do not read (plain LoRA and "
                    "DoRA they do)",
                )
            )
        if (
            not module.disable_adapters
            and not module.merged
            and any(
                module.lora_dropout[a].training and getattr(module.lora_dropout[a], "p", 0) > 0
                for a in module.active_adapters
                if a in module.lora_dropout
            )
        ):
            raise UnsupportedModelError(
                _refusal(
                    module,
                    where,
                    "is in training mode with LoRA dropout, so its forward is random; call model.eval(), or",
                )
            )


def _refusal(module: nn.Module, where: str, why: str) -> str:
    name = f"{type(module).__module__}.{type(module).__name__}" + (f" ({where})" if where else "")
    return f"peft layer {name} {why}{' ' if why.endswith(' or') else ': '}{MERGE_HINT}"


def check_peft_layers(model: nn.Module) -> None:
    """Refuse a model holding a peft layer that :func:`effective_linear` cannot read.

    Parameters
    ----------
    model : nn.Module
        The model to explain, with the peft wrappers already looked through.

    Raises
    ------
    UnsupportedModelError
        Naming the first such layer and why (another peft layer kind, a LoRA variant other than DoRA, adapters
        disabled while merged, LoRA dropout in training mode, a wrapper around a non-Linear), with the hint to
        merge the adapters.
    """
    for qualified, module in model.named_modules():
        if not is_peft(module):
            continue
        kind = _kind(module)
        if kind is None:
            if _inside_peft_layer(model, qualified):
                continue  # a part of a layer checked as a whole (lora_A, lora_B, a DoRA magnitude, …)
            raise UnsupportedModelError(
                _refusal(
                    module,
                    qualified,
                    "is not a layer the relevance rules read "
                    "(they read LoRA and DoRA, IA³ and "
                    "modules_to_save on Linear layers)",
                )
            )
        if kind == "modules_to_save":
            wrapper: Any = module
            if not is_linear(wrapper.original_module):
                raise UnsupportedModelError(
                    _refusal(module, qualified, f"wraps a {type(wrapper.original_module).__name__}, not a Linear")
                )
            continue
        _check_layer(module, qualified)


def _inside_peft_layer(model: nn.Module, qualified: str) -> bool:
    parts = qualified.split(".")
    for i in range(len(parts) - 1, 0, -1):
        parent = model.get_submodule(".".join(parts[:i]))
        if _kind(parent) is not None:
            return True
    return False


__all__ = ["LinearView", "MERGE_HINT", "check_peft_layers", "effective_linear", "is_conv1d", "is_linear", "is_peft"]

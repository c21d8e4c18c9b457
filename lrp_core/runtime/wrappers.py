"""Wrapped models: ``torch.compile``, ``DataParallel``, ``DistributedDataParallel`` and peft's ``PeftModel``
hold the model the engine explains; TorchScript has no Python submodules to replay and is refused."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..errors import UnsupportedModelError


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside its wrappers, nested ones too.

    ``_orig_mod`` of a compiled model, ``.module`` of
    ``DataParallel`` / ``DistributedDataParallel``, the base model of a peft ``PeftModel`` (and of its tuner,
    ``LoraModel`` …).

    The replay calls the inner model's own submodules, so a compiled wrapper's graphs are not used and a
    data-parallel wrapper's replicas are not made: the explanation is the inner model's, on its device. A
    ``PeftModel``'s forward is its base model's (whose adapter layers the replay calls and the rules read,
    :func:`lrp_core.rules.linear.effective_linear`), except with prompt learning (prefix / prompt tuning,
    p-tuning), whose virtual tokens the replay does not compute: refused.

    Parameters
    ----------
    model : nn.Module
        The model, possibly wrapped.

    Returns
    -------
    nn.Module
        The innermost model.

    Raises
    ------
    UnsupportedModelError
        If the model is a TorchScript module, or a peft model with a prompt
        learning adapter active.
    """
    import torch

    while True:
        if isinstance(model, torch.jit.ScriptModule):
            raise UnsupportedModelError(
                f"{type(model).__name__} is a TorchScript module (torch.jit.script / torch.jit.trace): its "
                "submodules are compiled code the explanation cannot replay. Explain the original nn.Module "
                "(the one you scripted or traced); torch.compile, DataParallel and DistributedDataParallel "
                "wrappers are accepted"
            )
        inner = _inner(model)
        if inner is None:
            return model
        model = inner


def _inner(model: nn.Module):
    from torch.nn.parallel import DataParallel, DistributedDataParallel

    if isinstance(model, (DataParallel, DistributedDataParallel)):
        return model.module
    if type(model).__name__ == "OptimizedModule" and isinstance(
        model.__dict__.get("_modules", {}).get("_orig_mod"), nn.Module
    ):
        return model._orig_mod
    return _peft_inner(model)


def _peft_inner(model: nn.Module):
    """A ``PeftModel``'s ``base_model`` or a peft tuner's (``LoraModel`` …) ``model``; ``None`` for other modules.

    peft is recognised by the class's module, never imported: the library works without it.
    """
    if type(model).__module__.split(".")[0] != "peft" or not isinstance(getattr(model, "peft_config", None), dict):
        return None
    children = model.__dict__.get("_modules", {})
    if isinstance(children.get("base_model"), nn.Module):  # PeftModel and its task subclasses
        peft: Any = model  # peft's attributes, read without importing peft
        active = peft.active_adapter
        for name in [active] if isinstance(active, str) else list(active):
            if getattr(peft.peft_config.get(name), "is_prompt_learning", False):
                raise UnsupportedModelError(
                    f"{type(model).__name__}: adapter {name!r} is prompt learning "
                    f"({peft.peft_config[name].peft_type}), whose virtual tokens the explanation does not compute; "
                    "adapters on layers (LoRA, DoRA, IA³) are explained"
                )
        return children["base_model"]
    if isinstance(children.get("model"), nn.Module):  # a tuner (LoraModel, IA3Model, …): the model it adapts
        return children["model"]
    return None


__all__ = ["unwrap"]

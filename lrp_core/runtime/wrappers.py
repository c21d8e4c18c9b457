"""Wrapped models: ``torch.compile``, ``DataParallel`` and ``DistributedDataParallel`` hold the model the
engine explains; TorchScript has no Python submodules to replay and is refused."""
from __future__ import annotations

from torch import nn

from ..errors import UnsupportedModelError


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside its wrappers (nested ones too): ``_orig_mod`` of a compiled model, ``.module`` of
    ``DataParallel`` / ``DistributedDataParallel``.

    The replay calls the inner model's own submodules, so a compiled wrapper's graphs are not used and a
    data-parallel wrapper's replicas are not made: the explanation is the inner model's, on its device.
    """
    import torch
    while True:
        if isinstance(model, torch.jit.ScriptModule):
            raise UnsupportedModelError(
                f"{type(model).__name__} is a TorchScript module (torch.jit.script / torch.jit.trace): its "
                "submodules are compiled code the explanation cannot replay. Explain the original nn.Module "
                "(the one you scripted or traced); torch.compile, DataParallel and DistributedDataParallel "
                "wrappers are accepted")
        inner = _inner(model)
        if inner is None:
            return model
        model = inner


def _inner(model: nn.Module):
    from torch.nn.parallel import DataParallel, DistributedDataParallel
    if isinstance(model, (DataParallel, DistributedDataParallel)):
        return model.module
    if type(model).__name__ == "OptimizedModule" and isinstance(model.__dict__.get("_modules", {}).get("_orig_mod"),
                                                                nn.Module):
        return model._orig_mod
    return None


__all__ = ["unwrap"]

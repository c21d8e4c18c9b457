"""Offloaded models: every tensor the engine reads is the one accelerate loads for the module's forward.

accelerate fits a model larger than its accelerator by keeping some modules' weights elsewhere (CPU memory or
disk: ``cpu_offload``, ``disk_offload``, ``dispatch_model`` with ``"cpu"`` / ``"disk"`` entries, ``from_pretrained(...,
device_map=..., offload_folder=...)``). Each such module carries an ``AlignDevicesHook`` (``module._hf_hook``,
possibly inside a ``SequentialHook``) with ``offload=True`` and a ``weights_map``: around the module's forward the
hook loads the weights from that map onto its ``execution_device``, and afterwards it puts a *meta* placeholder
back. The replay calls the modules themselves, so their outputs are right; but the relevance rules and the
adapters read parameters outside the forward (a Linear's weight in an LRP rule, a norm's γ in AttnLRP's rule, a
ViT's class token), and there they would read the placeholder.

:func:`loaded_weights` is entered around every call of the engine (by
:func:`~lrp_core.runtime.precision.compute_precision`): while it is active, a torch operation that is handed the
meta placeholder of an offloaded tensor is handed instead what the hook would load — ``weights_map[key]`` on the
hook's execution device, in the placeholder's dtype (as ``set_module_tensor_to_device`` does). The value is
loaded for that operation only: nothing keeps it but what the operation returns (and autograd, where a graph
needs it), so no full copy of the model is ever held; the model, its hooks and its placeholders are never
touched. :func:`resolve` gives one module's tensor the same way, for the weight views of the rules.

A tensor on the meta device that no hook offloads was never loaded (a model built under
``accelerate.init_empty_weights()`` or on ``device="meta"``): :func:`check_loaded` refuses such a model, naming
the first such tensor.

accelerate is optional: its hooks are recognised by their class names, and it is never imported here.
"""

from __future__ import annotations

import threading
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from ..errors import UnsupportedModelError

_state = threading.local()

#: torch functions that read a tensor's metadata (or manage autograd): handed the placeholder itself, so that
#: nothing is loaded for them and accelerate's own bookkeeping (``data_ptr`` of tied weights) sees what it set
METADATA_FUNCTIONS = frozenset(
    {
        "__set__",
        "__delete__",
        "size",
        "dim",
        "ndimension",
        "numel",
        "nelement",
        "element_size",
        "is_floating_point",
        "is_complex",
        "is_inference",
        "data_ptr",
        "untyped_storage",
        "stride",
        "storage_offset",
        "is_contiguous",
        "get_device",
        "__len__",
        "__repr__",
        "__format__",
        "__hash__",
        "__reduce_ex__",
        "__deepcopy__",
        "register_hook",
        "retain_grad",
        "requires_grad_",
    }
)


@dataclass(frozen=True)
class Offloaded:
    """One offloaded tensor: ``owner``'s parameter or buffer ``name``, loaded by ``hook`` from its
    ``weights_map[key]``."""

    owner: nn.Module
    name: str
    hook: Any
    key: str

    def current(self) -> Optional[Tensor]:
        """The tensor the owner holds now (its placeholder outside the forward)."""
        t = self.owner._parameters.get(self.name)
        return self.owner._buffers.get(self.name) if t is None else t

    def load(self, like: Tensor) -> Tensor:
        """What the hook's forward would load, in ``like``'s dtype (a floating tensor) on the execution device.

        Parameters
        ----------
        like : Tensor
            The placeholder (its dtype is the model's).

        Returns
        -------
        Tensor
            A new tensor outside autograd (no parameter gradient is ever taken).
        """
        value = self.hook.weights_map[self.key]
        device = as_device(self.hook.execution_device)
        with torch.no_grad():
            dtype = like.dtype if value.is_floating_point() and like.is_floating_point() else value.dtype
            return value.to(device=value.device if device is None else device, dtype=dtype)


def align_hooks(module: nn.Module, offloading: bool = True) -> list:
    """The ``AlignDevicesHook`` s on ``module`` (none for a module accelerate did not hook): the offloading ones
    (holding a weights map), or every one (``offloading=False``: a module placed on a device)."""
    hook = module.__dict__.get("_hf_hook")
    if hook is None:
        return []
    hooks = list(getattr(hook, "hooks", None) or [hook])  # a SequentialHook holds several
    return [
        h
        for h in hooks
        if type(h).__name__ == "AlignDevicesHook"
        and (not offloading or (getattr(h, "offload", False) and h.weights_map is not None))
    ]


def as_device(device: Any) -> Optional[torch.device]:
    """accelerate's ``execution_device`` (an int is a CUDA index; ``None`` stays ``None``) as a torch device."""
    if device is None:
        return None
    return torch.device("cuda", device) if isinstance(device, int) else torch.device(device)


def offloaded_tensors(model: nn.Module) -> list[Offloaded]:
    """Every tensor of ``model`` that an accelerate hook loads around its module's forward.

    Parameters
    ----------
    model : nn.Module
        Any model.

    Returns
    -------
    list[Offloaded]
        One entry per offloaded parameter (and buffer, where the hook offloads buffers); empty for a model
        accelerate did not offload.
    """
    out: list[Offloaded] = []
    for module in model.modules():
        for hook in align_hooks(module):
            recurse = bool(hook.place_submodules)
            keys = [n for n, _ in module.named_parameters(recurse=recurse)]
            if hook.offload_buffers:  # persistent buffers only: the hook keeps the others on the device
                keys += [n for n, _ in module.named_buffers(recurse=recurse) if _persistent(module, n)]
            for key in keys:
                path, _, leaf = key.rpartition(".")
                out.append(Offloaded(module.get_submodule(path) if path else module, leaf, hook, key))
    return out


def _persistent(module: nn.Module, key: str) -> bool:
    path, _, leaf = key.rpartition(".")
    return leaf not in (module.get_submodule(path) if path else module)._non_persistent_buffers_set


class _Index:
    """The offloaded tensors of one model, found by the identity of their placeholders.

    accelerate puts a new placeholder in after every forward of a module, so a placeholder not seen before is
    looked up among the owners' current tensors; each one seen stays known while it lives (a weak reference
    tells a live placeholder from a new tensor at a reused address).
    """

    def __init__(self, entries: list[Offloaded]):
        self.entries = entries
        self.known: dict[int, tuple[weakref.ref, Offloaded]] = {}

    def find(self, t: Tensor) -> Optional[Offloaded]:
        got = self.known.get(id(t))
        if got is not None and got[0]() is t:
            return got[1]
        for entry in self.entries:
            cur = entry.current()
            if cur is not None and cur.is_meta:
                self.known[id(cur)] = (weakref.ref(cur), entry)
        got = self.known.get(id(t))
        return got[1] if got is not None and got[0]() is t else None


class LoadedWeightsMode(TorchFunctionMode):
    """Every torch operation is handed, for an offloaded tensor's placeholder, the value its hook loads."""

    def __init__(self, index: _Index):
        super().__init__()
        self.index = index

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in METADATA_FUNCTIONS or (not _has_meta(args) and not _has_meta(kwargs.values())):
            return func(*args, **kwargs)
        if name == "__get__":  # an attribute: only a tensor-valued one (.T, .data) is loaded
            out = func(*args, **kwargs)
            if not (isinstance(out, Tensor) and out.is_meta):
                return out
        return func(*self._swap(args), **{k: self._swap(v) for k, v in kwargs.items()})

    def _swap(self, v: Any) -> Any:
        if isinstance(v, Tensor) and v.is_meta:
            entry = self.index.find(v)
            return v if entry is None else entry.load(v)
        if isinstance(v, (list, tuple)) and not hasattr(v, "_fields"):
            return type(v)(self._swap(x) for x in v)
        return v


def _has_meta(values: Any) -> bool:
    for v in values:
        if isinstance(v, Tensor):
            if v.is_meta:
                return True
        elif isinstance(v, (list, tuple)) and _has_meta(v):
            return True
    return False


@contextmanager
def loaded_weights(model: nn.Module) -> Iterator[None]:
    """While active, every offloaded tensor of ``model`` reads as the value accelerate loads for its forward.

    Re-entrant, and a no-op for a model accelerate did not offload. Nothing of the model is changed: the values
    are loaded per operation, transiently. A model with weights never loaded is refused here
    (:func:`check_loaded`), before anything computes with it.

    Parameters
    ----------
    model : nn.Module
        The model the enclosed code explains.

    Yields
    ------
    None
        Nothing; the enclosed code reads the loaded values.

    Raises
    ------
    UnsupportedModelError
        If tensors of ``model`` are on the meta device with no offloaded copy.
    """
    if getattr(_state, "model", None) is model:
        yield
        return
    check_loaded(model)
    entries = offloaded_tensors(model)
    outer = getattr(_state, "model", None), getattr(_state, "index", None)
    _state.model, _state.index = model, (_Index(entries) if entries else None)
    try:
        if _state.index is None:
            yield
        else:
            with LoadedWeightsMode(_state.index):
                yield
    finally:
        _state.model, _state.index = outer


def explained_model() -> Optional[nn.Module]:
    """The model whose weights the enclosing :func:`loaded_weights` reads (``None`` outside one): what a refusal
    names a module within.

    Returns
    -------
    nn.Module or None
        The model.
    """
    return getattr(_state, "model", None)


def loaded(t: Tensor) -> Tensor:
    """``t`` as the operation it enters sees it: an offloaded tensor's placeholder (meta) is its loaded value
    inside :func:`loaded_weights`, anything else ``t`` itself (what a rule reads later, outside the forward).

    Parameters
    ----------
    t : Tensor
        An operand of the replay.

    Returns
    -------
    Tensor
        The loaded value, or ``t``.
    """
    if not t.is_meta:
        return t
    index = getattr(_state, "index", None)
    entry = index.find(t) if index is not None else None
    return t if entry is None else entry.load(t)


def resolve(module: nn.Module, name: str) -> Optional[Tensor]:
    """``module``'s parameter or buffer ``name`` as its forward sees it: the loaded value of an offloaded tensor
    (inside :func:`loaded_weights`, or where the module's own hook offloads it), else the tensor itself.

    Parameters
    ----------
    module : nn.Module
        The module.
    name : str
        A direct parameter or buffer name (``"weight"``).

    Returns
    -------
    Tensor or None
        The tensor (``None`` where the module has none of that name).
    """
    t = getattr(module, name, None)
    if not isinstance(t, Tensor) or not t.is_meta:
        return t
    index = getattr(_state, "index", None)
    entry = index.find(t) if index is not None else None
    if entry is None:
        for hook in align_hooks(module):
            if name in dict(module.named_parameters(recurse=False)) or hook.offload_buffers:
                entry = Offloaded(module, name, hook, name)
                break
    return t if entry is None else entry.load(t)


def execution_device(module: nn.Module, tensor: Tensor) -> torch.device:
    """Where ``module``'s forward computes with ``tensor``: its offloading hook's execution device for a
    placeholder, else the tensor's own device.

    Parameters
    ----------
    module : nn.Module
        The module owning ``tensor`` directly.
    tensor : Tensor
        One of its parameters or buffers.

    Returns
    -------
    torch.device
        The device.
    """
    if tensor.is_meta:
        for hook in align_hooks(module):
            device = as_device(hook.execution_device)
            if device is not None:
                return device
    return tensor.device


def check_loaded(model: nn.Module) -> None:
    """Refuse a model with tensors on the meta device that no accelerate hook loads (weights never loaded).

    Parameters
    ----------
    model : nn.Module
        The model to explain.

    Raises
    ------
    UnsupportedModelError
        Naming how many tensors were never loaded, the first one, and how to load them.
    """
    meta = [n for n, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if not meta:
        return
    names = dict((id(m), n) for n, m in model.named_modules())
    covered = {f"{names[id(e.owner)]}{'.' if names[id(e.owner)] else ''}{e.name}" for e in offloaded_tensors(model)}
    missing = [n for n in meta if n not in covered]
    if missing:
        raise UnsupportedModelError(
            f"{type(model).__name__}'s weights were never loaded: {len(missing)} of its tensors are on the meta "
            f"device with no offloaded copy (first: {missing[0]!r}) — a model built under "
            "accelerate.init_empty_weights() or on device='meta' has shapes but no values. Load its weights first "
            "(accelerate.load_checkpoint_and_dispatch, from_pretrained, or model.to_empty(device=...) then "
            "load_state_dict); offloaded models (cpu_offload, disk_offload, dispatch_model, device_map with "
            "offload_folder) are explained as they are"
        )


__all__ = [
    "METADATA_FUNCTIONS",
    "Offloaded",
    "offloaded_tensors",
    "LoadedWeightsMode",
    "loaded_weights",
    "explained_model",
    "loaded",
    "resolve",
    "execution_device",
    "check_loaded",
    "align_hooks",
    "as_device",
]

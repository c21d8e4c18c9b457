"""Two simulated accelerators on the CPU, for the tests of models split over devices (issue #46).

No CUDA here, and torch cannot make a second real device from Python; what a split model needs checked is that
every operation's operands are on one device. :class:`FakeDevices` is a dispatch mode under which a tensor can
live "on" ``privateuseone:0`` or ``privateuseone:1``: it is a :class:`OnDevice` wrapper around an ordinary CPU
tensor that reports that device. Every operation unwraps its operands, computes on the CPU — the same kernels,
so the values are the CPU's bit for bit — and wraps its results on the operands' device. Like CUDA, an operation
that mixes tensors of two devices (a 0-dim CPU tensor aside, and the index tensors of an indexing) raises
``RuntimeError: Expected all tensors to be on the same device``; ``.to(device)`` and ``copy_`` move between
them, factories (``torch.arange(..., device=...)``) make tensors on them. accelerate's ``dispatch_model`` places
modules on them as on GPUs (its hooks move the inputs with ``.to``).

What this does not simulate: separate memory, streams and asynchrony, CUDA-only code paths (``torch.cuda.*``),
and kernels that differ by device (the values are the CPU's). A real GPU test runs where one is lent.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

#: the simulated devices
GPU0, GPU1 = torch.device("cpu", 1), torch.device("cpu", 2)
CPU = torch.device("cpu")

#: operations allowed to see tensors of several devices: moves, and indexing (its index tensors may be on the CPU)
CROSS_DEVICE = {
    "_to_copy",
    "copy_",
    "copy",
    "_copy_from",
    "_copy_from_and_resize",
    "index",
    "index_put_",
    "index_put",
    "_index_put_impl_",
    "lift_fresh",
    "lift_fresh_copy",
    "detach",
    "alias",
    "set_",
    "_has_compatible_shallow_copy_type",
    "_local_scalar_dense",
}


class OnDevice(Tensor):
    """A CPU tensor ``elem`` that reports ``device`` (a simulated accelerator)."""

    elem: Tensor

    @staticmethod
    def __new__(cls, elem: Tensor, device: Optional[torch.device] = None, requires_grad: bool = False):
        if device is None:  # type(param)(value, requires_grad=...), as accelerate remakes a parameter
            return torch.nn.Parameter(elem, requires_grad)
        out = Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
            cls,
            elem.shape,
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            layout=elem.layout,
            device=device,
            requires_grad=requires_grad,
        )
        out.elem = elem.detach()
        return out

    __torch_function__ = torch._C._disabled_torch_function_impl

    def untyped_storage(self):  # aliasing is the CPU tensors' (the replay asks whether an output is a view)
        return self.elem.untyped_storage()

    def tolist(self):  # as a CUDA tensor's: copied to the host
        return self.elem.tolist()

    def __repr__(self) -> str:
        return f"OnDevice({self.elem!r}, device={self.device})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        with FakeDevices():
            return func(*args, **(kwargs or {}))


class _Backend:
    """What torch asks of the module of a Python-registered device type: two devices, always ready."""

    def is_initialized(self) -> bool:
        return True

    def is_available(self) -> bool:
        return True

    def current_device(self) -> int:
        return 0

    def _is_in_bad_fork(self) -> bool:
        return False

    def manual_seed_all(self, seed: int) -> None:
        pass

    def device_count(self) -> int:
        return 2


def register() -> None:
    """Let torch parse and move to ``privateuseone:N`` (once per process; nothing else uses that device type)."""
    from torch.utils import backend_registration as reg

    if getattr(register, "done", False):
        return
    reg._setup_privateuseone_for_python_backend(backend_module=_Backend())
    register.done = True  # type: ignore[attr-defined]


def _fake(device: Any) -> bool:
    return device is not None and torch.device(device).type == "cpu" and torch.device(device).index not in (None, 0)


class FakeDevices(TorchDispatchMode):
    """While active, ``privateuseone:0`` / ``privateuseone:1`` behave as two accelerators (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.constructors = _Constructors()

    def __enter__(self):
        self.constructors.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self.constructors.__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = func.overloadpacket.__name__
        flat, _ = tree_flatten((args, kwargs))
        tensors = [t for t in flat if isinstance(t, Tensor)]
        devices = {t.device for t in tensors if not (t.device.type == "cpu" and t.dim() == 0)}
        if name not in CROSS_DEVICE and len(devices) > 1:
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found at least two devices, "
                f"{' and '.join(sorted(map(str, devices)))}! (when calling {func})"
            )
        target = kwargs.get("device")
        if target is not None:
            target = torch.device(target)
            if _fake(target):
                kwargs["device"] = CPU
        elif name in ("copy_", "index_put_", "_index_put_impl_", "set_"):
            target = args[0].device
        else:
            target = next(iter(devices)) if devices else (tensors[0].device if tensors else CPU)
        wrappers = {id(t.elem): t for t in tensors if isinstance(t, OnDevice)}
        args, kwargs = tree_map(_unwrap, (args, kwargs))
        out = func(*args, **kwargs)
        if target is None or not _fake(target):
            return tree_map(lambda t: wrappers.get(id(t), t) if isinstance(t, Tensor) else t, out)
        return tree_map(lambda t: _wrap(t, target, wrappers), out)


#: the constructors from data, which torch runs below the dispatch modes' reach: made on the CPU, then moved
CONSTRUCTORS = {torch.tensor, torch.as_tensor, torch.asarray, Tensor.new_tensor}


class _Constructors(TorchFunctionMode):
    """``torch.tensor(data, device=<simulated>)`` and its kin: made on the CPU, then moved there."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        device = kwargs.get("device")
        if func in CONSTRUCTORS and _fake(device):
            kwargs["device"] = CPU
            # data holding simulated tensors (a list of 0-dim values): their CPU values (a wrapper has no storage)
            return func(*tree_map(_unwrap, args), **kwargs).to(device)
        return func(*args, **kwargs)


def _unwrap(v: Any) -> Any:
    return v.elem if isinstance(v, OnDevice) else v


def _wrap(v: Any, device: torch.device, wrappers: dict) -> Any:
    if not isinstance(v, Tensor):
        return v
    known = wrappers.get(id(v))
    return OnDevice(v, device) if known is None else known


__all__ = ["GPU0", "GPU1", "CPU", "OnDevice", "FakeDevices"]

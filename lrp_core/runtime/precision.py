"""Half-precision models explained in float32, without copying or changing the model.

Relevance passes divide by sums of products that nearly cancel (``docs/METHODS.md`` §1): in float16 or
bfloat16 (11 or 8 significant bits) the ratios lose every digit, so a map computed in the model's own half
precision is wrong — silently: zeros, NaN, or a map far from the float32 one. The engine
therefore computes every pass of a half-precision model (and of any model under ``torch.autocast``) in
float32:

* :func:`compute_precision` is entered around every call of the engine (``explain`` and the adapters'
  forward and relevance passes, for their direct users); while it is active every torch operation sees
  its float16 / bfloat16 tensors as float32 — the model's weights are upcast one operation at a time,
  transiently (an embedding table only in the rows looked up), and a cast to a half dtype is a cast to
  float32. The model itself is never touched: no ``.float()``, no copy.
* autocast is switched off inside, so an enclosing ``torch.autocast`` changes nothing.
* autograd would keep the float32 copy of every weight a forward pass multiplies with (for the backward
  pass), that is a float32 copy of the model by the end of the forward; instead it keeps a reference to
  the half parameter and upcasts it again when the backward pass needs it.

The result is the float32 result of the same weights: what ``model.float()`` would give (bitwise on CPU).
Float32 and float64 models never enter the mode (their arithmetic is unchanged). Tolerances, and the errors
before and after: ``docs/METHODS.md`` §5.9.
"""

from __future__ import annotations

import threading
import weakref
from contextlib import ExitStack, contextmanager
from typing import Any, Iterator

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

#: the dtypes computed in float32 instead
HALF = (torch.float16, torch.bfloat16)

#: torch functions that read a tensor's metadata or manage autograd: passed through as they are
_METADATA = frozenset(
    {
        "__get__",
        "__set__",
        "__delete__",
        "grad",
        "size",
        "dim",
        "ndimension",
        "numel",
        "nelement",
        "element_size",
        "is_floating_point",
        "is_complex",
        "data_ptr",
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
_TO_FLOAT32 = frozenset({"half", "bfloat16"})  # x.half(), x.bfloat16()

_state = threading.local()


def autocast_active() -> bool:
    """Whether ``torch.autocast`` is on for the CPU or a CUDA device here."""
    devices = ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)
    return any(torch.is_autocast_enabled(d) for d in devices)


def is_half(model: nn.Module) -> bool:
    """Whether any floating parameter or buffer of ``model`` is float16 / bfloat16.

    Parameters
    ----------
    model : nn.Module
        The model.

    Returns
    -------
    bool
        ``True`` if a floating parameter or buffer is float16 or bfloat16.
    """
    return any(t.dtype in HALF for t in _tensors(model))


def needs_float32(model: nn.Module) -> bool:
    """Whether a relevance pass on ``model`` here must run under :func:`compute_precision`.

    Parameters
    ----------
    model : nn.Module
        The model.

    Returns
    -------
    bool
        ``True`` if the model is half precision or autocast is on.
    """
    return autocast_active() or is_half(model)


def compute_dtype(model: nn.Module) -> torch.dtype:
    """The dtype the engine computes ``model``'s passes in: float32 for half models, else the weights' dtype.

    Parameters
    ----------
    model : nn.Module
        The model.

    Returns
    -------
    torch.dtype
        ``torch.float32`` for a half model, else the dtype of its weights (the default
        dtype for a model without floating tensors).
    """
    for t in _tensors(model):
        return torch.float32 if t.dtype in HALF else t.dtype
    return torch.get_default_dtype()


@contextmanager
def compute_precision(model: nn.Module) -> Iterator[None]:
    """Run the enclosed passes in float32 if ``model`` is half precision or autocast is on; else do nothing.

    Re-entrant: a nested call inside an active one does nothing more, and a nested call for the model an
    enclosing call found in float32 does not look through its weights again (the engine changes no dtype;
    ``explain`` enters this three times per call, and each look walks every parameter and buffer).

    Parameters
    ----------
    model : nn.Module
        The model.

    Yields
    ------
    None
        Nothing; the enclosed passes run in float32 where needed.
    """
    if getattr(_state, "active", False):
        yield
        return
    outer = getattr(_state, "float32_model", None)  # the model an enclosing call found in float32, if any
    if not (autocast_active() or (outer is not model and is_half(model))):
        _state.float32_model = model
        try:
            yield
        finally:
            _state.float32_model = outer
        return
    _state.active = True
    try:
        with ExitStack() as stack:
            for device in {"cpu"} | {t.device.type for t in _tensors(model)}:
                if device in ("cpu", "cuda"):
                    stack.enter_context(torch.autocast(device, enabled=False))
            stack.enter_context(torch.autograd.graph.saved_tensors_hooks(_pack, _unpack))
            stack.enter_context(Float32Mode())
            yield
    finally:
        _state.active = False


class Float32Mode(TorchFunctionMode):
    """Every torch operation sees its float16 / bfloat16 tensors upcast to float32, its half dtypes as float32."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in _METADATA:
            return func(*args, **kwargs)
        if name in _TO_FLOAT32:
            return _upcast(args[0])
        if func is torch.nn.functional.embedding:  # look the rows up in half, upcast only them
            return _embedding(*args, **kwargs)
        if _writes_in_place(name, kwargs) and _is_half(args[0] if args else None):
            # a write into a half tensor would round the float32 result back to 8 or 11 bits
            raise RuntimeError(
                f"lrp_core.runtime.precision: in-place {name} on a {args[0].dtype} tensor inside a "
                "float32 pass (an engine bug: build the tensor in float32)"
            )
        return func(*_convert(args), **{k: _convert(v) for k, v in kwargs.items()})


def _writes_in_place(name: str, kwargs: dict) -> bool:
    return (
        "out" in kwargs
        or name == "__setitem__"
        or (name.endswith("_") and not name.startswith("_"))
        or (name.startswith("__i") and name.endswith("__"))
    )


def _is_half(t: Any) -> bool:
    return isinstance(t, Tensor) and t.dtype in HALF


def _convert(v: Any) -> Any:
    """A half tensor upcast, a half dtype replaced by float32, inside lists and tuples too; anything else as is."""
    if isinstance(v, Tensor):
        return _upcast(v) if v.dtype in HALF else v
    if isinstance(v, torch.dtype):
        return torch.float32 if v in HALF else v
    if isinstance(v, (list, tuple)) and not hasattr(v, "_fields"):  # not a named tuple (torch.Size is a tuple)
        return type(v)(_convert(x) for x in v)
    return v


def _upcast(t: Tensor) -> Tensor:
    """``t`` in float32. A parameter becomes a constant (no graph to the model's weights; none is asked for),
    registered so that autograd saves the parameter, not the float32 copy (see :func:`_pack`)."""
    if isinstance(t, nn.Parameter) or not t.requires_grad:
        with torch.no_grad():
            up = t.float()
        if isinstance(t, nn.Parameter) and up.numel():
            # keyed by the copy's memory: autograd often saves a view of it (Linear saves weight.t()); the entry
            # goes when the copy does, so the address cannot be taken by another tensor while it is listed
            ptr = up.untyped_storage().data_ptr()
            _UPCAST[ptr] = t
            weakref.finalize(up, _UPCAST.pop, ptr, None)
        return up
    return t.float()  # an activation: the graph goes on through the cast


#: memory address of a live float32 copy -> the half parameter it was made from
_UPCAST: dict[int, Tensor] = {}


def _embedding(input: Tensor, weight: Tensor, *args, **kwargs) -> Tensor:
    if not _is_half(weight):
        return torch.nn.functional.embedding(input, weight, *args, **kwargs)
    with torch.no_grad():
        return torch.nn.functional.embedding(input, weight, *args, **kwargs).float()


def _pack(t: Tensor) -> Any:
    """What autograd keeps of a tensor it saves: for (a view of) a parameter's float32 copy, the half parameter
    and the view's geometry — not a float32 copy of every weight until the backward pass."""
    if t.layout != torch.strided or t.dtype != torch.float32 or not t.numel():
        return t
    source = _UPCAST.get(t.untyped_storage().data_ptr())
    if source is None:
        return t
    return (source, t.size(), t.stride(), t.storage_offset())


def _unpack(saved: Any) -> Tensor:
    if isinstance(saved, tuple):
        source, size, stride, offset = saved
        with torch.no_grad():  # the copy has the parameter's layout (float() keeps the strides)
            return source.float().as_strided(size, stride, offset)
    return saved


def _tensors(model: nn.Module) -> Iterator[Tensor]:
    """The floating parameters and buffers of ``model``."""
    for t in model.parameters():
        if t.is_floating_point():
            yield t
    for b in model.buffers():
        if b.is_floating_point():
            yield b


__all__ = ["HALF", "autocast_active", "is_half", "needs_float32", "compute_dtype", "compute_precision", "Float32Mode"]

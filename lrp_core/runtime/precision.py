"""Half-precision models explained in float32, and any model in float64 on request, without copying it.

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
Float32 and float64 models never enter the mode unless asked (their arithmetic is unchanged).

``explain(..., dtype=torch.float64)`` enters the same mode with float64 as its target: float16, bfloat16 *and*
float32 tensors are upcast to float64 one operation at a time, so a float32 model is explained as
``model.double()`` would be, without the copy. Plain LRP and transformer attribution are ill-conditioned in
float32 (``docs/METHODS.md`` §5.10 gives the measured deviations): their float32 digits depend on the CPU's BLAS
kernels, their float64 digits far less. Tolerances, and the errors before and after: ``docs/METHODS.md`` §5.9.
"""

from __future__ import annotations

import threading
import weakref
from contextlib import ExitStack, contextmanager
from typing import Any, Iterator, Optional

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from . import fast_half as fast
from .offload import METADATA_FUNCTIONS, loaded_weights

#: the dtypes computed in float32 instead
HALF = (torch.float16, torch.bfloat16)
#: the dtypes a call may ask to be computed in (``explain(..., dtype=)``), by precision
TARGETS = (torch.float32, torch.float64)

#: torch functions that read a tensor's metadata or manage autograd: passed through as they are (the offload mode's
#: set, with attribute reads and ``.grad``, which this mode casts nothing for either)
_METADATA = (METADATA_FUNCTIONS - {"is_inference", "untyped_storage"}) | {"__get__", "grad"}
_TO_TARGET = {torch.float32: frozenset({"half", "bfloat16"}), torch.float64: frozenset({"half", "bfloat16", "float"})}
#: the floating dtypes upcast to each target
_BELOW = {torch.float32: HALF, torch.float64: (*HALF, torch.float32)}

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


def compute_dtype(model: nn.Module, dtype: Optional[torch.dtype] = None) -> torch.dtype:
    """The dtype the engine computes ``model``'s passes in: ``dtype`` if asked, float32 for half models, else
    the weights' dtype.

    Parameters
    ----------
    model : nn.Module
        The model.
    dtype : torch.dtype, optional
        The precision asked for (``explain(..., dtype=)``), checked by :func:`check_dtype`.

    Returns
    -------
    torch.dtype
        ``dtype`` when given; else ``torch.float32`` for a half model, else the dtype of its weights (the
        default dtype for a model without floating tensors).
    """
    own = torch.get_default_dtype()
    for t in _tensors(model):
        own = torch.float32 if t.dtype in HALF else t.dtype
        break
    checked = check_dtype(dtype, own)
    return own if checked is None else checked


def check_dtype(dtype: Any, own: Optional[torch.dtype] = None) -> Optional[torch.dtype]:
    """``dtype`` if it is a precision a call may ask for (``None``, float32, float64) and not below ``own``.

    Parameters
    ----------
    dtype : Any
        What ``explain(..., dtype=)`` was given.
    own : torch.dtype, optional
        The model's own compute dtype (:func:`compute_dtype` without a request), when known.

    Returns
    -------
    torch.dtype or None
        ``dtype``.

    Raises
    ------
    InputError
        If ``dtype`` is not ``None``, ``torch.float32``, ``torch.float64`` or a half dtype (the fast mode,
        :mod:`lrp_core.runtime.fast_half`, which checks it against the model), or is below the model's own
        compute precision (a float64 model is not explained in float32).
    """
    from ..errors import InputError  # late: lrp_core.errors imports nothing of the runtime, but keep it a leaf

    if dtype is None:
        return None
    if dtype in HALF:  # the fast half mode: checked against the model when entered (runtime.fast_half)
        return dtype
    if dtype not in TARGETS:
        raise InputError(
            f"dtype must be None (the model's precision; half models in float32), torch.float32, "
            f"torch.float64, or a half model's own dtype (torch.bfloat16 / torch.float16: the fast half mode), "
            f"got {dtype!r}"
        )
    if own is not None and own in TARGETS and TARGETS.index(dtype) < TARGETS.index(own):
        raise InputError(
            f"dtype={dtype} is below the precision of this {own} model: ask for {own} or None "
            "(a relevance pass is never computed in less than the model's own precision)"
        )
    return dtype


def active_dtype() -> Optional[torch.dtype]:
    """The target of the precision mode active in this thread (float32 or float64; the model's half dtype in the
    fast half mode, :mod:`lrp_core.runtime.fast_half`), ``None`` outside one.

    Returns
    -------
    torch.dtype or None
        The dtype every floating operation is computed in right now, if a mode is active.
    """
    return getattr(_state, "target", None)


@contextmanager
def compute_precision(model: nn.Module, dtype: Optional[torch.dtype] = None) -> Iterator[None]:
    """Run the enclosed passes in ``dtype`` if asked, in float32 if ``model`` is half precision or autocast is
    on; else do nothing.

    An offloaded model's tensors read, meanwhile, as accelerate loads them for each module's forward
    (:func:`lrp_core.runtime.offload.loaded_weights`).

    Re-entrant: a nested call inside an active mode does nothing more (unless it asks for a higher precision),
    and a nested call for the model an enclosing call found in float32 does not look through its weights
    again (the engine changes no dtype; ``explain`` enters this three times per call, and each look walks every
    parameter and buffer).

    Parameters
    ----------
    model : nn.Module
        The model.
    dtype : torch.dtype, optional
        ``torch.float64`` (or float32) to compute every pass of a lower-precision model in; checked by
        :func:`check_dtype`.

    Yields
    ------
    None
        Nothing; the enclosed passes run in the target precision where needed.
    """
    # an offloaded model's tensors read as accelerate loads them for each forward (lrp_core.runtime.offload)
    with loaded_weights(model), _precision(model, dtype):
        yield


@contextmanager
def _precision(model: nn.Module, dtype: Optional[torch.dtype]) -> Iterator[None]:
    """:func:`compute_precision` without the offloaded weights."""
    if dtype in HALF and active_dtype() is None:  # the fast half mode (opt-in): the model's own dtype
        with fast_half(model, dtype):
            yield
        return
    if dtype is not None:
        compute_dtype(model, dtype)  # checks it: a precision a call may ask for, not below the model's
    active = active_dtype()
    if active in HALF or (active is not None and (dtype is None or TARGETS.index(dtype) <= TARGETS.index(active))):
        yield
        return
    outer = getattr(_state, "float32_model", None)  # the model an enclosing call found in float32, if any
    if dtype is not None and _has_below(model, dtype):
        target: Optional[torch.dtype] = dtype
    elif autocast_active() or (outer is not model and is_half(model)):
        target = torch.float32
    else:
        target = None
    if target is None:
        _state.float32_model = model
        try:
            yield
        finally:
            _state.float32_model = outer
        return
    _state.target = target
    try:
        with ExitStack() as stack:
            for device in {"cpu"} | {t.device.type for t in _tensors(model)}:
                if device in ("cpu", "cuda"):
                    stack.enter_context(torch.autocast(device, enabled=False))
            stack.enter_context(torch.autograd.graph.saved_tensors_hooks(_pack, _unpack))
            stack.enter_context(UpcastMode(target))
            yield
    finally:
        _state.target = active


def _has_below(model: nn.Module, dtype: torch.dtype) -> bool:
    """Whether a floating parameter or buffer of ``model`` is below ``dtype`` (or autocast would lower one)."""
    return autocast_active() or any(t.dtype in _BELOW[dtype] for t in _tensors(model))


class UpcastMode(TorchFunctionMode):
    """Every torch operation sees its floating tensors below ``target`` upcast to it, and those dtypes as it.

    ``target`` float32: float16 / bfloat16 are upcast (a half model); float64: float32 too (``dtype=float64``).
    """

    def __init__(self, target: torch.dtype = torch.float32):
        super().__init__()
        self.target = target
        self.below = _BELOW[target]
        self.casts = _TO_TARGET[target]

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in _METADATA:
            return func(*args, **kwargs)
        if name in self.casts:
            return self._up(args[0])
        if func is torch.nn.functional.embedding:  # look the rows up in the table's dtype, upcast only them
            return _embedding(self, *args, **kwargs)
        first = args[0] if args else None
        if _writes_in_place(name, kwargs) and isinstance(first, Tensor) and first.dtype in self.below:
            if self.target is torch.float64 and first.dtype == torch.float32:
                # a float32 tensor the engine made in the default dtype (model.double() would write into it too)
                return func(*args, **kwargs)
            # a write into a half tensor would round the float32 result back to 8 or 11 bits
            raise RuntimeError(
                f"lrp_core.runtime.precision: in-place {name} on a {first.dtype} tensor inside a "
                f"{str(self.target).replace('torch.', '')} pass (an engine bug: build the tensor in that dtype)"
            )
        return func(*self._convert(args), **{k: self._convert(v) for k, v in kwargs.items()})

    def _convert(self, v: Any) -> Any:
        """A tensor below the target upcast, such a dtype replaced by the target, inside lists and tuples too."""
        if isinstance(v, Tensor):
            return self._up(v) if v.dtype in self.below else v
        if isinstance(v, torch.dtype):
            return self.target if v in self.below else v
        if isinstance(v, (list, tuple)) and not hasattr(v, "_fields"):  # not a named tuple (torch.Size is a tuple)
            return type(v)(self._convert(x) for x in v)
        return v

    def _up(self, t: Tensor) -> Tensor:
        return _upcast(t, self.target) if t.is_floating_point() or t.dtype in self.below else t.to(self.target)


#: the mode of a half model (the float32 target); the name the tests and older code use
Float32Mode = UpcastMode


def _writes_in_place(name: str, kwargs: dict) -> bool:
    return (
        "out" in kwargs
        or name == "__setitem__"
        or (name.endswith("_") and not name.startswith("_"))
        or (name.startswith("__i") and name.endswith("__"))
    )


def _upcast(t: Tensor, target: torch.dtype = torch.float32) -> Tensor:
    """``t`` in ``target``. A parameter becomes a constant (no graph to the model's weights; none is asked for),
    registered so that autograd saves the parameter, not the upcast copy (see :func:`_pack`)."""
    if isinstance(t, nn.Parameter) or not t.requires_grad:
        with torch.no_grad():
            up = t.to(target)
        if isinstance(t, nn.Parameter) and up.numel() and up.dtype != t.dtype:
            # keyed by the copy's memory: autograd often saves a view of it (Linear saves weight.t()); the entry
            # goes when the copy does, so the address cannot be taken by another tensor while it is listed
            ptr = up.untyped_storage().data_ptr()
            _UPCAST[ptr] = t
            weakref.finalize(up, _UPCAST.pop, ptr, None)
        return up
    return t.to(target)  # an activation: the graph goes on through the cast


#: memory address of a live upcast copy -> the parameter it was made from
_UPCAST: dict[int, Tensor] = {}


def _embedding(mode: UpcastMode, input: Tensor, weight: Tensor, *args, **kwargs) -> Tensor:
    if weight.dtype not in mode.below:
        return torch.nn.functional.embedding(input, weight, *args, **kwargs)
    with torch.no_grad():
        return torch.nn.functional.embedding(input, weight, *args, **kwargs).to(mode.target)


def _pack(t: Tensor) -> Any:
    """What autograd keeps of a tensor it saves: for (a view of) a parameter's upcast copy, the parameter and
    the view's geometry — not an upcast copy of every weight until the backward pass."""
    if t.layout != torch.strided or t.dtype not in TARGETS or not t.numel():
        return t
    source = _UPCAST.get(t.untyped_storage().data_ptr())
    if source is None:
        return t
    return (source, t.dtype, t.size(), t.stride(), t.storage_offset())


def _unpack(saved: Any) -> Tensor:
    if isinstance(saved, tuple):
        source, dtype, size, stride, offset = saved
        with torch.no_grad():  # the copy has the parameter's layout (to() keeps the strides)
            return source.to(dtype).as_strided(size, stride, offset)
    return saved


def _tensors(model: nn.Module) -> Iterator[Tensor]:
    """The floating parameters and buffers of ``model``."""
    for t in model.parameters():
        if t.is_floating_point():
            yield t
    for b in model.buffers():
        if b.is_floating_point():
            yield b


@contextmanager
def fast_half(model: nn.Module, dtype: torch.dtype) -> Iterator[None]:
    """The enclosed passes compute ``model`` (whose weights are ``dtype``) in its own dtype, autocast off.

    Parameters
    ----------
    model : nn.Module
        A float16 / bfloat16 model.
    dtype : torch.dtype
        Its dtype (checked: :func:`check_model`).

    Yields
    ------
    None
        Nothing; :func:`lrp_core.runtime.precision.active_dtype` reads ``dtype`` meanwhile.
    """
    fast.check_model(model, dtype)
    before = getattr(_state, "target", None)
    _state.target = dtype
    try:
        with ExitStack() as stack:
            for device in {"cpu"} | {p.device.type for p in model.parameters()}:
                if device in ("cpu", "cuda"):
                    stack.enter_context(torch.autocast(device, enabled=False))
            yield
    finally:
        _state.target = before


def active_fast() -> Optional[torch.dtype]:
    """The dtype of the fast mode active in this thread, ``None`` outside one."""
    dtype = active_dtype()
    return dtype if dtype in HALF else None


__all__ = [
    "HALF",
    "TARGETS",
    "autocast_active",
    "is_half",
    "needs_float32",
    "compute_dtype",
    "check_dtype",
    "active_dtype",
    "compute_precision",
    "UpcastMode",
    "Float32Mode",
    "fast_half",
    "active_fast",
]

"""Models split over devices: each block is replayed where its weights live (issue #46, docs/CONTRACTS.md).

accelerate places a model over several devices (``dispatch_model(model, device_map)``,
``from_pretrained(..., device_map="auto")``, a GPU and the CPU, two GPUs, layers offloaded to CPU memory or disk):
every entry of the device map is a module whose weights are on one device, or on the meta device with an
``AlignDevicesHook`` that loads them onto its ``execution_device`` for the module's forward. The hook also moves
the module's inputs there — but only when the module's own forward runs, and the replay calls a block's
submodules, not the block. So the replay moves what it hands a block itself: the residual stream, the attention
bias, the rotary tables, the rows read. :class:`Placement` says where a part of the model computes (the device
of its weights, or of the hook loading them) and moves tensors there; autograd moves the gradient — and in an
explicit pass the relevance — back across each ``.to(device)``, so every block's relevance is computed where
its weights are.

A model on one device (the usual case) is recognised once per call and nothing is moved. A block whose modules
compute on two devices (a device map that splits a block) is refused, naming the two modules and devices.

accelerate is optional: its hooks are recognised by their class name and attributes, and it is never imported.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

import torch
from torch import Tensor, nn

from ..errors import UnsupportedModelError
from .offload import align_hooks, as_device

#: how deep :meth:`Placement.devices` looks into a description (a block spec → its attention spec → a projection)
DEPTH = 4


def hook_device(module: nn.Module) -> Optional[torch.device]:
    """The ``execution_device`` of ``module``'s own accelerate ``AlignDevicesHook`` (inside a ``SequentialHook``
    too), or ``None`` where it has none.

    Parameters
    ----------
    module : nn.Module
        Any module.

    Returns
    -------
    torch.device or None
        Where the hook computes the module's forward.
    """
    for h in align_hooks(module, offloading=False):
        device = as_device(getattr(h, "execution_device", None))
        if device is not None:
            return device
    return None


def _hooked(model: nn.Module) -> dict[int, torch.device]:
    """id(module) → the execution device of its nearest hooked ancestor (itself included), for every module of
    ``model`` under an accelerate hook."""
    out: dict[int, torch.device] = {}

    def visit(module: nn.Module, inherited: Optional[torch.device]) -> None:
        own = hook_device(module) or inherited
        if own is not None:
            out[id(module)] = own
        for child in module.children():
            visit(child, own)

    visit(model, None)
    return out


class Placement:
    """Where the parts of one model compute, and the moves that put a block's inputs there.

    Built once per call from the model (:meth:`of`); ``split`` is False for a model on one device, and then
    :meth:`device` is ``None`` and nothing moves. ``name``: module → qualified name, for refusals.
    """

    def __init__(self, model: nn.Module, name: Optional[Callable[[nn.Module], str]] = None):
        self.name = name or (lambda m: type(m).__name__)
        self.hooked = _hooked(model)
        self.cache: dict[tuple[int, torch.device], tuple[Tensor, Tensor]] = {}
        self.modules: dict[int, tuple[Any, Optional[torch.device]]] = {}
        #: every device the model computes on, in module order
        self.all = list(dict.fromkeys(self._model_devices(model)))
        self.split = len(self.all) > 1

    def _model_devices(self, model: nn.Module) -> Iterator[torch.device]:
        for module in model.modules():
            for t in (*module._parameters.values(), *module._buffers.values()):
                if t is not None:
                    device = self._where(module, t)
                    if device is not None:
                        yield device

    def _where(self, owner: nn.Module, t: Tensor) -> Optional[torch.device]:
        """Where ``owner``'s forward computes with its tensor ``t``: its device, or its hook's for a placeholder."""
        return self.hooked.get(id(owner)) if t.is_meta else t.device

    def devices(self, *parts: Any) -> list[tuple[torch.device, nn.Module]]:
        """(device, the first module computing there) for every device the modules of ``parts`` compute on, in
        order of appearance. ``parts``: modules, or descriptions holding them (dataclasses, objects, lists)."""
        found: dict[torch.device, nn.Module] = {}
        seen: set[int] = set()
        for part in parts:
            self._scan(part, found, seen, DEPTH)
        return list(found.items())

    def _scan(self, part: Any, found: dict, seen: set, depth: int) -> None:
        if id(part) in seen or depth < 0 or part is None or isinstance(part, (Tensor, str, int, float, bool)):
            return
        seen.add(id(part))
        if isinstance(part, nn.Module):
            before = len(found)
            for module in part.modules():
                for t in (*module._parameters.values(), *module._buffers.values()):
                    device = None if t is None else self._where(module, t)
                    if device is not None:
                        found.setdefault(device, module)
            if len(found) == before:  # no tensor of its own: a view over the model's parts (plain attributes)
                self._scan_plain(part, found, seen, depth)
            return
        if isinstance(part, (list, tuple)):
            values: list = list(part)
        elif dataclasses.is_dataclass(part) and not isinstance(part, type):
            values = [getattr(part, f.name) for f in dataclasses.fields(part)]
        else:
            values = list(getattr(part, "__dict__", {}).values())
        for v in values:
            self._scan(v, found, seen, depth - 1)

    def _scan_plain(self, view: nn.Module, found: dict, seen: set, depth: int) -> None:
        """The modules and tensors a module without registered tensors holds as plain attributes (an adapter's
        view, e.g. an LM head with a bias and a scale): where they are is where the view computes."""
        for v in vars(view).values():
            if isinstance(v, nn.Module):
                self._scan(v, found, seen, depth - 1)
            elif isinstance(v, Tensor) and not v.is_meta:
                found.setdefault(v.device, view)

    def module_device(self, module: Any) -> Optional[torch.device]:
        """Where one module (a norm, a head Linear) computes: the first device of its tensors (``None``: the model
        is on one device, or the module holds no tensor). Looked up once per module and call."""
        if not self.split:
            return None
        got = self.modules.get(id(module))
        if got is None or got[0] is not module:
            found = self.devices(module)
            got = self.modules[id(module)] = (module, found[0][0] if found else None)
        return got[1]

    def device(self, what: str, *parts: Any) -> Optional[torch.device]:
        """The one device ``parts`` compute on (``None``: the model is on one device, or they hold no tensor).

        Parameters
        ----------
        what : str
            What the parts are, for the refusal (``"block 3"``, ``"the readout"``).
        *parts : Any
            Modules, or descriptions holding them.

        Returns
        -------
        torch.device or None
            The device.

        Raises
        ------
        UnsupportedModelError
            If the parts compute on several devices, naming two modules and their devices.
        """
        if not self.split:
            return None
        found = self.devices(*parts)
        if len(found) > 1:
            (d1, m1), (d2, m2) = found[:2]
            raise UnsupportedModelError(
                f"{what} of the model computes on several devices: {self.name(m1)} on {d1}, {self.name(m2)} on "
                f"{d2}. A block (or the readout) is replayed on one device; place each block whole (accelerate's "
                "device_map at block granularity: no_split_module_classes, as from_pretrained(device_map='auto') "
                "does)"
            )
        return found[0][0] if found else None

    @contextmanager
    def replaying(self, r: Any) -> Iterator[None]:
        """Inside: the replay ``r`` moves each module's input to that module's device (``r.placement``; a model on
        one device moves nothing). For the modules between blocks: embeddings, connectors, mergings, the readout."""
        before = r.placement
        r.placement = self if self.split else None
        try:
            yield
        finally:
            r.placement = before

    def returned(self, read: Any, device: torch.device) -> Any:
        """A readout record with its logits and pooled output on ``device`` (where the inputs are, as the model's own
        forward returns them); as it is for a model on one device."""
        if self.split:
            read.logits, read.pooled = self.move(read.logits, device), self.move(read.pooled, device)
        return read

    def move(self, value: Any, device: Optional[torch.device], shared: bool = False) -> Any:
        """``value`` (a tensor, or a tuple / list of them, ``None`` kept) on ``device``; ``None``: as it is.

        ``shared``: a tensor handed to several blocks (the mask, the rotary tables), moved once per device and
        call. The move is ``Tensor.to``: autograd carries the gradient (the relevance) back to where it came from.
        """
        if device is None or value is None:
            return value
        if isinstance(value, (tuple, list)):
            return type(value)(self.move(v, device, shared) for v in value)
        if not isinstance(value, Tensor) or value.device == device:
            return value
        if not shared:
            return value.to(device)
        key = (id(value), device)
        got = self.cache.get(key)
        if got is None or got[0] is not value:  # the original is kept with its copy: its id is not reused
            got = self.cache[key] = (value, value.to(device))
        return got[1]


def first_device(value: Any) -> Optional[torch.device]:
    """The device of the first tensor among a dataclass's fields (a batch: where the inputs are), else ``None``."""
    for f in dataclasses.fields(value):
        v = getattr(value, f.name)
        if isinstance(v, Tensor):
            return v.device
    return None


def at_entry(model: nn.Module, prepared: Any, given: Any = None) -> tuple[Any, Optional[torch.device]]:
    """A split model's batch on the device its first module computes on, and the device the inputs came on.

    The model's own forward takes inputs on any device (accelerate's hooks move them to each module's device); the
    replay's methods combine the batch (its mask, its pixels) with relevance computed where the embedding is, so
    the batch goes there first: the first device in module order, where the embedding is (``model.device`` for a
    transformers model). For a model on one device without accelerate's hooks nothing moves (its own forward would
    not take inputs from elsewhere either).

    Parameters
    ----------
    model : nn.Module
        The model explained.
    prepared : Any
        The typed batch (a dataclass of tensors).
    given : Any, optional
        The inputs as the user gave them (a tensor or a mapping of them): where the explanation goes back to
        (default: where ``prepared`` is).

    Returns
    -------
    tuple
        ``(batch, home)``: the batch on the entry device, and the device the explanation goes back to (``None``:
        it stays where the replay leaves it).
    """
    place = Placement(model)
    home = _tensor_device(given) or first_device(prepared)
    if home is None or not (place.split or place.hooked) or not place.all:  # accelerate's hooks move the inputs
        return prepared, None
    entry = place.all[0]
    if first_device(prepared) != entry:
        prepared = moved(prepared, entry)
    return prepared, (home if home != entry else None)


def entry_device(model: nn.Module) -> torch.device:
    """Where a model's inputs go: the first device it computes on (an offloaded first module: its hook's device)."""
    place = Placement(model)
    if place.all:
        return place.all[0]
    return next(model.parameters()).device


def _tensor_device(given: Any) -> Optional[torch.device]:
    """The device of a tensor, or of the first tensor among a mapping's values (a tokenizer's output)."""
    if isinstance(given, Tensor):
        return given.device
    if hasattr(given, "values") and callable(given.values):
        return next((v.device for v in given.values() if isinstance(v, Tensor)), None)
    return None


def moved(value: Any, device: torch.device) -> Any:
    """A dataclass (a method's result) with every tensor field, and those of its dataclass fields, on ``device``.

    Parameters
    ----------
    value : Any
        A dataclass instance (other values are returned as they are).
    device : torch.device
        Where the fields go (a split model's results: where the inputs are).

    Returns
    -------
    Any
        A copy with the fields moved (``value`` itself where nothing moves).
    """
    if not dataclasses.is_dataclass(value) or isinstance(value, type):
        return value
    changes = {}
    for f in dataclasses.fields(value):
        v = getattr(value, f.name)
        if isinstance(v, Tensor) and v.device != device:
            changes[f.name] = v.to(device)
        elif dataclasses.is_dataclass(v) and not isinstance(v, type):
            new = moved(v, device)
            if new is not v:
                changes[f.name] = new
    return dataclasses.replace(value, **changes) if changes else value


__all__ = ["DEPTH", "hook_device", "Placement", "at_entry", "entry_device", "first_device", "moved"]

"""The model's own forward inside a call, run so that it changes nothing and its hooks are accounted for.

The end-to-end check (:mod:`lrp_core.adapters.verification`) and the greedy steps of ``explain_generation`` call
the user's model itself, not its replay. :func:`own_forward` is the one place that makes such a call safe:

* eval semantics (no dropout; the modes restored, :func:`~lrp_core.runtime.guard.eval_semantics`) and no
  gradients, as the replay computes;
* the output-capturing hooks transformers installs on a model's layers at its first forward are taken back, with
  the flag that says they are there (:func:`no_new_observers`): the model keeps the hooks it had;
* the rotary modules whose tables depend on the length of the call (``dynamic`` and ``longrope`` rotary types:
  transformers' ``dynamic_rope_update`` rewrites their frequency buffers) start from their fresh state — a
  ``dynamic`` module otherwise keeps the longest length it has seen, so its own forward would depend on the
  calls before — and are put back exactly as found afterwards (:func:`rotary_state_kept`);
* the user's forward hooks that run in it are not counted as run by the explanation (the guard's report names
  the hooked modules the *replay* did not run, :class:`~lrp_core.errors.UnreflectedHookWarning`); the names of
  those that ran only here are yielded (:attr:`OwnRun.unreflected`), so a difference they make is not taken for
  a misread model.

Limit: a ``dynamic`` / ``longrope`` rotary module is reset for the duration of the call; another thread running
the same model's own forward at that moment sees the fresh state too (the tables it computes are those of its own
call, as transformers computes them for a fresh module).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from torch import Tensor, nn

from .guard import _OPEN, _observer, eval_semantics

#: the attribute transformers sets on a model once its output-capturing hooks are installed
INSTALLED = "_output_capturing_hooks_installed"
#: rotary types whose module rewrites its own frequencies by the length of the call
LENGTH_DEPENDENT = ("dynamic", "longrope")
_ROTARY_LOCK = threading.RLock()
#: the flag of a bitsandbytes 4-bit layer that lets its CPU forward repack the weight (see :func:`no_cpu_repacking`)
_CPU_KERNEL = "support_avx512bf16_for_cpu"


@dataclass
class OwnRun:
    """What one own forward saw: ``unreflected`` the names of the hooked modules that ran in it but not in the
    replay before it (their hooks change the model's output, not the explained function)."""

    unreflected: set = field(default_factory=set)


@contextmanager
def no_new_observers(model: nn.Module) -> Iterator[None]:
    """Take back the output-capturing hooks transformers installs on a model's layers at its first forward (and
    the flag that says they are there), so the model keeps the hooks it had.

    Parameters
    ----------
    model : nn.Module
        The model whose own forward runs inside the block.
    """
    modules = list(model.modules())
    before = [set(m._forward_hooks) for m in modules]
    flagged = [INSTALLED in vars(m) for m in modules]
    try:
        yield
    finally:
        for m, keys, had in zip(modules, before, flagged):
            for key in [k for k, fn in m._forward_hooks.items() if k not in keys and _observer(fn)]:
                del m._forward_hooks[key]
            if not had and INSTALLED in vars(m):
                delattr(m, INSTALLED)


def _length_dependent(module: nn.Module) -> bool:
    kinds: Any = getattr(module, "rope_type", None)
    kinds = kinds.values() if isinstance(kinds, dict) else [kinds]
    return any(isinstance(k, str) and any(d in k for d in LENGTH_DEPENDENT) for k in kinds)


def _snapshot(module: nn.Module) -> tuple[dict, dict, dict]:
    """(public attributes, buffer objects, buffer values) of a rotary module."""
    attrs = {k: v for k, v in vars(module).items() if not k.startswith("_")}
    buffers = dict(module._buffers)
    values = {k: b.detach().clone() for k, b in buffers.items() if isinstance(b, Tensor)}
    return attrs, buffers, values


def _fresh(module: nn.Module) -> None:
    """A ``dynamic`` module's frequencies as built (``original_inv_freq``, the original length cached): the state
    transformers' decorator starts a fresh model from. ``longrope`` chooses by the call alone."""
    for name in [n for n in module._buffers if n.endswith("inv_freq") and not n.endswith("original_inv_freq")]:
        prefix = name[: -len("inv_freq")]
        original, current = getattr(module, f"{prefix}original_inv_freq", None), module._buffers[name]
        if isinstance(original, Tensor) and isinstance(current, Tensor) and original.shape == current.shape:
            module._buffers[name] = original.clone()  # a copy: longrope's update writes into the buffer in place
        if hasattr(module, f"{prefix}max_seq_len_cached") and hasattr(module, "original_max_seq_len"):
            setattr(module, f"{prefix}max_seq_len_cached", module.original_max_seq_len)


def _restore(module: nn.Module, state: tuple[dict, dict, dict]) -> None:
    attrs, buffers, values = state
    for k in [k for k in vars(module) if not k.startswith("_") and k not in attrs]:
        delattr(module, k)  # e.g. the long_inv_freq transformers' longrope update adds
    for k, v in attrs.items():
        setattr(module, k, v)
    for k in [k for k in module._buffers if k not in buffers]:
        del module._buffers[k]
    for k, b in buffers.items():
        module._buffers[k] = b
        if isinstance(b, Tensor) and not torch.equal(b, values[k]):  # written in place (longrope copies into it)
            with torch.no_grad():
                b.copy_(values[k])


@contextmanager
def rotary_state_kept(model: nn.Module) -> Iterator[None]:
    """The model's length-dependent rotary modules fresh inside the block and exactly as found after it.

    Parameters
    ----------
    model : nn.Module
        The model whose own forward runs inside the block.
    """
    modules = [m for m in model.modules() if _length_dependent(m)]
    if not modules:
        yield
        return
    with _ROTARY_LOCK:
        states = [_snapshot(m) for m in modules]
        try:
            for m in modules:
                _fresh(m)
            yield
        finally:
            for m, s in zip(modules, states):
                _restore(m, s)


@contextmanager
def _hooks_not_counted(run: OwnRun) -> Iterator[None]:
    """The calling thread's guard brackets put the hooked modules that run here into ``run`` instead of their
    report's ``ran`` (the modules the explanation ran)."""
    brackets = list(getattr(_OPEN, "brackets", ()))
    seen: set = set()
    saved = [b.quiet for b in brackets]
    for b in brackets:
        b.quiet = seen
    try:
        yield
    finally:
        for b, q in zip(brackets, saved):
            b.quiet = q
            run.unreflected |= {b.report.hooked[i] for i in seen if i in b.report.hooked and i not in b.report.ran}


def _grad_mode(model: nn.Module) -> Any:
    """No gradients, except for a model with bitsandbytes 4-bit weights: on the CPU their forward without
    gradients repacks the weight in place for its inference kernel (changing the model, and refusing some shapes);
    with gradients it computes from the stored weight, as the replay's view reads it."""
    bnb = any(type(p).__name__ == "Params4bit" for p in model.parameters())
    return torch.enable_grad() if bnb else torch.no_grad()


@contextmanager
def no_cpu_repacking(model: nn.Module) -> Iterator[None]:
    """bitsandbytes' 4-bit layers with their CPU bfloat16 kernel switched off (``support_avx512bf16_for_cpu``),
    put back afterwards: with gradients off their forward would repack the weight in place, and in a half model's
    pass nothing requires a gradient (the embedding rows and norm scales are upcast constants), so
    :func:`_grad_mode` alone does not prevent it. They then compute from the stored weight, as the view reads it."""
    layers = [(m, vars(m)[_CPU_KERNEL]) for m in model.modules() if vars(m).get(_CPU_KERNEL)]
    for m, _ in layers:
        setattr(m, _CPU_KERNEL, False)
    try:
        yield
    finally:
        for m, flag in layers:
            setattr(m, _CPU_KERNEL, flag)


@contextmanager
def attributes_kept(model: nn.Module) -> Iterator[None]:
    """Every module's public attributes put back as found: what a forward caches on the model (Qwen2-VL's
    ``rope_deltas``, set by its own forward and read by the next call) does not outlive the check."""
    saved = [(m, {k: v for k, v in vars(m).items() if not k.startswith("_")}) for m in model.modules()]
    try:
        yield
    finally:
        for m, attrs in saved:
            for k in [k for k in vars(m) if not k.startswith("_") and k not in attrs]:
                delattr(m, k)
            for k, v in attrs.items():
                if vars(m).get(k, v) is not v or k not in vars(m):
                    setattr(m, k, v)


@contextmanager
def own_forward(model: nn.Module) -> Iterator[OwnRun]:
    """Run the model's own forward inside the block: eval semantics, no gradients, observers taken back, rotary
    state kept, hooks not counted as the replay's (see the module docstring).

    Parameters
    ----------
    model : nn.Module
        The (unwrapped) model.

    Yields
    ------
    OwnRun
        Filled on exit: the hooked modules that ran only in the own forward.
    """
    run = OwnRun()
    with (
        attributes_kept(model),
        _grad_mode(model),
        no_cpu_repacking(model),
        eval_semantics(model),
        no_new_observers(model),
        rotary_state_kept(model),
    ):
        with _hooks_not_counted(run):
            yield run


__all__ = [
    "OwnRun",
    "own_forward",
    "attributes_kept",
    "no_new_observers",
    "rotary_state_kept",
    "INSTALLED",
    "LENGTH_DEPENDENT",
]

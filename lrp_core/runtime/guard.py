"""Leave the model exactly as found, without undoing what other threads do meanwhile.

Design
------
The engine itself changes nothing on a model: it reads parameters, calls
submodules and takes gradients with ``torch.autograd.grad`` (which fills no
``.grad``) — save :func:`eval_semantics`, which switches modes to eval for
the model's own forward (CLIP's other side, the greedy steps of a generation)
and back. Only code that is not the engine's can change a model during a
call: the forward hooks and pre-hooks the user put on its modules, which fire
when the replay calls those modules (so does CLIP's embedding of the prompts).
Such a hook may flip a mode, add a hook, set ``requires_grad`` or a ``.grad``,
or fail half-way. :func:`model_guard` undoes exactly those changes:

* It watches a fixed set of attributes (:class:`_Watch`): every module's
  ``training`` mode and ``fused_attn`` flag, its hook dictionaries, every
  parameter's ``requires_grad`` and ``.grad``, and ``config._attn_implementation``.
  (Parameter values are not copied: nothing the engine runs writes them.)
* If no module of the model carries a forward hook or pre-hook, the call runs
  no foreign code on the model, so nothing it does can change what is watched:
  the guard restores nothing, and a change seen meanwhile — another thread's
  ``.train()``, ``requires_grad_`` or hook — stays.
* Otherwise it brackets the foreign code: two process-wide module hooks
  (``torch.nn.modules.module.register_module_forward_pre_hook`` / ``..._forward_hook``),
  filtered to the calling thread, capture the watched state just before a hooked
  module runs its hooks and again at the calling thread's next module call (or
  the end of the call). The differences inside these brackets are the call's
  changes. At the end each is undone, newest first, and only where the
  attribute still has the value the bracket left: if another thread changed it
  since, that thread's value stays.

The engine's own temporary hooks (the Captum baselines put one on the word-embedding
module for each replay) are made with :func:`engine_hook`: the watch does not see
them, so a bracket never takes their removal for a change of the user's code to be
undone (which would put them back on the model), and they are removed by the
context that made them, on every path.

Limits, as documented in docs/CONTRACTS.md: a change another thread makes
*inside* a bracket (while a hooked module runs in the calling thread) is taken
for the call's and undone; a user hook that calls other modules and changes
the model after them is seen only up to that nested call.

The same brackets tell which hooked modules ran: a hook on a module the replay
never calls (a whole block, the model itself) is not reflected in the
explanation, and :func:`warn_unreflected_hooks` names those modules with an
:class:`~lrp_core.errors.UnreflectedHookWarning`.
"""

from __future__ import annotations

import functools
import threading
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, TypeVar

import torch
from torch import Tensor, nn
from torch.nn.modules import module as _module

from ..errors import InputError, UnreflectedHookWarning, raised_at_the_call
from .precision import compute_precision
from .wrappers import unwrap

#: module attributes the engine's families read as flags (timm's fused attention)
FLAGS = ("fused_attn",)
#: a module's hook dictionaries (those this torch has); the first two change what its forward returns
HOOK_DICTS = tuple(
    name
    for name in (
        "_forward_pre_hooks",
        "_forward_hooks",
        "_forward_pre_hooks_with_kwargs",
        "_forward_hooks_with_kwargs",
        "_forward_hooks_always_called",
        "_backward_pre_hooks",
        "_backward_hooks",
    )
    if hasattr(nn.Module(), name)
)
_MISSING = object()

#: ids of the hooks the engine itself holds on some module right now, in any thread (hook ids are unique
#: process-wide): the watch skips them — they are the engine's to remove, not a change of the user's code
_ENGINE_HOOKS: set[int] = set()
_ENGINE_LOCK = threading.Lock()


@contextmanager
def engine_hook(module: nn.Module, hook: Callable[..., Any]) -> Iterator[None]:
    """``hook`` as a forward hook of ``module`` while the context lasts, removed on exit whatever ends it.

    It is the engine's: :func:`model_guard` neither records nor restores it, and it does not make ``module``
    a hooked module (no bracket, no :class:`~lrp_core.errors.UnreflectedHookWarning`). User hooks already on
    ``module`` run before it (they are older), and stay as they are.

    Parameters
    ----------
    module : nn.Module
        The module whose forward ``hook(module, args, output)`` follows.
    hook : callable
        A forward hook; what it returns (if not ``None``) replaces the module's output.
    """
    handle = None
    try:
        handle = module.register_forward_hook(hook)
        with _ENGINE_LOCK:
            _ENGINE_HOOKS.add(handle.id)
        yield
    finally:
        if handle is not None:
            handle.remove()
            with _ENGINE_LOCK:
                _ENGINE_HOOKS.discard(handle.id)


def _observer(hook: Any) -> bool:
    """transformers' output-capturing hook: installed on a model's layers the first time their hidden states are
    asked for (LLaVA asks for its vision tower's on every forward), it records outputs while a capture is active
    and never changes one."""
    return (
        getattr(hook, "__module__", None) == "transformers.utils.output_capturing"
        and getattr(hook, "__name__", None) == "output_capturing_hook"
    )


def _user_hooks(hooks: dict) -> dict:
    """The entries of one hook dictionary that are neither the engine's own (:func:`engine_hook`) nor
    transformers' output-capturing observers (:func:`_observer`)."""
    with _ENGINE_LOCK:
        engine = set(_ENGINE_HOOKS)
    return {k: v for k, v in hooks.items() if k not in engine and not _observer(v)}


Slot = tuple  # ("training", i) | ("flag", i, name) | ("hook", i, dict, id) | ("requires_grad", j) | ("grad", j) | ...


def _same(a: Any, b: Any) -> bool:
    """Identity for hooks and tensors, equality for bools and strings."""
    return a is b or (isinstance(a, (bool, str)) and type(a) is type(b) and a == b)


class _Watch:
    """The watched attributes of one model: capture them, compare two captures, undo a change."""

    def __init__(self, model: nn.Module):
        self.modules = list(model.modules())
        self.params = list(model.parameters())
        self.config = getattr(model, "config", None)

    def capture(self) -> dict[Slot, Any]:
        state: dict[Slot, Any] = {}
        for i, m in enumerate(self.modules):
            state[("training", i)] = m.training
            for f in FLAGS:
                if f in m.__dict__ or hasattr(type(m), f):
                    state[("flag", i, f)] = getattr(m, f)
            for name in HOOK_DICTS:
                for key, fn in _user_hooks(getattr(m, name)).items():
                    state[("hook", i, name, key)] = fn
        for j, p in enumerate(self.params):
            state[("requires_grad", j)] = p.requires_grad
            state[("grad", j)] = p.grad
        impl = getattr(self.config, "_attn_implementation", None)
        if impl is not None:
            state[("attn_impl",)] = impl
        return state

    @staticmethod
    def diff(before: dict, after: dict) -> list[tuple[Slot, Any, Any]]:
        """``(slot, old, new)`` for every watched attribute that differs (``_MISSING``: absent)."""
        out = []
        for slot in before.keys() | after.keys():
            old, new = before.get(slot, _MISSING), after.get(slot, _MISSING)
            if not _same(old, new):
                out.append((slot, old, new))
        return out

    def current(self, slot: Slot) -> Any:
        kind = slot[0]
        if kind == "training":
            return self.modules[slot[1]].training
        if kind == "flag":
            return getattr(self.modules[slot[1]], slot[2], _MISSING)
        if kind == "hook":
            return getattr(self.modules[slot[1]], slot[2]).get(slot[3], _MISSING)
        if kind == "requires_grad":
            return self.params[slot[1]].requires_grad
        if kind == "grad":
            return self.params[slot[1]].grad
        return getattr(self.config, "_attn_implementation", _MISSING)

    def set(self, slot: Slot, value: Any) -> None:
        kind = slot[0]
        if kind == "training":
            self.modules[slot[1]].training = value
        elif kind == "flag" and value is not _MISSING:
            setattr(self.modules[slot[1]], slot[2], value)
        elif kind == "hook":
            hooks = getattr(self.modules[slot[1]], slot[2])
            if value is _MISSING:
                hooks.pop(slot[3], None)
            else:
                hooks[slot[3]] = value
        elif kind == "requires_grad":
            self.params[slot[1]].requires_grad_(value)
        elif kind == "grad":
            self.params[slot[1]].grad = value
        elif kind == "attn_impl" and value is not _MISSING and self.config is not None:
            try:
                self.config._attn_implementation = value
            except Exception:  # pragma: no cover - a read-only property in some transformers versions
                pass

    def reorder_hooks(self, slots: list[Slot], start: dict) -> None:
        """Put re-inserted hooks back in their original order (hook ids are handed out in increasing order)."""
        order = {s[3]: n for n, s in enumerate(k for k in start if k[0] == "hook")}
        for i, name in {(s[1], s[2]) for s in slots if s[0] == "hook"}:
            hooks = getattr(self.modules[i], name)
            if hasattr(hooks, "move_to_end"):
                for key in sorted(hooks, key=lambda k: order.get(k, len(order))):
                    hooks.move_to_end(key)


@dataclass
class GuardReport:
    """What the guard saw during one call: the hooked modules, those the call ran, the changes it undid."""

    hooked: dict = field(default_factory=dict)  # id(module) -> qualified name, for modules with forward hooks
    ran: set = field(default_factory=set)  # ids of the hooked modules the call ran
    undone: list = field(default_factory=list)  # slots restored


#: the calling thread's installed brackets (guarded calls may nest), for :func:`eval_semantics`
_OPEN = threading.local()


class _Brackets:
    """Thread-filtered global module hooks that bracket the user code a call runs on a hooked model."""

    def __init__(self, watch: _Watch, report: GuardReport):
        self.watch, self.report = watch, report
        self.thread = threading.get_ident()
        self.open: Optional[dict] = None  # the capture at the start of the current bracket
        self.changes: list = []  # (slot, old, new), oldest first
        self.handles: list = []
        #: while the model's own forward runs (lrp_core.runtime.own_forward): where the hooked modules that run go
        #: instead of ``report.ran`` (they are not the explanation's)
        self.quiet: Optional[set] = None

    def install(self) -> None:
        self.handles = [
            _module.register_module_forward_pre_hook(self._pre),
            _module.register_module_forward_hook(self._post),
        ]
        _OPEN.__dict__.setdefault("brackets", []).append(self)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
        _OPEN.brackets.remove(self)
        self.close()

    def close(self) -> None:
        if self.open is not None:
            self.changes += _Watch.diff(self.open, self.watch.capture())
            self.open = None

    def _event(self, module: nn.Module, runs_hooks: bool) -> None:
        if threading.get_ident() != self.thread:
            return  # another thread's module call: none of this call's business
        self.close()
        if runs_hooks:
            self.open = self.watch.capture()

    def _pre(self, module: nn.Module, args: Any) -> None:
        hooked = id(module) in self.report.hooked
        if hooked and threading.get_ident() == self.thread:
            (self.report.ran if self.quiet is None else self.quiet).add(id(module))
        # its pre-hooks run next, then its forward (its forward hooks: bracket opened by _post)
        self._event(module, hooked and bool(_user_hooks(module._forward_pre_hooks)))

    def _post(self, module: nn.Module, args: Any, output: Any) -> None:
        self._event(module, id(module) in self.report.hooked and bool(_user_hooks(module._forward_hooks)))


def _hooked_modules(model: nn.Module) -> dict:
    """``id(module) -> qualified name`` of the modules with a forward hook or pre-hook of the user's."""
    return {
        id(m): name or type(model).__name__
        for name, m in model.named_modules()
        if _user_hooks(m._forward_hooks) or _user_hooks(m._forward_pre_hooks)
    }


@contextmanager
def model_guard(model: nn.Module) -> Iterator[GuardReport]:
    """Undo, on exit (also on error), what the call itself changed on ``model`` — see the module docstring.

    Parameters
    ----------
    model : nn.Module
        The model the call works on.

    Yields
    ------
    GuardReport
        Which hooked modules the call ran (for :func:`warn_unreflected_hooks`).
    """
    report = GuardReport(hooked=_hooked_modules(model))
    if not report.hooked:  # no foreign code runs on the model: nothing the call does can change it
        yield report
        return
    watch = _Watch(model)  # only here: listing every module and parameter costs a walk of the model
    start = watch.capture()
    brackets = _Brackets(watch, report)
    brackets.install()
    try:
        yield report
    finally:
        brackets.remove()
        for slot, old, new in reversed(brackets.changes):
            if _same(watch.current(slot), new):  # still as the call left it: not changed by another thread since
                watch.set(slot, old)
                report.undone.append(slot)
        watch.reorder_hooks(report.undone, start)


def warn_unreflected_hooks(report: GuardReport, stacklevel: int = 3) -> None:
    """Warn, naming them, about modules whose forward hooks the call did not run.

    The replay calls a model's leaf modules (Linear, LayerNorm, ...) but not its blocks, attention
    modules or the model itself; a hook there (a steering hook on a block's output) changes the
    model's prediction but not the explained function. ``warnings.simplefilter("error",
    lrp_core.errors.UnreflectedHookWarning)`` turns this into an error.

    Parameters
    ----------
    report : GuardReport
        The report :func:`model_guard` yielded for the call.
    stacklevel : int, optional
        How many frames up the warning points (passed to ``warnings.warn``).
    """
    missed = sorted(name for i, name in report.hooked.items() if i not in report.ran)
    if missed:
        warnings.warn(
            f"forward hooks on {', '.join(missed)} were not run by the explanation: it replays the model from its "
            "leaf modules (Linear, LayerNorm, ...), so hooks on these modules do not change the explained function "
            "and the explanation may not describe the hooked model's prediction. Put the hook on a leaf module the "
            "replay runs, remove it, or make this an error with "
            "warnings.simplefilter('error', lrp_core.errors.UnreflectedHookWarning)",
            UnreflectedHookWarning,
            stacklevel=stacklevel,
        )


@contextmanager
def eval_semantics(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode inside the block (no dropout), each module's mode restored on exit (also on error).

    The replay computes in inference semantics whatever the model's mode (``docs/METHODS.md``: Dropout is the
    identity); where the engine runs the model's own forward instead (CLIP's embeddings of the other side, the
    greedy steps of ``explain_generation``), a model left in ``train()`` is switched for that forward. A module
    is switched back only if it is still in eval mode at the end, so another thread's ``.train()`` made
    meanwhile stays.

    Parameters
    ----------
    model : nn.Module
        The model to run in eval mode.

    Yields
    ------
    None
        Nothing; the block runs with the model in eval mode.
    """
    switched = [m for m in model.modules() if m.training]
    _close_brackets()
    for m in switched:
        m.training = False
    try:
        yield
    finally:
        _close_brackets()
        for m in switched:
            if not m.training:
                m.training = True


def _close_brackets() -> None:
    """End the calling thread's open brackets here: a mode switch of the engine's own is not a change of the
    user's hooks to undo (a bracket opened after a hooked module stays open until the next module call)."""
    for brackets in getattr(_OPEN, "brackets", ()):
        brackets.close()


# ----------------------------------------------------------------------------
# any gradient context
# ----------------------------------------------------------------------------
@contextmanager
def autograd_on() -> Iterator[None]:
    """Gradients recorded whatever the caller's context (``no_grad``, ``inference_mode``, ``enable_grad``).

    The methods take ``torch.autograd.grad`` of the replay; their own ``no_grad`` sections still apply inside.
    """
    with torch.inference_mode(False), torch.enable_grad():
        yield


def normal_tensors(inputs: Any) -> Any:
    """``inputs`` with inference tensors (made under ``torch.inference_mode``) cloned into normal ones.

    Autograd cannot save an inference tensor for the backward pass; a clone made outside inference
    mode (inside :func:`autograd_on`) is an ordinary tensor with the same values. A mapping with such
    a tensor becomes a plain ``dict``; other inputs are returned as they are.

    Parameters
    ----------
    inputs : Any
        A tensor, a mapping of tensors, or any other input.

    Returns
    -------
    Any
        ``inputs``, with inference tensors cloned (a mapping becomes a ``dict``).
    """
    if isinstance(inputs, Tensor):
        return inputs.clone() if inputs.is_inference() else inputs
    if hasattr(inputs, "items") and any(isinstance(v, Tensor) and v.is_inference() for v in inputs.values()):
        return {k: (v.clone() if isinstance(v, Tensor) and v.is_inference() else v) for k, v in inputs.items()}
    return inputs


def in_dtype(inputs: Any, dtype: Optional[torch.dtype]) -> Any:
    """``inputs`` with their floating tensors of lower precision cast to ``dtype`` (``explain(..., dtype=)``).

    So a float32 model asked for float64 sees the float64 pixels ``model.double()`` would be given (the
    methods that draw noise, SmoothGrad, draw it in that dtype). A mapping with such a tensor becomes a
    ``dict``; ``dtype=None`` returns ``inputs`` as they are.

    Parameters
    ----------
    inputs : Any
        A tensor, a mapping of tensors, or any other input.
    dtype : torch.dtype, optional
        The precision the call computes in.

    Returns
    -------
    Any
        ``inputs``, their lower-precision floating tensors in ``dtype``.
    """
    if dtype is None:
        return inputs

    def cast(v: Any) -> Any:
        low = isinstance(v, Tensor) and v.is_floating_point() and torch.finfo(v.dtype).bits < torch.finfo(dtype).bits
        return v.to(dtype) if low else v

    if isinstance(inputs, Tensor):
        return cast(inputs)
    if hasattr(inputs, "items") and any(cast(v) is not v for v in inputs.values()):
        return {k: cast(v) for k, v in inputs.items()}
    return inputs


@contextmanager
def inference_model_named(model: nn.Module) -> Iterator[None]:
    """Turn autograd's error about a model made under ``torch.inference_mode`` into an :class:`InputError`.

    Such a model's parameters are inference tensors: the methods that need no gradient (rollout,
    raw_attention, lrp, partial_lrp, token_ablation) still explain it; the gradient methods cannot.

    Parameters
    ----------
    model : nn.Module
        The model being explained.

    Yields
    ------
    None
        Nothing; the block runs with autograd's error translated.

    Raises
    ------
    InputError
        If autograd refuses a parameter made under ``torch.inference_mode``.
    """
    try:
        yield
    except RuntimeError as err:
        if "Inference tensors" not in str(err) or not any(p.is_inference() for p in model.parameters()):
            raise
        raise InputError(
            f"{type(model).__name__}'s parameters are inference tensors (the model was created or "
            "loaded inside torch.inference_mode()), so no gradient flows through them and this method "
            "needs one; create or load the model outside inference_mode (explain itself may run "
            "inside it), or use a method without gradients (rollout, raw_attention, lrp, partial_lrp, "
            "token_ablation)"
        ) from err


F = TypeVar("F", bound=Callable[..., Any])


def public_call(fn: F) -> F:
    """The same footing for every public call ``fn(model, inputs, ...)``.

    Used by ``explain``, ``concept_target`` and ``attention_parts``:

    * wrappers are looked through (``torch.compile``, ``DataParallel``, ``DistributedDataParallel``;
      :func:`lrp_core.wrappers.unwrap`), TorchScript is refused;
    * gradients are recorded whatever the caller's context (``no_grad``, ``inference_mode``), and inputs
      made under ``inference_mode`` are cloned into ordinary tensors (:func:`normal_tensors`);
    * the model is left as found (:func:`model_guard`, also on error), and forward hooks on modules the
      replay does not run are named in an :class:`~lrp_core.errors.UnreflectedHookWarning`;
    * a half-precision model (or autocast) is computed in float32, and every model in the ``dtype=`` a call
      asks for (float64: :mod:`lrp_core.runtime.precision`);
    * an :class:`~lrp_core.errors.InputError` is raised from the call itself, so its traceback ends at the
      caller's line (:func:`lrp_core.errors.raised_at_the_call`).

    Parameters
    ----------
    fn : F
        The public function, called as ``fn(model, inputs, ...)``.

    Returns
    -------
    F
        ``fn`` wrapped, with the same signature.
    """

    @raised_at_the_call
    @functools.wraps(fn)
    def call(model, inputs, *args, **kwargs):
        if not isinstance(model, nn.Module):
            return fn(model, inputs, *args, **kwargs)  # get_adapter names what is supported
        model = unwrap(model)
        dtype = kwargs.get("dtype")
        with autograd_on(), inference_model_named(model):
            with model_guard(model) as seen, compute_precision(model, dtype):
                out = fn(model, in_dtype(normal_tensors(inputs), dtype), *args, **kwargs)
        warn_unreflected_hooks(seen, stacklevel=3)
        return out

    return call  # type: ignore[return-value]


__all__ = [
    "GuardReport",
    "model_guard",
    "eval_semantics",
    "engine_hook",
    "warn_unreflected_hooks",
    "autograd_on",
    "normal_tensors",
    "inference_model_named",
    "public_call",
    "FLAGS",
    "HOOK_DICTS",
]

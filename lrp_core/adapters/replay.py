"""The one replay: every operation of a model's forward pass, run through the rule its composite chooses.

Block, attention, MoE, readout and embedding code call ``r(kind, fn, *inputs)``, ``r.module(kind, module, x)``,
``r.norm(module, x)`` and ``r.fork(x, n)``; what that computes depends on the composite only:

* none: ``fn(*inputs)``, the model's own arithmetic;
* a modified-gradient composite (AttnLRP, CP-LRP): the rule's ``forward``, a value with the gradient the rule
  prescribes — gradient × input of the replay is the relevance;
* an explicit composite (Chefer et al.'s rules, the LRP baseline): ``fn(*inputs)`` as an autograd Function whose
  backward is the rule's ``relevance(Op(kind, inputs, output, module), R)`` — ``torch.autograd.grad`` of the
  logits with the start relevance as ``grad_outputs`` is the explicit pass. A tensor read by several branches is
  forked (:meth:`Replay.fork`), its backward the Clone rule; structural operations (reshape, permute, cat,
  indexing) move relevance as autograd moves gradients.

An explicit replay can also hand out plain gradients on the same graph (:meth:`Replay.plain_gradients`: each
operation keeps its own vector-Jacobian product), so a method that needs ∇A and R^A runs one forward.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from typing import Callable, Iterator, Mapping, Optional, cast

import torch
from torch import Tensor, nn
from torch.overrides import _get_current_function_mode_stack

from ..rules.composites import Composite, RuleChoice
from ..rules.half import half_dtype, half_forward
from ..rules.norms import check_norm_value, norm_kind
from ..rules.ops import CLONE, EXPLICIT, LAYERNORM, LINEAR, MODIFIED_GRADIENT, RMSNORM, ExplicitRule, GradientRule, Op
from ..rules.views import linear_call
from ..runtime.devices import Placement
from ..runtime.offload import loaded

#: the operation kinds whose modified-gradient rules recompute the model's norm from its parameters
NORM_KINDS = (LAYERNORM, RMSNORM)


class Replay(RuleChoice):
    """Runs each operation of the forward pass through its rule (see the module docstring).

    ``first`` records the first module of each operation kind the replay meets (input order): the
    first-layer rules of a composite. ``names``: the model's module → qualified name, for a composite that
    chooses rules by name. ``fuse``: attention of models that run sdpa is computed fused (the ATTENTION kind; no
    attention map) — for passes that never read A. ``where``: module → qualified name, for refusals; with a
    modified-gradient composite every norm its rules recompute is checked against the module's own output
    (:func:`lrp_core.rules.norms.check_norm_value`). ``cache``: an explicit pass keeps each weight's signed parts
    for the whole pass (a layer used again: ALBERT's shared layer); otherwise they are made per operation.
    """

    serves = MODIFIED_GRADIENT

    def __init__(
        self,
        composite: Optional[Composite] = None,
        names: Optional[Mapping[nn.Module, str]] = None,
        record: bool = True,
        fuse: bool = False,
        where: Optional[Callable[[nn.Module], str]] = None,
        cache: bool = False,
    ):
        self.fuse = fuse
        self.where = where or (lambda m: type(m).__name__)
        self.first: Optional[dict] = {} if record else None
        self.composite = None
        self.explicit = False
        self.cache: Optional[dict] = None
        self._gradients = False  # explicit: the backward computes plain gradients (plain_gradients) …
        self.vjps = False  # … which each operation then keeps its own graph for (keep_gradients)
        #: a model split over devices (lrp_core.runtime.devices): each module's input is moved to its device
        self.placement: Optional[Placement] = None
        #: a modified-gradient replay computes explicit attention in query chunks (lrp_core.adapters.chunked)
        self.chunked = False
        if composite is not None:
            self.serves = getattr(composite, "serves", MODIFIED_GRADIENT) or MODIFIED_GRADIENT
            super().__init__(composite, names, self.first)
            self.explicit = self.serves == EXPLICIT
            self.cache = {} if self.explicit and cache else None

    def __call__(
        self,
        kind: str,
        fn: Callable[..., Tensor],
        *inputs: Tensor,
        module: Optional[nn.Module] = None,
        reuse: bool = True,
    ) -> Tensor:
        """``fn(*inputs)`` through the rule of ``kind``. ``reuse=False``: an explicit rule is handed no output
        (it forms what it needs from the inputs, as for a head's Linears or a scaled ``q·kᵀ``)."""
        if self.composite is None:
            return fn(*inputs)
        if self.explicit:  # the rule reads its operands in the backward: offloaded ones as loaded now
            inputs = tuple(loaded(t) if isinstance(t, Tensor) else t for t in inputs)
            return _Explicit.apply(_Step(self, kind, module, fn, reuse), *inputs)
        rule = cast(GradientRule, self.rule(kind, module))  # a gradient rule set
        half = half_dtype(inputs)  # the fast half mode: the rule in half or lifted to float32 (rules.half)
        if half is None:
            out = rule.forward(fn, *inputs, module=module)
        else:
            out = half_forward(rule, kind, fn, inputs, module, half)
        if kind in NORM_KINDS and module is not None:  # the rule recomputed the norm from its parameters
            check_norm_value(module, inputs[0], out, self.where, rule.name)
        return out

    def module(self, kind: str, module: nn.Module, x: Tensor, reuse: bool = True) -> Tensor:
        """A submodule of the model; identities are skipped."""
        if isinstance(module, nn.Identity):
            return x
        if self.placement is not None:
            x = self.placement.move(x, self.placement.module_device(module))
        if self.first is not None:
            self.first.setdefault(kind, module)
        # a quantised Linear: its own forward, with the gradient of the dequantised map the rules read
        fn = linear_call(module) if kind == LINEAR else module
        return self(kind, fn, x, module=module, reuse=reuse)

    def norm(self, module: nn.Module, x: Tensor) -> Tensor:
        """A normalisation of the model (LayerNorm or RMSNorm: its kind from the module); identities skipped."""
        return self.module(norm_kind(module), module, x)

    def fork(self, x: Tensor, n: int) -> tuple[Tensor, ...]:
        """``x`` read by ``n`` branches: ``n`` times ``x``; in an explicit pass the branches' relevances meet in
        the Clone rule (in this order), in any other pass autograd sums the gradients."""
        if not self.explicit or not x.requires_grad:
            return (x,) * n
        return _Fork.apply(self, n, x)

    def transparent(self, fn: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
        """An operation that moves no relevance (a constant scale): its relevance passes unchanged in an
        explicit pass; everywhere else, and for plain gradients, ``fn`` itself."""
        if not self.explicit:
            return fn(x)
        return _Explicit.apply(_Step(self, "", None, fn, False), x)

    @property
    def gradients(self) -> bool:
        """Whether a backward started now computes plain gradients (inside :meth:`plain_gradients`)."""
        return self._gradients

    @contextmanager
    def plain_gradients(self) -> Iterator[None]:
        """Backward passes started inside compute plain gradients (each operation's own vector-Jacobian product,
        kept where the replay ran with :attr:`vjps`), not relevance."""
        before, self._gradients = self._gradients, True
        try:
            yield
        finally:
            self._gradients = before


class _Step:
    """One operation of an explicit replay: its kind, module, function, and whether its rule sees the output."""

    __slots__ = ("replay", "kind", "module", "fn", "reuse", "modes")

    def __init__(self, replay: Replay, kind: str, module: Optional[nn.Module], fn: Callable, reuse: bool):
        self.replay, self.kind, self.module, self.fn, self.reuse = replay, kind, module, fn, reuse
        # the torch-function modes the forward ran under (a precision mode, offloaded weights): autograd runs a
        # backward outside them, and the rule must compute as the forward did
        self.modes = _get_current_function_mode_stack()

    def computing(self) -> ExitStack:
        """The forward's torch-function modes, entered again for the backward (those not active now)."""
        stack, active = ExitStack(), _get_current_function_mode_stack()
        for mode in self.modes:
            if not any(mode is m for m in active):
                stack.enter_context(mode)
        return stack

    def relevance(self, inputs: tuple, output: Tensor, R: Tensor) -> tuple:
        """The rule's relevance of each input (``kind == ""``: a transparent operation, R itself)."""
        r = self.replay
        if not self.kind:
            return (R,)
        rule = cast(ExplicitRule, r.rule(self.kind, self.module))  # an explicit rule set (check_pass)
        op = Op(self.kind, inputs, output if self.reuse else None, self.module)
        return tuple(rule.relevance(op, R, r.cache))


class _Explicit(torch.autograd.Function):
    """``fn(*inputs)`` whose backward is the operation's rule (or, for plain gradients, its own vjp)."""

    @staticmethod
    def forward(ctx, step: _Step, *inputs):
        ctx.step, ctx.vjp = step, None
        ctx.where = [i for i, t in enumerate(inputs) if isinstance(t, Tensor)]
        ctx.others = [None if isinstance(t, Tensor) else t for t in inputs]
        if step.replay.vjps:  # keep the operation's own graph for plain gradients
            with torch.enable_grad():
                leaves = tuple(_leaf(t) if isinstance(t, Tensor) else t for t in inputs)
                out = step.fn(*leaves)
            ctx.vjp = (leaves, out)
            result = out.detach()
        else:
            result = step.fn(*inputs)
        if any(_shares(result, inputs[i]) for i in ctx.where):
            result = result.clone()  # an output of its own, not a view of an input (a selection, an identity)
        ctx.save_for_backward(*(inputs[i] for i in ctx.where), result)
        return result

    @staticmethod
    def backward(ctx, R):
        *saved, output = ctx.saved_tensors
        inputs = list(ctx.others)
        for i, t in zip(ctx.where, saved):
            inputs[i] = t
        step, vjp = ctx.step, ctx.vjp
        ctx.vjp = None
        with step.computing():
            return _Explicit._backward(ctx, step, vjp, inputs, output, R)

    @staticmethod
    def _backward(ctx, step: _Step, vjp: Optional[tuple], inputs: list, output: Tensor, R: Tensor) -> tuple:
        if step.replay._gradients:
            assert vjp is not None, "plain gradients of an explicit replay that kept them (Replay.vjps)"
            leaves, out = vjp
            wanted = [i for i, t in enumerate(leaves) if isinstance(t, Tensor) and t.requires_grad]
            grads = torch.autograd.grad(out, [leaves[i] for i in wanted], R, allow_unused=True)
            got = dict(zip(wanted, grads))
            return (None, *(got.get(i) for i in range(len(inputs))))
        rel = step.relevance(tuple(inputs), output, R)
        return (None, *(rel[i] if i < len(rel) and ctx.needs_input_grad[i + 1] else None for i in range(len(inputs))))


def _leaf(t: Tensor) -> Tensor:
    """``t`` detached, requiring a gradient where ``t`` does: the root of an operation's own graph."""
    return t.detach().requires_grad_(t.requires_grad)


def _shares(a: Tensor, b: Tensor) -> bool:
    """Whether ``a`` and ``b`` share memory."""
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


class _Fork(torch.autograd.Function):
    """``x`` handed to ``n`` branches; backward: the Clone rule of the branches' relevances (plain: their sum)."""

    @staticmethod
    def forward(ctx, replay: Replay, n: int, x: Tensor):
        ctx.replay = replay
        ctx.save_for_backward(x)
        return tuple(x.view_as(x) for _ in range(n))

    @staticmethod
    def backward(ctx, *Rs):
        (x,) = ctx.saved_tensors
        r = ctx.replay
        if r._gradients:
            total = Rs[0]
            for g in Rs[1:]:
                total = total + g
            return None, None, total
        rule = cast(ExplicitRule, r.rule(CLONE))
        return None, None, rule.relevance(Op(CLONE, (x,)), Rs, r.cache)[0]


#: the plain replay of code that needs no record of the order (a module-level default: it keeps nothing)
NO_RECORD = Replay(record=False)


__all__ = ["Replay", "NO_RECORD", "NORM_KINDS"]

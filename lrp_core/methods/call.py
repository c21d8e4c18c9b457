"""What every method receives and returns: :class:`Call`, :class:`MethodResult`, and the two target forms
:class:`Contrast` and :class:`ConceptTarget`.

A method is a function ``Call -> MethodResult``; its options, defaults and what it returns are its class's
(:mod:`lrp_core.methods.objects`); the call carries the bound method object (``call.method``) and the options
every call shares (``call.shared``). ``lrp_core.api.explain`` validates the inputs, guards the model and builds
the :class:`~lrp_core.Explanation`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Optional, TypeVar

import torch
from torch import Tensor

from ..adapters.base import Adapter, TokenLayout, Trace
from ..adapters.batches import Batch
from ..adapters.readouts import Readout
from ..explanation import ResultFields
from .options import Method, Shared

M = TypeVar("M", bound=Method)


@dataclass
class ConceptTarget:
    """A concept instead of a class: ``y = ⟨z, c⟩`` with ``z`` the model's final embedding (head removed).

    Attributes:
        vector: (D,) the mean final embedding ``c`` of the example inputs.
        n_examples: how many examples defined it.
        name: an optional label for plots.
    """

    vector: Tensor
    n_examples: int = 0
    name: str = "concept"


@dataclass
class MethodResult(ResultFields):
    """What a method returns: the per-sample fields of :class:`~lrp_core.explanation.ResultFields` (``scores``
    (B, T), ``target`` (B,), ``logits`` (B, C), then the optional ones, ``None`` by default) and ``used``, the
    options the method used (``Explanation.options``)."""

    used: dict[str, Any] = field(default_factory=dict)


TargetResolver = Callable[[Tensor], Tensor]  # logits (B, C) -> target (B,)


@dataclass
class Contrast:
    """Explain class ``positive`` *rather than* class ``negative``: ``y = y_positive − y_negative``.

    Each is what ``target`` accepts (``None`` = the predicted class, an int, a sequence or a tensor (B,)).
    For CLIP: this image as prompt ``positive`` rather than prompt ``negative``.
    """

    positive: Any = None
    negative: Any = None


@dataclass
class Call(Generic[M]):
    """One method call: what every method receives.

    ``method``: the method object, bound to the model (its own options, defaults filled, blocks counted from 0);
    ``shared``: the options every method takes (progress, sources, ...).
    ``negative`` (B,): the classes subtracted from the target (a :class:`Contrast`), else ``None``.
    ``readout``: the batch's readout (``adapter.readout_for(prepared)`` when not given); every replay of
    the call (:meth:`forward`) runs with it and every map is read through it.
    """

    adapter: Adapter
    prepared: Batch
    layout: TokenLayout
    resolve: TargetResolver
    method: M
    shared: Shared = field(default_factory=Shared)
    concept: Optional[ConceptTarget] = None
    negative: Optional[Tensor] = None
    # ``None`` (the default) is replaced in __post_init__, so every method reads a Readout
    readout: Readout = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.readout is None:
            self.readout = self.adapter.readout_for(self.prepared)

    def forward(self, **kwargs: Any) -> Trace:
        """The adapter's replay of the call's batch, read out with the call's readout (``trace.readout``)."""
        return self.adapter.forward(self.prepared, readout=self.readout, **kwargs)

    def start(self, logits: Tensor, target: Tensor) -> Tensor:
        """(B, C) relevance the explicit passes start from: one-hot of the target (minus the contrast class)."""
        w = one_hot(logits, target)
        return w if self.negative is None else w - one_hot(logits, self.negative.to(target.device))

    def output(self, logits: Tensor, target: Tensor, rows: Optional[Tensor] = None) -> Tensor:
        """(B,) the explained output: y_t (minus y of the contrast class); ``rows``: a subset of the batch."""
        y = logits.gather(1, target[:, None]).squeeze(1)
        if self.negative is None:
            return y
        neg = self.negative.to(target.device)
        neg = neg if rows is None else neg[rows]
        return y - logits.gather(1, neg[:, None]).squeeze(1)


def one_hot(logits: Tensor, target: Tensor) -> Tensor:
    """(B, C) one-hot rows of the target classes: the relevance the passes start from."""
    return torch.zeros_like(logits).scatter_(1, target[:, None], 1.0)

"""The widgets' single door to the engine (``lrp_core``).

Every engine call and every method fact a widget uses goes through here: one
place tests can patch, and no widget keeps its own copy of what the engine
(:mod:`lrp_core.methods.registry`, :mod:`lrp_core.adapters`) already says.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence, Union

import numpy as np
import torch

from lrp_core import api
from lrp_core.adapters import Adapter, TokenLayout, get_adapter
from lrp_core.errors import InputError
from lrp_core.methods import products as rollout
from lrp_core.methods import registry

#: Models below this many parameters are explained on one CPU thread by default.
SMALL_MODEL_PARAMS = 50_000_000

#: Perturbed copies per forward pass for the methods that batch them (the Captum baselines' ``batch_size``):
#: the engine's default, 64, lifts a kernel by 1.6-1.8 GB on dinov2-scenes (integrated gradients, occlusion);
#: 8 keeps a widget's call within a few hundred MB for about the same time (docs/TEACHING.md, "Memory").
WIDGET_BATCH = 8


def _threads_for(module: Optional[torch.nn.Module], threads: Union[str, int, None]) -> Optional[int]:
    if threads is None:
        return None
    if threads == "auto":
        if module is None:
            return None
        n = sum(p.numel() for p in module.parameters())
        return 1 if n < SMALL_MODEL_PARAMS else None
    return max(1, int(threads))


@contextmanager
def torch_threads(module: Optional[torch.nn.Module], threads: Union[str, int, None] = "auto") -> Iterator[None]:
    """Run torch on ``threads`` CPU threads inside the block, then restore the setting.

    ``"auto"``: one thread for models under :data:`SMALL_MODEL_PARAMS` parameters.
    One input through a small model is made of tiny operations that gain nothing
    from several threads, and on a busy machine (a notebook server next to a
    browser, 2 cores) the threads wait for each other: measured here, one
    explanation of toy-vit took 4 s on 2 threads and 0.04 s on one, MiniLM 8.7 s
    and 0.11 s. ``None`` leaves torch's setting alone.
    """
    n = _threads_for(module, threads)
    old = torch.get_num_threads()
    if n is None or n == old:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def methods() -> tuple[str, ...]:
    """Names of all explanation methods, in the registry's order."""
    return registry.METHOD_NAMES


def default_method() -> str:
    """The method ``lrp_core.explain`` uses when none is named (the explorers start with it)."""
    return inspect.signature(api.explain).parameters["method"].default


def check_methods(names: Sequence[str]) -> list[str]:
    """``names`` as a list, each validated by the registry (its error names the choices)."""
    chosen = list(names)
    if not chosen:
        raise InputError(f"no method given; choose from {', '.join(methods())}")
    for name in chosen:
        registry.get(name)
    return chosen


def takes(method: str, option: str) -> bool:
    """Whether ``method`` accepts ``option`` (read from the method registry)."""
    return registry.get(method).takes(option)


def class_agnostic() -> tuple[str, ...]:
    """The methods whose map does not depend on the class (read from the method registry)."""
    return registry.CLASS_AGNOSTIC


def concept_method() -> str:
    """The method that explains a concept target (the first the registry marks as taking one)."""
    return next(n for n, s in registry.METHODS.items() if s.concept_target)


def explain(
    model: torch.nn.Module,
    inputs: Any,
    method: str,
    target: Any = None,
    start_layer: Optional[int] = None,
    keep_heads: bool = True,
    sources: Any = None,
) -> Any:
    """``lrp_core.explain`` with the options a widget needs, where the method takes them.

    ``start_layer`` is passed to the methods that take it; per-head matrices are
    requested (``keep_heads=True``) from the methods that offer them; ``sources`` (token spans) to every method;
    the methods that run perturbed copies in batches get ``batch_size=WIDGET_BATCH``, which bounds their memory
    (the result is the same, only the batching differs).
    """
    kwargs: dict[str, Any] = {"method": method, "target": target}
    if sources is not None:
        kwargs["sources"] = sources
    if takes(method, "batch_size"):
        kwargs["batch_size"] = WIDGET_BATCH
    if start_layer is not None and takes(method, "start_layer"):
        kwargs["start_layer"] = int(start_layer)
    if keep_heads and takes(method, "keep_heads"):
        kwargs["keep_heads"] = True
    return api.explain(model, inputs, **kwargs)


def readout_minimum(method: str) -> bool:
    """Whether ``method``'s map is its product's readout row with the scored readout tokens' entries
    replaced by the row minimum (the BERT rule of docs/METHODS.md §5.6; read from the method registry)."""
    return registry.get(method).readout_minimum


@dataclass(frozen=True)
class SampleReadout:
    """How the engine reads one sample's token-mixing matrices (docs/METHODS.md §4).

    Attributes:
        weights: (N,) float64, the readout's token weights w (``Readout.weights``): the classifier
            reads ``Σ_i w_i h_i``, and the map of a matrix M (N, N) is ``wᵀM`` — row 0 for [CLS]
            pooling, the mean of the averaged rows, half of each of two rows, the end-of-text row.
            Right-padded text is explained unpadded (§5.8): w is that of the real tokens, 0 on the padding.
        layout: the sample's :class:`~lrp_core.adapters.TokenLayout` (scored tokens, readout tokens,
            padding mask).
    """

    weights: np.ndarray
    layout: TokenLayout


def sample_readout(model: Any, inputs: Any) -> SampleReadout:
    """The readout of one sample (a batch of one) as ``lrp_core.explain`` applies it.

    ``model``: the model or its adapter; ``inputs``: what ``explain`` takes (CLIP's text side included:
    the adapter is the one ``explain`` uses for these inputs). The weights are those of the batch's own
    readout (``Adapter.readout_for``): a token position that differs by row (CLIP's end-of-text token, a
    decoder's last real token) is the sample's real position, padding gets weight 0 — as when the engine
    explains the sample without its padding (docs/METHODS.md §5.8).
    """
    adapter = (model if isinstance(model, Adapter) else get_adapter(model)).for_inputs(inputs)
    prepared = adapter.check_inputs(inputs)
    layout = adapter.layout(prepared)
    if layout.mask is not None and layout.mask.shape[0] != 1:
        raise InputError(f"a view reads one sample; got a batch of {layout.mask.shape[0]}")
    weights = adapter.readout_for(prepared).weights(layout.num_tokens).double()[0].cpu().numpy()
    return SampleReadout(weights=weights, layout=layout)


def accumulate(layers: torch.Tensor, start: int, stop: int, norm: str = "none") -> torch.Tensor:
    """``lrp_core.methods.products.accumulate``: the product (I+Ā_stop)…(I+Ā_start), (B, N, N)."""
    return rollout.accumulate(layers, start, stop, norm=norm)


def concept_target(model: torch.nn.Module, examples: torch.Tensor) -> Any:
    """``lrp_core.concept_target``: the mean final embedding of ``examples``, pooled as the model's readout
    pools it (the [CLS] state, the patch mean, …; docs/METHODS.md §4.4)."""
    return api.concept_target(model, examples)

"""The widgets' single door to the engine (``lrp_core``).

Every engine call and every method fact a widget uses goes through here: one
place tests can patch, and no widget keeps its own copy of what the engine
(:mod:`lrp_core.registry`, :mod:`lrp_core.adapters`) already says.
"""
from __future__ import annotations

import inspect
from contextlib import contextmanager
from typing import Any, Iterator, Optional, Sequence, Union

import torch

from lrp_core import api, registry, rollout

#: Models below this many parameters are explained on one CPU thread by default.
SMALL_MODEL_PARAMS = 50_000_000


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
def torch_threads(module: Optional[torch.nn.Module], threads: Union[str, int, None] = "auto"
                  ) -> Iterator[None]:
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
        raise ValueError(f"no method given; choose from {', '.join(methods())}")
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


def explain(model: torch.nn.Module, inputs: Any, method: str, target: Any = None,
            start_layer: Optional[int] = None, keep_heads: bool = True) -> Any:
    """``lrp_core.explain`` with the options a widget needs, where the method takes them.

    ``start_layer`` is passed to the methods that take it; per-head matrices are
    requested (``keep_heads=True``) from the methods that offer them.
    """
    kwargs: dict[str, Any] = {"method": method, "target": target}
    if start_layer is not None and takes(method, "start_layer"):
        kwargs["start_layer"] = int(start_layer)
    if keep_heads and takes(method, "keep_heads"):
        kwargs["keep_heads"] = True
    return api.explain(model, inputs, **kwargs)


def accumulate(layers: torch.Tensor, start: int, stop: int, norm: str = "none") -> torch.Tensor:
    """``lrp_core.rollout.accumulate``: the product (I+Ā_stop)…(I+Ā_start), (B, N, N)."""
    return rollout.accumulate(layers, start, stop, norm=norm)


def concept_target(model: torch.nn.Module, examples: torch.Tensor) -> Any:
    """``lrp_core.concept_target``: the mean final [CLS] embedding of ``examples``."""
    return api.concept_target(model, examples)

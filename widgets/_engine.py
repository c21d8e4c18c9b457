"""The widgets' single door to the engine (``lrp_core``), imported lazily.

Keeping every engine call here gives one place that turns a missing engine or
an engine error into a readable message, and one place tests can patch.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Optional, Union

import torch

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
    """Names of all explanation methods (``lrp_core.METHODS``)."""
    from lrp_core import registry
    return registry.METHOD_NAMES


def takes(method: str, option: str) -> bool:
    """Whether ``method`` accepts ``option`` (read from the method registry)."""
    from lrp_core import registry
    return registry.get(method).takes(option)


def explain(model: torch.nn.Module, inputs: Any, method: str, target: Any = None,
            start_layer: Optional[int] = None, keep_heads: bool = True) -> Any:
    """``lrp_core.explain`` with the options a widget needs, where the method takes them.

    ``start_layer`` is passed to the methods that take it; per-head matrices are
    requested (``keep_heads=True``) from the methods that offer them.
    """
    from lrp_core import api
    kwargs: dict[str, Any] = {"method": method, "target": target}
    if start_layer is not None and takes(method, "start_layer"):
        kwargs["start_layer"] = int(start_layer)
    if keep_heads and takes(method, "keep_heads"):
        kwargs["keep_heads"] = True
    return api.explain(model, inputs, **kwargs)


def accumulate(layers: torch.Tensor, start: int, stop: int, norm: str = "none") -> torch.Tensor:
    """``lrp_core.rollout.accumulate``: the product (I+Ā_stop)…(I+Ā_start), (B, N, N)."""
    from lrp_core import rollout
    return rollout.accumulate(layers, start, stop, norm=norm)


def concept_target(model: torch.nn.Module, examples: torch.Tensor) -> Any:
    """``lrp_core.concept_target``: the mean final [CLS] embedding of ``examples``."""
    from lrp_core import api
    return api.concept_target(model, examples)

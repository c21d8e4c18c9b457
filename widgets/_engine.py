"""The widgets' single door to the engine (``lrp_core``), imported lazily.

Keeping every engine call here gives one place that turns a missing engine or
an engine error into a readable message, and one place tests can patch.
"""
from __future__ import annotations

import inspect
from typing import Any, Optional

import torch

#: Methods whose result depends on ``start_layer`` (the others ignore it).
START_LAYER_METHODS = ("transformer_attribution", "rollout")


def _api() -> Any:
    try:
        from lrp_core import api
    except ImportError as err:  # pragma: no cover - only before the engine lands
        raise RuntimeError("lrp_core's engine (lrp_core.api) is not installed: "
                           f"cannot compute explanations ({err})") from err
    return api


def methods() -> tuple[str, ...]:
    """Names of all explanation methods (``lrp_core.METHODS``)."""
    return tuple(_api().METHODS)


def _accepts(fn: Any, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def explain(model: torch.nn.Module, inputs: Any, method: str, target: Any = None,
            start_layer: Optional[int] = None, keep_heads: bool = True) -> Any:
    """``lrp_core.explain`` with the options a widget needs.

    ``start_layer`` is passed only to methods that use it; per-head matrices
    are requested (``keep_heads=True``) where the engine offers that option.
    """
    api = _api()
    kwargs: dict[str, Any] = {"method": method, "target": target}
    if start_layer is not None and method in START_LAYER_METHODS:
        kwargs["start_layer"] = int(start_layer)
    if keep_heads and _accepts(api.explain, "keep_heads"):
        kwargs["keep_heads"] = True
    return api.explain(model, inputs, **kwargs)


def accumulate(layers: torch.Tensor, start: int, stop: int, norm: str = "none") -> torch.Tensor:
    """``lrp_core.rollout.accumulate``: the product (I+Ā_stop)…(I+Ā_start), (B, N, N)."""
    from lrp_core import rollout
    return rollout.accumulate(layers, start, stop, norm=norm)


def concept_target(model: torch.nn.Module, examples: torch.Tensor) -> Any:
    """``lrp_core.concept_target``: the mean final [CLS] embedding of ``examples``."""
    return _api().concept_target(model, examples)

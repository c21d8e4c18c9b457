"""The engine calls shared by the image and text protocols.

Both protocols explain through :func:`explain_batch` (one place to spy on in
tests, one place that sets the engine options of the evaluation) and run the
methods in the order of :func:`method_order`.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from torch import Tensor

from .. import explain
from ..methods import registry

TAM_BATCH = 256
"""Sequences per forward pass of ``token_ablation``."""


def explain_batch(model: Any, inputs: Any, method: str, target: Optional[Tensor]) -> Any:
    """One :func:`lrp_core.explain` call, without a progress bar (for the methods that show one).

    Parameters
    ----------
    model : Any
        The model to explain.
    inputs : Any
        (B, 3, H, W) images, or a tokenized batch (``input_ids``, ``attention_mask``: (B, T)).
    method : str
        A name of :data:`lrp_core.METHODS`.
    target : Optional[Tensor]
        (B,) classes, or ``None`` for the predicted class.

    Returns
    -------
    Explanation
        The :class:`lrp_core.Explanation`, ``scores`` (B, T).
    """
    spec = registry.get(method)
    extra: dict[str, Any] = {k: v for k, v in (("batch_size", TAM_BATCH), ("progress", False)) if spec.takes(k)}
    return explain(model, inputs, method=method, target=target, **extra)


def method_order(methods: Sequence[str]) -> list[str]:
    """The methods, with ``token_ablation`` moved before ``cdam``.

    CDAM's statistics correlate it with token ablation; when that runs first, the CDAM row reuses its scores
    instead of a second, costly pass.

    Parameters
    ----------
    methods : Sequence[str]
        Method names.

    Returns
    -------
    list[str]
        The same names, reordered.
    """
    names = list(methods)
    if "token_ablation" in names and "cdam" in names:
        names.remove("token_ablation")
        names.insert(names.index("cdam"), "token_ablation")
    return names


__all__ = ["TAM_BATCH", "explain_batch", "method_order"]

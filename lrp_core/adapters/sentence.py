"""A ``SentenceTransformer`` pipeline (Transformer → Pooling → Normalize), recognised by its class names.

The pipeline's first module holds a Hugging Face base model (``auto_model``: a ``BertModel``, ``MPNetModel``, ...);
its adapter is that model's, told the pipeline's Pooling mode and whether a Normalize module follows. A
``Projection`` / ``Similarity`` target then explains the pipeline's own ``sentence_embedding``
(:mod:`lrp_core.adapters.embeddings`); the end-to-end check runs the pipeline itself. sentence-transformers is not
imported: the modules are read by class name and attribute.

Pooling modes explained: ``"mean"`` (the normalised sum over the real tokens) and ``"cls"`` (the first token).
Refused: ``"max"`` (a different token per channel, a selection no readout describes), ``"mean_sqrt_len_tokens"``,
``"weightedmean"``, ``"lasttoken"``, concatenated modes, and any module besides these three (Dense, ...).
"""

from __future__ import annotations

import copy
from typing import Any

from torch import nn

from ..errors import UnsupportedModelError

#: the Pooling modes a readout reproduces, and the name ``Projection(pooling=)`` gives them
POOLING_MODES = {"mean": "mean", "cls": "cls"}


def _pooling_mode(pooling: Any) -> Any:
    """The Pooling module's mode: ``pooling_mode`` (sentence-transformers ≥ 6), else the older flags."""
    mode = getattr(pooling, "pooling_mode", None)
    if mode is not None:
        return mode
    get = getattr(pooling, "get_pooling_mode_str", None)
    return get() if callable(get) else None


def pipeline_parts(model: nn.Module) -> tuple[nn.Module, str, bool]:
    """(the inner Hugging Face model, the pooling name, whether it normalises) of a SentenceTransformer, or
    :class:`UnsupportedModelError` naming the module or mode that is not explained."""
    name = type(model).__name__
    modules = list(model.children())
    kinds = [type(m).__name__ for m in modules]
    inner = getattr(modules[0], "auto_model", None) if modules else None
    if inner is None or len(modules) < 2 or kinds[1] != "Pooling":
        raise UnsupportedModelError(
            f"{name}: expected a Transformer (with auto_model) then a Pooling module; got {kinds}"
        )
    extra = [k for k in kinds[2:] if k != "Normalize"]
    if extra or kinds[2:].count("Normalize") > 1:
        raise UnsupportedModelError(
            f"{name}: modules {extra or kinds[2:]} after Pooling are not explained (only one Normalize)"
        )
    mode = _pooling_mode(modules[1])
    if mode not in POOLING_MODES:
        raise UnsupportedModelError(
            f"{name}: pooling mode {mode!r} is not explained (max pooling picks a token per channel, the weighted "
            f"and length-scaled means and concatenated modes are not described); explained: {sorted(POOLING_MODES)}"
        )
    return inner, POOLING_MODES[mode], "Normalize" in kinds[2:]


def sentence_adapter(model: nn.Module, adapter_of: Any) -> Any:
    """The inner model's adapter (``adapter_of(inner)``), copied and told the pipeline: its ``sentence``, Pooling
    mode and Normalize. The inner model must be a base model (no classification head)."""
    inner, pooling, normalised = pipeline_parts(model)
    adapter = adapter_of(inner)
    if adapter.num_classes:
        raise UnsupportedModelError(
            f"{type(model).__name__}: its Transformer holds {type(inner).__name__}, a model with a classification head"
        )
    out = copy.copy(adapter)
    out.sentence, out.sentence_pooling, out.normalised = model, pooling, normalised
    return out


__all__ = ["POOLING_MODES", "pipeline_parts", "sentence_adapter"]

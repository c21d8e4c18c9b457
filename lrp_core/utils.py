"""Small helpers shared by the metrics and the evaluation runner.

- :func:`model_device`: where a model's parameters live.
- :func:`progress_bar`: an optional tqdm bar around an iterable.
- :func:`logits_of`: call a classifier and return its (B, C) logits.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Optional

import torch
from torch import Tensor

from .errors import InputError


def model_device(model: Any) -> torch.device:
    """Device of ``model``'s first parameter; CPU for parameter-free callables."""
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration):
        return torch.device("cpu")


def progress_bar(iterable: Iterable, progress: bool, **kwargs: Any) -> Iterable:
    """``iterable`` in a tqdm bar (``kwargs`` go to tqdm); as is when ``progress`` is False."""
    if not progress:
        return iterable
    from tqdm.auto import tqdm  # imported late: only runs that show a bar need it
    return tqdm(iterable, **kwargs)


def logits_of(model: Callable[..., Any], inputs: Tensor | Mapping[str, Tensor]) -> Tensor:
    """Call ``model`` and return its logits (B, C).

    Args:
        model: a timm model (returns a tensor) or a Hugging Face classifier
            (returns an output with ``.logits``).
        inputs: (B, 3, H, W) images, or a tokenized batch (``input_ids``,
            ``attention_mask``) passed as keyword arguments.
    """
    out = model(**inputs) if isinstance(inputs, Mapping) else model(inputs)
    if hasattr(out, "logits"):
        out = out.logits
    if not isinstance(out, Tensor) or out.dim() != 2:
        raise InputError("the model must return logits of shape (B, C)")
    return out


def proc_kib(path: str, key: str) -> Optional[int]:
    """The value of a ``key: N kB`` line of a Linux ``/proc`` file (``/proc/meminfo``, ``/proc/self/status``),
    in KiB; ``None`` where the file or the line is missing (other systems)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


__all__ = ["model_device", "progress_bar", "logits_of", "proc_kib"]

"""Small helpers shared by the metrics and the evaluation runner.

- :func:`model_device`: where a model's parameters live.
- :func:`progress_bar`: an optional tqdm bar around an iterable.
- :func:`logits_of`: call a classifier and return its (B, C) logits.
- :func:`logits_in_batches`: run a classifier over N samples in blocks of
  ``batch_size`` (the one loop behind every "predict / score in batches").
- :func:`minmax_rows`: per-row min–max scaling to [0, 1] (optionally over a mask).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence

import torch
from torch import Tensor

from ..errors import InputError
from .offload import execution_device


def model_device(model: Any) -> torch.device:
    """Device of ``model``'s first parameter (where accelerate offloads it, the device its forward computes on);
    CPU for parameter-free callables.

    Parameters
    ----------
    model : Any
        A module, or any callable (then without parameters).

    Returns
    -------
    torch.device
        The device of its first parameter, or CPU.
    """
    try:
        first = next(model.parameters())
    except (AttributeError, StopIteration):
        return torch.device("cpu")
    if first.is_meta and isinstance(model, torch.nn.Module):  # an offloaded placeholder: its hook's device
        owner = next((m for m in model.modules() if any(t is first for t in m._parameters.values())), model)
        return execution_device(owner, first)
    return first.device


def progress_bar(iterable: Iterable, progress: bool, **kwargs: Any) -> Iterable:
    """``iterable`` in a tqdm bar (``kwargs`` go to tqdm); as is when ``progress`` is False.

    Parameters
    ----------
    iterable : Iterable
        The items to iterate over.
    progress : bool
        Show the bar.
    **kwargs
        Passed on to tqdm (e.g. ``desc``, ``total``).

    Returns
    -------
    Iterable
        The iterable, wrapped or as it is.
    """
    if not progress:
        return iterable
    from tqdm.auto import tqdm  # imported late: only runs that show a bar need it

    return tqdm(iterable, **kwargs)


def logits_of(model: Callable[..., Any], inputs: Tensor | Mapping[str, Tensor]) -> Tensor:
    """Call ``model`` and return its logits (B, C).

    Parameters
    ----------
    model : Callable[..., Any]
        a timm model (returns a tensor) or a Hugging Face classifier
        (returns an output with ``.logits``).
    inputs : Tensor | Mapping[str, Tensor]
        (B, 3, H, W) images, or a tokenized batch (``input_ids``,
        ``attention_mask``) passed as keyword arguments.

    Returns
    -------
    Tensor
        (B, C) the logits.

    Raises
    ------
    InputError
        If the model's logits are not (B, C).
    """
    out = model(**inputs) if isinstance(inputs, Mapping) else model(inputs)
    if hasattr(out, "logits"):
        out = out.logits
    if not isinstance(out, Tensor) or out.dim() != 2:
        raise InputError("the model must return logits of shape (B, C)")
    return out


def to_device(inputs: Tensor | Mapping[str, Any], device: torch.device) -> Tensor | dict[str, Any]:
    """``inputs`` on ``device``: a tensor, or every tensor of a mapping (other values as they are).

    Parameters
    ----------
    inputs : Tensor | Mapping[str, Any]
        (B, ...) a tensor, or a mapping of tensors and other values.
    device : torch.device
        The target device.

    Returns
    -------
    Tensor | dict[str, Any]
        The tensor moved, or a ``dict`` with every tensor moved.
    """
    if isinstance(inputs, Mapping):
        return {k: v.to(device) if isinstance(v, Tensor) else v for k, v in inputs.items()}
    return inputs.to(device)


def logits_in_batches(
    model: Callable[..., Any],
    samples: Sequence[Any] | Tensor,
    batch_size: int,
    prepare: Optional[Callable[[Any], Any]] = None,
    *,
    progress: bool = False,
    desc: Optional[str] = None,
) -> Iterator[tuple[slice, Tensor]]:
    """Run ``model`` over ``samples`` in consecutive blocks of ``batch_size``.

    Each block ``samples[s:s + batch_size]`` is turned into model inputs by
    ``prepare`` (default: the block as is, e.g. images (b, 3, H, W)), moved to
    the model's device and passed through :func:`logits_of`. The caller
    reduces each block's logits itself (argmax, softmax, ...) on the device
    they come back on, so every call site keeps its arithmetic.

    Parameters
    ----------
    model : Callable[..., Any]
        The classifier, called through :func:`logits_of`.
    samples : Sequence[Any] | Tensor
        anything sliceable with a length: (N, ...) tensor, list of
        texts, list of jobs.
    batch_size : int
        Number of samples per block (≥ 1).
    prepare : Optional[Callable[[Any], Any]], optional
        block -> model inputs (a tensor or a tokenized mapping).
    progress : bool, optional
        Show a progress bar over the blocks.
    desc : Optional[str], optional
        The progress bar's label.

    Yields
    ------
    tuple[slice, Tensor]
        The ``slice`` of the block in ``samples``, and its logits (b, C) on the model's device.

    Raises
    ------
    InputError
        If ``batch_size`` is below 1.
    """
    if batch_size < 1:
        raise InputError(f"batch_size must be >= 1, got {batch_size}")
    device = model_device(model)
    starts = range(0, len(samples), batch_size)
    for s in progress_bar(starts, progress, desc=desc, total=len(starts)):
        block = slice(s, s + batch_size)
        x: Any = samples[block] if prepare is None else prepare(samples[block])  # a tensor or a mapping
        yield block, logits_of(model, to_device(x, device))


def minmax_rows(x: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    """Scale each row of ``x`` (B, T) to [0, 1]; a constant row becomes all zeros.

    With ``mask`` (B, T) the minimum and maximum are taken over the masked
    entries only and the entries outside the mask are set to 0.

    Parameters
    ----------
    x : Tensor
        (B, T) rows to scale.
    mask : Optional[Tensor], optional
        (B, T) bool, the entries to scale (``None``: all).

    Returns
    -------
    Tensor
        (B, T) scaled rows in [0, 1].
    """
    if mask is None:
        lo, hi = x.min(dim=1, keepdim=True).values, x.max(dim=1, keepdim=True).values
    else:
        big = torch.finfo(x.dtype).max
        m = mask.bool()
        lo = torch.where(m, x, torch.full_like(x, big)).min(dim=1, keepdim=True).values
        hi = torch.where(m, x, torch.full_like(x, -big)).max(dim=1, keepdim=True).values
    span = hi - lo
    out = torch.where(span > 0, (x - lo) / torch.where(span > 0, span, torch.ones_like(span)), torch.zeros_like(x))
    return out if mask is None else out * mask.to(out.dtype)


def proc_kib(path: str, key: str) -> Optional[int]:
    """The value of a ``key: N kB`` line of a Linux ``/proc`` file, in KiB.

    Files such as ``/proc/meminfo`` or ``/proc/self/status``; ``None`` where the file or the line is missing
    (other systems).

    Parameters
    ----------
    path : str
        Path of the ``/proc`` file.
    key : str
        The line's key, e.g. ``"MemAvailable"``.

    Returns
    -------
    Optional[int]
        The value in KiB, or ``None``.
    """
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


__all__ = ["model_device", "progress_bar", "logits_of", "logits_in_batches", "to_device", "minmax_rows", "proc_kib"]

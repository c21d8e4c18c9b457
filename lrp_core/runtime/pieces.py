"""A batch explained in pieces: which pieces, how each is cut out, and how their results are merged.

``explain`` hands a batch here once it is validated. A batch whose estimated peak memory exceeds the
budget (:mod:`lrp_core.runtime.memory`), or a ``chunk_size``, is explained in runs of consecutive samples and the
results are scattered back in batch order — every field, as if explained at once. Right-padded text of
several lengths is first grouped by length and each group explained without its padding
(docs/METHODS.md §5.8): every sample then gets exactly the arithmetic of being explained alone.

What is per sample and what is shared by the batch (CLIP's prompts / images) is the batch's fact
(:meth:`~lrp_core.adapters.batches.Batch.take`); the modality is the adapter's (``adapter.modality``).

Shapes: B batch, T (padded) tokens, n a group's length.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any, NamedTuple, Optional

import torch
from torch import Tensor

from ..adapters.base import Adapter
from ..adapters.batches import Batch, TextBatch
from ..explanation import RESULT_FIELDS, Conservation, ResultField
from ..methods.call import Call, MethodResult
from ..methods.options import Method, Shared
from . import memory
from .devices import Placement, first_device, moved
from .utils import model_device, progress_bar


class Piece(NamedTuple):
    """One piece of a batch: the sample indices ``rows`` (K,), and the length ``n`` the text is trimmed to
    (``None``: not trimmed)."""

    rows: Tensor
    n: Optional[int]


def length_groups(prepared: TextBatch) -> Optional[list[Piece]]:
    """Right-padded text of several lengths: the samples grouped by length, else ``None``.

    Each group is explained without padding, so every sample gets exactly the
    arithmetic of explaining it alone: relevance passes amplify round-off, and
    padding changes the length of the reductions (softmax, A·V) and hence
    their rounding.

    Parameters
    ----------
    prepared : TextBatch
        The adapter's batch of tokens.

    Returns
    -------
    Optional[list[Piece]]
        One :class:`Piece` per length (rows and the length n), or ``None`` when
        the batch is not right-padded text of several lengths.
    """
    mask = prepared.attention_mask
    lengths = mask.sum(dim=1)
    T = mask.shape[1]
    prefix = (torch.arange(T, device=mask.device)[None, :] < lengths[:, None]).long()
    if not torch.equal(mask, prefix) or bool((lengths == T).all()):
        return None  # no padding, or not right-padded (positions would shift if trimmed)
    return [Piece(torch.nonzero(lengths == n).flatten(), int(n)) for n in lengths.unique().tolist()]


def plan(adapter: Adapter, prepared: Batch, method: Method, shared: Shared) -> list[Piece]:
    """The pieces a batch is explained in.

    Right-padded text of several lengths is first grouped by length (:func:`length_groups`); each group
    (or the whole batch) is then cut into runs of at most ``k`` consecutive samples: ``k = chunk_size``
    if given, else as many as fit ``max_memory`` by :mod:`lrp_core.runtime.memory`'s estimate (at least one).

    Parameters
    ----------
    adapter : Adapter
        The model's adapter.
    prepared : Batch
        The batch.
    method : Method
        The method: its memory profile (``method.memory``) and the options the estimate reads
        (``keep_heads``, ``batch_size``: :meth:`Method.memory_knobs`).
    shared : Shared
        The call's shared options (``chunk_size``, ``max_memory``).

    Returns
    -------
    list[Piece]
        The pieces, each with its sample indices (K,) and trimmed length.
    """
    groups = length_groups(prepared) if isinstance(prepared, TextBatch) else None
    if groups is None:
        groups = [Piece(torch.arange(prepared.size), None)]  # indices, moved where they index
    budget = None
    pieces = []
    for rows, n in groups:
        if shared.chunk_size is not None:
            k = shared.chunk_size
        elif len(rows) == 1:
            k = 1  # one sample is never split: no need to read the free memory (a file read, or a CUDA query)
        else:
            if budget is None:
                # a model split over devices: the tightest of them (each holds its blocks' share of the pass)
                devices = Placement(adapter.model).all or [model_device(adapter.model)]
                budget = min(memory.budget(shared.max_memory, d) for d in devices)
            facts = memory.facts_of(adapter, prepared, tokens=n)
            k = memory.piece_size(budget, method.memory, facts, len(rows), **method.memory_knobs())
        pieces += [Piece(part, n) for part in rows.split(k)]
    return pieces


def call_for(call: Call, piece: Piece) -> Call:
    """The call of one piece: its samples (:meth:`Batch.take`), their layout, readout, targets, contrast.

    Parameters
    ----------
    call : Call
        The call on the whole batch.
    piece : Piece
        The piece: sample indices (K,) and the length its text is trimmed to.

    Returns
    -------
    Call
        The call on the piece's K samples.
    """
    a, (rows, n) = call.adapter, piece
    sub = call.prepared.take(rows, n)
    negative = None if call.negative is None else call.negative.to(rows.device)[rows]
    shared = call.shared
    if shared.sources is not None:  # per-row spans (columns): the piece's rows (a trimmed piece keeps its columns)
        shared = replace(shared, sources=shared.sources[rows.to(shared.sources.device)])
    resolve = _sub_resolver(call.resolve, rows)
    return Call(a, sub, a.layout(sub), resolve, call.method, shared, call.concept, negative, a.readout_for(sub))


def _sub_resolver(resolve, rows: Tensor):
    return lambda logits: resolve(logits, rows)


def run(call: Call, pieces: list[Piece]) -> MethodResult:
    """``call.method.run`` on the whole batch (one untrimmed piece), else on every piece and the results merged.

    Parameters
    ----------
    call : Call
        The call on the whole batch.
    pieces : list[Piece]
        The pieces from :func:`plan`.

    Returns
    -------
    MethodResult
        The result for the whole batch, (B, ...) fields in batch order.
    """
    result = _run(call, pieces)
    device = first_device(call.prepared)
    if device is not None and Placement(call.adapter.model).split:  # each field where the inputs are
        result = moved(result, device)
    return result


def _run(call: Call, pieces: list[Piece]) -> MethodResult:
    """:func:`run`, the fields on the devices the method left them on."""
    if len(pieces) == 1 and pieces[0].n is None:  # the whole batch at once, as given
        return call.method.run(call)
    method, shown = call.method, call.shared.progress
    parts = []
    for piece in progress_bar(
        pieces, shown or (shown is None and len(pieces) >= 16), desc=method.name, unit="piece", leave=False
    ):
        parts.append((piece.rows, piece.n, method.run(call_for(call, piece))))
    a = call.adapter
    return merge(parts, call.prepared.size, call.layout.num_tokens if a.modality == "text" else None)


def merge(parts: list, batch: int, T: Optional[int]) -> MethodResult:
    """Scatter the results of the pieces back into (B, ...) tensors in batch order.

    ``parts``: ``(rows, n, MethodResult)`` per piece. Every field of
    :data:`~lrp_core.explanation.RESULT_FIELDS` is merged by its own rule: text (``T`` the padded length):
    its ``token_axes`` trailing axes are zero-padded from ``n`` back to ``T``; images (``T`` is ``None``):
    every piece has the whole token axes. ``conservation`` is merged total by total.

    Parameters
    ----------
    parts : list
        ``(rows, n, MethodResult)`` per piece.
    batch : int
        Number of samples B.
    T : Optional[int]
        The padded text length, or ``None`` for images.

    Returns
    -------
    MethodResult
        The merged (B, ...) result.
    """
    first = parts[0][2]

    def gather(f: ResultField):
        like = getattr(first, f.name)
        if like is None:
            return None
        if isinstance(like, Conservation):
            return _merge_conservation(parts, batch)
        pad_dims = 0 if T is None else f.token_axes
        shape = (batch,) + tuple(like.shape[1 : like.dim() - pad_dims]) + (T,) * pad_dims
        out = torch.zeros(shape, dtype=like.dtype, device=like.device)
        for rows, n, res in parts:
            idx = (rows.to(out.device),) + (slice(None),) * (like.dim() - 1 - pad_dims) + (slice(0, n),) * pad_dims
            out[idx] = getattr(res, f.name).to(out.device)
        return out

    return MethodResult(**{f.name: gather(f) for f in RESULT_FIELDS}, used=first.used)


def _merge_conservation(parts: list, batch: int) -> Optional[Conservation]:
    """The per-sample totals of each piece, back in batch order."""
    first = parts[0][2].conservation
    if first is None:
        return None
    totals: dict[str, Any] = {}  # Conservation's fields by name (the optional ones may be None)
    for name in (f.name for f in fields(Conservation)):
        like = getattr(first, name)
        if like is None:
            totals[name] = None
            continue
        out = torch.empty((batch,) + tuple(like.shape[1:]), dtype=like.dtype, device=like.device)
        for rows, _, res in parts:
            out[rows.to(out.device)] = getattr(res.conservation, name)
        totals[name] = out
    return Conservation(**totals)


__all__ = ["Piece", "length_groups", "plan", "call_for", "run", "merge"]

"""The blockwise relevance pass: a modified-gradient replay (AttnLRP, CP-LRP) at the memory floor.

The full pass (:meth:`Adapter.forward` with ``grad=True``, then one ``torch.autograd.grad``) keeps every block's
saved tensors until the backward reaches it: L blocks' activations, and with explicit (eager) attention every
block's ``(B, H, N, N)`` scores and weights at once. This pass keeps only each block's input:

1. the embedding with its graph (``(B, N, D)``), then every block but the last through the same
   :class:`~lrp_core.adapters.replay.Replay` without a graph, keeping each block's input ``x_b`` (B, N, D);
2. the last block (at the read rows of a decoder) and the readout with their graph: the logits, the target, the
   explained output ``y`` and its gradient at the last block's input and output;
3. from the last block down: block b replayed again on ``x_b`` with its graph — the same operations through the
   same rules, so the same values — its gradient taken from the gradient at its output, and the graph freed
   before block b − 1 (gradient checkpointing through the engine's own replay: the rules stay the backward of the
   operations); explicit attention runs in query chunks (:mod:`.chunked`), so at most ``(B, H, c, N)`` of a map
   lives at once;
4. the embedding's gradient from block 0's.

Gradient × input at each block's output and at the embedding are those of the full pass (the same gradients,
up to the round-off of the chunks' sums). The forward runs twice for every block but the last (≈ 1.3 × the
full pass's time); the peak is L inputs ``(B, N, D)`` plus one block's graph.

Shapes: B batch, N tokens, D width, L blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from ..rules.composites import Composite
from ..runtime.precision import compute_precision
from .batches import TextBatch
from .blocks import block_forward
from .readouts import PositionReadout, Readout
from .replay import Replay


@dataclass
class BlockwiseGradients:
    """What the blockwise pass returns (the fields a gradient × input method reads).

    ``logits`` (B, C) detached; ``target`` (B,); ``y`` (B,) the explained output; ``embeds`` / ``embeds_grad``
    the embedding output and its gradient; ``images`` / ``images_grad`` the pixels and theirs (``None`` for text);
    ``x0`` / ``x0_grad`` block 0's input and its gradient; ``blocks`` (B, L, N): Σ over channels of each block's
    output ⊙ its gradient (before :meth:`Adapter.block_tokens`).
    """

    logits: Tensor
    target: Tensor
    y: Tensor
    embeds: Tensor
    embeds_grad: Tensor
    x0: Tensor
    x0_grad: Tensor
    blocks: list
    images: Optional[Tensor] = None
    images_grad: Optional[Tensor] = None


def blockwise_gradients(
    adapter: Any,
    prepared: Any,
    composite: Composite,
    readout: Readout,
    resolve: Callable[[Tensor], Tensor],
    output: Callable[[Tensor, Tensor], Tensor],
    read_rows: bool = False,
) -> BlockwiseGradients:
    """The gradients of a modified-gradient pass, one block's graph at a time (see the module docstring).

    Parameters
    ----------
    adapter : Adapter
        The model's adapter (:attr:`Adapter.blockwise`).
    prepared : Batch
        The adapter's batch.
    composite : Composite
        A modified-gradient rule set (AttnLRP, CP-LRP).
    readout : Readout
        The batch's readout.
    resolve : Callable
        logits (B, C) detached -> target (B,).
    output : Callable
        (logits (B, C), target (B,)) -> y (B,), the explained output.
    read_rows : bool
        A decoder read at one token per row: the last block computes those rows only (as the full pass).

    Returns
    -------
    BlockwiseGradients
        The logits, target, output and the gradients at the embedding, block 0's input and each block's output.
    """
    r = Replay(composite, adapter._names_for(composite), fuse=True, where=adapter.module_name)
    r.chunked = True
    with compute_precision(adapter.model):
        with torch.enable_grad():
            emb = adapter.embed(prepared, r, track=True)
        x0 = emb.x0
        if not x0.requires_grad:  # a frozen input layer: block 0's input is the leaf
            x0 = x0.detach().requires_grad_(True)
        mask, positions = (
            (prepared.attention_mask, prepared.position_ids) if isinstance(prepared, TextBatch) else (None, None)
        )
        if adapter.mask_value is not None and mask is None:
            mask = torch.ones(x0.shape[:2], dtype=torch.long, device=x0.device)
        with torch.no_grad():
            context = adapter.block_context(x0, mask, positions, r.fuse)
            inputs = [x0.detach()]
            for spec, (bias, rope) in zip(adapter.blocks[:-1], context[:-1]):
                inputs.append(block_forward(spec, inputs[-1], bias, r, rope).out)
        rows = readout.positions if read_rows and isinstance(readout, PositionReadout) else None
        return _backward(adapter, r, emb, x0, inputs, context, readout, rows, resolve, output)


def _backward(
    adapter: Any,
    r: Replay,
    emb: Any,
    x0: Tensor,
    inputs: list,
    context: list,
    readout: Readout,
    rows: Optional[Tensor],
    resolve: Callable[[Tensor], Tensor],
    output: Callable[[Tensor, Tensor], Tensor],
) -> BlockwiseGradients:
    """Steps 2–4 of the module docstring: the last block and the readout, then the blocks from the top."""
    L = len(adapter.blocks)
    B, N, D = x0.shape
    relevance: list = [None] * L
    x_last = inputs[-1].detach().requires_grad_(True)
    bias, rope = context[-1]
    with torch.enable_grad():
        rec = block_forward(adapter.blocks[-1], x_last, bias, r, rope, rows)
        out = rec.out
        if rows is not None:  # the read rows' outputs placed in (B, N, D), as run_blocks does
            index = rows.to(out.device).view(-1, 1, 1).expand(-1, 1, D)
            out = x_last.new_zeros(x_last.shape).scatter(1, index, out)
        logits = readout.forward(out, r).logits
        target = resolve(logits.detach())
        y = output(logits, target)
        g_out, g = torch.autograd.grad(y.sum(), [out, x_last])
    relevance[-1] = (out.detach() * g_out).sum(-1)
    del rec, out, g_out, x_last
    for b in range(L - 2, -1, -1):
        x_b = inputs[b].requires_grad_(True)
        bias, rope = context[b]
        with torch.enable_grad():
            out = block_forward(adapter.blocks[b], x_b, bias, r, rope).out
            relevance[b] = (out.detach() * g).sum(-1)
            (g,) = torch.autograd.grad(out, [x_b], g)
        inputs[b] = None  # block b's input is no longer needed
        del out, x_b
    embeds, images = emb.embeds, emb.images
    leaves = [t for t in (embeds, images) if t is not None and t.requires_grad and t is not x0]
    grads = dict(zip(map(id, leaves), torch.autograd.grad(x0, leaves, g, allow_unused=True) if leaves else ()))
    embeds_grad = g if embeds is x0 or embeds is None else grads.get(id(embeds))
    return BlockwiseGradients(
        logits=logits.detach(),
        target=target,
        y=y.detach(),
        embeds=(x0 if embeds is None else embeds).detach(),
        embeds_grad=_or_zeros(embeds_grad, embeds if embeds is not None else x0),
        x0=x0.detach(),
        x0_grad=g,
        blocks=relevance,
        images=None if images is None else images.detach(),
        images_grad=None if images is None else _or_zeros(grads.get(id(images)), images),
    )


def _or_zeros(g: Optional[Tensor], like: Tensor) -> Tensor:
    """A gradient, or zeros where the output does not depend on the tensor."""
    return torch.zeros_like(like) if g is None else g


__all__ = ["BlockwiseGradients", "blockwise_gradients"]

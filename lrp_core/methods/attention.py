"""The attention-product family (docs/METHODS.md §2.0–2.3, §2.6): maps read from the attention of each block.

Transformer attribution and generic attention weigh each block's attention (by its relevance or by itself)
with its gradient and multiply the blocks' ``I + Ā_b``; rollout multiplies the plain attention; raw attention
and attention Grad-CAM read the last block alone; CDAM takes gradient × the tokens entering the last attention.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional

import torch
from torch import Tensor

from ..adapters.base import Trace
from ..errors import InputError, LRPError
from ..rules.composites import TRANSFORMER_ATTRIBUTION
from ..runtime.utils import minmax_rows
from .call import Call, MethodResult

if TYPE_CHECKING:
    from .objects import GenericAttention, RawAttention, Rollout, TransformerAttribution
from .products import accumulate_row


def _product_scores(c: Call, layers: Tensor, start: int, stop: Optional[int] = None, norm: str = "none") -> Tensor:
    """Token scores from the readout's row of ``Π (I + Ā_b)`` over blocks ``start … stop`` of ``layers``
    (B, L, N, N), carried as a vector (:func:`~lrp_core.methods.products.accumulate_row`); scored tokens only."""
    return c.layout.scores(accumulate_row(layers, c.readout.weights(layers.shape[-1]), start, stop, norm=norm))


def _readout_scores(c: Call, M: Tensor) -> Tensor:
    """Token scores from a token-mixing matrix M (B, N, N): the readout's row, scored tokens only."""
    return c.layout.scores(c.readout.row(M))


def _stack(layers: list) -> Tensor:
    """(B, L, ...) the blocks' tensors, on the first's device (a model split over devices computes each block's
    on its own)."""
    return torch.stack([m.to(layers[0].device) for m in layers], dim=1)


def _full_layers(parts: dict, L: int, like: Tensor) -> Tensor:
    """(B, L, ...) with the computed blocks filled in and zeros elsewhere."""
    out = torch.zeros((like.shape[0], L) + tuple(like.shape[1:]), dtype=like.dtype, device=like.device)
    for b, m in parts.items():
        out[:, b] = m
    return out


def _layers_result(kept: dict, L: int, first: int, per_head: bool) -> tuple[Tensor, Optional[Tensor]]:
    """Head means as (B, L, N, N), and the per-head matrices (B, L, H, N, N) when ``kept`` holds them.

    ``kept[b]``: block b's per-head matrices (B, H, N, N) if ``per_head``, else their head mean (B, N, N).
    """
    if not per_head:
        return _full_layers(kept, L, kept[first]), None
    means = {b: m.mean(dim=1) for b, m in kept.items()}
    return _full_layers(means, L, means[first]), _full_layers(kept, L, kept[first])


class _TopDownGradients:
    """∂y/∂A_b handed out top-down, one block's backward at a time.

    The relevance pass reaches the blocks top-down, and so does a backward split at the block outputs:
    ``∂y/∂h_L`` first, then per block ``(∂y/∂A_b, ∂y/∂h_b) = backward(h_{b+1}, ∂y/∂h_{b+1})``. Each
    block's gradient is made when the pass needs it and its graph is freed then, so at most one block's
    ``(B, H, N, N)`` gradient is alive, not all L of them. Needs a plain stack (each block's input is the
    previous block's output): :meth:`applies`.
    """

    def __init__(self, trace: Trace, y: Tensor, start: int, keep: bool = False) -> None:
        blocks = trace.blocks
        self.start, self.next, self.keep = start, len(blocks) - 1, keep
        self.attns = [rec.attn.A for rec in blocks]  # dropped one by one as they are used
        self.ins = [rec.x for rec in blocks]
        self.outs = [rec.out for rec in blocks]
        self.g: Optional[Tensor]  # ∂y/∂h of the next block's output; None once the last block is handed out
        # (B, N, D) through the readout only; ``keep``: the graph stays for the relevance pass that follows
        (self.g,) = torch.autograd.grad(y, [blocks[-1].out], retain_graph=keep)

    @staticmethod
    def applies(trace: Trace) -> bool:
        """Whether every block's input is the previous block's output (then y reaches A_b only via h_{b+1})."""
        return all(trace.blocks[b].x is trace.blocks[b - 1].out for b in range(1, len(trace.blocks)))

    def __call__(self, b: int) -> Tensor:
        """(B, H, N, N) ∂y/∂A_b; blocks must be asked for top-down, each once."""
        if b != self.next:
            raise LRPError(f"gradients are handed out top-down: block {self.next} next, asked for {b}")
        A, out, self.attns[b], self.outs[b] = self.attns[b], self.outs[b], None, None
        wrt = [A] + ([self.ins[b]] if b > self.start else [])
        grads = torch.autograd.grad(out, wrt, grad_outputs=self.g, retain_graph=self.keep)
        self.g = grads[1] if b > self.start else None
        self.ins[b], self.next = None, b - 1
        return grads[0]


def _attention_gradients(trace: Trace, y: Tensor, start: int, keep: bool = False) -> Callable[[int], Tensor]:
    """``grad_of(b)``: (B, H, N, N) ∂y/∂A_b for blocks ``start … L−1``, each asked for once, top-down.

    On a plain stack the backward is split per block (:class:`_TopDownGradients`: one block's gradient
    alive at a time); otherwise one backward makes them all, and each is dropped as it is handed out.
    ``keep``: the graph is kept for a relevance pass on the same replay.
    """
    if _TopDownGradients.applies(trace):
        return _TopDownGradients(trace, y, start, keep)
    blocks = range(start, len(trace.blocks))
    return dict(zip(blocks, torch.autograd.grad(y, [trace.attention(b) for b in blocks], retain_graph=keep))).pop


def transformer_attribution(c: Call[TransformerAttribution]) -> MethodResult:
    """Chefer et al. (CVPR 2021): gradient-weighted relevance of the attention maps, multiplied over blocks.

    One replay with the rules as its backward: ∇A_b is the plain gradient on that graph, made as the top-down
    relevance pass reaches block b's output (:class:`_TopDownGradients`, one block's at a time), R^A_b the
    relevance pass's. Memory: each block's ``mean_h((∇A ⊙ R^A)⁺)`` is formed in place in the gradient, and
    the map is the readout row of the product carried as a vector
    (:func:`~lrp_core.methods.products.accumulate_row`): no N×N product.
    """
    a, opt = c.adapter, c.method
    L, s = a.num_blocks, opt.start_layer
    end = L - 1 if opt.end_layer is None else opt.end_layer
    trace = c.forward(grad=opt.use_gradient, composite=TRANSFORMER_ATTRIBUTION)
    replay = trace.replay
    assert replay is not None  # an explicit replay
    target = c.resolve(trace.logits.detach())
    stash: dict = {}
    if opt.use_gradient:
        with replay.plain_gradients():
            grad_of = _attention_gradients(trace, c.output(trace.logits, target).sum(), s, keep=True)

        def before(b: int) -> None:
            """∇A_b, made on the graph before the relevance pass enters block b."""
            with torch.enable_grad(), replay.plain_gradients():  # noqa: F821 - as grad_of
                stash[b] = grad_of(b)  # noqa: F821 - deleted by the caller only after the pass

    else:  # the maps themselves weigh the relevance, each dropped once used
        grad_of = {b: trace.attention(b).detach() for b in range(s, L)}.pop

        def before(b: int) -> None:
            stash[b] = grad_of(b)  # noqa: F821 - as above

    logits = trace.logits.detach()
    kept: dict = {}

    def weigh(b: int, R_A: Tensor) -> None:
        """Keep (∇A_b ⊙ R^A_b)⁺ (B, H, N, N) — or its head mean (B, N, N) — as the pass reaches block b."""
        w = stash.pop(b)
        if opt.use_gradient:  # a fresh gradient, ours alone: the product is formed in it, no H·N² temporary
            per_head = w.mul_(R_A).clamp_(min=0)
        else:  # the attention map itself: not ours to change
            per_head = (w * R_A).clamp_(min=0)
        del w
        kept[b] = per_head if opt.keep_heads else per_head.mean(dim=1)  # noqa: F821 - as grad_of

    # the pass weighs each block's map as it goes and frees the graph behind it: the peak
    # memory holds one block's relevance maps, not all of them
    rel = a.relprop(
        trace,
        c.start(logits, target),
        TRANSFORMER_ATTRIBUTION,
        stop_block=s,
        on_attention=weigh,
        release=True,
        on_block=before,
    )
    del trace, grad_of, replay
    with torch.no_grad():
        rel.attn = []  # the per-block maps are not returned
        layers, heads = _layers_result(kept, L, s, opt.keep_heads)
        del kept
        norm = opt.rollout_norm
        assert norm is not None  # TransformerAttribution.defaults sets it for every modality
        scores = c.layout.readout_minimum(_product_scores(c, layers, s, end, norm=norm))
    return MethodResult(
        scores=scores,
        target=target,
        logits=logits,
        layers=layers,
        layers_per_head=heads,
        token_relevance=rel.tokens,
        used={"start_layer": s, "end_layer": end, "rollout_norm": opt.rollout_norm, "use_gradient": opt.use_gradient},
    )


def generic_attention(c: Call[GenericAttention]) -> MethodResult:
    """Chefer et al. (ICCV 2021): ``Ā_b = mean_h((∇A_b ⊙ A_b)⁺)``, ``R ← R + Ā_b R``. One forward, one backward.

    Memory: on a plain stack the backward is split at the block outputs and run top-down
    (:class:`_TopDownGradients`), each block's ``(∇A_b ⊙ A_b)⁺`` formed in its fresh gradient and reduced at
    once, so one block's ``(B, H, N, N)`` gradient is alive at a time, not L of them; the map is the readout
    row of ``Π (I + Ā_b)`` carried as a vector (:func:`~lrp_core.methods.products.accumulate_row`): no N×N product.
    """
    a, s = c.adapter, c.method.start_layer
    L = a.num_blocks
    trace = c.forward(grad=True)
    target = c.resolve(trace.logits.detach())
    y = c.output(trace.logits, target).sum()
    attns = {b: trace.attention(b) for b in range(s, L)}
    grad_of = _attention_gradients(trace, y, s)
    logits = trace.logits.detach()
    del trace, y  # the graph lives on in grad_of's block outputs, freed block by block
    kept = {}
    for b in range(L - 1, s - 1, -1):  # top-down, as the split backward hands the gradients out
        with torch.enable_grad():
            g = grad_of(b)
        with torch.no_grad():
            per_head = g.mul_(attns.pop(b)).clamp_(min=0)  # a fresh gradient, ours alone: formed in place
            kept[b] = per_head if c.method.keep_heads else per_head.mean(dim=1)
        del g, per_head
    del grad_of
    with torch.no_grad():
        layers, heads = _layers_result(kept, L, s, c.method.keep_heads)
        del kept
        scores = _product_scores(c, layers, s)
    return MethodResult(
        scores=scores, target=target, logits=logits, layers=layers, layers_per_head=heads, used={"start_layer": s}
    )


def _attention_only(c: Call) -> tuple[Trace, Tensor, list]:
    with torch.no_grad():
        trace = c.forward(grad=False)
    target = c.resolve(trace.logits)
    return trace, target, [trace.attention(b) for b in range(c.adapter.num_blocks)]


def rollout(c: Call[Rollout]) -> MethodResult:
    """Abnar & Zuidema: ``mean_h(A_b) + I``, row-normalised, multiplied over blocks. Class-agnostic."""
    trace, target, attns = _attention_only(c)
    layers = _stack([A.mean(dim=1) for A in attns])
    # the readout row of the product, carried as a vector (O(N²) per block, not the N×N product's O(N³))
    scores = _product_scores(c, layers, c.method.start_layer, c.method.end_layer, norm="row")
    return MethodResult(
        scores=scores,
        target=target,
        logits=trace.logits,
        layers=layers,
        layers_per_head=_stack(attns) if c.method.keep_heads else None,
        used={"start_layer": c.method.start_layer},
    )


def raw_attention(c: Call[RawAttention]) -> MethodResult:
    """The last block's attention from the readout token(s), averaged over heads. Class-agnostic."""
    trace, target, attns = _attention_only(c)
    layers = _stack([A.mean(dim=1) for A in attns])
    return MethodResult(
        scores=_readout_scores(c, layers[:, -1]),
        target=target,
        logits=trace.logits,
        layers=layers,
        layers_per_head=_stack(attns) if c.method.keep_heads else None,
    )


def attention_gradcam(c: Call) -> MethodResult:
    """Grad-CAM on the last attention map: head weights = mean gradient of the readout row."""
    a = c.adapter
    trace = c.forward(grad=True)
    target = c.resolve(trace.logits.detach())
    A = trace.attention(a.num_blocks - 1)
    (grad,) = torch.autograd.grad(c.output(trace.logits, target).sum(), [A])
    mask = c.layout.mask
    with torch.no_grad():
        first = c.layout.output_start
        g_row, a_row = c.readout.row(grad)[..., first:], c.readout.row(A.detach())[..., first:]  # (B, H, T)
        if mask is None:
            w = g_row.mean(dim=-1, keepdim=True)
        else:
            m = mask[:, None, first:].to(g_row.device, g_row.dtype)
            w = (g_row * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True)
        cam = (w * a_row).mean(dim=1).clamp(min=0)  # (B, T)
        scores = minmax_rows(cam, None if mask is None else mask[:, first:].to(cam.device))  # over real tokens
    return MethodResult(scores=scores, target=target, logits=trace.logits.detach())


def cdam(c: Call) -> MethodResult:
    """Brocki & Chung: gradient × tokens entering the last attention (after its LayerNorm); a hierarchical model's
    last-stage tokens are mapped onto the input patches (``Adapter.block_tokens``)."""
    a = c.adapter
    trace = c.forward(grad=True)
    T = a.cdam_tokens(trace)
    if c.concept is None:
        target = c.resolve(trace.logits.detach())
        y = c.output(trace.logits, target)
    else:
        v = c.concept.vector.to(trace.pooled)  # its dtype, and its device (a split model's inputs elsewhere)
        if v.shape[-1] != trace.pooled.shape[-1]:
            raise InputError(
                f"concept vector has size {v.shape[-1]}, the model's final embedding {trace.pooled.shape[-1]}"
            )
        target = torch.full((T.shape[0],), -1, dtype=torch.long)
        y = trace.pooled @ v
    (g,) = torch.autograd.grad(y.sum(), [T])
    with torch.no_grad():
        scores = c.layout.scores(a.block_tokens(a.num_blocks - 1, (T * g).sum(dim=-1)))
    return MethodResult(
        scores=scores,
        target=target,
        logits=trace.logits.detach(),
        used={"concept": c.concept.name} if c.concept is not None else {},
    )

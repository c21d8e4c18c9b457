"""The LRP family (docs/METHODS.md §2.4–2.5, §2b, §2e): relevance conserved from the output to the input.

``lrp`` and ``partial_lrp`` run the explicit pass with the baseline rules; ``attnlrp``, ``cp_lrp`` and
``pa_lrp`` are gradient × input through a replay whose operations carry their rules' modified gradients.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch
from torch import Tensor

from ..adapters.records import Trace
from ..errors import InputError, UnsupportedModelError
from ..explanation import Conservation
from ..rules.composites import ATTNLRP, CP_LRP, LRP_BASELINE, Composite, pa_lrp_composite
from ..rules.gradient import PositionLeaves
from ..runtime import memory, pass_memory
from ..runtime.devices import Placement
from ..runtime.fast_half import FAST, gradients, lift
from ..runtime.utils import model_device
from .attention import _readout_scores
from .call import Call, MethodResult

if TYPE_CHECKING:
    from .objects import PALRP


def _rule_set(c: Call, default: Composite) -> Composite:
    """The call's rule set: the user's ``composite=`` (a fresh copy, recording which of its name / first-layer
    entries take effect) or the method's ``default``."""
    return default if c.method.composite is None else c.method.composite.fresh()


def _used(c: Call, composite: Composite, method: str) -> dict:
    """``Explanation.options`` of a call with a user's rule set (``{}`` without one): its name; a rule set whose
    name / first-layer entries chose no rule is refused here (:meth:`Composite.check_used`)."""
    if c.method.composite is None:
        return {}
    composite.check_used(f"method {method!r}")
    return {"composite": composite.name}


def _explicit_replay(c: Call, composite: Composite) -> tuple[Trace, Tensor, Tensor]:
    """The call's batch replayed with an explicit rule set (its backward is the relevance pass): the trace, the
    target and the logits (B, C)."""
    trace = c.forward(composite=composite)
    logits = trace.logits.detach()
    return trace, c.resolve(logits), logits


def lrp(c: Call) -> MethodResult:
    """Full LRP with the baseline rules (or ``composite=``), down to input space (pixels for images, embeddings
    for text)."""
    composite = _rule_set(c, LRP_BASELINE)
    trace, target, logits = _explicit_replay(c, composite)
    start = c.start(logits, target)
    rel = c.adapter.relprop(trace, start, composite, stop_block=0, to_input=True, prepared=c.prepared, release=True)
    assert rel.scores is not None  # to_input=True: the pass reached the input
    regs = list(c.layout.registers)
    return MethodResult(
        scores=rel.scores,
        target=target,
        logits=logits,
        pixels=rel.pixels,
        token_relevance=rel.tokens,
        registers=rel.inputs[:, regs] if regs and rel.inputs is not None else None,
        used=_used(c, composite, "lrp"),
    )


def partial_lrp(c: Call) -> MethodResult:
    """Baseline LRP (or ``composite=``) down to the last block only: ``mean_h((R^{A_L})⁺)``, the readout's row."""
    composite = _rule_set(c, LRP_BASELINE)
    trace, target, logits = _explicit_replay(c, composite)
    L = c.adapter.num_blocks
    rel = c.adapter.relprop(trace, c.start(logits, target), composite, stop_block=L - 1, release=True)
    del trace
    with torch.no_grad():
        last = rel.attn[L - 1].clamp(min=0).mean(dim=1)
    return MethodResult(
        scores=_readout_scores(c, last),
        target=target,
        logits=logits,
        token_relevance=rel.tokens,
        used=_used(c, composite, "partial_lrp"),
    )


def _modified_gradient(c: Call, composite: Composite, positions: Optional[PositionLeaves] = None) -> MethodResult:
    """Gradient × input with a modified-gradient rule set: one forward replay, one backward pass.

    Gradients are taken only with respect to the input-space tensors and the
    block outputs (no parameter gradients). Token relevance is read at the
    patch-/word-embedding output, pixels (images) at the input, and the
    residual stream's relevance after every block (docs/METHODS.md §2b). ``positions``: the leaves a PA-LRP
    composite's rules made of the position encodings; their relevance is read too (§2e).
    """
    if positions is None and takes_blockwise(c):
        return _blockwise_result(c, composite)
    # a decoder reads one token per row: its last block is replayed at that token only (the block's other rows
    # reach nothing that is read; at a long context their causal attention is most of that block's cost)
    rows = {"read_rows": True} if c.adapter.is_decoder else {}
    trace = c.forward(grad=True, composite=composite, track=True, **rows)
    logits = lift(trace.logits)  # the fast half mode: the explained logit and the start in float32 (exact: ±1)
    target = c.resolve(logits.detach())
    y = c.output(logits, target)
    emb = trace.embedding
    assert emb is not None and emb.embeds is not None  # a tracked replay records its embedding
    embeds, images = emb.embeds, emb.images
    hidden = [rec.out for rec in trace.blocks]
    regs = list(c.layout.registers)  # register tokens: their relevance is read at block 0's input
    wrt = [embeds] + hidden + ([images] if images is not None else []) + ([trace.x0] if regs else [])
    leaves = [] if positions is None else positions.leaves
    if positions is not None and not leaves:
        raise UnsupportedModelError(
            f"pa_lrp gives relevance to the position encoding, but {type(c.adapter.model).__name__} adds none that "
            "the engine sees (no learned / absolute position embedding added to the tokens, no rotary q/k); "
            "use attnlrp or cp_lrp"
        )
    grads = gradients(y, wrt + leaves, embeds)  # float16: a scaled start (float32 gradients), else plain autograd
    pos_grads, grads = grads[len(wrt) :], grads[: len(wrt)]
    if regs:
        g0, grads = grads[-1], grads[:-1]
    with torch.no_grad():
        # the per-token sums in float32 (the fast half mode; a no-op otherwise): (B, T) the scored tokens' embeddings
        scores = (lift(embeds) * lift(grads[0])).sum(-1)
        mask = c.layout.mask
        if mask is not None:
            scores = scores * mask[:, c.layout.output_start :].to(scores.dtype)
        blocks = _block_scores(c, hidden, grads[1 : 1 + len(hidden)], mask, scores.device)
        pixels = (lift(images) * lift(grads[-1])).sum(1) if images is not None else None
        per_position = _positional(leaves, pos_grads, mask)
        registers = (lift(trace.x0) * lift(g0)).sum(-1)[:, regs] if regs else None  # (B, R)
        conservation = Conservation(
            output=y.detach(),
            blocks=blocks.sum(-1),
            input=scores.sum(-1),
            pixels=None if pixels is None else pixels.sum(dim=tuple(range(1, pixels.dim()))),  # (B, H, W) or (B, T)
            positional=None if per_position is None else per_position.sum(-1),
            registers=None if registers is None else registers.sum(-1),
        )
    positional = None if per_position is None else per_position[:, -scores.shape[1] :]  # the scored tokens'
    return MethodResult(
        scores=scores,
        target=target,
        logits=logits.detach(),
        pixels=pixels,
        token_relevance=blocks,
        conservation=conservation,
        positional=positional,
        registers=registers,
    )


def _block_scores(c: Call, hidden: list, grads: tuple, mask: Optional[Tensor], device: torch.device) -> Tensor:
    """(B, L, T) the relevance of the residual stream after each block (h ⊙ ∂/∂h summed over channels, in float32 in
    the fast half mode), on ``device`` (a split model's blocks live on theirs), padding 0."""
    blocks = torch.stack(
        [
            c.adapter.block_tokens(b, (lift(h) * lift(g)).sum(-1)).to(device)
            for b, (h, g) in enumerate(zip(hidden, grads))
        ],
        dim=1,
    )
    return blocks if mask is None else blocks * mask[:, None, :].to(blocks.dtype)


def takes_blockwise(c: Call) -> bool:
    """Whether the call runs the blockwise pass (:mod:`lrp_core.adapters.blockwise`): asked (``low_memory=True``;
    refused on an adapter that replays its blocks its own way), or, by default, where the full pass's predicted
    peak (:func:`lrp_core.runtime.pass_memory.full_pass`) exceeds the call's memory budget."""
    asked = c.shared.low_memory
    if asked is False:
        return False
    other = _blockwise_excluded(c)
    if other is not None:
        if asked:
            raise InputError(f"low_memory=True: {other}; use low_memory=None or False (the full pass)")
        return False
    if not c.adapter.blockwise:
        if asked:
            raise UnsupportedModelError(
                f"low_memory=True: {type(c.adapter.model).__name__} is replayed by its own block driver (it "
                "overrides Adapter.forward / run_blocks, or shares a layer), which the blockwise pass cannot "
                "re-enter block by block; use low_memory=None or False (the full pass)"
            )
        return False
    if asked:
        return True
    room = memory.budget(c.shared.max_memory, model_device(c.adapter.model))
    return not pass_memory.fits(c.adapter, c.prepared, room)


def _blockwise_excluded(c: Call) -> Optional[str]:
    """Why the blockwise pass does not run on this call, or ``None``: it has not been checked in the fast half
    mode (``dtype=`` a half dtype) nor on a model split over devices, so those calls take the full pass."""
    if c.shared.dtype in FAST:
        return "the blockwise pass is not run in the fast half mode (dtype=torch.float16 / torch.bfloat16)"
    if Placement(c.adapter.model).split:
        return "the blockwise pass is not run on a model split over devices"
    return None


def _blockwise_result(c: Call, composite: Composite) -> MethodResult:
    """:func:`_modified_gradient`'s result from the blockwise pass (the same fields; ``used`` names the pass)."""
    got = c.adapter.blockwise_gradients(
        c.prepared, composite, c.readout, c.resolve, c.output, read_rows=c.adapter.is_decoder
    )
    regs = list(c.layout.registers)
    with torch.no_grad():
        scores = (got.embeds * got.embeds_grad).sum(-1)
        mask = c.layout.mask
        if mask is not None:
            scores = scores * mask[:, c.layout.output_start :].to(scores.dtype)
        blocks = torch.stack([c.adapter.block_tokens(b, row) for b, row in enumerate(got.blocks)], dim=1)
        if mask is not None:
            blocks = blocks * mask[:, None, :].to(blocks.dtype)
        pixels = None if got.images is None or got.images_grad is None else (got.images * got.images_grad).sum(1)
        registers = (got.x0 * got.x0_grad).sum(-1)[:, regs] if regs else None
        conservation = Conservation(
            output=got.y,
            blocks=blocks.sum(-1),
            input=scores.sum(-1),
            pixels=None if pixels is None else pixels.sum(dim=tuple(range(1, pixels.dim()))),
            registers=None if registers is None else registers.sum(-1),
        )
    return MethodResult(
        scores=scores,
        target=got.target,
        logits=got.logits,
        pixels=pixels,
        token_relevance=blocks,
        conservation=conservation,
        registers=registers,
        used={"relevance_pass": "blockwise"},
    )


def _positional(leaves: list, grads: tuple, mask: Optional[Tensor]) -> Optional[Tensor]:
    """(B, N) the position encodings' relevance per position: Σ over leaves (position tables; a rotary table
    holds every block's share) of leaf ⊙ gradient, summed over channels; padding 0. ``None`` without leaves.
    A table over fewer positions covers the last ones (a vision rotary table skips the prefix tokens)."""
    if not leaves:
        return None
    rows = []
    for leaf, g in zip(leaves, grads):
        if g is None:  # a table the output does not depend on (e.g. CP-LRP: q, k detached after RoPE)
            g = torch.zeros_like(leaf)
        rows.append((lift(leaf) * lift(g)).sum(-1))  # (B, n), float32 in the fast half mode
    total = torch.zeros(rows[0].shape[0], max(r.shape[1] for r in rows), dtype=rows[0].dtype, device=rows[0].device)
    for r in rows:
        total[:, total.shape[1] - r.shape[1] :] += r.to(total.device)  # a table per device (a split model)
    if mask is not None and mask.shape[1] == total.shape[1]:
        total = total * mask.to(total.device, total.dtype)
    return total


def attnlrp(c: Call) -> MethodResult:
    """AttnLRP (Achtibat et al., ICML 2024): LayerNorm std detached, identity rule on non-linearities,
    plain softmax gradient, the uniform ÷2 rule at ``Q·Kᵀ`` and ``A·V`` (or the rules of ``composite=``)."""
    composite = _rule_set(c, ATTNLRP)
    result = _modified_gradient(c, composite)
    result.used = {**result.used, **_used(c, composite, "attnlrp")}
    return result


def cp_lrp(c: Call) -> MethodResult:
    """CP-LRP (Ali et al., ICML 2022): as AttnLRP, but Q and K detached (attention weights constant), no halving
    (or the rules of ``composite=``)."""
    composite = _rule_set(c, CP_LRP)
    result = _modified_gradient(c, composite)
    result.used = {**result.used, **_used(c, composite, "cp_lrp")}
    return result


def pa_lrp(c: Call[PALRP]) -> MethodResult:
    """PA-LRP (Bakish et al., 2025): AttnLRP (or CP-LRP, or the authors' ViT rules "cp_halved": option ``base``)
    with the position encodings as inputs:
    an added position embedding takes its ε-rule share of the sum; the rotary tables take half of each rotated
    q / k (the uniform rule). ``positional`` (B, T): their relevance per scored token; ``conservation.positional``."""
    composite, positions = pa_lrp_composite(c.method.base)
    return _modified_gradient(c, composite, positions)

"""The explanation methods of ``docs/METHODS.md`` §2, on top of a model adapter.

Each method takes a :class:`Call` (the adapter, the validated inputs, their
token layout, the target resolver and the parsed options) and returns a
:class:`MethodResult`. Which options a method takes, its defaults and what it
returns are declared in :mod:`lrp_core.registry`; ``lrp_core.api.explain``
validates, guards the model and builds the :class:`~lrp_core.Explanation`.

``explain`` runs every method under :func:`lrp_core.precision.compute_precision`: a
float16 / bfloat16 model (or any model under ``torch.autocast``) is explained in float32.
"""
from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass
from typing import Any, Callable, Optional

import torch
from torch import Tensor
from tqdm.auto import tqdm

from .adapters.base import Adapter, TokenLayout, Trace
from .adapters.readouts import Readout
from .composites import ATTNLRP, CP_LRP, LRP_BASELINE, TRANSFORMER_ATTRIBUTION, Composite, pa_lrp_composite
from .errors import InputError, LRPError, UnsupportedModelError
from .gradient_rules import PositionLeaves
from .explanation import RESULT_FIELDS, Conservation
from .options import OPTIONS
from .rollout import accumulate_row
from .utils import minmax_rows


@dataclass
class ConceptTarget:
    """A concept instead of a class: ``y = ⟨z, c⟩`` with ``z`` the model's final embedding (head removed).

    Attributes:
        vector: (D,) the mean final embedding ``c`` of the example inputs.
        n_examples: how many examples defined it.
        name: an optional label for plots.
    """

    vector: Tensor
    n_examples: int = 0
    name: str = "concept"


def _result_class() -> type:
    """:class:`MethodResult`: the :data:`~lrp_core.explanation.RESULT_FIELDS` (scores (B, T), target (B,),
    logits (B, C), then the optional ones, ``None`` by default) and ``used``, the options the method used."""
    spec = [(f.name, f.type) if f.required else (f.name, f.type, None) for f in RESULT_FIELDS]
    cls = make_dataclass("MethodResult", spec + [("used", dict, field(default_factory=dict))])
    cls.__module__, cls.__doc__ = __name__, _result_class.__doc__
    return cls


#: What a method returns; its fields are :data:`lrp_core.explanation.RESULT_FIELDS` and ``used``.
MethodResult = _result_class()

TargetResolver = Callable[[Tensor], Tensor]  # logits (B, C) -> target (B,)


def _options_class() -> type:
    """:class:`Options`: every option any method takes, with its default (:data:`lrp_core.options.OPTIONS`,
    where each is declared once); :mod:`lrp_core.registry` says which method takes which."""
    cls = make_dataclass("Options", [(o.name, o.type, o.default) for o in OPTIONS])
    cls.__module__, cls.__doc__ = __name__, _options_class.__doc__
    return cls


#: The parsed options a method reads (``call.opt.start_layer``, ...).
Options = _options_class()


@dataclass
class Contrast:
    """Explain class ``positive`` *rather than* class ``negative``: ``y = y_positive − y_negative``.

    Each is what ``target`` accepts (``None`` = the predicted class, an int, a sequence or a tensor (B,)).
    For CLIP: this image as prompt ``positive`` rather than prompt ``negative``.
    """

    positive: Any = None
    negative: Any = None


@dataclass
class Call:
    """One method call: what every method receives.

    ``negative`` (B,): the classes subtracted from the target (a :class:`Contrast`), else ``None``.
    ``readout``: the batch's readout (``adapter.readout_for(prepared)`` when not given); every replay of
    the call (:meth:`forward`) runs with it and every map is read through it.
    """

    adapter: Adapter
    prepared: dict
    layout: TokenLayout
    resolve: TargetResolver
    opt: Options
    concept: Optional[ConceptTarget] = None
    negative: Optional[Tensor] = None
    readout: Optional[Readout] = None

    def __post_init__(self) -> None:
        if self.readout is None:
            self.readout = self.adapter.readout_for(self.prepared)

    def forward(self, **kwargs: Any) -> Trace:
        """The adapter's replay of the call's batch, read out with the call's readout (``trace.head``)."""
        return self.adapter.forward(self.prepared, readout=self.readout, **kwargs)

    def start(self, logits: Tensor, target: Tensor) -> Tensor:
        """(B, C) relevance the explicit passes start from: one-hot of the target (minus the contrast class)."""
        w = one_hot(logits, target)
        return w if self.negative is None else w - one_hot(logits, self.negative.to(target.device))

    def output(self, logits: Tensor, target: Tensor, rows: Optional[Tensor] = None) -> Tensor:
        """(B,) the explained output: y_t (minus y of the contrast class); ``rows``: a subset of the batch."""
        y = logits.gather(1, target[:, None]).squeeze(1)
        if self.negative is None:
            return y
        neg = self.negative.to(target.device)
        neg = neg if rows is None else neg[rows]
        return y - logits.gather(1, neg[:, None]).squeeze(1)


# ----------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------
def one_hot(logits: Tensor, target: Tensor) -> Tensor:
    """(B, C) one-hot rows of the target classes: the relevance the passes start from."""
    return torch.zeros_like(logits).scatter_(1, target[:, None], 1.0)


def _product_scores(c: Call, layers: Tensor, start: int, stop: Optional[int] = None, norm: str = "none") -> Tensor:
    """Token scores from the readout's row of ``Π (I + Ā_b)`` over blocks ``start … stop`` of ``layers``
    (B, L, N, N), carried as a vector (:func:`~lrp_core.rollout.accumulate_row`); scored tokens only."""
    return c.layout.scores(accumulate_row(layers, c.readout.weights(layers.shape[-1]), start, stop, norm=norm))


def _readout_scores(c: Call, M: Tensor) -> Tensor:
    """Token scores from a token-mixing matrix M (B, N, N): the readout's row, scored tokens only."""
    return c.layout.scores(c.readout.row(M))


def _stack(layers: list) -> Tensor:
    return torch.stack(layers, dim=1)


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


# ----------------------------------------------------------------------------
# the methods
# ----------------------------------------------------------------------------
class _TopDownGradients:
    """∂y/∂A_b handed out top-down, one block's backward at a time (issue #22 item 6).

    The relevance pass reaches the blocks top-down, and so does a backward split at the block outputs:
    ``∂y/∂h_L`` first, then per block ``(∂y/∂A_b, ∂y/∂h_b) = backward(h_{b+1}, ∂y/∂h_{b+1})``. Each
    block's gradient is made when the pass needs it and its graph is freed then, so at most one block's
    ``(B, H, N, N)`` gradient is alive, not all L of them. Needs a plain stack (each block's input is the
    previous block's output): :meth:`applies`.
    """

    def __init__(self, trace: Trace, y: Tensor, start: int) -> None:
        blocks = trace.blocks
        self.start, self.next = start, len(blocks) - 1
        self.attns = [rec.attn.A for rec in blocks]  # dropped one by one as they are used
        self.ins = [rec.x for rec in blocks]
        self.outs = [rec.out for rec in blocks]
        (self.g,) = torch.autograd.grad(y, [blocks[-1].out])  # (B, N, D) through the readout only

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
        grads = torch.autograd.grad(out, wrt, grad_outputs=self.g)
        self.g = grads[1] if b > self.start else None
        self.ins[b], self.next = None, b - 1
        return grads[0]


def _attention_gradients(trace: Trace, y: Tensor, start: int) -> Callable[[int], Tensor]:
    """``grad_of(b)``: (B, H, N, N) ∂y/∂A_b for blocks ``start … L−1``, each asked for once, top-down.

    On a plain stack the backward is split per block (:class:`_TopDownGradients`: one block's gradient
    alive at a time); otherwise one backward makes them all, and each is dropped as it is handed out.
    """
    if _TopDownGradients.applies(trace):
        return _TopDownGradients(trace, y, start)
    blocks = range(start, len(trace.blocks))
    return dict(zip(blocks, torch.autograd.grad(y, [trace.attention(b) for b in blocks]))).pop


def transformer_attribution(c: Call) -> MethodResult:
    """Chefer et al. (CVPR 2021): gradient-weighted relevance of the attention maps, multiplied over blocks.

    Memory (issue #22 item 6): the attention gradients are made block by block as the top-down relevance
    pass reaches each block (:class:`_TopDownGradients`), each block's ``mean_h((∇A ⊙ R^A)⁺)`` is formed in
    place in the gradient, and the map is the readout row of the product carried as a vector
    (:func:`~lrp_core.rollout.accumulate_row`): no N×N product.
    """
    a, opt = c.adapter, c.opt
    L, s = a.num_blocks, opt.start_layer
    end = L - 1 if opt.end_layer is None else opt.end_layer
    trace = c.forward(grad=opt.use_gradient)
    target = c.resolve(trace.logits.detach())
    if opt.use_gradient:
        grad_of = _attention_gradients(trace, c.output(trace.logits, target).sum(), s)
    else:  # the maps themselves weigh the relevance, each dropped once used
        grad_of = {b: trace.attention(b).detach() for b in range(s, L)}.pop
    logits = trace.logits.detach()
    kept: dict = {}

    def weigh(b: int, R_A: Tensor) -> None:
        """Keep (∇A_b ⊙ R^A_b)⁺ (B, H, N, N) — or its head mean (B, N, N) — as the pass reaches block b."""
        with torch.enable_grad() if opt.use_gradient else torch.no_grad():
            w = grad_of(b)
        if opt.use_gradient:  # a fresh gradient, ours alone: the product is formed in it, no H·N² temporary
            per_head = w.mul_(R_A).clamp_(min=0)
        else:  # the attention map itself: not ours to change
            per_head = (w * R_A).clamp_(min=0)
        del w
        kept[b] = per_head if opt.keep_heads else per_head.mean(dim=1)

    with torch.no_grad():
        # the pass weighs each block's map as it goes and drops the records behind it: the peak
        # memory holds one block's relevance maps, not all of them (issue #15)
        rel = a.relprop(trace, c.start(logits, target), TRANSFORMER_ATTRIBUTION, stop_block=s,
                        on_attention=weigh, release=True)
        del trace, grad_of
        rel.attn = None
        layers, heads = _layers_result(kept, L, s, opt.keep_heads)
        del kept
        scores = c.layout.readout_minimum(_product_scores(c, layers, s, end, norm=opt.rollout_norm))
    return MethodResult(
        scores=scores, target=target, logits=logits, layers=layers, layers_per_head=heads,
        token_relevance=rel.tokens,
        used={"start_layer": s, "end_layer": end, "rollout_norm": opt.rollout_norm, "use_gradient": opt.use_gradient})


def generic_attention(c: Call) -> MethodResult:
    """Chefer et al. (ICCV 2021): ``Ā_b = mean_h((∇A_b ⊙ A_b)⁺)``, ``R ← R + Ā_b R``. One forward, one backward.

    Memory (issue #22 item 6): on a plain stack the backward is split at the block outputs and run top-down
    (:class:`_TopDownGradients`), each block's ``(∇A_b ⊙ A_b)⁺`` formed in its fresh gradient and reduced at
    once, so one block's ``(B, H, N, N)`` gradient is alive at a time, not L of them; the map is the readout
    row of ``Π (I + Ā_b)`` carried as a vector (:func:`~lrp_core.rollout.accumulate_row`): no N×N product.
    """
    a, s = c.adapter, c.opt.start_layer
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
            kept[b] = per_head if c.opt.keep_heads else per_head.mean(dim=1)
        del g, per_head
    del grad_of
    with torch.no_grad():
        layers, heads = _layers_result(kept, L, s, c.opt.keep_heads)
        del kept
        scores = _product_scores(c, layers, s)
    return MethodResult(scores=scores, target=target, logits=logits, layers=layers,
                        layers_per_head=heads, used={"start_layer": s})


def _attention_only(c: Call) -> tuple[Trace, Tensor, list]:
    with torch.no_grad():
        trace = c.forward(grad=False)
    target = c.resolve(trace.logits)
    return trace, target, [trace.attention(b) for b in range(c.adapter.num_blocks)]


def rollout(c: Call) -> MethodResult:
    """Abnar & Zuidema: ``mean_h(A_b) + I``, row-normalised, multiplied over blocks. Class-agnostic."""
    trace, target, attns = _attention_only(c)
    layers = _stack([A.mean(dim=1) for A in attns])
    # the readout row of the product, carried as a vector (O(N²) per block, not the N×N product's O(N³))
    scores = _product_scores(c, layers, c.opt.start_layer, c.opt.end_layer, norm="row")
    return MethodResult(scores=scores, target=target, logits=trace.logits, layers=layers,
                        layers_per_head=_stack(attns) if c.opt.keep_heads else None,
                        used={"start_layer": c.opt.start_layer})


def raw_attention(c: Call) -> MethodResult:
    """The last block's attention from the readout token(s), averaged over heads. Class-agnostic."""
    trace, target, attns = _attention_only(c)
    layers = _stack([A.mean(dim=1) for A in attns])
    return MethodResult(scores=_readout_scores(c, layers[:, -1]), target=target, logits=trace.logits,
                        layers=layers, layers_per_head=_stack(attns) if c.opt.keep_heads else None)


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
            m = mask[:, None, first:].to(g_row.dtype)
            w = (g_row * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True)
        cam = (w * a_row).mean(dim=1).clamp(min=0)  # (B, T)
        scores = minmax_rows(cam, None if mask is None else mask[:, first:])  # over real tokens
    return MethodResult(scores=scores, target=target, logits=trace.logits.detach())


def lrp(c: Call) -> MethodResult:
    """Full LRP with the baseline rules, down to input space (pixels for images, embeddings for text)."""
    trace, target, _ = _attention_only(c)
    with torch.no_grad():
        rel = c.adapter.relprop(trace, c.start(trace.logits, target), LRP_BASELINE, stop_block=0,
                                to_input=True, prepared=c.prepared)
    return MethodResult(scores=rel.scores, target=target, logits=trace.logits, pixels=rel.pixels,
                        token_relevance=rel.tokens)


def partial_lrp(c: Call) -> MethodResult:
    """Baseline LRP down to the last block only: ``mean_h((R^{A_L})⁺)``, the readout's row."""
    trace, target, _ = _attention_only(c)
    L = c.adapter.num_blocks
    with torch.no_grad():
        rel = c.adapter.relprop(trace, c.start(trace.logits, target), LRP_BASELINE, stop_block=L - 1)
        last = rel.attn[L - 1].clamp(min=0).mean(dim=1)
    return MethodResult(scores=_readout_scores(c, last), target=target, logits=trace.logits,
                        token_relevance=rel.tokens)


def cdam(c: Call) -> MethodResult:
    """Brocki & Chung: gradient × tokens entering the last attention (after its LayerNorm)."""
    a = c.adapter
    trace = c.forward(grad=True)
    T = a.cdam_tokens(trace)
    if c.concept is None:
        target = c.resolve(trace.logits.detach())
        y = c.output(trace.logits, target)
    else:
        v = c.concept.vector.to(trace.pooled.dtype)
        if v.shape[-1] != trace.pooled.shape[-1]:
            raise InputError(f"concept vector has size {v.shape[-1]}, the model's final embedding "
                             f"{trace.pooled.shape[-1]}")
        target = torch.full((T.shape[0],), -1, dtype=torch.long)
        y = trace.pooled @ v
    (g,) = torch.autograd.grad(y.sum(), [T])
    with torch.no_grad():
        scores = c.layout.scores((T * g).sum(dim=-1))
    return MethodResult(scores=scores, target=target, logits=trace.logits.detach(),
                        used={"concept": c.concept.name} if c.concept is not None else {})


def token_ablation(c: Call) -> MethodResult:
    """Token ablation map: ``y_t(all tokens) − y_t(without token i)``, the removals batched.

    Decoders: the other tokens keep their position ids, and the head reads the same token.
    """
    a, opt = c.adapter, c.opt
    with torch.no_grad():
        trace = c.forward(grad=False)
        target = c.resolve(trace.logits)
        y_full = c.output(trace.logits, target)
        x0 = trace.x0
        B, N, D = x0.shape
        mask, positions = trace.mask, trace.positions
        # (sample, token) pairs to ablate: every scored token but those the classifier reads (their score stays 0)
        dev = x0.device  # every index lives where the activations are (CUDA too)
        pairs = c.layout.ablation_pairs(B, dev)
        keep = torch.arange(N - 1, device=dev)
        scores = torch.zeros(B, N, dtype=x0.dtype, device=dev)
        bar = tqdm(total=len(pairs), desc="token ablation", unit="seq",
                   disable=not opt.progress if opt.progress is not None else len(pairs) < 2048, leave=False)
        for chunk in pairs.split(opt.batch_size):
            bi, ti = chunk[:, 0], chunk[:, 1]
            idx = keep[None, :] + (keep[None, :] >= ti[:, None]).long()  # positions without token ti
            xs = x0[bi].gather(1, idx[..., None].expand(-1, -1, D))
            ms = None if mask is None else mask[bi].gather(1, idx)
            ps = None if positions is None else positions[bi].gather(1, idx)  # the others keep their positions
            head = c.readout.after_removal(bi, ti)  # a per-row readout position moves with the removal
            out = a.run_blocks(xs, ms, keep=False, readout=head, positions=ps)  # logits only
            scores[bi, ti] = y_full[bi] - c.output(out.logits, target[bi], rows=bi)
            bar.update(len(chunk))
        bar.close()
    return MethodResult(scores=scores[:, c.layout.output_start:], target=target, logits=trace.logits)


def _modified_gradient(c: Call, composite: Composite, positions: Optional[PositionLeaves] = None) -> MethodResult:
    """Gradient × input with a modified-gradient rule set: one forward replay, one backward pass.

    Gradients are taken only with respect to the input-space tensors and the
    block outputs (no parameter gradients). Token relevance is read at the
    patch-/word-embedding output, pixels (images) at the input, and the
    residual stream's relevance after every block (docs/METHODS.md §2b). ``positions``: the leaves a PA-LRP
    composite's rules made of the position encodings; their relevance is read too (§2e).
    """
    trace = c.forward(grad=True, composite=composite, track=True)
    target = c.resolve(trace.logits.detach())
    y = c.output(trace.logits, target)
    emb = trace.embedding
    hidden = [rec.out for rec in trace.blocks]
    wrt = [emb.embeds] + hidden + ([emb.images] if emb.images is not None else [])
    leaves = [] if positions is None else positions.leaves
    if positions is not None and not leaves:
        raise UnsupportedModelError(
            f"pa_lrp gives relevance to the position encoding, but {type(c.adapter.model).__name__} adds none that "
            "the engine sees (no learned / absolute position embedding added to the tokens, no rotary q/k); "
            "use attnlrp or cp_lrp")
    grads = torch.autograd.grad(y.sum(), wrt + leaves, allow_unused=True)
    pos_grads, grads = grads[len(wrt):], grads[:len(wrt)]
    with torch.no_grad():
        scores = (emb.embeds * grads[0]).sum(-1)  # (B, T) the scored tokens' embeddings
        mask = c.layout.mask
        if mask is not None:
            scores = scores * mask[:, c.layout.output_start:].to(scores.dtype)
        blocks = torch.stack([(h * g).sum(-1) for h, g in zip(hidden, grads[1:1 + len(hidden)])], dim=1)
        if mask is not None:
            blocks = blocks * mask[:, None, :].to(blocks.dtype)
        pixels = (emb.images * grads[-1]).sum(1) if emb.images is not None else None
        per_position = _positional(leaves, pos_grads, mask)
        conservation = Conservation(output=y.detach(), blocks=blocks.sum(-1), input=scores.sum(-1),
                                    pixels=None if pixels is None else pixels.sum(dim=(1, 2)),
                                    positional=None if per_position is None else per_position.sum(-1))
    positional = None if per_position is None else per_position[:, -scores.shape[1]:]  # the scored tokens'
    return MethodResult(scores=scores, target=target, logits=trace.logits.detach(), pixels=pixels,
                        token_relevance=blocks, conservation=conservation, positional=positional)


def _positional(leaves: list, grads: tuple, mask: Optional[Tensor]) -> Optional[Tensor]:
    """(B, N) the position encodings' relevance per position: Σ over leaves (position tables; a rotary table
    holds every block's share) of leaf ⊙ gradient, summed over channels; padding 0. ``None`` without leaves."""
    if not leaves:
        return None
    total = None
    for leaf, g in zip(leaves, grads):
        if g is None:  # a table the output does not depend on (e.g. CP-LRP: q, k detached after RoPE)
            g = torch.zeros_like(leaf)
        r = (leaf * g).sum(-1)  # (B, N)
        total = r if total is None else total + r
    if mask is not None and mask.shape[1] == total.shape[1]:
        total = total * mask.to(total.dtype)
    return total


def attnlrp(c: Call) -> MethodResult:
    """AttnLRP (Achtibat et al., ICML 2024): LayerNorm std detached, identity rule on non-linearities,
    plain softmax gradient, the uniform ÷2 rule at ``Q·Kᵀ`` and ``A·V``."""
    return _modified_gradient(c, ATTNLRP)


def cp_lrp(c: Call) -> MethodResult:
    """CP-LRP (Ali et al., ICML 2022): as AttnLRP, but Q and K detached (attention weights constant), no halving."""
    return _modified_gradient(c, CP_LRP)


def pa_lrp(c: Call) -> MethodResult:
    """PA-LRP (Bakish et al., 2025): AttnLRP (or CP-LRP, or the authors' ViT rules "cp_halved": option ``base``)
    with the position encodings as inputs:
    an added position embedding takes its ε-rule share of the sum; the rotary tables take half of each rotated
    q / k (the uniform rule). ``positional`` (B, T): their relevance per scored token; ``conservation.positional``."""
    composite, positions = pa_lrp_composite(c.opt.base)
    return _modified_gradient(c, composite, positions)


__all__ = ["ConceptTarget", "Contrast", "MethodResult", "Options", "Call", "one_hot",
           "transformer_attribution", "generic_attention", "rollout", "raw_attention", "attention_gradcam", "lrp",
           "partial_lrp", "cdam", "token_ablation", "attnlrp", "cp_lrp", "pa_lrp"]

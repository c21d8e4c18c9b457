"""The explanation methods of ``METHODS.md`` §2, on top of a model adapter.

Each method takes the adapter, the validated inputs, a target resolver and the
options, and returns a :class:`MethodResult`. ``lrp_core.api.explain`` wraps
them with validation and the model guard.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch import Tensor
from tqdm.auto import tqdm

from .adapters.base import Adapter, Trace
from .rollout import accumulate, accumulate_residual
from .rules import LRP_BASELINE, TRANSFORMER_ATTRIBUTION


@dataclass
class ConceptTarget:
    """A concept instead of a class: ``y = ⟨z, c⟩`` with ``z`` the final [CLS] embedding.

    Attributes:
        vector: (D,) the mean [CLS] embedding ``c`` of the example inputs.
        n_examples: how many examples defined it.
        name: an optional label for plots.
    """

    vector: Tensor
    n_examples: int = 0
    name: str = "concept"


@dataclass
class MethodResult:
    scores: Tensor  # (B, T)
    target: Tensor  # (B,)
    logits: Tensor  # (B, C)
    layers: Optional[Tensor] = None  # (B, L, N, N)
    layers_per_head: Optional[Tensor] = None  # (B, L, H, N, N)
    token_relevance: Optional[Tensor] = None  # (B, L, N)
    pixels: Optional[Tensor] = None  # (B, H, W)
    used: dict = field(default_factory=dict)


TargetResolver = Callable[[Tensor], Tensor]  # logits (B, C) -> target (B,)


@dataclass
class Options:
    start_layer: int = 0
    end_layer: Optional[int] = None
    rollout_norm: Optional[str] = None
    use_gradient: bool = True
    keep_heads: bool = False
    progress: Optional[bool] = None
    batch_size: int = 64


# ----------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------
def _one_hot(logits: Tensor, target: Tensor) -> Tensor:
    return torch.zeros_like(logits).scatter_(1, target[:, None], 1.0)


def _target_output(trace: Trace, target: Tensor) -> Tensor:
    """y_t per sample (B,): the target logit."""
    return trace.logits.gather(1, target[:, None]).squeeze(1)


def _cls_row(a: Adapter, joint: Tensor, mask: Optional[Tensor]) -> Tensor:
    """Row 0 of a (B, N, N) matrix as token scores: ViT drops the prefix tokens, BERT zeroes padding."""
    row = joint[:, 0, a.output_slice()]
    return row if mask is None else row * mask.to(row.dtype)


def _stack(layers: list) -> Tensor:
    return torch.stack(layers, dim=1)


def _full_layers(parts: dict, L: int, like: Tensor) -> Tensor:
    """(B, L, ...) with the computed blocks filled in and zeros elsewhere."""
    out = torch.zeros((like.shape[0], L) + tuple(like.shape[1:]), dtype=like.dtype, device=like.device)
    for b, m in parts.items():
        out[:, b] = m
    return out


def _mask(prepared: dict) -> Optional[Tensor]:
    return prepared.get("attention_mask")


# ----------------------------------------------------------------------------
# the methods
# ----------------------------------------------------------------------------
def transformer_attribution(a: Adapter, prepared: dict, resolve: TargetResolver, opt: Options) -> MethodResult:
    """Chefer et al. (CVPR 2021): gradient-weighted relevance of the attention maps, multiplied over blocks."""
    L, s = a.num_blocks, opt.start_layer
    end = L - 1 if opt.end_layer is None else opt.end_layer
    norm = opt.rollout_norm or ("row" if a.family == "bert" else "none")
    trace = a.forward(prepared, grad=opt.use_gradient)
    target = resolve(trace.logits.detach())
    if opt.use_gradient:
        y = _target_output(trace, target).sum()
        weights = torch.autograd.grad(y, [trace.attention(b) for b in range(s, L)])
    else:
        weights = [trace.attention(b).detach() for b in range(s, L)]
    with torch.no_grad():
        rel = a.relprop(trace, _one_hot(trace.logits, target), TRANSFORMER_ATTRIBUTION, stop_block=s)
        per_head = {b: (weights[b - s] * rel.attn[b]).clamp(min=0) for b in range(s, L)}
        parts = {b: m.mean(dim=1) for b, m in per_head.items()}
        layers = _full_layers(parts, L, parts[s])
        joint = accumulate(layers, s, end, norm=norm)
        scores = _cls_row(a, joint, _mask(prepared))
        if a.family == "bert":
            scores = _replace_cls_with_min(scores, _mask(prepared))
    return MethodResult(
        scores=scores, target=target, logits=trace.logits.detach(), layers=layers,
        layers_per_head=_full_layers(per_head, L, per_head[s]) if opt.keep_heads else None,
        token_relevance=rel.tokens,
        used={"start_layer": s, "end_layer": end, "rollout_norm": norm, "use_gradient": opt.use_gradient})


def _replace_cls_with_min(scores: Tensor, mask: Tensor) -> Tensor:
    """BERT reference: the [CLS] entry becomes the row's minimum over the real tokens."""
    big = torch.finfo(scores.dtype).max
    row_min = torch.where(mask.bool(), scores, torch.full_like(scores, big)).min(dim=1).values
    scores = scores.clone()
    scores[:, 0] = row_min
    return scores * mask.to(scores.dtype)


def generic_attention(a: Adapter, prepared: dict, resolve: TargetResolver, opt: Options) -> MethodResult:
    """Chefer et al. (ICCV 2021): ``Ā_b = mean_h((∇A_b ⊙ A_b)⁺)``, ``R ← R + Ā_b R``. One forward, one backward."""
    L, s = a.num_blocks, opt.start_layer
    trace = a.forward(prepared, grad=True)
    target = resolve(trace.logits.detach())
    attns = [trace.attention(b) for b in range(s, L)]
    grads = torch.autograd.grad(_target_output(trace, target).sum(), attns)
    with torch.no_grad():
        per_head = {b: (grads[b - s] * attns[b - s]).clamp(min=0) for b in range(s, L)}
        parts = {b: m.mean(dim=1) for b, m in per_head.items()}
        layers = _full_layers(parts, L, parts[s])
        joint = accumulate_residual(layers, s)
        scores = _cls_row(a, joint, _mask(prepared))
    return MethodResult(scores=scores, target=target, logits=trace.logits.detach(), layers=layers,
                        layers_per_head=_full_layers(per_head, L, per_head[s]) if opt.keep_heads else None,
                        used={"start_layer": s})


def _attention_only(a: Adapter, prepared: dict, resolve: TargetResolver) -> tuple[Trace, Tensor, list]:
    with torch.no_grad():
        trace = a.forward(prepared, grad=False)
    target = resolve(trace.logits)
    return trace, target, [trace.attention(b) for b in range(a.num_blocks)]


def rollout(a: Adapter, prepared: dict, resolve: TargetResolver, opt: Options) -> MethodResult:
    """Abnar & Zuidema: ``mean_h(A_b) + I``, row-normalised, multiplied over blocks. Class-agnostic."""
    trace, target, attns = _attention_only(a, prepared, resolve)
    layers = _stack([A.mean(dim=1) for A in attns])
    joint = accumulate(layers, opt.start_layer, opt.end_layer, norm="row")
    return MethodResult(scores=_cls_row(a, joint, _mask(prepared)), target=target, logits=trace.logits,
                        layers=layers, layers_per_head=_stack(attns) if opt.keep_heads else None,
                        used={"start_layer": opt.start_layer})


def raw_attention(a: Adapter, prepared: dict, resolve: TargetResolver, opt: Options) -> MethodResult:
    """The last block's attention from [CLS], averaged over heads. Class-agnostic."""
    trace, target, attns = _attention_only(a, prepared, resolve)
    layers = _stack([A.mean(dim=1) for A in attns])
    return MethodResult(scores=_cls_row(a, layers[:, -1], _mask(prepared)), target=target, logits=trace.logits,
                        layers=layers, layers_per_head=_stack(attns) if opt.keep_heads else None)


def attention_gradcam(a: Adapter, prepared: dict, resolve: TargetResolver, opt: Options) -> MethodResult:
    """Grad-CAM on the last attention map: head weights = mean gradient of the [CLS] row."""
    trace = a.forward(prepared, grad=True)
    target = resolve(trace.logits.detach())
    A = trace.attention(a.num_blocks - 1)
    (grad,) = torch.autograd.grad(_target_output(trace, target).sum(), [A])
    mask = _mask(prepared)
    with torch.no_grad():
        cols = a.output_slice()
        g_row, a_row = grad[:, :, 0, cols], A.detach()[:, :, 0, cols]  # (B, H, T)
        if mask is None:
            w = g_row.mean(dim=-1, keepdim=True)
        else:
            m = mask[:, None, :].to(g_row.dtype)
            w = (g_row * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True)
        cam = (w * a_row).mean(dim=1).clamp(min=0)  # (B, T)
        scores = _minmax(cam, mask)
    return MethodResult(scores=scores, target=target, logits=trace.logits.detach())


def _minmax(x: Tensor, mask: Optional[Tensor]) -> Tensor:
    """Per-sample min–max scaling to [0, 1] (over real tokens); a constant map becomes 0."""
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


def lrp(a: Adapter, prepared: dict, resolve: TargetResolver, opt: Options) -> MethodResult:
    """Full LRP with the baseline rules, down to the pixels (ViT) or the embeddings (BERT)."""
    trace, target, _ = _attention_only(a, prepared, resolve)
    with torch.no_grad():
        images = a.family == "vit"
        extra = {"to_pixels": True} if images else {"to_inputs": True}
        rel = a.relprop(trace, _one_hot(trace.logits, target), LRP_BASELINE, stop_block=0,
                        prepared=prepared, **extra)
        if images:
            pixels = rel.pixels
            ph, pw = a.patch_size
            B, H, W = pixels.shape
            scores = pixels.reshape(B, H // ph, ph, W // pw, pw).sum(dim=(2, 4)).reshape(B, -1)
        else:
            pixels = None
            scores = rel.inputs * prepared["attention_mask"].to(rel.inputs.dtype)  # at the embeddings
    return MethodResult(scores=scores, target=target, logits=trace.logits, pixels=pixels,
                        token_relevance=rel.tokens)


def partial_lrp(a: Adapter, prepared: dict, resolve: TargetResolver, opt: Options) -> MethodResult:
    """Baseline LRP down to the last block only: ``mean_h((R^{A_L})⁺)`` from [CLS]."""
    trace, target, _ = _attention_only(a, prepared, resolve)
    L = a.num_blocks
    with torch.no_grad():
        rel = a.relprop(trace, _one_hot(trace.logits, target), LRP_BASELINE, stop_block=L - 1)
        last = rel.attn[L - 1].clamp(min=0).mean(dim=1)
    return MethodResult(scores=_cls_row(a, last, _mask(prepared)), target=target, logits=trace.logits,
                        token_relevance=rel.tokens)


def cdam(a: Adapter, prepared: dict, resolve: TargetResolver, opt: Options,
         concept: Optional[ConceptTarget] = None) -> MethodResult:
    """Brocki & Chung: gradient × tokens entering the last attention (after its LayerNorm)."""
    trace = a.forward(prepared, grad=True)
    T = a.cdam_tokens(trace)
    if concept is None:
        target = resolve(trace.logits.detach())
        y = _target_output(trace, target)
    else:
        c = concept.vector.to(trace.pooled.dtype)
        if c.shape[-1] != trace.pooled.shape[-1]:
            raise ValueError(f"concept vector has size {c.shape[-1]}, the model's [CLS] embedding "
                             f"{trace.pooled.shape[-1]}")
        target = torch.full((T.shape[0],), -1, dtype=torch.long)
        y = trace.pooled @ c
    (g,) = torch.autograd.grad(y.sum(), [T])
    with torch.no_grad():
        scores = (T * g).sum(dim=-1)[:, a.output_slice()]
        mask = _mask(prepared)
        if mask is not None:
            scores = scores * mask.to(scores.dtype)
    return MethodResult(scores=scores, target=target, logits=trace.logits.detach(),
                        used={"concept": concept.name} if concept is not None else {})


def token_ablation(a: Adapter, prepared: dict, resolve: TargetResolver, opt: Options) -> MethodResult:
    """Token ablation map: ``y_t(all tokens) − y_t(without token i)``, the removals batched."""
    with torch.no_grad():
        trace = a.forward(prepared, grad=False)
        target = resolve(trace.logits)
        y_full = _target_output(trace, target)
        x0 = trace.x0
        B, N, D = x0.shape
        mask = trace.mask
        # (sample, token) pairs to ablate: ViT every patch (after the prefix tokens); BERT every real
        # token but [CLS], the token the classifier reads (its score stays 0)
        first = 1 if a.family == "bert" else a.output_slice().start
        tok = torch.arange(first, N)
        pairs = torch.cartesian_prod(torch.arange(B), tok)
        if mask is not None:
            pairs = pairs[mask[pairs[:, 0], pairs[:, 1]].bool()]
        keep = torch.arange(N - 1)
        scores = torch.zeros(B, N, dtype=x0.dtype)
        bar = tqdm(total=len(pairs), desc="token ablation", unit="seq",
                   disable=not opt.progress if opt.progress is not None else len(pairs) < 2048, leave=False)
        for chunk in pairs.split(opt.batch_size):
            bi, ti = chunk[:, 0], chunk[:, 1]
            idx = keep[None, :] + (keep[None, :] >= ti[:, None]).long()  # positions without token ti
            xs = x0[bi].gather(1, idx[..., None].expand(-1, -1, D))
            ms = None if mask is None else mask[bi].gather(1, idx)
            y = a.run_blocks(xs, ms).logits.gather(1, target[bi][:, None]).squeeze(1)
            scores[bi, ti] = y_full[bi] - y
            bar.update(len(chunk))
        bar.close()
    return MethodResult(scores=scores[:, a.output_slice()], target=target, logits=trace.logits)


REGISTRY: dict[str, Callable[..., MethodResult]] = {
    "transformer_attribution": transformer_attribution,
    "generic_attention": generic_attention,
    "rollout": rollout,
    "raw_attention": raw_attention,
    "attention_gradcam": attention_gradcam,
    "lrp": lrp,
    "partial_lrp": partial_lrp,
    "cdam": cdam,
    "token_ablation": token_ablation,
}

#: Methods whose map does not depend on the target class.
CLASS_AGNOSTIC = ("rollout", "raw_attention")

"""The tensor functions the attention replay computes with, in the numerics each model uses.

Softmaxes (plain, in float32 as Hugging Face's eager attention, block by block as its per-window attention),
the fused ``scaled_dot_product_attention`` call, rotary embeddings computed in another precision (ModernBERT,
Qwen2.5-VL's vision tower) and the two channel layouts of rotary pairs. Each is what a recorded operation of
:mod:`lrp_core.adapters.blocks` applies; the rules never see these functions, only the operation kinds.

Shapes: B batch, H heads, N tokens, d head width.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor, nn

from ..rules.tensors import apply_rotary, repeat_kv


def softmax_rows(s: Tensor) -> Tensor:
    """The softmax over the last axis, in the scores' dtype.

    Parameters
    ----------
    s : Tensor
        (B, H, N, N) masked scores.

    Returns
    -------
    Tensor
        The attention weights, same shape.
    """
    return s.softmax(dim=-1)


def softmax_float32(s: Tensor) -> Tensor:
    """Hugging Face eager attention's softmax: computed in float32 and cast back.

    Parameters
    ----------
    s : Tensor
        (B, H, N, N) masked scores.

    Returns
    -------
    Tensor
        The attention weights in the scores' dtype.
    """
    return s.softmax(dim=-1, dtype=torch.float32).to(s.dtype)


def eager_softmax_dtype(config) -> Optional[torch.dtype]:
    """The dtype a Hugging Face attention whose eager kernel casts computes its softmax in.

    transformers dispatches on ``config._attn_implementation``: ``"eager"`` or unset (``None``) runs the family's
    ``eager_attention_forward``, which for CLIP, SigLIP (1, 2), ViT, DeiT, Idefics3 / SmolVLM, Swin (v1),
    Qwen2.5-VL's vision tower and the Llama-style decoders (GPT-NeoX, Phi, Phi-3, ModernBERT, …) is
    ``softmax(scores, dtype=float32).to(query.dtype)``; every other implementation (sdpa, flash, flex) runs its
    own kernel in the model's dtype. Families whose eager kernel does not cast (DINOv2, BERT, GPT-2, Swin v2,
    Falcon) do not call this.

    Parameters
    ----------
    config : PretrainedConfig
        The config the attention module reads (a tower's own config in a composite model).

    Returns
    -------
    torch.dtype or None
        ``torch.float32`` under eager attention, else ``None`` (the model's dtype).
    """
    return torch.float32 if getattr(config, "_attn_implementation", None) in (None, "eager") else None


def segmented_softmax(bias: Tensor) -> Callable[[Tensor], Tensor]:
    """The float32 softmax block by block, the blocks those the bias leaves open along the diagonal.

    Hugging Face's per-window eager attention (Qwen2.5-VL's vision tower): the weights outside the blocks are
    exactly 0, as the masked softmax's.

    Parameters
    ----------
    bias : Tensor
        (…, N, N) the additive mask: 0 inside the blocks, the dtype's minimum outside.

    Returns
    -------
    Callable[[Tensor], Tensor]
        Scores (…, N, N) -> weights (…, N, N).
    """
    open_ = bias.reshape(-1, *bias.shape[-2:])[0] == 0
    N = open_.shape[-1]
    starts = [0] + [i for i in range(1, N) if not bool(open_[i, i - 1])] + [N]

    def softmax(s: Tensor) -> Tensor:
        out = torch.zeros_like(s)
        for a, b in zip(starts[:-1], starts[1:]):
            out[..., a:b, a:b] = s[..., a:b, a:b].softmax(dim=-1, dtype=torch.float32).to(s.dtype)
        return out

    return softmax


def fused_attention(
    bias: Optional[Tensor], scale: float, groups: int, causal: bool
) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """softmax(q·kᵀ·scale + bias)·v by ``F.scaled_dot_product_attention``.

    Parameters
    ----------
    bias : Tensor, optional
        The additive mask (B, 1 or H, N, M), or ``None``.
    scale : float
        The score scale.
    groups : int
        Query heads per key/value head (k and v are repeated to H heads).
    causal : bool
        The kernel's own causal mask (with ``bias`` ``None``: no N × N tensor at all).

    Returns
    -------
    Callable[[Tensor, Tensor, Tensor], Tensor]
        (q (B, H, N, d), k, v (B, Hkv, M, d)) -> (B, H, N, d).
    """

    def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return torch.nn.functional.scaled_dot_product_attention(
            q, repeat_kv(k, groups), repeat_kv(v, groups), attn_mask=bias, scale=scale, is_causal=causal
        )

    return attend


def rounded_rotary(dtype: torch.dtype) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """:func:`apply_rotary` of x's values rounded to ``dtype`` (Hugging Face ModernBERT's
    ``q.float() * cos + rotate_half(q.float()) * sin``, whose products are formed in cos's dtype, x's).

    The rounding passes the gradient unchanged (``x + (round(x) − x)`` with the difference detached: the same
    values, since ``round(x) − x`` is exact), so a modified-gradient pass keeps x's precision.

    Parameters
    ----------
    dtype : torch.dtype
        The dtype the model rounds q and k to.

    Returns
    -------
    Callable[[Tensor, Tensor, Tensor], Tensor]
        (x (B, H, N, d), cos, sin) -> rotated x.
    """

    def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        return apply_rotary(x + (x.to(dtype).to(x.dtype) - x).detach(), cos, sin)

    return rotate


def computed_rotary(dtype: torch.dtype) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """:func:`apply_rotary` computed in ``dtype`` and cast back (Qwen2.5-VL's vision rotation
    ``(q.float() * cos.float() + rotate_half(q.float()) * sin.float()).to(q.dtype)``).

    The value is that rounded rotation; the gradient is the exact rotation's (its difference to the rounded one is
    detached), so a modified-gradient pass keeps x's precision.

    Parameters
    ----------
    dtype : torch.dtype
        The dtype the model rotates in.

    Returns
    -------
    Callable[[Tensor, Tensor, Tensor], Tensor]
        (x (B, H, N, d), cos, sin) -> rotated x.
    """

    def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        exact = apply_rotary(x, cos, sin)
        rounded = apply_rotary(x.to(dtype), cos.to(dtype), sin.to(dtype)).to(x.dtype)
        return exact + (rounded - exact).detach()

    return rotate


def pairs_to_halves(x: Tensor) -> Tensor:
    """Interleaved rotary pairs (2i, 2i+1) laid out as halves (i, i + d/2): the even channels, then the odd ones.

    Parameters
    ----------
    x : Tensor
        (…, d).

    Returns
    -------
    Tensor
        (…, d).
    """
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)


def halves_to_pairs(x: Tensor) -> Tensor:
    """The inverse of :func:`pairs_to_halves`.

    Parameters
    ----------
    x : Tensor
        (…, d).

    Returns
    -------
    Tensor
        (…, d).
    """
    h = x.shape[-1] // 2
    return torch.stack((x[..., :h], x[..., h:]), dim=-1).reshape(x.shape)


def plus(u: Tensor, v: Tensor) -> Tensor:
    """``u + v`` (a recorded ADD: a residual or a bias-like sum).

    Parameters
    ----------
    u, v : Tensor
        Broadcastable operands.

    Returns
    -------
    Tensor
        The sum.
    """
    return u + v


def times(u: Tensor, v: Tensor) -> Tensor:
    """``u · v`` element-wise (a recorded MUL: a gate, a layer scale).

    Parameters
    ----------
    u, v : Tensor
        Broadcastable operands.

    Returns
    -------
    Tensor
        The product.
    """
    return u * v


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` (a recorded MATMUL_QK or MATMUL_AV).

    Parameters
    ----------
    a : Tensor
        (…, N, k).
    b : Tensor
        (…, k, M).

    Returns
    -------
    Tensor
        (…, N, M).
    """
    return a @ b


def scaled_matmul(scale: float, queries_first: bool) -> Callable[[Tensor, Tensor], Tensor]:
    """The scaled scores ``(q, kᵀ) -> (…, N, M)`` as one operation, in the model's order.

    Parameters
    ----------
    scale : float
        The scale (or a tensor broadcast with the scores).
    queries_first : bool
        ``(q · scale) @ kᵀ`` (timm scales the queries first); else ``(q @ kᵀ) · scale`` (Hugging Face).

    Returns
    -------
    Callable
        q (…, N, d), kᵀ (…, d, M) -> (…, N, M).
    """

    def scores(q: Tensor, kT: Tensor) -> Tensor:
        return (q * scale) @ kT if queries_first else (q @ kT) * scale

    return scores


def parallel_sum(x: Tensor, a: Tensor, f: Tensor) -> Tensor:
    """A parallel block's output ``(a + f) + x``: the order in which GPT-NeoX, Phi and Falcon add.

    Parameters
    ----------
    x, a, f : Tensor
        (B, N, D) the block's input, its attention output and its MLP output.

    Returns
    -------
    Tensor
        (B, N, D).
    """
    return a + f + x


def parallel_sum_skip_first(x: Tensor, a: Tensor, f: Tensor) -> Tensor:
    """A parallel block's output ``(x + a) + f`` (StableLM's, Cohere's order).

    Parameters
    ----------
    x, a, f : Tensor
        (B, N, D) the block's input, its attention output and its MLP output.

    Returns
    -------
    Tensor
        (B, N, D).
    """
    return x + a + f


class SoftCap(nn.Module):
    """``cap · tanh(x / cap)``, the soft-capping of attention scores and logits (Gemma 2), as the model computes it.

    An element-wise non-linearity (operation kind ELEMENTWISE): identity in the explicit passes, the identity rule
    under AttnLRP (docs/METHODS.md §2f).
    """

    def __init__(self, cap: float):
        super().__init__()
        self.cap = float(cap)

    def forward(self, x: Tensor) -> Tensor:
        """(...) -> (...): divided, tanh, multiplied, in the model's order of operations."""
        return torch.tanh(x / self.cap) * self.cap

    def extra_repr(self) -> str:
        return f"cap={self.cap:g}"


__all__ = [
    "SoftCap",
    "softmax_rows",
    "softmax_float32",
    "eager_softmax_dtype",
    "segmented_softmax",
    "fused_attention",
    "rounded_rotary",
    "computed_rotary",
    "pairs_to_halves",
    "halves_to_pairs",
    "plus",
    "times",
    "matmul",
    "scaled_matmul",
    "parallel_sum",
    "parallel_sum_skip_first",
]

"""One multi-head self-attention: its description (:class:`AttentionSpec`) and its replay
(:func:`attention_forward`), for :mod:`.blocks`.

Shapes: B batch, N tokens, D width, H heads, Hkv key/value heads, d head width.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

import torch
from torch import Tensor, nn

from ..errors import InputError
from ..rules.ops import (
    ATTENTION,
    ELEMENTWISE,
    KV_REPEAT,
    LINEAR,
    MASK_ADD,
    MATMUL_AV,
    MATMUL_QK,
    ROPE,
    SOFTMAX,
)
from ..rules.tensors import apply_rotary, query_row_bias, repeat_kv, take_rows
from .chunked import chunked_core
from .kernels import (
    SoftCap,
    computed_rotary,
    fused_attention,
    halves_to_pairs,
    matmul,
    pairs_to_halves,
    plus,
    rounded_rotary,
    scaled_matmul,
    segmented_softmax,
    softmax_float32,
    softmax_rows,
)
from .parts import IDENTITY, ModelPart
from .records import AttentionRecord

if TYPE_CHECKING:
    from .replay import Replay

#: how a fused qkv projection orders its outputs: "split" (all query heads, then the key heads, then the value
#: heads: timm, Phi-3, GPT-2), "grouped" (per key/value head its query heads, then its key, then its value:
#: GPT-NeoX's and Falcon's per-head ``[q, k, v]``, Falcon's new decoder architecture's ``[q…, k, v]``)
QKV_LAYOUTS = ("split", "grouped")


@dataclass
class AttentionSpec:
    """The parts of one multi-head self-attention.

    Either ``qkv`` (one fused Linear, timm, Phi-3) or ``q``, ``k``, ``v`` (Hugging Face).
    ``scale_queries_first``: timm scales q before ``q·kᵀ``; Hugging Face scales the product.

    Decoders (docs/METHODS.md §2c): ``num_kv_heads`` key/value heads shared by ``num_heads // num_kv_heads``
    consecutive query heads each (``None``: as many as query heads); ``rotary``: q and k are rotated by the
    batch's rotary tables (``rope_key`` names which, for models with several, e.g. Gemma 3's local and global
    bases); ``window``: sliding-window attention over that many positions (the adapter builds the mask);
    ``softmax_dtype``: the dtype the model's softmax computes in (Hugging Face eager: float32, cast back);
    ``sdpa``: the model runs fused attention, so a modified-gradient replay may too (no N×N map in memory);
    ``causal``: causal attention — where the fused replay gets no mask (no padding, no window), the kernel's own;
    ``rotary_dtype``: the dtype q and k are rounded to before they are rotated (ModernBERT rotates float32 copies,
    so a float64 model's rotated q and k carry float32 round-off); ``None``: rotated as they are;
    ``rotary_compute``: the dtype the whole rotation is computed in, q, k and the tables cast to it and the result
    cast back (Qwen2.5-VL's vision tower rotates in float32); ``None``: in q's dtype; ``segmented``: the additive
    mask leaves contiguous diagonal blocks open (Qwen2.5-VL's windows) and the model runs one attention per block,
    so a float32 softmax is computed block by block, its sums those of the model's (over the whole masked row they
    would be summed in another order);
    ``norm_whole``: ``q_norm`` / ``k_norm`` normalise the whole projection (every head together, OLMoE) before
    it is split into heads, not each head's d channels (OLMo-2, OLMoE); ``qkv_layout``: the order of a fused
    ``qkv``'s outputs (:data:`QKV_LAYOUTS`); ``softcap``: the scaled scores are soft-capped (:class:`SoftCap`)
    before the mask is added (Gemma 2; never fused); ``sinks``: the softmax with attention sinks, masked scores
    (B, H, N, M) -> weights (B, H, N, M) (:class:`lrp_core.adapters.gpt_oss.AttentionSinks`: one learned logit
    per head in every row's denominator, no value; never fused), the map ``A`` then the softmax without the sink
    column.

    ``mix_scores`` / ``mix_weights``: talking-heads attention (CaiT): Linear maps across the H heads, one on the
    scaled scores before the softmax, one on its weights after it (each a LINEAR operation of the replay on the
    map with the heads last, §1's Linear rule); ``A`` is then the mixed map ``A·v`` reads; never fused.

    ``query_scale``: the queries are multiplied by it before they are rotated (ESM; a constant scale, its relevance
    passes unchanged), the scores then taking ``scale`` (1 there); ``None``: no such step.

    ``scores``: the scaled scores computed by the family's own forward, ``(q, k, r, rows) -> (B, H, N, M)`` in
    place of one scaled ``q·kᵀ`` (DeBERTa's disentangled c2c + c2p + p2c: :mod:`.disentangled`; never fused).

    ``pad_tokens``: the attention reads that many zero tokens after the N tokens of its input (keys and values,
    whose outputs are dropped): the padding a windowed model adds to fill its windows (Swin). The bias then covers
    all N + pad_tokens tokens; the record keeps the unpadded input ``h`` and the cropped output projection
    (``lin["proj_all"]``: the uncropped one). ``softmax``: the model's own softmax of the masked scores
    (B, H, N, N) -> A, where it is not one over each whole row (Swin's eager attention: per window, in float32);
    ``None``: per row, in ``softmax_dtype``.

    Vision rotary embeddings (timm EVA): ``rope_skip`` leading tokens (class, register tokens) are not rotated,
    and the rotary tables then cover the other tokens only, (B or 1, N − rope_skip, d); ``rope_interleaved``:
    the rotation turns the channel pairs (2i, 2i+1) (timm's default) instead of (i, i + d/2) — the replay
    gathers each head's even channels then its odd ones, rotates them in the halves layout (the tables given in
    that order) and puts them back: the same products, element by element, as the model's.
    """

    proj: ModelPart  # Linear-like parts: the model's Linears (a peft LoRA layer is none), or views (GPT-2's Conv1D)
    num_heads: int
    head_dim: int
    scale: float
    qkv: Optional[ModelPart] = None
    q: Optional[ModelPart] = None
    k: Optional[ModelPart] = None
    v: Optional[ModelPart] = None
    q_norm: nn.Module = IDENTITY
    k_norm: nn.Module = IDENTITY
    ctx_norm: nn.Module = IDENTITY
    scale_queries_first: bool = False
    num_kv_heads: Optional[int] = None
    rotary: bool = False
    rope_key: str = "default"
    window: Optional[int] = None
    softmax_dtype: Optional[torch.dtype] = None
    sdpa: bool = False
    causal: bool = False
    rope_skip: int = 0
    rope_interleaved: bool = False
    rotary_dtype: Optional[torch.dtype] = None
    rotary_compute: Optional[torch.dtype] = None
    segmented: bool = False
    norm_whole: bool = False
    qkv_layout: str = "split"
    softcap: Optional[SoftCap] = None
    pad_tokens: int = 0
    softmax: Optional[Callable[[Tensor], Tensor]] = None
    sinks: Optional[nn.Module] = None
    scores: Optional[Callable[..., Tensor]] = None
    query_scale: Optional[float] = None
    mix_scores: Optional[ModelPart] = None
    mix_weights: Optional[ModelPart] = None

    def __post_init__(self) -> None:
        if self.qkv_layout not in QKV_LAYOUTS:
            raise InputError(f"qkv_layout must be one of {QKV_LAYOUTS}, got {self.qkv_layout!r}")

    @property
    def kv_heads(self) -> int:
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def groups(self) -> int:
        """Query heads per key/value head."""
        return self.num_heads // self.kv_heads


def _project(
    p: AttentionSpec, h: Tensor, r: Replay, kv: Optional[Tensor] = None
) -> tuple[dict, Tensor, Tensor, Tensor]:
    """The q, k, v projections of h (B, N, D) -> (Linear outputs by role, q (B, H, N, d), k, v (B, Hkv, N, d)).

    q/k norms act on each head's d channels (Qwen3: before the heads are transposed, as the model does).
    ``kv`` (B, M, D): a cross-attention's keys and values are projected from it (an encoder's output), the
    queries from ``h``; k, v are then (B, Hkv, M, d).
    """
    if kv is not None:
        return _cross_project(p, h, kv, r)
    B, N, _ = h.shape
    H, Hkv, d = p.num_heads, p.kv_heads, p.head_dim
    if p.qkv is not None:
        lin = {"qkv": r.module(LINEAR, p.qkv, h)}  # (B, N, (H + 2·Hkv)·d)
        if p.qkv_layout == "grouped":  # per key/value head: its query heads, its key, its value
            parts = lin["qkv"].reshape(B, N, Hkv, p.groups + 2, d)
            q = parts[:, :, :, : p.groups].reshape(B, N, H, d).transpose(1, 2)
            k, v = parts[:, :, :, p.groups].transpose(1, 2), parts[:, :, :, p.groups + 1].transpose(1, 2)
        elif Hkv == H:
            q, k, v = lin["qkv"].reshape(B, N, 3, H, d).permute(2, 0, 3, 1, 4).unbind(0)
        else:  # fused GQA projection (Phi-3): the query heads, then the key heads, then the value heads
            q, k, v = (
                t.reshape(B, N, -1, d).transpose(1, 2) for t in lin["qkv"].split([H * d, Hkv * d, Hkv * d], dim=-1)
            )
        return lin, r.norm(p.q_norm, q), r.norm(p.k_norm, k), v
    assert p.q is not None and p.k is not None and p.v is not None, "an attention without qkv has q, k and v"
    lin = {n: r.module(LINEAR, m, t) for n, m, t in zip("qkv", (p.q, p.k, p.v), r.fork(h, 3))}  # h read thrice
    if p.norm_whole:  # the norms over all heads' channels at once, then the heads
        q, k, v = (
            t.reshape(B, N, -1, d).transpose(1, 2)
            for t in (r.norm(p.q_norm, lin["q"]), r.norm(p.k_norm, lin["k"]), lin["v"])
        )
        return lin, q, k, v
    q, k, v = (lin[n].reshape(B, N, -1, d) for n in "qkv")
    return lin, r.norm(p.q_norm, q).transpose(1, 2), r.norm(p.k_norm, k).transpose(1, 2), v.transpose(1, 2)


def _cross_project(p: AttentionSpec, h: Tensor, kv: Tensor, r: Replay) -> tuple[dict, Tensor, Tensor, Tensor]:
    """A cross-attention's projections: q from h (B, N, D), k and v from kv (B, M, D) (read twice)."""
    assert p.q is not None and p.k is not None and p.v is not None, "a cross-attention has q, k and v"
    kv_k, kv_v = r.fork(kv, 2)
    lin = {n: r.module(LINEAR, m, t) for n, m, t in zip("qkv", (p.q, p.k, p.v), (h, kv_k, kv_v))}
    q, k, v = (lin[n].reshape(lin[n].shape[0], lin[n].shape[1], -1, p.head_dim).transpose(1, 2) for n in "qkv")
    return lin, q, k, v


def _rotate(p: AttentionSpec, x: Tensor, cos: Tensor, sin: Tensor, r: Replay) -> Tensor:
    """x (B, H, N, d) rotated by the tables: the first ``p.rope_skip`` tokens pass, pairs per ``p.rope_interleaved``."""
    n = p.rope_skip
    body = x[:, :, n:] if n else x
    if p.rope_interleaved:
        body = pairs_to_halves(body)
    rotate = apply_rotary if p.rotary_dtype is None else rounded_rotary(p.rotary_dtype)
    if p.rotary_compute is not None:
        rotate = computed_rotary(p.rotary_compute)
    out = r(ROPE, rotate, body, cos, sin)
    if p.rope_interleaved:
        out = halves_to_pairs(out)
    return torch.cat((x[:, :, :n], out), dim=2) if n else out


def _padded(p: AttentionSpec, t: Tensor) -> Tensor:
    """(B, N, D) -> (B, N + p.pad_tokens, D): the zero tokens the attention reads after the N tokens."""
    if not p.pad_tokens:
        return t
    return torch.cat([t, t.new_zeros(t.shape[0], p.pad_tokens, t.shape[-1])], dim=1)


def _unpadded(p: AttentionSpec, t: Tensor, n: int) -> Tensor:
    """(B, n + p.pad_tokens, D) -> (B, n, D): the padding's entries dropped."""
    return t[:, :n] if p.pad_tokens else t


def _across_heads(linear: ModelPart, t: Tensor, r: Replay) -> Tensor:
    """(B, H, N, M) -> (B, H, N, M): ``linear`` (H -> H) applied across the heads of every entry (talking heads)."""
    return r.module(LINEAR, linear, t.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


#: the smallest attention chunk of the blockwise pass: fewer rows make the matrix products inefficient
MIN_ROWS = 32


def rows_per_chunk(p: AttentionSpec) -> int:
    """c: the query rows per chunk of the blockwise pass (:mod:`.chunked`), ``4·d`` (at least :data:`MIN_ROWS`),
    so one chunk's ``(B, H, c, M)`` scores hold ``4·B·M·H·d`` elements, four times the ``(B, M, D)`` activations
    where ``D = H·d``."""
    return max(MIN_ROWS, 4 * int(p.head_dim))


def chunkable(p: AttentionSpec) -> bool:
    """Whether the core of ``p`` is row-wise (one softmax per query row over its keys, nothing mixing rows):
    not a family's own scores (DeBERTa), talking heads, a windowed softmax (Swin, segments), sinks or padding."""
    return (
        p.scores is None
        and p.mix_scores is None
        and p.mix_weights is None
        and p.softmax is None
        and not p.segmented
        and p.sinks is None
        and p.pad_tokens == 0
    )


def _explicit_attention(
    p: AttentionSpec,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Optional[Tensor],
    r: Replay,
    rows: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """The attention with its map computed: ``A = softmax(mask(scaled q·kᵀ))``, then ``A·v``.

    Parameters
    ----------
    p : AttentionSpec
        The attention's scale, soft-cap, softmax and key/value groups.
    q : Tensor
        The queries ``(B, H, N, d)`` (rotated where rotary; N = 1 where one row is computed).
    k : Tensor
        The keys ``(B, Hkv, M, d)``.
    v : Tensor
        The values ``(B, Hkv, M, d)``.
    bias : Tensor or None
        The additive mask, broadcast to ``(B, H, N, M)``, or ``None``.
    r : Replay
        Runs (and records) each operation through its rule.
    rows : Tensor or None
        ``(B,)``: the query row q holds of each sample, for the family's own ``p.scores``; ``None``: every row.

    Returns
    -------
    tuple of Tensor
        ``(A, ctx)``: the attention map ``(B, H, N, M)`` and the heads' outputs ``A·v`` ``(B, H, N, d)``.
    """
    groups = p.groups
    k_all, v_all = (k, v) if groups == 1 else (r(KV_REPEAT, lambda t: repeat_kv(t, groups), t) for t in (k, v))
    # the scaled q·kᵀ is one operation; its explicit rule reads q·kᵀ itself (reuse=False)
    if p.scores is not None:  # the family's own scores (DeBERTa's disentangled terms)
        scores = p.scores(q, k_all, r, rows)
    else:
        scores = r(MATMUL_QK, scaled_matmul(p.scale, p.scale_queries_first), q, k_all.transpose(-2, -1), reuse=False)
    if p.mix_scores is not None:  # talking heads: a Linear across the heads on the scores
        scores = _across_heads(p.mix_scores, scores, r)
    if p.softcap is not None:  # not a module of the model: not recorded as the first element-wise layer
        scores = r(ELEMENTWISE, p.softcap, scores, module=p.softcap)
    masked = scores if bias is None else r(MASK_ADD, plus, scores, bias)
    softmax: Callable[[Tensor], Tensor] = softmax_rows if p.softmax_dtype is None else softmax_float32
    if p.segmented and bias is not None and p.softmax_dtype is not None:
        softmax = segmented_softmax(bias)
    softmax = p.sinks if p.sinks is not None else p.softmax or softmax
    A = r(SOFTMAX, softmax, masked)  # (B, H, N, N)
    if p.mix_weights is not None:  # talking heads: a Linear across the heads on the weights
        A = _across_heads(p.mix_weights, A, r)
    return A, r(MATMUL_AV, matmul, A, v_all)  # (B, H, N, d)


def attention_forward(
    p: AttentionSpec,
    h: Tensor,
    bias: Optional[Tensor],
    r: Replay,
    rope: Optional[tuple] = None,
    rows: Optional[Tensor] = None,
    kv: Optional[Tensor] = None,
) -> AttentionRecord:
    """Multi-head self-attention on ``h`` (or cross-attention, ``kv`` given); the map is explicit unless fused.

    Parameters
    ----------
    p : AttentionSpec
        The attention's modules and shape (heads, head size, groups, rotary, scale).
    h : Tensor
        The attention's input ``(B, N, D)``.
    bias : Tensor or None
        The additive mask ``(B, 1, 1, N)`` or ``(B, 1, N, N)``, or ``None``.
    r : Replay
        Runs (and records) each operation through its rule; ``r.fuse`` allows the fused sdpa kernel.
    rope : tuple of Tensor or None
        ``(cos, sin)``, each ``(B, N − p.rope_skip, r)``, where ``p.rotary``; otherwise ``None``.
    rows : Tensor or None
        ``(B,)`` long: only the query at row ``rows[b]`` of each sample is computed (keys and values at every
        row); the output, ``ctx`` and ``A`` then have one row (``(B, 1, D)``, ``(B, H, 1, d)``, ``(B, H, 1, N)``).
        ``None``: every row.
    kv : Tensor or None
        ``(B, M, D)``: a cross-attention's keys and values are projected from it (the encoder's output; the
        bias is then ``(B, 1, 1, M)``), its queries from ``h``; ``None``: self-attention.

    Returns
    -------
    AttentionRecord
        The forward quantities the rules need (projections, queries, keys, values, the map ``A`` ``(B, H, N, N)``
        unless fused, the output ``(B, N, D)``).
    """
    B, N, _ = h.shape
    H, d, groups = p.num_heads, p.head_dim, p.groups
    lin, q, k, v = _project(p, _padded(p, h), r, kv)
    if p.query_scale is not None:
        scale = p.query_scale
        q = r.transparent(lambda t: t * scale, q)
    if p.rotary:
        assert rope is not None, "a rotary attention gets its tables (Adapter.block_context)"
        cos, sin = rope
        q, k = _rotate(p, q, cos, sin, r), _rotate(p, k, cos, sin, r)
    causal, picked = p.causal, rows
    if rows is not None:  # every other query row's output reaches nothing that is read
        q = take_rows(q, rows, 2)  # (B, H, 1, d)
        bias = query_row_bias(bias, rows, N, p.causal, q)
        causal = False  # a single query row: its keys are chosen by the row mask
        N = 1
    A = None
    if p.sdpa and r.fuse and p.softcap is None and p.sinks is None and p.scores is None and p.mix_scores is None:
        ctx = r(ATTENTION, fused_attention(bias, p.scale, groups, causal and bias is None), q, k, v)  # (B, H, N, d)
    elif r.chunked and chunkable(p) and N > rows_per_chunk(p):  # the blockwise pass: no N × N map at once

        def core(q_rows: Tensor, k: Tensor, v: Tensor, bias_rows: Optional[Tensor]) -> Tensor:
            return _explicit_attention(p, q_rows, k, v, bias_rows, r)[1]

        ctx = chunked_core(core, q, k, v, bias, rows_per_chunk(p))
    else:
        A, ctx = _explicit_attention(p, q, k, v, bias, r, picked)
    o = r.norm(p.ctx_norm, ctx.transpose(1, 2).reshape(B, N + p.pad_tokens, H * d))
    lin["proj"] = r.module(LINEAR, p.proj, o)
    if p.pad_tokens:  # the padding's outputs are dropped
        lin["proj_all"] = lin["proj"]
        lin["proj"] = lin["proj_all"][:, :N]
    return AttentionRecord(
        h=h,
        q=q,
        k=k,
        v=v,
        A=A,
        ctx=ctx,
        o=o,
        lin=lin,
        bias=bias,
        rope=rope if p.rotary else None,
    )


__all__ = ["AttentionSpec", "QKV_LAYOUTS", "attention_forward"]

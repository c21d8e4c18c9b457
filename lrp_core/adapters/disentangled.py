"""DeBERTa's disentangled attention scores (docs/METHODS.md §2k): a block feature of :mod:`.attention`.

The scores of one head are three products, each divided by ``√(d · f)`` (``f`` = 1 + the number of position
terms), summed before the mask:

* content → content ``c2c = Q_c · K_cᵀ``;
* content → position ``c2p[i, j] = Q_c[i] · K_r[δ(i, j)]`` (``"c2p"`` in ``pos_att_type``);
* position → content ``p2c[i, j] = K_c[j] · Q_r[δ'(j, i)]`` (``"p2c"``),

with ``K_r``, ``Q_r`` the relative embeddings (the model's table, after its LayerNorm where it has one) projected
by the layer's key / query projections (``share_att_key``) or by its own position projections, and ``δ`` the
model's (log-bucketed) relative position ``i − j`` shifted into the table (``clamp(δ + S, 0, 2S − 1)``). Each
product is one ``MATMUL_QK`` operation of the replay, so the rule set chooses its rule (AttnLRP: the ÷2 uniform
rule; CP-LRP: both operands detached; explicit passes: §1's MatMul rule); the relative-position operand is a
constant (computed from the weights alone, no gradient), so its share is absorbed. The three products are
summed by one ``ADD`` (explicit passes: the normalised add); the bucket gather is a selection (its relevance
goes back to the product entry it read).

Shapes: B batch, H heads, N tokens, d head width, S attention span (the table has 2S rows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

import torch
from torch import Tensor

from ..rules.ops import ADD, MATMUL_QK
from ..rules.tensors import take_rows
from .parts import ModelPart

if TYPE_CHECKING:
    from .replay import Replay


@dataclass
class DisentangledScores:
    """The disentangled scores of one layer (a callable for :attr:`AttentionSpec.scores`).

    ``table``: the relative embeddings (2S', D) as the model's encoder computes them (its LayerNorm included);
    the first 2S rows are read. ``relative``: N -> (N, N) long, the model's bucketed relative positions ``i − j``.
    ``pos_key`` / ``pos_query``: the projections of the table for c2p / p2c (``None``: that term is off).
    ``scale_factor``: ``f`` of the scale ``√(d · f)``, computed as the model does (in float32, then cast).
    """

    num_heads: int
    head_dim: int
    span: int
    scale_factor: int
    table: Callable[[], Tensor]
    relative: Callable[[int], Tensor]
    pos_key: Optional[ModelPart] = None
    pos_query: Optional[ModelPart] = None

    def scale(self, dtype: torch.dtype) -> Tensor:
        """``√(d · f)``: the model's float32 square root, cast to the scores' dtype."""
        return torch.sqrt(torch.tensor(self.head_dim, dtype=torch.float32) * self.scale_factor).to(dtype)

    def projected(self, proj: ModelPart, like: Tensor) -> Tensor:
        """The table's first 2S rows through ``proj``, as heads ``(B, H, 2S, d)``: a constant (no gradient)."""
        with torch.no_grad():
            rows = proj(self.table()[: 2 * self.span].to(like.dtype))  # (2S, H·d)
        heads = rows.reshape(1, -1, self.num_heads, self.head_dim).transpose(1, 2)  # (1, H, 2S, d)
        return heads.expand(like.shape[0], -1, -1, -1)

    def __call__(self, q: Tensor, k: Tensor, r: "Replay", rows: Optional[Tensor] = None) -> Tensor:
        """The scaled scores ``(B, H, N_q, N)`` of queries ``q`` ``(B, H, N_q, d)`` and keys ``k`` ``(B, H, N, d)``.

        ``rows`` ``(B,)``: q holds only query row ``rows[b]`` of each sample (N_q = 1); ``None``: every row.
        """
        N = k.shape[2]
        scale = self.scale(q.dtype)
        c2c = r(MATMUL_QK, lambda a, bT: a @ (bT / scale), q, k.transpose(-2, -1), reuse=False)
        if self.pos_key is None and self.pos_query is None:  # no relative attention: the content term alone
            return c2c
        terms = []
        rel = self.relative(N).to(q.device)  # (N, N): δ(i, j) of query i, key j
        top = 2 * self.span - 1
        if self.pos_key is not None:  # content → position: Q_c[i] · K_r[δ(i, j)]
            kr = self.projected(self.pos_key, q)
            c2p = r(MATMUL_QK, lambda a, bT: (a @ bT) / scale, q, kr.transpose(-2, -1), reuse=False)
            index = (rel + self.span).clamp(0, top).expand(q.shape[0], N, N)
            if rows is not None:
                index = take_rows(index, rows.to(q.device), 1)  # (B, 1, N)
            terms.append(c2p.gather(-1, index[:, None].expand(-1, q.shape[1], -1, -1)))
        if self.pos_query is not None:  # position → content: K_c[j] · Q_r[δ'(j, i)], gathered by key, transposed
            qr = self.projected(self.pos_query, k)
            p2c = r(MATMUL_QK, lambda a, bT: (a @ bT) / scale, k, qr.transpose(-2, -1), reuse=False)
            index = (self.span - rel).clamp(0, top).expand(*k.shape[:2], N, N)
            p2c = p2c.gather(-1, index).transpose(-1, -2)  # (B, H, N, N): [query i, key j]
            terms.append(p2c if rows is None else take_rows(p2c, rows.to(q.device), 2))
        return r(ADD, _summed, c2c, *terms)


def _summed(c2c: Tensor, *terms: Tensor) -> Tensor:
    """``c2c + (c2p + p2c)``: the position terms added up first, as the model does."""
    total = terms[0]
    for t in terms[1:]:
        total = total + t
    return c2c + total


__all__ = ["DisentangledScores"]

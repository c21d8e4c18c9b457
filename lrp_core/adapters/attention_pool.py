"""Attention pooling (MAP: multi-head attention pooling) as a readout: a learned probe token attends to the final
tokens, then ``y = a + mlp(norm(a))`` — SigLIP's pooling head and timm's ``AttentionPoolLatent``
(``global_pool='map'``), described once (:class:`PoolHead`) and replayed once (:class:`AttentionPoolReadout`).

The pooling is an attention block with one query (docs/METHODS.md §2v): in the replay each operation is the same
kind as in a block (LINEAR projections, MATMUL_QK, SOFTMAX, MATMUL_AV, the residual ADD), so every composite applies
its attention rules to it; the probe is a constant (its query's relevance is absorbed).

Shapes: B batch, N tokens, D width, H heads, d head width.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import Tensor, nn

from ..errors import InputError, UnsupportedModelError
from ..rules.linear import LinearView, is_linear
from ..rules.ops import ADD, ELEMENTWISE, LINEAR, MATMUL_AV, MATMUL_QK, SOFTMAX
from .blocks import NO_RECORD, MlpSpec, Replay
from .kernels import matmul, plus, scaled_matmul
from .parts import IDENTITY, ModelPart
from .readouts import HeadLayer, Readout, head_layer
from .records import ReadoutRecord


class RowSlice(LinearView):
    """Rows ``[start, stop)`` of a Linear's weight and bias as a Linear of their own (timm's fused ``kv``: the keys
    are the first half, the values the second), read at every call (a view: no parameters)."""

    owner: ModelPart  # set in __init__, not as a child module

    def __init__(self, linear: ModelPart, start: int, stop: int):
        super().__init__()
        object.__setattr__(self, "owner", linear)  # not a child module: the view owns no parameters
        self.start, self.stop = start, stop
        self.in_features, self.out_features = int(linear.in_features), stop - start

    @property
    def weight(self) -> Tensor:
        return self.owner.weight[self.start : self.stop]

    @property
    def bias(self) -> Optional[Tensor]:
        b = self.owner.bias
        return None if b is None else b[self.start : self.stop]

    def linear_parts(self) -> tuple[Tensor, Optional[Tensor]]:
        return self.weight, self.bias

    def forward(self, x: Tensor) -> Tensor:
        return torch.nn.functional.linear(x, self.weight, self.bias)


@dataclass
class PoolHead:
    """The parts of an attention-pooling head, as the model's modules.

    ``probe`` (1, 1, D_q): the learned query token; ``q`` (Linear-like, or identity where the probe is the query
    itself), ``k``, ``v``: the projections; ``q_norm`` / ``k_norm``: per-head norms; ``proj``: the output
    projection; ``norm`` and ``mlp``: the residual MLP after it (``None``: no MLP, the head ends at ``proj``);
    ``skip``: the prefix tokens the pooling does not read (timm without ``pool_include_prefix``).
    """

    probe: Tensor
    q: ModelPart
    k: ModelPart
    v: ModelPart
    proj: ModelPart
    num_heads: int
    head_dim: int
    scale: float
    norm: nn.Module = IDENTITY
    mlp: Optional[MlpSpec] = None
    q_norm: nn.Module = IDENTITY
    k_norm: nn.Module = IDENTITY
    skip: int = 0


@dataclass(kw_only=True)  # keyword-only: the fields after the base's need no default
class PoolRecord(ReadoutRecord):
    """The attention-pooling head's forward quantities (one query: the probe).

    ``probe`` (B, 1, D), ``lin`` the projections' outputs (``q`` (B, 1, D), ``k`` / ``v`` (B, n, D), ``proj``
    (B, 1, D)), ``q`` (B, H, 1, d), ``k`` / ``v`` (B, H, n, d), ``A`` (B, H, 1, n) over the n pooled tokens,
    ``ctx`` (B, H, 1, d), ``o`` (B, 1, D) the heads side by side, ``ln`` the norm's output, ``fc1`` / ``g`` /
    ``fc2`` the MLP's (``None`` without one), ``y`` (B, 1, D) the head's output.
    """

    probe: Tensor
    lin: dict
    q: Tensor
    k: Tensor
    v: Tensor
    A: Tensor
    ctx: Tensor
    o: Tensor
    ln: Optional[Tensor]
    fc1: Optional[Tensor]
    g: Optional[Tensor]
    fc2: Optional[Tensor]
    y: Tensor


def _softmax(s: Tensor) -> Tensor:
    return s.softmax(dim=-1)


class AttentionPoolReadout(Readout):
    """An attention-pooling head (:class:`PoolHead`) as a readout: ``norm`` (the final norm), then the probe
    attends to the tokens, then the head layers.

    The token weights the layer-product methods read (:meth:`weights`) are the probe's attention averaged over
    the heads, per image (``probe_attention`` (B, N), from a plain replay of the batch, 0 at the skipped prefix):
    the pooling's own attention row, as [CLS]'s row is a ViT's.
    """

    def __init__(
        self,
        norm: nn.Module,
        pool: PoolHead,
        head_layers: Sequence[HeadLayer],
        probe_attention: Optional[Tensor] = None,
    ):
        self.norm, self.pool_head = norm, pool
        self.head_layers = [h for h in head_layers if not isinstance(h.module, nn.Identity)]
        self.probe_attention = probe_attention

    def with_attention(self, probe_attention: Optional[Tensor]) -> "AttentionPoolReadout":
        """The same readout with the batch's probe attention (B, N)."""
        return AttentionPoolReadout(self.norm, self.pool_head, self.head_layers, probe_attention)

    def attention_of(self, record: Optional[ReadoutRecord]) -> Tensor:
        """(B, N) the probe's head-mean attention of a replay's record, 0 at the skipped prefix tokens."""
        assert isinstance(record, PoolRecord), "the attention-pooling readout's record"
        A = record.A.mean(dim=1)[:, 0].detach()
        skip = self.pool_head.skip
        return torch.cat([A.new_zeros(A.shape[0], skip), A], dim=1) if skip else A

    def pool(self, normed: Tensor) -> Tensor:
        """(B, N, D) -> (B, D): the pooling head's output (a plain replay)."""
        return self._pool(normed, NO_RECORD).y[:, 0]

    def weights(self, num_tokens: int) -> Tensor:
        """(B, N): the probe's head-mean attention of the batch."""
        if self.probe_attention is None or self.probe_attention.shape[-1] != num_tokens:
            raise InputError(
                "the attention-pooling readout's token weights come from a batch: build the readout "
                "with adapter.readout_for(prepared)"
            )
        return self.probe_attention.cpu().to(torch.float64)

    def row(self, M: Tensor) -> Tensor:
        """``wᵀ M`` per image for M (B, ..., N, N) -> (B, ..., N), on M's device."""
        w = self.weights(M.shape[-1]).to(dtype=M.dtype, device=M.device)
        return (w.reshape((w.shape[0],) + (1,) * (M.dim() - 3) + (1, w.shape[-1])) @ M).squeeze(-2)

    def after_removal(self, rows: Tensor, removed: Tensor) -> "AttentionPoolReadout":
        """Rows ``rows`` without their token ``removed``: the weights lose that column and are renormalised (the
        pooling itself is recomputed by every replay)."""
        if self.probe_attention is None:
            return self
        w = self.probe_attention.to(rows.device)[rows]
        keep = torch.arange(w.shape[1] - 1, device=rows.device)
        idx = keep[None, :] + (keep[None, :] >= removed.to(rows.device)[:, None]).long()
        w = w.gather(1, idx)
        return self.with_attention(w / w.sum(dim=1, keepdim=True))

    def _pool(self, normed: Tensor, r: Replay) -> PoolRecord:
        p = self.pool_head
        tokens = normed[:, p.skip :] if p.skip else normed
        B = tokens.shape[0]
        H, d = p.num_heads, p.head_dim
        probe = p.probe.expand(B, -1, -1)
        for_k, for_v = r.fork(tokens, 2)
        lin = {
            "q": r.module(LINEAR, p.q, probe) if is_linear(p.q) else probe,
            "k": r.module(LINEAR, p.k, for_k),
            "v": r.module(LINEAR, p.v, for_v),
        }
        q, k, v = (lin[n].reshape(B, -1, H, d).transpose(1, 2) for n in "qkv")
        q, k = r.norm(p.q_norm, q), r.norm(p.k_norm, k)
        # both models scale the queries before the product (the rule reads q·kᵀ itself)
        scores = r(MATMUL_QK, scaled_matmul(p.scale, True), q, k.transpose(-2, -1), reuse=False)
        A = r(SOFTMAX, _softmax, scores)
        ctx = r(MATMUL_AV, matmul, A, v)  # (B, H, 1, d)
        o = ctx.transpose(1, 2).reshape(B, 1, H * d)
        lin["proj"] = y = r.module(LINEAR, p.proj, o)
        ln = fc1 = g = fc2 = None
        if p.mlp is not None:
            proj, for_ln = r.fork(lin["proj"], 2)
            ln = r.norm(p.norm, for_ln)
            fc1 = r.module(LINEAR, p.mlp.fc1, ln)
            g = r.norm(p.mlp.mid_norm, r.module(ELEMENTWISE, p.mlp.act, fc1))
            fc2 = r.module(LINEAR, p.mlp.fc2, g)
            y = r(ADD, plus, proj, fc2)
        return PoolRecord(
            hidden=normed,
            token=y[:, 0],
            inputs=[],
            pooled=y[:, 0],
            logits=y[:, 0],
            probe=probe,
            lin=lin,
            q=q,
            k=k,
            v=v,
            A=A,
            ctx=ctx,
            o=o,
            ln=ln,
            fc1=fc1,
            g=g,
            fc2=fc2,
            y=y,
        )

    def forward(self, hidden: Tensor, r: Replay = NO_RECORD) -> PoolRecord:
        normed = r.norm(self.norm, hidden)
        rec = self._pool(normed, r)
        h, inputs = rec.token, []
        for layer in self.head_layers:
            inputs.append(h)
            h = head_layer(layer, h, r)
        rec.hidden, rec.inputs, rec.logits = hidden, inputs, h
        rec.pooled = inputs[-1] if inputs else h  # the input of the last head layer (SigLIP: the embedding)
        return rec


def timm_pool_head(model: ModelPart) -> PoolHead:
    """timm's ``AttentionPoolLatent`` (``model.attn_pool``, ``global_pool='map'``) as a :class:`PoolHead`: one
    latent query, the fused ``kv`` Linear split into its key and value rows, the optional q / k norms, ``proj``,
    then ``x + mlp(norm(x))``. A ``VisionTransformer`` pools the tokens after its prefix unless
    ``pool_include_prefix``; ``Eva`` pools every token.

    Raises
    ------
    UnsupportedModelError
        For another pooling module (``'prr'``), several latent queries, a position embedding of the pool's own or a
        pool without its output projection (``out_features=0``), naming it.
    """
    ap, name = model.attn_pool, type(model).__name__
    if type(ap).__name__ != "AttentionPoolLatent":
        raise UnsupportedModelError(
            f"{name}: its attention pool {type(ap).__name__} is not timm's AttentionPoolLatent (global_pool='map')"
        )
    if int(ap.latent_len) != 1 or ap.pool not in ("token", "avg"):
        raise UnsupportedModelError(
            f"{name}: its attention pool has {ap.latent_len} latent queries (pool_type={ap.pool!r}); one query is "
            "explained"
        )
    if ap.pos_embed is not None or not is_linear(ap.proj) or not is_linear(ap.kv):
        raise UnsupportedModelError(
            f"{name}: its attention pool adds a position embedding of its own or has no output projection; the pool "
            "explained is AttentionPoolLatent with pos_embed='' and its proj / MLP"
        )
    D = int(ap.kv.out_features) // 2
    mlp = None if ap.mlp is None else MlpSpec(fc1=ap.mlp.fc1, act=ap.mlp.act, fc2=ap.mlp.fc2, mid_norm=ap.mlp.norm)
    return PoolHead(
        probe=ap.latent,
        q=ap.q,
        k=RowSlice(ap.kv, 0, D),
        v=RowSlice(ap.kv, D, 2 * D),
        proj=ap.proj,
        num_heads=int(ap.num_heads),
        head_dim=int(ap.head_dim),
        scale=float(ap.scale),
        norm=ap.norm,
        mlp=mlp,
        q_norm=ap.q_norm,
        k_norm=ap.k_norm,
        skip=0 if getattr(model, "pool_include_prefix", True) else int(model.num_prefix_tokens),
    )


__all__ = ["AttentionPoolReadout", "PoolHead", "PoolRecord", "RowSlice", "timm_pool_head"]

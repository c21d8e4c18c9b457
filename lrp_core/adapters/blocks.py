"""Transformer blocks as descriptions, their replay, and their relevance drivers.

An adapter describes each block of its model with a :class:`BlockSpec` — which
of the model's own submodules plays which part, in which layout — and the
code here replays it (:func:`block_forward`) and walks it backward
(:func:`block_relprop`), asking a composite for every rule. Two layouts:

* ``"pre_ln"`` (ViT): ``mid = x + ls1(attn(norm1(x)))``, ``out = mid + ls2(mlp(norm2(mid)))``.
* ``"post_ln"`` (BERT): ``mid = norm1(x + attn(x))``, ``out = norm2(mid + mlp(mid))``.

Shapes: B batch, N tokens, D width, H heads, d head width.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional

import torch
from torch import Tensor, nn

from ..composites import (ADD, ELEMENTWISE, LAYERNORM, LINEAR, MASK_ADD, MATMUL_AV, MATMUL_QK, MODIFIED_GRADIENT,
                          SCALE, SOFTMAX, Composite, Propagation, RuleChoice)
from ..errors import InputError
from .records import AttentionRecord, BlockRecord

IDENTITY = nn.Identity()
LAYOUTS = ("pre_ln", "post_ln")


@dataclass
class AttentionSpec:
    """The parts of one multi-head self-attention.

    Either ``qkv`` (one fused Linear, timm) or ``q``, ``k``, ``v`` (Hugging Face).
    ``scale_queries_first``: timm scales q before ``q·kᵀ``; Hugging Face scales the product.
    """

    proj: nn.Linear
    num_heads: int
    head_dim: int
    scale: float
    qkv: Optional[nn.Linear] = None
    q: Optional[nn.Linear] = None
    k: Optional[nn.Linear] = None
    v: Optional[nn.Linear] = None
    q_norm: nn.Module = IDENTITY
    k_norm: nn.Module = IDENTITY
    ctx_norm: nn.Module = IDENTITY
    scale_queries_first: bool = False


@dataclass
class MlpSpec:
    """``fc2(mid_norm(act(fc1(x))))``."""

    fc1: nn.Linear
    act: nn.Module
    fc2: nn.Linear
    mid_norm: nn.Module = IDENTITY


@dataclass
class BlockSpec:
    """One block: its layout, attention, MLP, norms and LayerScales (identity where absent)."""

    layout: str
    attn: AttentionSpec
    mlp: MlpSpec
    norm1: nn.Module
    norm2: nn.Module
    ls1: nn.Module = IDENTITY
    ls2: nn.Module = IDENTITY

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise InputError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")


# ----------------------------------------------------------------------------
# the replay
# ----------------------------------------------------------------------------
class Replay(RuleChoice):
    """Runs each operation of the forward pass through its rule's ``forward``.

    ``Replay(None)`` computes every operation plainly (the model's own arithmetic); with a
    modified-gradient composite (AttnLRP, CP-LRP) each operation keeps its value and gets the gradient its
    rule prescribes. An explicit-pass composite (TRANSFORMER_ATTRIBUTION, LRP_BASELINE) is refused at once
    (:class:`~lrp_core.errors.RuleSetError`): its rules define no gradient.

    ``first`` records the first module of each operation kind the replay meets (input order): the
    first-layer rules of a composite, in this replay and in a later explicit pass (``Trace.first``).
    ``names``: the model's module → qualified name, for a composite that chooses rules by name.
    """

    serves = MODIFIED_GRADIENT

    def __init__(self, composite: Optional[Composite] = None, names: Optional[Mapping[nn.Module, str]] = None,
                 record: bool = True):
        self.first: Optional[dict] = {} if record else None
        self.composite = None
        if composite is not None:
            super().__init__(composite, names, self.first)

    def __call__(self, kind: str, fn: Callable[..., Tensor], *inputs: Tensor,
                 module: Optional[nn.Module] = None) -> Tensor:
        if self.composite is None:
            return fn(*inputs)
        return self.rule(kind, module).forward(fn, *inputs, module=module)

    def module(self, kind: str, module: nn.Module, x: Tensor) -> Tensor:
        """A submodule of the model; identities are skipped."""
        if isinstance(module, nn.Identity):
            return x
        if self.first is not None:
            self.first.setdefault(kind, module)
        return self(kind, module, x, module=module)


#: the plain replay of code that needs no record of the order (a module-level default: it keeps nothing)
PLAIN = Replay(record=False)


def _add(u: Tensor, v: Tensor) -> Tensor:
    return u + v


def _softmax(s: Tensor) -> Tensor:
    return s.softmax(dim=-1)


def _matmul(a: Tensor, b: Tensor) -> Tensor:
    return a @ b


def attention_forward(p: AttentionSpec, h: Tensor, bias: Optional[Tensor], r: Replay) -> AttentionRecord:
    """Multi-head self-attention on ``h`` (B, N, D), the attention computed explicitly."""
    B, N, _ = h.shape
    H, d = p.num_heads, p.head_dim
    if p.qkv is not None:
        lin = {"qkv": r.module(LINEAR, p.qkv, h)}  # (B, N, 3·H·d)
        q, k, v = lin["qkv"].reshape(B, N, 3, H, d).permute(2, 0, 3, 1, 4).unbind(0)
    else:
        lin = {n: r.module(LINEAR, m, h) for n, m in (("q", p.q), ("k", p.k), ("v", p.v))}
        q, k, v = (lin[n].reshape(B, N, H, d).transpose(1, 2) for n in "qkv")
    q, k = r.module(LAYERNORM, p.q_norm, q), r.module(LAYERNORM, p.k_norm, k)
    kT = k.transpose(-2, -1)
    if p.scale_queries_first:
        scores = r(MATMUL_QK, _matmul, q * p.scale, kT)
    else:
        scores = r(MATMUL_QK, _matmul, q, kT) * p.scale
    masked = scores if bias is None else r(MASK_ADD, _add, scores, bias)
    A = r(SOFTMAX, _softmax, masked)  # (B, H, N, N)
    ctx = r(MATMUL_AV, _matmul, A, v)  # (B, H, N, d)
    o = r.module(LAYERNORM, p.ctx_norm, ctx.transpose(1, 2).reshape(B, N, H * d))
    lin["proj"] = r.module(LINEAR, p.proj, o)
    return AttentionRecord(h=h, q=q, k=k, v=v, A=A, ctx=ctx, o=o, lin=lin,
                           scores=None if bias is None else scores, bias=bias)


def block_forward(p: BlockSpec, x: Tensor, bias: Optional[Tensor], r: Replay = PLAIN) -> BlockRecord:
    """One block on ``x`` (B, N, D); ``bias`` (B, 1, 1, N) is the additive padding mask or ``None``."""
    pre = p.layout == "pre_ln"
    att = attention_forward(p.attn, r.module(LAYERNORM, p.norm1, x) if pre else x, bias, r)
    a = r.module(SCALE, p.ls1, att.lin["proj"])
    mid = r(ADD, _add, x, a)
    if not pre:
        mid = r.module(LAYERNORM, p.norm1, mid)
    m = r.module(LAYERNORM, p.norm2, mid) if pre else mid
    lin = {"fc1": r.module(LINEAR, p.mlp.fc1, m)}
    g = r.module(LAYERNORM, p.mlp.mid_norm, r.module(ELEMENTWISE, p.mlp.act, lin["fc1"]))
    lin["fc2"] = r.module(LINEAR, p.mlp.fc2, g)
    f = r.module(SCALE, p.ls2, lin["fc2"])
    out = r(ADD, _add, mid, f)
    if not pre:
        out = r.module(LAYERNORM, p.norm2, out)
    return BlockRecord(x=x, attn=att, a=a, mid=mid, m=m, g=g, f=f, out=out, lin=lin)


# ----------------------------------------------------------------------------
# the relevance driver
# ----------------------------------------------------------------------------
def block_relprop(p: BlockSpec, rec: BlockRecord, R: Tensor, prop: Propagation,
                  deeper: bool = True) -> tuple[Optional[Tensor], Tensor]:
    """Relevance of the block output (B, N, D) -> (relevance of the block input or ``None``, R^A).

    ``deeper=False`` stops at the attention map: R^A is the halved relevance of
    A at the ``A·V`` product (docs/METHODS.md §1.9), and the input relevance is ``None``.
    """
    pre = p.layout == "pre_ln"
    if not pre:
        R = prop.unary(LAYERNORM, rec.out, R, p.norm2)
    # MLP branch | skip
    R_mid, R_f = prop(ADD, (rec.mid, rec.f), R)
    R_fc2 = prop.unary(SCALE, rec.lin["fc2"], R_f, p.ls2)
    R_g = prop.linear(p.mlp.fc2, rec.g, R_fc2, out=rec.lin["fc2"])
    R_g = prop.unary(ELEMENTWISE, rec.lin["fc1"], prop.unary(LAYERNORM, rec.g, R_g, p.mlp.mid_norm), p.mlp.act)
    R_m = prop.linear(p.mlp.fc1, rec.m, R_g, out=rec.lin["fc1"])
    if pre:
        R_m = prop.unary(LAYERNORM, rec.mid, R_m, p.norm2)
    R_mid = prop.clone(rec.mid, R_mid, R_m)
    if not pre:
        R_mid = prop.unary(LAYERNORM, rec.mid, R_mid, p.norm1)
    # attention branch | skip
    R_x, R_a = prop(ADD, (rec.x, rec.a), R_mid)
    R_proj = prop.unary(SCALE, rec.attn.lin["proj"], R_a, p.ls1)
    R_A, R_h = _attention_relprop(p.attn, rec.attn, R_proj, prop, deeper)
    if not deeper:
        return None, R_A
    if pre:
        R_h = prop.unary(LAYERNORM, rec.x, R_h, p.norm1)
    return prop.clone(rec.x, R_x, R_h), R_A


def _attention_relprop(p: AttentionSpec, rec: AttentionRecord, R: Tensor, prop: Propagation,
                       deeper: bool) -> tuple[Tensor, Optional[Tensor]]:
    """Relevance of the output projection's output -> (R^A, relevance of the attention input or ``None``)."""
    B, N, _ = R.shape
    H, d = p.num_heads, p.head_dim
    R_o = prop.linear(p.proj, rec.o, R, out=rec.lin["proj"])
    R_o = prop.unary(LAYERNORM, rec.o, R_o, p.ctx_norm).reshape(B, N, H, d).transpose(1, 2)
    R_A, R_v = prop(MATMUL_AV, (rec.A, rec.v), R_o, output=rec.ctx)
    if not deeper:
        return R_A, None
    (R_s,) = prop(SOFTMAX, (), R_A, output=rec.A)  # the pass keeps only the softmax's output
    if rec.bias is not None:  # keep the scores' share of the mask add
        R_s, _ = prop(MASK_ADD, (rec.scores, rec.bias.expand_as(rec.scores)), R_s)
    R_q, R_kT = prop(MATMUL_QK, (rec.q, rec.k.transpose(-2, -1)), R_s)
    R_q = prop.unary(LAYERNORM, rec.q, R_q, p.q_norm)
    R_k = prop.unary(LAYERNORM, rec.k, R_kT.transpose(-2, -1), p.k_norm)
    if p.qkv is not None:
        R_qkv = torch.stack([R_q, R_k, R_v], dim=2).transpose(1, 3).reshape(B, N, 3 * H * d)
        return R_A, prop.linear(p.qkv, rec.h, R_qkv, out=rec.lin["qkv"])
    flat = lambda t: t.transpose(1, 2).reshape(B, N, H * d)  # noqa: E731
    R_parts = [prop.linear(m, rec.h, flat(r), out=rec.lin[n])
               for n, m, r in (("q", p.q, R_q), ("k", p.k, R_k), ("v", p.v, R_v))]
    return R_A, prop.clone(rec.h, *R_parts)  # the three-way Clone


__all__ = ["AttentionSpec", "MlpSpec", "BlockSpec", "Replay", "PLAIN", "IDENTITY", "LAYOUTS",
           "attention_forward", "block_forward", "block_relprop"]

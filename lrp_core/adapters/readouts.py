"""Readouts: how a model turns its final hidden states into logits — a seam of its own (timm's ``pool → head``).

Every method reads its map through the readout: the layer-product methods
apply the readout's token weights to the rows of their aggregated matrix
(:meth:`Readout.row`; for [CLS] pooling this is row 0 — docs/METHODS.md §4), and
the relevance passes start from :meth:`Readout.relprop`.

Shapes: B batch, N tokens, D width, C classes.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import Tensor, nn

from ..composites import LAYERNORM, LINEAR, READOUT, Propagation
from .blocks import PLAIN, Replay
from .records import ReadoutRecord


@dataclass
class HeadLayer:
    """One layer of a classification head: an operation kind and the model's own module."""

    kind: str
    module: nn.Module


class Readout(ABC):
    """Final hidden states (B, N, D) -> logits (B, C)."""

    #: the head layers after pooling, in forward order (the last Linear gives the logits)
    head: Sequence[HeadLayer]
    norm: nn.Module

    @property
    def num_classes(self) -> int:
        """C, or 0 for a model without a classification head."""
        last = self.head[-1] if self.head else None
        return last.module.out_features if last is not None and last.kind == LINEAR else 0

    @property
    def tokens(self) -> tuple:
        """Token positions the classifier reads directly (``()`` where it reads a pooled average)."""
        return ()

    @abstractmethod
    def pool(self, normed: Tensor) -> Tensor:
        """(B, N, D) -> (B, D)."""

    @abstractmethod
    def weights(self, num_tokens: int, mask: Optional[Tensor] = None) -> Tensor:
        """The readout's token weights w (B or 1, N): the pooled token is ``Σ_i w_i h_i``."""

    def row(self, M: Tensor) -> Tensor:
        """The readout's row of a token-mixing matrix M (..., N, N): ``wᵀ M`` -> (..., N)."""
        w = self.weights(M.shape[-1]).to(M.dtype)
        shape = (w.shape[0],) + (1,) * (M.dim() - 3) + (1, w.shape[-1])
        return (w.reshape(shape) @ M).squeeze(-2)

    # ------------------------------------------------------------------ replay
    def forward(self, hidden: Tensor, r: Replay = PLAIN) -> ReadoutRecord:
        normed = r.module(LAYERNORM, self.norm, hidden)
        token = self.pool(normed)
        h, inputs = token, []
        for layer in self.head:
            inputs.append(h)
            h = r.module(layer.kind, layer.module, h)
        last_linear = bool(self.head) and self.head[-1].kind == LINEAR
        pooled = inputs[-1] if last_linear else h
        return ReadoutRecord(hidden=hidden, normed=normed, token=token, inputs=inputs, pooled=pooled, logits=h)

    # --------------------------------------------------------------- relevance
    def relprop(self, rec: ReadoutRecord, R_out: Tensor, prop: Propagation) -> Tensor:
        """Relevance of the logits (B, C) -> relevance of the final hidden states (B, N, D)."""
        R = R_out
        for layer, x in zip(reversed(self.head), reversed(rec.inputs)):
            if isinstance(layer.module, nn.Identity):
                continue
            R = prop.unary(layer.kind, x, R, layer.module)  # Linears: the rule forms z from two products
        R_hidden = self.unpool(rec, R, prop)
        return prop.unary(LAYERNORM, rec.hidden, R_hidden, self.norm)

    @abstractmethod
    def unpool(self, rec: ReadoutRecord, R_token: Tensor, prop: Propagation) -> Tensor:
        """Relevance of the pooled token (B, D) -> (B, N, D)."""


class TokenReadout(Readout):
    """The classifier reads one token ([CLS] pooling): ``head(norm(h)[:, index])``."""

    def __init__(self, norm: nn.Module, head: Sequence[HeadLayer], index: int = 0):
        self.norm, self.head, self.index = norm, [l for l in head if not isinstance(l.module, nn.Identity)], index

    @property
    def tokens(self) -> tuple:
        return (self.index,)

    def pool(self, normed: Tensor) -> Tensor:
        return normed[:, self.index]

    def weights(self, num_tokens: int, mask: Optional[Tensor] = None) -> Tensor:
        w = torch.zeros(1, num_tokens)
        w[0, self.index] = 1.0
        return w

    def row(self, M: Tensor) -> Tensor:
        return M[..., self.index, :]  # = wᵀM, without the round-off of a product

    def unpool(self, rec: ReadoutRecord, R_token: Tensor, prop: Propagation) -> Tensor:
        B, N, D = rec.normed.shape
        R = torch.zeros(B, N, D, dtype=R_token.dtype, device=R_token.device)
        (R[:, self.index],) = prop(READOUT, (rec.token,), R_token)
        return R


__all__ = ["HeadLayer", "Readout", "TokenReadout"]

"""Readouts: how a model turns its final hidden states into logits — a seam of its own (timm's ``pool → head``).

Every method reads its map through the readout: the layer-product methods
apply the readout's token weights to the rows of their aggregated matrix
(:meth:`Readout.row`; for [CLS] pooling this is row 0 — docs/METHODS.md §4); the relevance
passes start at the logits the readout's replay (:meth:`Readout.forward`) gives.

Shapes: B batch, N tokens, D width, C classes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import Tensor, nn

from ..rules.ops import ADD, LINEAR, POOL, READOUT
from ..rules.views import check_output
from .kernels import SoftCap, plus
from .parts import ModelPart
from .records import ReadoutRecord
from .replay import NO_RECORD, Replay


@dataclass
class HeadLayer:
    """One layer of a classification head: an operation kind and the model's own module."""

    kind: str
    module: ModelPart  # the model's head Linear or norm (read by name), or a SoftCap of the logits


class Readout(ABC):
    """Final hidden states (B, N, D) -> logits (B, C)."""

    #: the head layers after pooling, in forward order (the last Linear gives the logits)
    head_layers: Sequence[HeadLayer]
    norm: nn.Module
    #: the head ends in the model's embedding (a projection such as CLIP's ``visual_projection``), not in
    #: classes: ``num_classes`` is 0 and a ``Projection`` / ``Similarity`` target reads its output
    embedding: bool = False

    @property
    def _logit_layers(self) -> Sequence[HeadLayer]:
        """The head without a trailing soft-cap of the logits (Gemma 2: it keeps C, the last Linear's width)."""
        head = list(self.head_layers)
        while head and isinstance(head[-1].module, SoftCap):
            head.pop()
        return head

    @property
    def num_classes(self) -> int:
        """C, or 0 for a model without a classification head."""
        if self.embedding:
            return 0
        head = self._logit_layers
        last = head[-1] if head else None
        return last.module.out_features if last is not None and last.kind == LINEAR else 0

    @property
    def tokens(self) -> tuple:
        """Token positions the classifier reads directly in every row (``()`` where it reads a pooled average,
        or a position that differs by row: :attr:`positions`)."""
        return ()

    @property
    def positions(self) -> Optional[Tensor]:
        """(B,) the one token each row is read at, where it differs by row (:class:`PositionReadout`); else ``None``."""
        return None

    def after_removal(self, rows: Tensor, removed: Tensor) -> "Readout":
        """The readout of the sequences ``rows`` (K,) of this batch, each with the token at ``removed`` (K,) taken
        out (token ablation). Default: ``self`` — a readout whose token weights do not depend on the row."""
        return self

    @abstractmethod
    def pool(self, normed: Tensor) -> Tensor:
        """(B, N, D) -> (B, D)."""

    def pool_replay(self, normed: Tensor, r: Replay) -> Tensor:
        """:meth:`pool` in the replay: the selected token (B, D) as a READOUT operation of its own (a pooled
        average: the POOL operation on the pooled tokens and their weights)."""
        return r(READOUT, _selected, self.pool(normed))

    @abstractmethod
    def weights(self, num_tokens: int) -> Tensor:
        """The readout's token weights w (B or 1, N): the pooled token is ``Σ_i w_i h_i``."""

    def row(self, M: Tensor) -> Tensor:
        """The readout's row of a token-mixing matrix M (..., N, N): ``wᵀ M`` -> (..., N)."""
        w = self.weights(M.shape[-1]).to(device=M.device, dtype=M.dtype)
        shape = (w.shape[0],) + (1,) * (M.dim() - 3) + (1, w.shape[-1])
        return (w.reshape(shape) @ M).squeeze(-2)

    # ------------------------------------------------------------------ replay
    def forward(self, hidden: Tensor, r: Replay = NO_RECORD) -> ReadoutRecord:
        normed = r.norm(self.norm, hidden)
        token = self.pool_replay(normed, r)
        h, inputs = token, []
        for layer in self.head_layers:
            inputs.append(h)
            h = head_layer(layer, h, r)
        logit_layers = len(self._logit_layers)
        last_linear = bool(logit_layers) and self.head_layers[logit_layers - 1].kind == LINEAR
        pooled = inputs[logit_layers - 1] if last_linear else h
        return ReadoutRecord(hidden=hidden, token=token, inputs=inputs, pooled=pooled, logits=h)


def _selected(t: Tensor) -> Tensor:
    """The selected token itself (the READOUT operation: its rule is the selection's)."""
    return t


def _mean(x: Tensor, w: Tensor) -> Tensor:
    """(B, n, D), weights (1, n) -> (B, D) the mean over n (the POOL operation; ``w`` is its rule's)."""
    return x.mean(dim=1)


def head_layer(layer: HeadLayer, h: Tensor, r: Replay) -> Tensor:
    """One head layer in the replay. Its explicit rule is handed no output (a Linear's rule forms z from two
    products), so a Linear's view is checked on the output here."""
    if r.placement is not None:  # a model split over devices: the layer's input where it computes
        h = r.placement.move(h, r.placement.module_device(layer.module))
    out = r.module(layer.kind, layer.module, h, reuse=False)
    if r.explicit and layer.kind == LINEAR and not isinstance(layer.module, nn.Identity):
        check_output(layer.module, h, out)
    return out


class PooledReadout(Readout):
    """A readout with one pooled token: ``head_layers(pool(norm(h)))``."""


def _kept(head_layers: Sequence[HeadLayer]) -> list:
    """The head layers without identities (a model without a head, or a removed one)."""
    return [h for h in head_layers if not isinstance(h.module, nn.Identity)]


class TokenReadout(PooledReadout):
    """The classifier reads one token ([CLS] pooling): ``head(norm(h)[:, index])``."""

    def __init__(self, norm: nn.Module, head_layers: Sequence[HeadLayer], index: int = 0):
        self.norm, self.head_layers, self.index = norm, _kept(head_layers), index

    @property
    def tokens(self) -> tuple:
        return (self.index,)

    def pool(self, normed: Tensor) -> Tensor:
        return normed[:, self.index]

    def weights(self, num_tokens: int) -> Tensor:
        w = torch.zeros(1, num_tokens)
        w[0, self.index] = 1.0
        return w

    def row(self, M: Tensor) -> Tensor:
        return M[..., self.index, :]  # = wᵀM, without the round-off of a product


class PositionReadout(PooledReadout):
    """The classifier reads one token per row, at a position that differs by row: ``head(norm(h)[b, p_b])``.

    A decoder's last real token (padding on either side), CLIP's end-of-text token of each prompt.
    ``positions`` (B,) long. The token weights are one-hot per row, (B, N); the selection is the
    READOUT operation of the composite, as for :class:`TokenReadout`.
    """

    def __init__(self, norm: nn.Module, head_layers: Sequence[HeadLayer], positions: Tensor):
        self.norm, self.head_layers = norm, _kept(head_layers)
        self._positions = positions.long()

    @property
    def positions(self) -> Tensor:
        return self._positions

    def _rows(self, like: Tensor) -> tuple[Tensor, Tensor]:
        """(arange(B), positions) on ``like``'s device: the advanced index of each row's token."""
        p = self._positions.to(like.device)
        return torch.arange(p.shape[0], device=like.device), p

    def pool(self, normed: Tensor) -> Tensor:
        return normed[self._rows(normed)]

    def weights(self, num_tokens: int) -> Tensor:
        p = self._positions.cpu()
        w = torch.zeros(p.shape[0], num_tokens)
        w[torch.arange(p.shape[0]), p] = 1.0
        return w

    def row(self, M: Tensor) -> Tensor:
        """Row p_b of each sample's M (B, ..., N, N) -> (B, ..., N): ``wᵀM`` without the round-off of a product."""
        b, p = self._rows(M)
        return M[b, ..., p, :]  # the advanced indices are split by the ellipsis: their axis B comes first

    def after_removal(self, rows: Tensor, removed: Tensor) -> "PositionReadout":
        """Each row's token moves one place to the left where a token before it was removed."""
        p = self._positions.to(rows.device)[rows]
        return PositionReadout(self.norm, self.head_layers, p - (removed.to(p.device) < p).long())


def _range_weights(num_tokens: int, start: int) -> Tensor:
    """(1, N) float64: 1/P on the P tokens from ``start`` on, 0 before (exact in float64, rounded once on use)."""
    w = torch.zeros(1, num_tokens, dtype=torch.float64)
    w[0, start:] = 1.0 / (num_tokens - start)
    return w


class MeanReadout(PooledReadout):
    """The classifier reads the average of the tokens from ``start`` on: ``head(mean_{i ≥ start} norm(h)_i)``.

    timm ``global_pool='avg'`` (``start`` = the number of prefix tokens, or 0 with ``class_token=False``),
    with ``fc_norm`` as the first head layer; HF BEiT-style mean pooling.
    """

    def __init__(self, norm: nn.Module, head_layers: Sequence[HeadLayer], start: int = 0):
        self.norm, self.head_layers, self.start = norm, _kept(head_layers), start

    def pool(self, normed: Tensor) -> Tensor:
        return normed[:, self.start :].mean(dim=1)

    def pool_replay(self, normed: Tensor, r: Replay) -> Tensor:
        w = self.weights(normed.shape[1])[:, self.start :].to(normed.device)
        return r(POOL, _mean, normed[:, self.start :], w)

    def weights(self, num_tokens: int) -> Tensor:
        return _range_weights(num_tokens, self.start)

    def row(self, M: Tensor) -> Tensor:
        return M[..., self.start :, :].mean(dim=-2)  # = wᵀM


class MaskedMeanReadout(PooledReadout):
    """The classifier reads the average of each row's real tokens: ``head(Σ_i m_i norm(h)_i / Σ_i m_i)``.

    ``mask`` (B, N) 1 = real token: mean pooling over the attention mask (HF ``ModernBertForSequenceClassification``
    with ``classifier_pooling="mean"``), in the model's arithmetic (masked sum, then one division by the count).
    The token weights ``m_i / Σ m`` differ by row; the pooling is the POOL operation (docs/METHODS.md §4.4).
    """

    def __init__(self, norm: nn.Module, head_layers: Sequence[HeadLayer], mask: Tensor):
        self.norm, self.head_layers = norm, _kept(head_layers)
        self.mask = mask.long()

    def pool(self, normed: Tensor) -> Tensor:
        m = self.mask.to(normed.device)
        return (normed * m[..., None]).sum(dim=1) / m.sum(dim=1, keepdim=True)

    def pool_replay(self, normed: Tensor, r: Replay) -> Tensor:
        w = self.weights(normed.shape[1]).to(normed.device)
        return r(POOL, lambda x, w: self.pool(x), normed, w)

    def weights(self, num_tokens: int) -> Tensor:
        """(B, N) float64: ``1/P_b`` on each of row b's ``P_b`` real tokens, 0 on padding."""
        m = self.mask.cpu().to(torch.float64)
        return m / m.sum(dim=1, keepdim=True)

    def row(self, M: Tensor) -> Tensor:
        """The mean of each sample's real rows of M (B, ..., N, N) -> (B, ..., N) (= wᵀM), on M's device."""
        m = self.mask.to(device=M.device, dtype=M.dtype)
        m = m.reshape((m.shape[0],) + (1,) * (M.dim() - 3) + (m.shape[1], 1))
        return (M * m).sum(dim=-2) / m.sum(dim=-2)

    def after_removal(self, rows: Tensor, removed: Tensor) -> "MaskedMeanReadout":
        """The average of the rows ``rows`` (K,) without their token ``removed`` (K,): the mask loses that column."""
        m = self.mask.to(rows.device)[rows]
        keep = torch.arange(m.shape[1] - 1, device=rows.device)
        idx = keep[None, :] + (keep[None, :] >= removed.to(rows.device)[:, None]).long()
        return MaskedMeanReadout(self.norm, self.head_layers, m.gather(1, idx))


class ClsMeanReadout(PooledReadout):
    """``head(concat(norm(h)_0, mean_{i ≥ start} norm(h)_i))`` — HF ``Dinov2ForImageClassification``.

    The Linear reads two D-vectors; each counts half in the token weights (docs/METHODS.md §4.2):
    ``w = ½ e_0 + ½ · (1/P on the patch tokens)``.
    """

    def __init__(self, norm: nn.Module, head_layers: Sequence[HeadLayer], start: int = 1):
        self.norm, self.head_layers, self.start = norm, _kept(head_layers), start

    @property
    def tokens(self) -> tuple:
        return (0,)

    def pool(self, normed: Tensor) -> Tensor:
        """(B, N, D) -> (B, 2D)."""
        return torch.cat([normed[:, 0], normed[:, self.start :].mean(dim=1)], dim=-1)

    def pool_replay(self, normed: Tensor, r: Replay) -> Tensor:
        """The [CLS] selection (READOUT) and the mean (POOL), side by side."""
        w = _range_weights(normed.shape[1], self.start)[:, self.start :]
        cls = r(READOUT, _selected, normed[:, 0])
        return torch.cat([cls, r(POOL, _mean, normed[:, self.start :], w)], dim=-1)

    def weights(self, num_tokens: int) -> Tensor:
        w = 0.5 * _range_weights(num_tokens, self.start)
        w[0, 0] = 0.5
        return w

    def row(self, M: Tensor) -> Tensor:
        return 0.5 * (M[..., 0, :] + M[..., self.start :, :].mean(dim=-2))


def _half(t: Tensor) -> Tensor:
    return t / 2


class TwoHeadReadout(Readout):
    """Two tokens, each read by its own head; the logits are the heads' mean (distilled DeiT at inference).

    timm ``VisionTransformerDistilled`` (``head`` on [CLS], ``head_dist`` on the distillation token) and HF
    ``DeiTForImageClassificationWithTeacher``. Token weights ``½ (e_cls + e_dist)``; the pooled embedding
    (concept targets) is timm's ``pre_logits``, ``(t_cls + t_dist) / 2``.
    """

    def __init__(self, norm: nn.Module, head: nn.Module, head_dist: nn.Module, indices: tuple = (0, 1)):
        self.norm, self.indices = norm, tuple(indices)
        self.heads = (head, head_dist)
        self.head_layers = [HeadLayer(LINEAR, head)] if not isinstance(head, nn.Identity) else []

    @property
    def tokens(self) -> tuple:
        return self.indices

    def pool(self, normed: Tensor) -> Tensor:
        i, j = self.indices
        return (normed[:, i] + normed[:, j]) / 2

    def weights(self, num_tokens: int) -> Tensor:
        w = torch.zeros(1, num_tokens, dtype=torch.float64)
        w[0, list(self.indices)] = 0.5
        return w

    def row(self, M: Tensor) -> Tensor:
        i, j = self.indices
        return (M[..., i, :] + M[..., j, :]) / 2

    def forward(self, hidden: Tensor, r: Replay = NO_RECORD) -> ReadoutRecord:
        normed = r.norm(self.norm, hidden)
        tokens = [r(READOUT, _selected, normed[:, k]) for k in self.indices]
        outs = tuple(r.module(LINEAR, head, t) for head, t in zip(self.heads, tokens))
        halves = tuple(r.transparent(_half, o) for o in outs)  # a constant scale: relevance passes unchanged
        logits = r(ADD, plus, *halves)  # = (u + v) / 2 exactly (halving is exact in floating point)
        pooled = self.pool(normed)
        return ReadoutRecord(hidden=hidden, token=pooled, inputs=tokens, pooled=pooled, logits=logits)


__all__ = [
    "HeadLayer",
    "Readout",
    "PooledReadout",
    "TokenReadout",
    "PositionReadout",
    "MeanReadout",
    "MaskedMeanReadout",
    "ClsMeanReadout",
    "TwoHeadReadout",
    "head_layer",
]

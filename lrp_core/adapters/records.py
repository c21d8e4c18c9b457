"""Typed records of one replayed forward pass, and the token layout of an input batch.

Shapes: B batch, N tokens, D width, H heads, d head width, C classes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

import torch
from torch import Tensor

if TYPE_CHECKING:
    from .readouts import Readout
    from .replay import Replay


@dataclass
class AttentionRecord:
    """One self-attention, forward quantities the rules need.

    Attributes:
        h: (B, N, D) the attention's input (pre-LN: after ``norm1``; post-LN: the block input).
        q, k, v: (B, H, N, d) queries (unscaled), keys, values — after ``q_norm``/``k_norm``.
        A: (B, H, N, N) attention after softmax.
        ctx: (B, H, N, d) ``A @ v``.
        o: (B, N, H·d) the heads concatenated (after any context norm), input of the output projection.
        lin: outputs of the attention's Linears by role: ``"qkv"`` or ``"q"``, ``"k"``, ``"v"``; ``"proj"``.
        bias: (B, 1, 1, N) the additive padding mask, (B, 1, N, N) a causal one, or ``None``.
        rope: the rotation tables (cos, sin), each (B, N, r) — (B, N − skipped prefix tokens, d) for a vision
            model whose prefix tokens are not rotated (``AttentionSpec.rope_skip``) —, or ``None``.
        A is ``None`` where the attention ran fused (sdpa under a modified-gradient rule set).
    """

    h: Tensor
    q: Tensor
    k: Tensor
    v: Tensor
    A: Optional[Tensor]
    ctx: Tensor
    o: Tensor
    lin: dict
    bias: Optional[Tensor] = None
    rope: Optional[tuple] = None


@dataclass
class BlockRecord:
    """One Transformer block, pre-LN or post-LN, in one vocabulary.

    Attributes:
        x: (B, N, D) block input.
        attn: the attention record.
        a: (B, N, D) attention branch output as it enters the residual Add (after LayerScale).
        mid: (B, N, D) the residual stream between attention and MLP (pre-LN: ``x + a``;
            post-LN: ``norm1(x + a)``).
        m: (B, N, D) the MLP's input (pre-LN: ``norm2(mid)``; post-LN: ``mid``).
        g: (B, N, D_mlp) the MLP's hidden units after the activation (and its norm, if any).
        f: (B, N, D) MLP branch output as it enters the residual Add.
        out: (B, N, D) block output.
        lin: outputs of the MLP's Linears: ``"fc1"``, ``"fc2"`` (gated MLPs: ``"fc1"`` is the up projection,
            or the fused gate-up one, and ``"gate"`` the gate projection where it is separate).
        gate: gated MLPs: (B, N, D_mlp) ``act(gate(m))``, the first operand of the product ``g``.
        up: gated MLPs: (B, N, D_mlp) ``up(m)``, the second operand.
        moe: a mixture-of-experts MLP's record (then ``g`` is its output (B, N, D), ``lin`` empty).
        cross: an encoder-decoder's cross-attention record (queries from the stream, keys and values from the
            encoder's output), between the self-attention and the MLP; else ``None``.
    """

    x: Tensor
    attn: AttentionRecord
    a: Tensor
    mid: Tensor
    m: Tensor
    g: Tensor
    f: Tensor
    out: Tensor
    lin: dict
    gate: Optional[Tensor] = None
    up: Optional[Tensor] = None
    moe: Optional[MoeRecord] = None
    cross: Optional[AttentionRecord] = None


@dataclass
class MlpRecord:
    """One gated MLP run on some tokens (an expert of a mixture-of-experts layer): the fields of
    :class:`BlockRecord` its relevance rules read.

    Attributes:
        m: (P, D) its input (the tokens routed to it).
        lin: its Linears' outputs: ``"fc1"`` (gate and up fused, or up), ``"gate"`` where separate, ``"fc2"``.
        g: (P, F) ``act(gate) ⊙ up``; gate, up: (P, F) the product's operands.
    """

    m: Tensor
    lin: dict
    g: Tensor
    gate: Optional[Tensor] = None
    up: Optional[Tensor] = None


@dataclass
class ExpertRun:
    """One expert on the tokens routed to it.

    Attributes:
        expert: the expert's index e.
        tokens: (P,) long, the tokens (rows of the flattened (T, D) input) routed to e.
        slots: (P,) long, where e stands in each token's top-k (column of the routing weights).
        mlp: the expert's record on those tokens.
        weight: (P, 1) the routing weights w_e of those tokens.
        out: (P, D) ``w_e ⊙ expert_e(x)``, the summand.
    """

    expert: int
    tokens: Tensor
    slots: Tensor
    mlp: MlpRecord
    weight: Tensor
    out: Tensor


@dataclass
class MoeRecord:
    """One mixture-of-experts MLP (docs/METHODS.md §2c.4), tokens flattened (T = B·N).

    Attributes:
        x: (T, D) its input.
        logits: (T, E) the router's logits.
        chosen: (T, k) long, each token's chosen experts (top-k of the softmax).
        weights: (T, k) their routing weights (renormalised where the model does).
        runs: one :class:`ExpertRun` per expert that received a token, in expert order.
        shared: the shared expert's record on every token, or ``None``.
        shared_logit, shared_weight, shared_out: (T, 1), (T, 1), (T, D): its gate's logit, ``sigmoid`` of it,
            and the summand ``shared_weight ⊙ shared expert(x)``.
        parts: (P, D) the summands of every token, the runs' then the shared expert's; ``tokens`` (P,) theirs.
        out: (T, D) their sum per token, the MLP's output.
    """

    x: Tensor
    logits: Tensor
    chosen: Tensor
    weights: Tensor
    runs: list
    parts: Tensor
    tokens: Tensor
    out: Tensor
    shared: Optional[MlpRecord] = None
    shared_logit: Optional[Tensor] = None
    shared_weight: Optional[Tensor] = None
    shared_out: Optional[Tensor] = None


@dataclass
class ReadoutRecord:
    """The readout: the final hidden states to the logits.

    Attributes:
        hidden: (B, N, D) the last block's output.
        token: (B, D) what the head reads: the selected token, or the pooled tokens.
        inputs: the input of each head layer, in order.
        pooled: (B, D') the embedding the classifier reads (input of the last Linear), the
            "final embedding" of concept targets.
        logits: (B, C), or ``pooled`` for a model without a head.
    """

    hidden: Tensor
    token: Tensor
    inputs: list
    pooled: Tensor
    logits: Tensor


@dataclass
class EmbeddingRecord:
    """The input layer: what input-space relevance needs.

    Attributes:
        x0: (B, N, D) input of block 0.
        embeds: (B, P, D) ViT: the patch embedding's output (before the prefix tokens and the
            position embedding); text: the word embeddings (before position and token-type
            embeddings). Gradient × input here gives token relevance (AttnLRP, CP-LRP).
        tokens: (B, N, D) ViT: prefix tokens and patches before the position embedding.
        x_pos: (B, N, D) ViT: ``tokens`` + position embedding (``tokens`` itself where the model adds none).
        images: (B, 3, H, W) ViT: the pixels.
        patches: (B, P, D) ViT: the patch convolution's output as tokens, before the patch embedding's
            norm (timm; ``embeds`` itself where there is none).
    """

    x0: Tensor
    embeds: Optional[Tensor] = None
    tokens: Optional[Tensor] = None
    x_pos: Optional[Tensor] = None
    images: Optional[Tensor] = None
    patches: Optional[Tensor] = None


@dataclass
class Trace:
    """Everything one replayed forward pass recorded.

    ``readout`` is the :class:`~lrp_core.adapters.readouts.Readout` the pass was read out with (per batch:
    :meth:`Adapter.readout_for`); the relevance pass and the methods read the readout from here, so a
    batch is explained with the readout it was run with. ``readout_record`` is what that readout recorded.
    """

    x0: Tensor
    blocks: list = field(default_factory=list)  # BlockRecord per block
    readout_record: Optional[ReadoutRecord] = None
    mask: Optional[Tensor] = None  # (B, N) 1 = real token; None for images
    embedding: Optional[EmbeddingRecord] = None
    readout: Optional["Readout"] = None
    #: the replay that ran the pass (its composite, and the first module of each kind in input order)
    replay: Optional["Replay"] = None
    positions: Optional[Tensor] = None  # (B, N) position ids (decoders), else None

    @property
    def first(self) -> Optional[dict]:
        """Operation kind → the first module of that kind the replay met (input order); ``None``: no record."""
        return None if self.replay is None else self.replay.first

    def attention(self, b: int) -> Tensor:
        """A_b (B, H, N, N)."""
        return self.blocks[b].attn.A

    @property
    def logits(self) -> Tensor:
        assert self.readout_record is not None, "run_blocks records the readout"
        return self.readout_record.logits

    @property
    def pooled(self) -> Tensor:
        assert self.readout_record is not None, "run_blocks records the readout"
        return self.readout_record.pooled


@dataclass
class BlockRelevance:
    """Result of an explicit relevance pass.

    Attributes:
        attn: per block R^{A_b} (B, H, N, N); ``None`` below the block where the pass stopped.
        tokens: (B, L, N) relevance of each token in the residual stream leaving block b
            (summed over channels; zeros below the stop block).
        inputs: (B, N) relevance of the block-0 input tokens (summed over channels), where the
            pass went below block 0's attention.
        scores: (B, T) input-space token relevance (``to_input=True``): ViT patch sums of the
            pixel relevance, text the embedding output's relevance (padding 0).
        pixels: (B, H, W) pixel relevance (images, ``to_input=True``).
    """

    attn: list
    tokens: Tensor
    inputs: Optional[Tensor] = None
    scores: Optional[Tensor] = None
    pixels: Optional[Tensor] = None


@dataclass
class TokenLayout:
    """How a batch's tokens are laid out, and which of them a method scores.

    Attributes:
        modality: ``"image"`` or ``"text"``.
        num_tokens: N.
        output_start: first token that gets a score (ViT: after the prefix tokens; text: 0).
        readout_tokens: the tokens the classifier reads directly in every row (``(0,)`` for [CLS]
            pooling, ``()`` for average pooling or a position that differs by row).
        readout_rows: (B,) the token each row is read at where it differs by row (``Readout.positions``:
            a decoder's last real token, CLIP's end-of-text token), else ``None``.
        grid: (h, w) patch grid (images).
        image_size: (H, W) (images).
        mask: (B, N) 1 = real token (text), else ``None``.
        image_tokens: (B, k·h·w) long, a vision-language model's k images per row: for each patch in raster order,
            image after image, the position of the token that carries it in the sequence; else ``None``.
        registers: the positions of a ViT's register tokens in block 0's input (prefix tokens, not scored: their
            relevance is ``Explanation.registers``); ``()`` without registers.
        source_tokens: an encoder-decoder's S (its source tokens come first, its prefix's after); else ``None``.
    """

    modality: str
    num_tokens: int
    output_start: int
    readout_tokens: tuple
    grid: Optional[tuple] = None
    image_size: Optional[tuple] = None
    mask: Optional[Tensor] = None
    readout_rows: Optional[Tensor] = None
    #: whether :meth:`readout_minimum` replaces the read tokens' entries (encoders: Chefer et al.'s [CLS] quirk;
    #: decoders: no — docs/METHODS.md §2c)
    readout_minimum_applies: bool = True
    image_tokens: Optional[Tensor] = None
    registers: tuple = ()
    #: an encoder-decoder's source tokens S: the first S of the N tokens (the prefix's follow); else ``None``
    source_tokens: Optional[int] = None

    def scores(self, row: Tensor) -> Tensor:
        """Token scores from a (B, N) row: the scored tokens, padding set to 0."""
        row = row[:, self.output_start :]
        return row if self.mask is None else row * self.mask[:, self.output_start :].to(row.device, row.dtype)

    def ablatable(self) -> Tensor:
        """Positions a token-ablation may remove in every row: every scored token not in ``readout_tokens``."""
        return torch.tensor(
            [i for i in range(self.output_start, self.num_tokens) if i not in self.readout_tokens], dtype=torch.long
        )

    def ablation_pairs(self, batch: int, device: torch.device) -> Tensor:
        """(K, 2) the (sample, token) pairs a token ablation removes, sample-major: every real scored token
        but those the classifier reads itself (``readout_tokens``, and each row's ``readout_rows``)."""
        pairs = torch.cartesian_prod(torch.arange(batch, device=device), self.ablatable().to(device))
        if self.mask is not None:
            pairs = pairs[self.mask.to(device)[pairs[:, 0], pairs[:, 1]].bool()]
        if self.readout_rows is not None:
            pairs = pairs[pairs[:, 1] != self.readout_rows.to(device)[pairs[:, 0]]]
        return pairs

    def readout_minimum(self, scores: Tensor) -> Tensor:
        """Scored readout tokens' entries replaced by the row minimum over real tokens (BERT reference quirk).

        The readout token's own entry of ``Π(I + Ā)`` is dominated by the identity; Chefer et al.'s
        text code replaces it by the smallest score. A readout that is not scored (ViT [CLS]) changes
        nothing.
        """
        positions = [t - self.output_start for t in self.readout_tokens if t >= self.output_start]
        if not self.readout_minimum_applies or (not positions and self.readout_rows is None):
            return scores
        mask = (
            torch.ones_like(scores, dtype=torch.bool)
            if self.mask is None
            else self.mask[:, self.output_start :].to(scores.device).bool()
        )
        big = torch.finfo(scores.dtype).max
        row_min = torch.where(mask, scores, torch.full_like(scores, big)).min(dim=1).values
        scores = scores.clone()
        for p in positions:
            scores[:, p] = row_min
        if self.readout_rows is not None:  # one readout token per row (read at or after output_start)
            rows = torch.arange(scores.shape[0], device=scores.device)
            scores[rows, self.readout_rows.to(scores.device) - self.output_start] = row_min
        return scores * mask.to(scores.dtype)


__all__ = [
    "AttentionRecord",
    "BlockRecord",
    "MlpRecord",
    "ExpertRun",
    "MoeRecord",
    "ReadoutRecord",
    "EmbeddingRecord",
    "Trace",
    "BlockRelevance",
    "TokenLayout",
]

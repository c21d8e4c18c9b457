"""What every model adapter provides to the explanation methods."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from torch import Tensor, nn


@dataclass
class Trace:
    """Everything one replayed forward pass recorded.

    Attributes:
        x0: (B, N, D) input of block 0.
        acts: per block, the activations the rules need; ``acts[b]["A"]`` is the
            attention after softmax (B, H, N, N).
        pooled: (B, D) the final [CLS] embedding that enters the classifier.
        logits: (B, C) (or ``pooled`` when the model has no head).
        tokens, x_pos: ViT only, the tokens before / after the position embedding.
        mask: BERT only, (B, N) attention mask (1 = real token).
    """

    x0: Tensor
    acts: list = field(default_factory=list)
    pooled: Optional[Tensor] = None
    logits: Optional[Tensor] = None
    tokens: Optional[Tensor] = None
    x_pos: Optional[Tensor] = None
    mask: Optional[Tensor] = None
    cls_token: Optional[Tensor] = None  # (B, D) the selected token before fc_norm (ViT)

    def attention(self, b: int) -> Tensor:
        return self.acts[b]["A"]


@dataclass
class BlockRelevance:
    """Result of a relevance pass.

    Attributes:
        attn: per block, R^{A_b} (B, H, N, N) — ``None`` below the block where the pass stopped.
        tokens: (B, L, N) relevance of each token in the residual stream leaving block b
            (summed over channels; zeros below the stop block).
        pixels: (B, H, W) pixel relevance (ViT, ``to_pixels=True`` only).
        inputs: (B, N) relevance of the block-0 input tokens (summed over channels), where the
            pass went below block 0's attention (``stop_block=0`` with ``deeper`` propagation).
    """

    attn: list
    tokens: Tensor
    pixels: Optional[Tensor] = None
    inputs: Optional[Tensor] = None


class Adapter:
    """Interface of a model family. See ``vit.py`` and ``bert.py``."""

    family: str = ""
    model: nn.Module

    num_blocks: int
    num_heads: int
    num_classes: int

    def check_inputs(self, inputs) -> dict:  # pragma: no cover - interface
        raise NotImplementedError

    def forward(self, prepared: dict, *, grad: bool = False) -> Trace:  # pragma: no cover
        raise NotImplementedError

    def run_blocks(self, x0: Tensor, mask: Optional[Tensor] = None) -> Trace:  # pragma: no cover
        raise NotImplementedError

    def relprop(self, trace: Trace, R_out: Tensor, composite, stop_block: int = 0,
                to_pixels: bool = False, prepared: Optional[dict] = None) -> BlockRelevance:  # pragma: no cover
        raise NotImplementedError

    def cdam_tokens(self, trace: Trace) -> Tensor:  # pragma: no cover
        raise NotImplementedError

    def output_slice(self) -> slice:  # pragma: no cover
        raise NotImplementedError

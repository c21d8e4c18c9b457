"""Mixtral decoders: ``MixtralForCausalLM`` and ``MixtralForSequenceClassification``.

Mistral's attention (one sliding window for every layer where ``config.sliding_window`` is set) and a
mixture-of-experts MLP in every layer (docs/METHODS.md §2c.4): softmax over the router's logits, the top
``num_experts_per_tok``, always renormalised to sum 1. The router's jitter noise acts in training mode only
(the replay is inference).
"""

from __future__ import annotations

from torch import nn

from .blocks import AttentionSpec
from .moe import MoeDecoderAdapter


class MixtralAdapter(MoeDecoderAdapter):
    """Hugging Face Mixtral decoders (eager or sdpa attention)."""

    family = "Mixtral"
    normalise = True

    def _attention(self, att: nn.Module, **extra) -> AttentionSpec:
        window = getattr(self.config, "sliding_window", None)
        return super()._attention(att, window=int(window) if window else None, **extra)


__all__ = ["MixtralAdapter"]

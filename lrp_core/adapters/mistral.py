"""Mistral decoders: ``MistralForCausalLM`` and ``MistralForSequenceClassification``.

Llama's layout; every layer attends within ``config.sliding_window`` positions when it is set.
"""

from __future__ import annotations

from torch import nn

from .blocks import AttentionSpec
from .decoder import DecoderAdapter


class MistralAdapter(DecoderAdapter):
    """Hugging Face Mistral decoders (sliding-window attention on every layer, if configured)."""

    def _attention(self, att: nn.Module, **extra) -> AttentionSpec:
        window = getattr(self.config, "sliding_window", None)
        return super()._attention(att, window=int(window) if window else None, **extra)


__all__ = ["MistralAdapter"]

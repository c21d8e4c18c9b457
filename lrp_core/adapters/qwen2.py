"""Qwen2 / Qwen2.5 decoders: ``Qwen2ForCausalLM`` and ``Qwen2ForSequenceClassification``.

Llama's layout with biases on the q, k, v projections (ordinary Linear biases to every rule) and, where the
config enables it, sliding-window attention on the layers ``config.layer_types`` marks as sliding (the
attention module's ``sliding_window``).
"""

from __future__ import annotations

from .decoder import DecoderAdapter


class Qwen2Adapter(DecoderAdapter):
    """Hugging Face Qwen2 decoders (eager or sdpa attention)."""


__all__ = ["Qwen2Adapter"]

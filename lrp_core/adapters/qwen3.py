"""Qwen3 decoders: ``Qwen3ForCausalLM`` and ``Qwen3ForSequenceClassification``.

Llama's layout with an RMSNorm on each query and key head (``q_norm``, ``k_norm``, before the rotation;
identity in the explicit passes, ``rsqrt`` detached under AttnLRP / CP-LRP) and per-layer sliding windows
where configured.
"""

from __future__ import annotations

from .decoder import DecoderAdapter


class Qwen3Adapter(DecoderAdapter):
    """Hugging Face Qwen3 decoders (eager or sdpa attention); the q/k norms are read by the base's ``_attention``."""


__all__ = ["Qwen3Adapter"]

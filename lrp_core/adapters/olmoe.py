"""OLMoE decoders: ``OlmoeForCausalLM``.

Llama's layout with RMSNorms on the whole query and key projections (every head's channels together, before
they are split into heads) and a mixture-of-experts MLP in every layer (docs/METHODS.md §2c.4): softmax over the
router's logits, the top ``num_experts_per_tok``, renormalised where ``norm_topk_prob``. ``config.clip_qkv``
(clamping q, k, v) is refused: a clamp the rules do not describe.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..errors import UnsupportedModelError
from .blocks import AttentionSpec
from .moe import MoeDecoderAdapter


class OlmoeAdapter(MoeDecoderAdapter):
    """Hugging Face OLMoE decoders (eager or sdpa attention)."""

    family = "OLMoE"

    def __init__(self, model: Any):
        clip = getattr(getattr(model, "config", None), "clip_qkv", None)
        if clip is not None:
            raise UnsupportedModelError(
                f"config.clip_qkv={clip}: the attention clamps q, k and v to ±{clip}, a "
                "clamp the relevance rules do not describe; load the model with clip_qkv=None "
                "only where no value reaches the bound (else it is another function)"
            )
        super().__init__(model)

    def _attention(self, att: nn.Module, **extra) -> AttentionSpec:
        window = getattr(self.config, "sliding_window", None)
        return super()._attention(att, window=int(window) if window else None, norm_whole=True, **extra)


__all__ = ["OlmoeAdapter"]

"""Llama-family decoders: ``LlamaForCausalLM`` (Llama 2 / 3, TinyLlama, SmolLM) and ``LlamaForSequenceClassification``.

The layout is :class:`~lrp_core.adapters.decoder.DecoderAdapter`'s default: RMSNorm, grouped-query attention
with rotary embeddings, RMSNorm, SwiGLU MLP, final RMSNorm, LM head (tied or not) or classifier ``score``.
"""

from __future__ import annotations

from ..errors import UnsupportedModelError
from .decoder import DecoderAdapter


class LlamaAdapter(DecoderAdapter):
    """Hugging Face Llama decoders (eager or sdpa attention)."""

    def __init__(self, model):
        super().__init__(model)
        if int(getattr(self.config, "pretraining_tp", 1) or 1) > 1:  # older checkpoints: sliced Linears
            raise UnsupportedModelError(
                "pretraining_tp > 1 splits every Linear into slices the replay does not "
                "describe; load the model with pretraining_tp=1 (the same function)"
            )


__all__ = ["LlamaAdapter"]

"""Qwen3-MoE decoders: ``Qwen3MoeForCausalLM`` and ``Qwen3MoeForSequenceClassification``.

Qwen3's attention (per-head q/k RMSNorms, sliding windows where configured) and a mixture-of-experts MLP in every
sparse layer (docs/METHODS.md §2c.4): softmax over the router's logits, the top ``num_experts_per_tok``, renormalised
where ``norm_topk_prob``; the layers of ``mlp_only_layers`` (and those ``decoder_sparse_step`` skips) have a dense
gated MLP.
"""

from __future__ import annotations

from .moe import MoeDecoderAdapter


class Qwen3MoeAdapter(MoeDecoderAdapter):
    """Hugging Face Qwen3-MoE decoders (eager or sdpa attention)."""

    family = "Qwen3-MoE"


__all__ = ["Qwen3MoeAdapter"]

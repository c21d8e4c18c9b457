"""Gemma 3 text decoders: ``Gemma3ForCausalLM`` (e.g. gemma-3-270m, 1b) and ``Gemma3TextForSequenceClassification``.

Llama's layout with Gemma's differences (docs/METHODS.md §2c): RMSNorm with the weight ``1 + w``, computed in
float32 (the ``eps``-style norm of the decoder operations); the token embedding scaled by ``√D`` inside
``embed_tokens`` (so the scale is part of ``e``, the tensor AttnLRP / CP-LRP read relevance at); the attention
scale ``query_pre_attn_scalar^-½``; per-head q/k norms; a GELU-tanh gated MLP; sandwich norms (a norm on each
branch's output before its residual Add: the block's ``post1`` / ``post2``); and alternating sliding-window and
global layers, each kind with its own rotary base (``rope_key`` = the layer type).

The multimodal ``Gemma3ForConditionalGeneration`` is explained by :mod:`~lrp_core.adapters.gemma3_vl` (this adapter
for its language model); Gemma 2 has its own adapter (soft-capping).
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor, nn

from ..errors import UnsupportedModelError
from .blocks import BlockSpec, MlpSpec
from .decoder import DecoderAdapter
from .parts import ModelPart
from .positions import row_rotary_tables


class Gemma3Adapter(DecoderAdapter):
    """Hugging Face Gemma 3 text decoders (eager or sdpa attention)."""

    def __init__(self, model: nn.Module):
        cfg = getattr(model, "config", None)
        if getattr(cfg, "use_bidirectional_attention", False):
            raise UnsupportedModelError(
                f"{type(model).__name__}: use_bidirectional_attention=True (an embedding "
                "model, EmbeddingGemma) is not a causal decoder; only causal Gemma 3 is "
                "supported"
            )
        super().__init__(model)

    def _block(self, i: int, layer: ModelPart) -> BlockSpec:
        """input norm → attention → post-attention norm → + → pre-MLP norm → gated MLP → post-MLP norm → +."""
        try:
            att, mlp = layer.self_attn, layer.mlp
            return BlockSpec(
                layout="pre_ln",
                norm1=layer.input_layernorm,
                norm2=layer.pre_feedforward_layernorm,
                post1=layer.post_attention_layernorm,
                post2=layer.post_feedforward_layernorm,
                attn=self._attention(att, rope_key=att.layer_type),
                mlp=MlpSpec(gate=mlp.gate_proj, fc1=mlp.up_proj, act=mlp.act_fn, fc2=mlp.down_proj),
            )
        except AttributeError as e:
            raise UnsupportedModelError(
                f"layer {i} ({type(layer).__name__}) does not have the Gemma 3 layout (input_layernorm, self_attn "
                "with q/k/v/o_proj and q/k norms, post_attention_layernorm, pre_feedforward_layernorm, mlp, "
                f"post_feedforward_layernorm): {e}"
            ) from None

    def rotary_tables(
        self, x0: Tensor, positions: Tensor, key: str, mask: Optional[Tensor] = None
    ) -> tuple[Tensor, Tensor]:
        """(cos, sin) (B, T, d) of the rotary embedding of layer type ``key`` (sliding / full: own bases), each
        row's as for the row alone (:func:`~lrp_core.adapters.positions.row_rotary_tables`)."""
        return row_rotary_tables(self.base.rotary_emb, x0, positions, mask, key)


__all__ = ["Gemma3Adapter"]

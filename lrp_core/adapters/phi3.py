"""Phi-3 decoders: ``Phi3ForCausalLM`` (e.g. Phi-3-mini-4k-instruct) and ``Phi3ForSequenceClassification``.

Llama's layout with fused projections: one ``qkv_proj`` (the query heads, then the key heads, then the value
heads) and one ``gate_up_proj`` (gate first, then up) — relevance of the two parts side by side through the one
Linear in the explicit passes —, partial rotary where ``partial_rotary_factor`` < 1 (the rest of each head passes
unrotated) and one sliding window for every layer where ``config.sliding_window`` is set. The residual dropouts
are identities (inference).
"""

from __future__ import annotations

from ..errors import UnsupportedModelError
from .blocks import AttentionSpec, BlockSpec, MlpSpec
from .decoder import DecoderAdapter
from .kernels import eager_softmax_dtype
from .parts import ModelPart


class Phi3Adapter(DecoderAdapter):
    """Hugging Face Phi-3 decoders (eager or sdpa attention)."""

    def _block(self, i: int, layer: ModelPart) -> BlockSpec:
        """input norm → attention (fused qkv) → + → post-attention norm → gated MLP (fused gate_up) → +."""
        try:
            att, mlp = layer.self_attn, layer.mlp
            return BlockSpec(
                layout="pre_ln",
                norm1=layer.input_layernorm,
                norm2=layer.post_attention_layernorm,
                attn=self._fused_attention(att),
                mlp=MlpSpec(fc1=mlp.gate_up_proj, fused_gate=True, act=mlp.activation_fn, fc2=mlp.down_proj),
            )
        except AttributeError as e:
            raise UnsupportedModelError(
                f"layer {i} ({type(layer).__name__}) does not have the Phi-3 layout (input_layernorm, self_attn "
                f"with qkv_proj / o_proj, post_attention_layernorm, mlp with gate_up_proj / down_proj): {e}"
            ) from None

    def _fused_attention(self, att: ModelPart) -> AttentionSpec:
        cfg = self.config
        window = getattr(cfg, "sliding_window", None)
        return AttentionSpec(
            qkv=att.qkv_proj,
            proj=att.o_proj,
            num_heads=cfg.num_attention_heads,
            num_kv_heads=cfg.num_key_value_heads,
            head_dim=att.head_dim,
            scale=float(att.scaling),
            rotary=True,
            window=int(window) if window else None,
            softmax_dtype=eager_softmax_dtype(self.config),
            sdpa=self.sdpa,
            causal=True,
        )


__all__ = ["Phi3Adapter"]

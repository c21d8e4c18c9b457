"""Falcon decoders: ``FalconForCausalLM`` and ``FalconForSequenceClassification`` with rotary positions.

``model.transformer`` holds ``word_embeddings``, ``h``, ``ln_f`` and ``rotary_emb``. Each layer's attention has one
fused ``query_key_value``: per head ``[q, k, v]`` (the original layout), all query heads then one key and one value
head (``multi_query``), or per key/value group its query heads, its key and its value
(``new_decoder_architecture``, ``num_kv_heads`` groups); the scale is ``1/√head_dim``. The blocks are parallel
(docs/METHODS.md §2f: ``out = x + (mlp + attn)``) with one norm ``input_layernorm`` feeding both branches or two
(``ln_attn``, ``ln_mlp``: ``num_ln_in_parallel_attn = 2``), or sequential pre-LN (``parallel_attn=False``). ALiBi
(``alibi=True``: a per-head linear bias on the scores) is refused. The dropouts are identities (inference).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import nn

from ..errors import UnsupportedModelError
from .blocks import AttentionSpec, BlockSpec, MlpSpec
from .decoder import DecoderAdapter
from .parts import ModelPart


class FalconAdapter(DecoderAdapter):
    """Hugging Face Falcon decoders with rotary embeddings (eager or sdpa attention)."""

    def __init__(self, model: nn.Module):
        cfg = getattr(model, "config", None)
        if getattr(cfg, "alibi", False):
            raise UnsupportedModelError(
                f"{type(model).__name__}: alibi=True adds a per-head linear position bias to "
                "the attention scores (scaled with them), which the block replay does not "
                "describe; only Falcon with rotary embeddings (alibi=False) is supported"
            )
        super().__init__(model)

    def _stack(self) -> tuple[ModelPart, Sequence[ModelPart], ModelPart]:
        base = getattr(self.model, "transformer", None)
        if self.config is None or base is None or not hasattr(base, "h"):
            raise UnsupportedModelError(f"{type(self.model).__name__}: not a Falcon (expected model.transformer.h)")
        return base, base.h, base.ln_f

    def _block(self, i: int, layer: ModelPart) -> BlockSpec:
        """The layer's norms and layout as its forward reads the config (FalconDecoderLayer.forward)."""
        cfg = self.config
        try:
            att, mlp = layer.self_attention, layer.mlp
            H, d = int(att.num_heads), int(att.head_dim)
            if cfg.new_decoder_architecture:
                Hkv, qkv_layout = int(cfg.num_kv_heads), "grouped"
            elif cfg.multi_query:
                Hkv, qkv_layout = 1, "split"
            else:
                Hkv, qkv_layout = H, "grouped"
            if att.query_key_value.out_features != (H + 2 * Hkv) * d:
                raise UnsupportedModelError(
                    f"layer {i}: query_key_value gives {att.query_key_value.out_features} "
                    f"outputs, not {H} query and {Hkv} key/value heads of {d}"
                )
            attn = AttentionSpec(
                qkv=att.query_key_value,
                qkv_layout=qkv_layout,
                proj=att.dense,
                num_heads=H,
                num_kv_heads=Hkv,
                head_dim=d,
                scale=1.0 / math.sqrt(d),
                rotary=True,
                sdpa=self.sdpa,
                causal=True,
            )  # eager: its softmax in the model's dtype
            mlp_spec = MlpSpec(fc1=mlp.dense_h_to_4h, act=mlp.act, fc2=mlp.dense_4h_to_h)
            if cfg.new_decoder_architecture and cfg.num_ln_in_parallel_attn == 2:
                return BlockSpec(layout="parallel", norm1=layer.ln_attn, norm2=layer.ln_mlp, attn=attn, mlp=mlp_spec)
            if cfg.new_decoder_architecture or cfg.parallel_attn:
                return BlockSpec(
                    layout="parallel", norm1=layer.input_layernorm, norm2=layer.input_layernorm, attn=attn, mlp=mlp_spec
                )
            return BlockSpec(
                layout="pre_ln",
                norm1=layer.input_layernorm,
                norm2=layer.post_attention_layernorm,
                attn=attn,
                mlp=mlp_spec,
            )
        except AttributeError as e:
            raise UnsupportedModelError(
                f"layer {i} ({type(layer).__name__}) does not have a Falcon layout its config describes "
                "(self_attention with query_key_value / dense, mlp with dense_h_to_4h / act / dense_4h_to_h, "
                f"input_layernorm (+ post_attention_layernorm) or ln_attn + ln_mlp): {e}"
            ) from None


__all__ = ["FalconAdapter"]

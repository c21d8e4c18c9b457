"""GPT-NeoX decoders (Pythia, GPT-NeoX-20B): ``GPTNeoXForCausalLM`` and ``GPTNeoXForSequenceClassification``.

``model.gpt_neox`` holds ``embed_in``, ``layers``, ``final_layer_norm`` and ``rotary_emb``; the LM head is
``lm_head`` (the checkpoints' ``embed_out``), the classifier ``score``. Each layer: LayerNorm ``input_layernorm``
→ attention with one fused ``query_key_value`` whose outputs are per head ``[q, k, v]`` (the "grouped" qkv
layout), partial rotary (``partial_rotary_factor``, the config's former ``rotary_pct``: the first part of each head
rotated, the rest passed) → ``dense``; LayerNorm
``post_attention_layernorm`` → ``dense_h_to_4h`` → GELU → ``dense_4h_to_h``. With ``use_parallel_residual`` (Pythia)
the two branches read the layer input and ``out = (mlp + attn) + x`` (the "parallel" layout, docs/METHODS.md §2f),
otherwise the sequential pre-LN layout with its two norms. The dropouts are identities (inference).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import UnsupportedModelError
from .blocks import AttentionSpec, BlockSpec, MlpSpec
from .decoder import DecoderAdapter
from .kernels import eager_softmax_dtype
from .parts import ModelPart


class GPTNeoXAdapter(DecoderAdapter):
    """Hugging Face GPT-NeoX decoders (eager or sdpa attention), parallel or sequential residual."""

    def _stack(self) -> tuple[ModelPart, Sequence[ModelPart], ModelPart]:
        base = getattr(self.model, "gpt_neox", None)
        if self.config is None or base is None or not hasattr(base, "layers"):
            raise UnsupportedModelError(f"{type(self.model).__name__}: not a GPT-NeoX (expected model.gpt_neox.layers)")
        return base, base.layers, base.final_layer_norm

    def _block(self, i: int, layer: ModelPart) -> BlockSpec:
        """input_layernorm → attention (fused per-head qkv) | post_attention_layernorm → MLP; parallel or not."""
        try:
            att, mlp = layer.attention, layer.mlp
            H = int(self.config.num_attention_heads)
            attn = AttentionSpec(
                qkv=att.query_key_value,
                qkv_layout="grouped",
                proj=att.dense,
                num_heads=H,
                head_dim=int(att.head_size),
                scale=float(att.scaling),
                rotary=True,
                softmax_dtype=eager_softmax_dtype(self.config),
                sdpa=self.sdpa,
                causal=True,
            )
            return BlockSpec(
                layout="parallel" if layer.use_parallel_residual else "pre_ln",
                norm1=layer.input_layernorm,
                norm2=layer.post_attention_layernorm,
                attn=attn,
                mlp=MlpSpec(fc1=mlp.dense_h_to_4h, act=mlp.act, fc2=mlp.dense_4h_to_h),
            )
        except AttributeError as e:
            raise UnsupportedModelError(
                f"layer {i} ({type(layer).__name__}) does not have the GPT-NeoX layout (input_layernorm, attention "
                "with query_key_value / dense, post_attention_layernorm, mlp with dense_h_to_4h / act / "
                f"dense_4h_to_h): {e}"
            ) from None


__all__ = ["GPTNeoXAdapter"]

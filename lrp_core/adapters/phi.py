"""Phi-1, Phi-1.5 and Phi-2: ``PhiForCausalLM`` and ``PhiForSequenceClassification``.

Parallel blocks (docs/METHODS.md §2f): one LayerNorm ``input_layernorm`` feeds both the attention (q/k/v
projections with biases, optional per-head LayerNorms ``q_layernorm`` / ``k_layernorm`` where ``qk_layernorm``,
partial rotary, output projection ``dense``) and the MLP (``fc1`` → GELU → ``fc2``), and ``out = (attn + mlp) + x``.
The final norm is ``final_layernorm``; the LM head has a bias. The dropouts are identities (inference).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from ..errors import UnsupportedModelError
from .blocks import AttentionSpec, BlockSpec, MlpSpec
from .decoder import DecoderAdapter
from .kernels import eager_softmax_dtype
from .parts import ModelPart


class PhiAdapter(DecoderAdapter):
    """Hugging Face Phi (1, 1.5, 2) decoders (eager or sdpa attention)."""

    def _stack(self) -> tuple[ModelPart, Sequence[ModelPart], ModelPart]:
        base = getattr(self.model, "model", None)
        if self.config is None or base is None or not hasattr(base, "layers"):
            raise UnsupportedModelError(f"{type(self.model).__name__}: not a Phi (expected model.model.layers)")
        return base, base.layers, base.final_layernorm

    def _block(self, i: int, layer: ModelPart) -> BlockSpec:
        """input_layernorm → attention (+) MLP, both from the one norm's output, added to the input together."""
        cfg = self.config
        try:
            att, mlp = layer.self_attn, layer.mlp
            qk = bool(getattr(att, "qk_layernorm", False))
            attn = AttentionSpec(
                q=att.q_proj,
                k=att.k_proj,
                v=att.v_proj,
                proj=att.dense,
                num_heads=int(cfg.num_attention_heads),
                num_kv_heads=int(cfg.num_key_value_heads),
                head_dim=int(att.head_dim),
                scale=float(att.scaling),
                rotary=True,
                q_norm=att.q_layernorm if qk else nn.Identity(),
                k_norm=att.k_layernorm if qk else nn.Identity(),
                softmax_dtype=eager_softmax_dtype(self.config),
                sdpa=self.sdpa,
                causal=True,
            )
            return BlockSpec(
                layout="parallel",
                norm1=layer.input_layernorm,
                norm2=layer.input_layernorm,
                attn=attn,
                mlp=MlpSpec(fc1=mlp.fc1, act=mlp.activation_fn, fc2=mlp.fc2),
            )
        except AttributeError as e:
            raise UnsupportedModelError(
                f"layer {i} ({type(layer).__name__}) does not have the Phi layout (input_layernorm, self_attn with "
                f"q/k/v_proj / dense, mlp with fc1 / activation_fn / fc2): {e}"
            ) from None


__all__ = ["PhiAdapter"]

"""OLMo-2 and OLMo-3 decoders: ``Olmo2ForCausalLM``, ``Olmo3ForCausalLM`` (and their sequence classifiers where
transformers has them).

Llama's parts in a post-norm layout: no norm before either branch; an RMSNorm on each branch's output before its
residual Add (``post_attention_layernorm``, ``post_feedforward_layernorm``: the block's ``post1`` / ``post2`` with
identity pre-norms). The query and key RMSNorms (``q_norm``, ``k_norm``) normalise the whole projection — all heads
together, before the head split — not each head (docs/METHODS.md §2f; identity in the explicit passes, ``rsqrt``
detached under AttnLRP / CP-LRP as every RMSNorm). OLMo-3 adds sliding-window layers, each layer type with its own
rotary table (``rope_key`` = the layer type).
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor, nn

from ..errors import UnsupportedModelError
from .blocks import BlockSpec, MlpSpec
from .decoder import DecoderAdapter
from .parts import ModelPart
from .positions import row_rotary_tables


class Olmo2Adapter(DecoderAdapter):
    """Hugging Face OLMo-2 / OLMo-3 decoders (eager or sdpa attention)."""

    def _block(self, i: int, layer: ModelPart) -> BlockSpec:
        """attention (whole-projection q/k norms) → post-attention norm → + → gated MLP → post-MLP norm → +."""
        try:
            att, mlp = layer.self_attn, layer.mlp
            key = getattr(att, "attention_type", None) if self._typed_rope else None
            extra = {"rope_key": key} if key is not None else {}
            return BlockSpec(
                layout="pre_ln",
                norm1=nn.Identity(),
                norm2=nn.Identity(),
                post1=layer.post_attention_layernorm,
                post2=layer.post_feedforward_layernorm,
                attn=self._attention(att, norm_whole=True, **extra),
                mlp=MlpSpec(gate=mlp.gate_proj, fc1=mlp.up_proj, act=mlp.act_fn, fc2=mlp.down_proj),
            )
        except AttributeError as e:
            raise UnsupportedModelError(
                f"layer {i} ({type(layer).__name__}) does not have the OLMo-2 layout (self_attn with q/k/v/o_proj and "
                f"q_norm / k_norm, post_attention_layernorm, mlp, post_feedforward_layernorm): {e}"
            ) from None

    @property
    def _typed_rope(self) -> bool:
        """Whether the rotary module keeps one table per layer type (OLMo-3)."""
        return isinstance(getattr(self.base.rotary_emb, "rope_type", None), dict)

    def rotary_tables(
        self, x0: Tensor, positions: Tensor, key: str, mask: Optional[Tensor] = None
    ) -> tuple[Tensor, Tensor]:
        """(cos, sin) (B, T, r): the one table (OLMo-2) or that of layer type ``key`` (OLMo-3), each row's as for the
        row alone (:func:`~lrp_core.adapters.positions.row_rotary_tables`)."""
        return row_rotary_tables(self.base.rotary_emb, x0, positions, mask, key if self._typed_rope else None)


__all__ = ["Olmo2Adapter"]

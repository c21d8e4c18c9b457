"""Gemma 2 decoders: ``Gemma2ForCausalLM`` and ``Gemma2ForSequenceClassification`` (eager attention only, as
Hugging Face runs them).

Gemma 3's layout (docs/METHODS.md §2c: ``1 + w`` RMSNorm in float32, the ``√D`` embedding scale inside
``embed_tokens``, the scale ``query_pre_attn_scalar^-½``, a GELU-tanh gated MLP, sandwich norms, sliding-window and
global layers) without q/k norms, with one rotary table for every layer, and with soft-capping (docs/METHODS.md
§2f): the scaled attention scores pass ``c · tanh(s / c)`` (``attn_logit_softcapping``) before the mask is added, and
the LM head's logits ``c · tanh(z / c)`` (``final_logit_softcapping``; the explained logit is the capped one, as the
model outputs it). The sequence classifier's scores are not capped (the model does not cap them).
"""

from __future__ import annotations

from torch import nn

from ..errors import UnsupportedModelError
from ..rules.ops import ELEMENTWISE
from .blocks import BlockSpec, MlpSpec
from .decoder import DecoderAdapter
from .kernels import SoftCap
from .parts import ModelPart
from .readouts import HeadLayer


class Gemma2Adapter(DecoderAdapter):
    """Hugging Face Gemma 2 decoders, with or without soft-capping."""

    def __init__(self, model: nn.Module):
        cfg = getattr(model, "config", None)
        if getattr(cfg, "use_bidirectional_attention", False):
            raise UnsupportedModelError(
                f"{type(model).__name__}: use_bidirectional_attention=True is not a causal "
                "decoder; only causal Gemma 2 is supported"
            )
        super().__init__(model)

    def _head_layers(self) -> list[HeadLayer]:
        """The LM head, then its soft-cap where the model caps the logits (the causal LM only)."""
        layers = super()._head_layers()
        cap = getattr(self.config, "final_logit_softcapping", None)
        if cap is not None and layers[0].module is getattr(self.model, "lm_head", None):
            layers.append(HeadLayer(ELEMENTWISE, SoftCap(cap)))
        return layers

    def _block(self, i: int, layer: ModelPart) -> BlockSpec:
        """input norm → attention (soft-capped scores) → post-attention norm → + → pre-MLP norm → gated MLP →
        post-MLP norm → +."""
        cap = getattr(self.config, "attn_logit_softcapping", None)
        try:
            att, mlp = layer.self_attn, layer.mlp
            return BlockSpec(
                layout="pre_ln",
                norm1=layer.input_layernorm,
                norm2=layer.pre_feedforward_layernorm,
                post1=layer.post_attention_layernorm,
                post2=layer.post_feedforward_layernorm,
                attn=self._attention(att, softcap=None if cap is None else SoftCap(cap)),
                mlp=MlpSpec(gate=mlp.gate_proj, fc1=mlp.up_proj, act=mlp.act_fn, fc2=mlp.down_proj),
            )
        except AttributeError as e:
            raise UnsupportedModelError(
                f"layer {i} ({type(layer).__name__}) does not have the Gemma 2 layout (input_layernorm, self_attn "
                "with q/k/v/o_proj, post_attention_layernorm, pre_feedforward_layernorm, mlp, "
                f"post_feedforward_layernorm): {e}"
            ) from None


__all__ = ["Gemma2Adapter"]

"""DistilBERT sequence classifiers from Hugging Face (``DistilBertForSequenceClassification``).

Post-LN blocks like BERT's, under other names (``attention.q_lin/k_lin/v_lin/out_lin``,
``sa_layer_norm``, ``ffn.lin1/activation/lin2``, ``output_layer_norm``); word +
position embeddings (learned or sinusoidal: both are a lookup table), no token
types; the classifier reads [CLS] through ``pre_classifier → ReLU → classifier``.

Padding mask: transformers masks padded keys with the dtype's minimum (eager) or
a boolean mask (sdpa); the replay adds −10000 as for BERT. Both give exactly 0
after the softmax (``exp(−10000 + O(scores))`` underflows to 0 in float32 and
float64), so the logits agree; −10000 keeps the mask add's relevance shares finite.

Shapes: B batch, T tokens, D width, C classes.
"""

from __future__ import annotations

from torch import nn

from ..errors import UnsupportedModelError
from ..rules.linear import is_linear
from ..rules.ops import ELEMENTWISE, LINEAR
from .bert import BertAdapter
from .blocks import AttentionSpec, BlockSpec, MlpSpec
from .heads import hf_heads
from .parts import ModelPart
from .predicates import is_base_model
from .readouts import HeadLayer

#: the classifier's ReLU (the model applies a fresh ``nn.ReLU()`` inline; it has no state)
_RELU = nn.ReLU()


class DistilBertAdapter(BertAdapter):
    """``DistilBertForSequenceClassification``: [CLS] → pre_classifier → ReLU → classifier."""

    #: the model's forward takes no token types and no position ids
    honoured_inputs = ("input_ids", "attention_mask")

    def _backbone(self) -> ModelPart:
        model = self.model
        name = type(model).__name__
        base = model if is_base_model(model) else getattr(model, "distilbert", None)
        if (
            getattr(model, "config", None) is None
            or base is None
            or not hasattr(base, "embeddings")
            or not hasattr(getattr(base, "transformer", None), "layer")
        ):
            raise UnsupportedModelError(
                f"{name}: not a DistilBERT classifier (expected distilbert.embeddings and distilbert.transformer.layer)"
            )
        for part in (
            ("pre_classifier", "classifier") if base is not model and self.task in ("sequence", "choice") else ()
        ):
            if not is_linear(getattr(model, part, None)):
                raise UnsupportedModelError(f"{name}: expected a Linear {part!r} (DistilBERT's [CLS] head)")
        return base

    def _layers(self) -> list:
        return list(self.base.transformer.layer)

    def _max_length(self) -> int:
        return int(self.model.config.max_position_embeddings)

    def _head(self) -> list:
        return [
            HeadLayer(LINEAR, self.model.pre_classifier),
            HeadLayer(ELEMENTWISE, _RELU),
            HeadLayer(LINEAR, self.model.classifier),
        ]

    def _block(self, i: int, layer: ModelPart) -> BlockSpec:
        try:
            att, ffn = layer.attention, layer.ffn
            d = self.model.config.dim // self.model.config.n_heads
            H, d, scale = hf_heads(att, att.q_lin, att.k_lin, att.v_lin, att.out_lin, f"layer {i}", d)
            return BlockSpec(
                layout="post_ln",
                norm1=layer.sa_layer_norm,
                norm2=layer.output_layer_norm,
                attn=AttentionSpec(
                    q=att.q_lin, k=att.k_lin, v=att.v_lin, proj=att.out_lin, num_heads=H, head_dim=d, scale=scale
                ),
                mlp=MlpSpec(fc1=ffn.lin1, act=ffn.activation, fc2=ffn.lin2),
            )
        except AttributeError as e:
            raise UnsupportedModelError(
                f"layer {i} ({type(layer).__name__}) does not have the DistilBERT layout (attention.q_lin/k_lin/"
                f"v_lin/out_lin, sa_layer_norm, ffn.lin1/activation/lin2, output_layer_norm): {e}"
            ) from None


__all__ = ["DistilBertAdapter"]

"""ALBERT sequence classifiers from Hugging Face (``AlbertForSequenceClassification``).

Two twists on BERT:

* factorised embeddings: word + token-type + position embeddings of width E,
  LayerNorm, then ``encoder.embedding_hidden_mapping_in`` (a Linear E → D);
* shared layers: ``num_hidden_layers`` uses of ``num_hidden_groups`` layer
  groups (each of ``inner_group_num`` layers), group ``⌊i·G/L⌋`` at use i as the
  model computes it. Each use is listed as its own :class:`BlockSpec` (the same
  modules), so relevance, attention and per-block views treat it as its own block.

The readout is the pooler (Linear + tanh) on [CLS], then the classifier. attnlrp /
cp_lrp read token relevance at the word embeddings, before the projection.

Shapes: B batch, T tokens, E embedding width, D hidden width.
"""

from __future__ import annotations

from typing import Optional

from ..errors import UnsupportedModelError
from ..rules.linear import is_linear
from ..rules.ops import ELEMENTWISE, LINEAR
from .bert import BertAdapter
from .blocks import AttentionSpec, BlockSpec, MlpSpec
from .heads import hf_heads
from .parts import ModelPart
from .readouts import HeadLayer


class AlbertAdapter(BertAdapter):
    """``AlbertForSequenceClassification``: shared post-LN layers, pooler (dense + tanh) → classifier."""

    def _backbone(self) -> ModelPart:
        model = self.model
        name = type(model).__name__
        base = getattr(model, "albert", None)
        enc = getattr(base, "encoder", None)
        if (
            getattr(model, "config", None) is None
            or base is None
            or not hasattr(enc, "albert_layer_groups")
            or not is_linear(getattr(enc, "embedding_hidden_mapping_in", None))
        ):
            raise UnsupportedModelError(
                f"{name}: not an ALBERT classifier (expected albert.embeddings and "
                "albert.encoder.albert_layer_groups / embedding_hidden_mapping_in)"
            )
        if self.task in ("sequence", "choice") and (
            not is_linear(getattr(base, "pooler", None)) or not is_linear(getattr(model, "classifier", None))
        ):
            raise UnsupportedModelError(
                f"{name}: expected a pooler (Linear + tanh) and a Linear classifier; "
                "ALBERT without its pooling layer is not supported"
            )
        return base

    def _layers(self) -> list:
        return self.layer_uses(self.base.encoder, self.model.config)

    def _max_length(self) -> int:
        return int(self.model.config.max_position_embeddings)

    def _head(self) -> list:
        return [
            HeadLayer(LINEAR, self.base.pooler),
            HeadLayer(ELEMENTWISE, self.base.pooler_activation),
            HeadLayer(LINEAR, self.model.classifier),
        ]

    @staticmethod
    def layer_uses(enc: ModelPart, cfg) -> list:
        """The ALBERT layers in the order the encoder runs them (a shared layer once per use)."""
        L, G = cfg.num_hidden_layers, cfg.num_hidden_groups
        return [layer for i in range(L) for layer in enc.albert_layer_groups[int(i / (L / G))].albert_layers]

    def _block(self, i: int, layer: ModelPart) -> BlockSpec:
        try:
            att = layer.attention
            H, d, scale = hf_heads(att, att.query, att.key, att.value, att.dense, f"layer {i}", att.attention_head_size)
            return BlockSpec(
                layout="post_ln",
                norm1=att.LayerNorm,
                norm2=layer.full_layer_layer_norm,
                attn=AttentionSpec(
                    q=att.query, k=att.key, v=att.value, proj=att.dense, num_heads=H, head_dim=d, scale=scale
                ),
                mlp=MlpSpec(fc1=layer.ffn, act=layer.activation, fc2=layer.ffn_output),
            )
        except AttributeError as e:
            raise UnsupportedModelError(
                f"{type(layer).__name__} does not have the ALBERT layout (attention.query/key/value/dense/LayerNorm, "
                f"ffn, activation, ffn_output, full_layer_layer_norm): {e}"
            ) from None

    def embedding_projection(self) -> Optional[ModelPart]:
        return self.base.encoder.embedding_hidden_mapping_in


__all__ = ["AlbertAdapter"]

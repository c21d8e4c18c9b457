"""MPNet sequence classifiers from Hugging Face (``MPNetForSequenceClassification``).

BERT's post-LN layout under other names (``attention.attn.q/k/v/o``,
``attention.LayerNorm``, ``intermediate``, ``output``), word + position embeddings
(RoBERTa-style positions after the padding index, no token types), a RoBERTa head
(dense → tanh → out_proj on token 0) — and a **relative position bias**: the encoder
adds a per-head table ``relative_attention_bias[bucket(j − i)]`` (1, H, N, N) to the
scaled scores of every layer before the padding mask.

The bias does not depend on the tokens, so the replay treats it like the padding
mask: one constant additive operand of the mask add (docs/METHODS.md §1.10; the
scores keep their share, the bias's share is dropped; modified-gradient rules pass
no gradient into it). It is computed by the model's own
``encoder.compute_position_bias`` for the sequence at hand; ``token_ablation``
therefore removes a token from the sequence (later tokens move one position closer
in the relative bias, their absolute position embedding stays).

Shapes: B batch, N tokens, H heads.
"""

from __future__ import annotations

import importlib
from typing import Optional

from torch import Tensor

from ..errors import UnsupportedModelError
from .bert import BertAdapter
from .blocks import AttentionSpec, BlockSpec, MlpSpec
from .heads import hf_heads
from .parts import ModelPart
from .predicates import is_base_model


class MPNetAdapter(BertAdapter):
    """``MPNetForSequenceClassification``: post-LN layers with a relative position bias."""

    #: no token types; position ids the replay does not take (its relative bias follows the token order)
    honoured_inputs = ("input_ids", "attention_mask")
    refused_inputs = {
        **BertAdapter.refused_inputs,
        "position_ids": "the replay places MPNet's tokens at the positions the model gives them "
        "itself (after the padding index): pass no position_ids",
    }

    def _backbone(self) -> ModelPart:
        model = self.model
        base = model if is_base_model(model) else getattr(model, "mpnet", None)
        enc = getattr(base, "encoder", None)
        if (
            getattr(model, "config", None) is None
            or base is None
            or not hasattr(enc, "layer")
            or not hasattr(enc, "compute_position_bias")
        ):
            raise UnsupportedModelError(
                f"{type(model).__name__}: not an MPNet classifier (expected mpnet.embeddings "
                "and mpnet.encoder.layer / compute_position_bias)"
            )
        self.padding_idx = int(base.embeddings.padding_idx)
        return base

    def _max_length(self) -> int:
        """Positions start after the padding index (as RoBERTa's)."""
        return int(self.model.config.max_position_embeddings) - self.padding_idx - 1

    def _block(self, i: int, layer: ModelPart) -> BlockSpec:
        try:
            att = layer.attention.attn
            H, d, scale = hf_heads(att, att.q, att.k, att.v, att.o, f"layer {i}", att.attention_head_size)
            return BlockSpec(
                layout="post_ln",
                norm1=layer.attention.LayerNorm,
                norm2=layer.output.LayerNorm,
                attn=AttentionSpec(q=att.q, k=att.k, v=att.v, proj=att.o, num_heads=H, head_dim=d, scale=scale),
                mlp=MlpSpec(
                    fc1=layer.intermediate.dense, act=layer.intermediate.intermediate_act_fn, fc2=layer.output.dense
                ),
            )
        except AttributeError as e:
            raise UnsupportedModelError(
                f"layer {i} ({type(layer).__name__}) does not have the MPNet layout (attention.attn.q/k/v/o, "
                f"attention.LayerNorm, intermediate, output): {e}"
            ) from None

    def _positions(self, ids: Tensor) -> Tensor:
        """The model's own position ids (its module-level ``create_position_ids_from_input_ids``)."""
        module = importlib.import_module(type(self.base.embeddings).__module__)
        return module.create_position_ids_from_input_ids(ids, self.padding_idx)

    def attention_bias(self, x0: Tensor, mask: Optional[Tensor]) -> Tensor:
        """Relative position bias (B, H, N, N) + padding mask (B, 1, 1, N), added after the scale."""
        position = self.base.encoder.compute_position_bias(x0)  # the model's own buckets and table
        return position.to(x0.device) + super().attention_bias(x0, mask)  # a split model: where the stream is


__all__ = ["MPNetAdapter"]

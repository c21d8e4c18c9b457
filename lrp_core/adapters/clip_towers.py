"""The CLIP towers alone: ``CLIPVisionModelWithProjection`` and ``CLIPTextModelWithProjection``.

Each tower's output is an embedding — ``image_embeds = visual_projection(post_layernorm([CLS]))``,
``text_embeds = text_projection(final_layer_norm(h_eot))`` at each prompt's end-of-text token — explained with a
``Projection`` / ``Similarity`` target (:mod:`lrp_core.adapters.embeddings`); the readout is marked as an
embedding (no classes). The blocks, embeddings and end-of-text rule are :mod:`lrp_core.adapters.clip`'s.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor, nn

from ..errors import InputError
from ..rules.norms import norm_kind
from ..rules.ops import LINEAR
from .batches import ImageBatch, PromptBatch
from .blocks import BlockSpec
from .clip import CLIPTextAdapter, CLIPVisionEncoder, _prompts, clip_block
from .parts import ModelPart
from .readouts import HeadLayer, PositionReadout, TokenReadout
from .vit import ViTAdapter


class CLIPVisionProjectionAdapter(ViTAdapter[ImageBatch]):
    """``CLIPVisionModelWithProjection``: [CLS] → ``post_layernorm`` → ``visual_projection`` = ``image_embeds``."""

    def __init__(self, model: ModelPart):
        super().__init__(model)
        vision = model.vision_model
        self.use_encoder(CLIPVisionEncoder(vision))
        self.readout = TokenReadout(
            norm=nn.Identity(),
            head_layers=[
                HeadLayer(norm_kind(vision.post_layernorm), vision.post_layernorm),
                HeadLayer(LINEAR, model.visual_projection),
            ],
        )
        self.readout.embedding = True

    def own_embedding(self, prepared: ImageBatch, pooling: Optional[str]) -> Tensor:
        out = self.model(pixel_values=prepared.images)
        return out.image_embeds if pooling is None else super().own_embedding(prepared, pooling)


class CLIPTextProjectionAdapter(CLIPTextAdapter):
    """``CLIPTextModelWithProjection``: each prompt's end-of-text token → ``final_layer_norm`` →
    ``text_projection`` = ``text_embeds``; inputs are the prompts alone (``input_ids``, ``attention_mask``)."""

    def __init__(self, model: ModelPart):
        super().__init__(model)
        self.readout = self._embedding_readout(torch.zeros(1, dtype=torch.long))

    def _block(self, i: int, layer: ModelPart) -> BlockSpec:
        return clip_block(layer, self.model.config)

    def _embedding_readout(self, positions: Tensor) -> PositionReadout:
        head = PositionReadout(
            self.model.text_model.final_layer_norm, [HeadLayer(LINEAR, self.model.text_projection)], positions
        )
        head.embedding = True
        return head

    def readout_for(self, prepared: PromptBatch) -> PositionReadout:
        return self._embedding_readout(self._end_of_text(prepared.input_ids))

    def check_inputs(self, inputs: Any) -> PromptBatch:
        """The prompts (``input_ids`` / ``attention_mask`` (P, T), right-padded; the end-of-text token last)."""
        if not hasattr(inputs, "keys") or "input_ids" not in inputs:
            raise InputError(f"{type(self.model).__name__} takes the tokenizer's output (input_ids, attention_mask)")
        ids, mask = _prompts(inputs)
        if ids.shape[1] > self.max_length:
            raise InputError(f"the prompts are {ids.shape[1]} tokens long; the tower accepts at most {self.max_length}")
        if not torch.equal(self._end_of_text(ids), mask.sum(dim=1) - 1):
            raise InputError("the end-of-text token must be the last real token of every prompt (right padding)")
        none = torch.zeros(0, self.model.text_projection.out_features, dtype=self.model.text_projection.weight.dtype)
        return PromptBatch(input_ids=ids, attention_mask=mask, image_embeddings=none)

    def own_embedding(self, prepared: PromptBatch, pooling: Optional[str]) -> Tensor:
        out = self.model(input_ids=prepared.input_ids, attention_mask=prepared.attention_mask)
        return out.text_embeds if pooling is None else super().own_embedding(prepared, pooling)


__all__ = ["CLIPVisionProjectionAdapter", "CLIPTextProjectionAdapter"]

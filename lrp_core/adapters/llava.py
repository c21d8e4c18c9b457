"""LLaVA (Hugging Face ``LlavaForConditionalGeneration``, docs/METHODS.md §2g).

The vision tower (CLIP vision or DINOv2) is read at ``vision_feature_layer`` (one layer; a list of layers
concatenated is refused), ``vision_feature_select_strategy`` ``"default"`` drops its [CLS] token and ``"full"``
keeps it, and the multi-modal projector ``linear_2(act(linear_1(·)))`` turns each kept token into one image token
of the language model: the image tokens are the patches in raster order (``"full"``: [CLS] first).

Shapes: B rows, N_v tower tokens, D_v tower width, P image tokens, D language-model width.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..errors import UnsupportedModelError
from ..rules.ops import ELEMENTWISE, LINEAR
from .blocks import Replay
from .parts import ModelPart
from .vlm import VLMAdapter

#: the feature-select strategies LLaVA knows
STRATEGIES = ("default", "full")


class LlavaAdapter(VLMAdapter):
    """``LlavaForConditionalGeneration``: tower → projector MLP → the language model's image tokens."""

    def _parts(self) -> tuple[ModelPart, ModelPart, Any, ModelPart, int]:
        cfg = self.model.config
        layer = cfg.vision_feature_layer
        if not isinstance(layer, int):
            raise UnsupportedModelError(
                f"vision_feature_layer={layer!r} concatenates several tower layers; one layer (an int) is explained"
            )
        self.strategy = cfg.vision_feature_select_strategy
        if self.strategy not in STRATEGIES:
            raise UnsupportedModelError(f"vision_feature_select_strategy={self.strategy!r}; explained: {STRATEGIES}")
        base = self.model.model
        self.projector = base.multi_modal_projector
        return base.language_model, self.model.lm_head, cfg.get_text_config(), base.vision_tower, layer

    def select(self, hidden: Tensor) -> Tensor:
        """ "default": the tokens after [CLS]; "full": all."""
        return hidden[:, 1:] if self.strategy == "default" else hidden

    def connect(self, selected: Tensor, r: Replay) -> tuple[dict, Tensor]:
        """``linear_2(act(linear_1(selected)))``."""
        p = self.projector
        h1 = r.module(LINEAR, p.linear_1, selected)
        a = r.module(ELEMENTWISE, p.act, h1)
        out = r.module(LINEAR, p.linear_2, a)
        return {"linear_1": h1, "act": a}, out

    def patch_tokens(self, grid: tuple) -> Tensor:
        """Patch i is image token i ("default") or i + 1 ("full": [CLS] first)."""
        return torch.arange(grid[0] * grid[1]) + (1 if self.strategy == "full" else 0)

    def tokens_per_image(self, grid: tuple) -> int:
        return grid[0] * grid[1] + (1 if self.strategy == "full" else 0)


__all__ = ["LlavaAdapter", "STRATEGIES"]

"""PaliGemma 1 and 2 (Hugging Face ``PaliGemmaForConditionalGeneration``, docs/METHODS.md §2g.3).

* The vision tower is SigLIP (``SiglipVisionModel``, :class:`~lrp_core.adapters.towers.SiglipVisionTower`), read at
  its ``last_hidden_state``: every block, then ``post_layernorm`` (the first operation of the connector here).
* The connector is one Linear (``multi_modal_projector.linear``): one image token per patch, in raster order. In
  transformers 5 the image features enter the language model unscaled (the √D scale of Gemma's embeddings is inside
  ``embed_tokens``, applied to the words only; earlier versions divided the features by √D and scaled everything).
* The language model is Gemma (PaliGemma 1: the Llama layout with Gemma's ``1 + w`` RMSNorm and GELU-tanh MLP,
  :class:`~lrp_core.adapters.llama.LlamaAdapter`) or Gemma 2 (PaliGemma 2:
  :class:`~lrp_core.adapters.gemma2.Gemma2Adapter`, with its soft-capped attention scores and logits and its
  sliding-window layers).
* The prefix-LM mask: with ``token_type_ids`` (the processor always gives them: 0 for the image, the prompt and
  the padding, 1 for a ``suffix``), every token of type 0 attends every other real token of type 0 in both
  directions, the suffix causally (:mod:`~lrp_core.adapters.vlm_groups`; a sliding window bounds the causal pairs
  only, as the model's mask has it). ``token_type_ids`` are required: without them the model's attention depends
  on its attention implementation and the padding (PaliGemma's config sets ``use_bidirectional_attention`` on its
  language model, which attends in both directions everywhere where no mask is built — sdpa, no padding — and
  causally otherwise; eager attention with left padding gives NaN logits). With them the model always builds its
  own mask, and that flag changes nothing: the language model is replayed with it off.
* Positions count from 1: the model's default ``position_ids`` are ``1 … T`` (``generate``: 1 from each row's
  first real token); the replay's default is the latter, so a padded row is read as alone. Given ``position_ids``
  are used as given.
* The final logit soft-cap of PaliGemma 2 is replayed only where the model's ``forward`` applies it: its config
  carries ``final_logit_softcapping`` in every transformers version, but transformers 5.17's forward ignored it
  (the logits were uncapped) and later versions cap them (:func:`forward_caps_logits`).

Shapes: B rows, N_v tower tokens (= P image tokens), D_v tower width, D language-model width.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

import torch
from torch import Tensor

from ..errors import InputError
from ..rules.ops import LINEAR
from .batches import VLMBatch
from .blocks import Replay
from .parts import ModelPart
from .vlm_groups import GroupedAttentionVLM


def forward_caps_logits(model: ModelPart) -> bool:
    """Whether ``type(model).forward`` soft-caps the logits by the text config's ``final_logit_softcapping``.

    Parameters
    ----------
    model : nn.Module
        A ``PaliGemmaForConditionalGeneration`` (or a subclass).

    Returns
    -------
    bool
        True where the forward's source reads the cap (transformers after 5.17); False where it does not, so the
        logits the model returns are uncapped whatever its config says. Without source code (a frozen build) the
        config is taken at its word: True.
    """
    try:
        source = inspect.getsource(type(model).forward)
    except (OSError, TypeError):
        return True
    return "final_logit_softcapping" in source


class PaliGemmaAdapter(GroupedAttentionVLM):
    """``PaliGemmaForConditionalGeneration``: SigLIP tower → post_layernorm → Linear → the image tokens of the
    Gemma / Gemma 2 language model (the prefix bidirectional)."""

    #: generated tokens are the suffix, causal: type 1 (as ``generate`` attends them)
    generated_token_values = {"token_type_ids": 1}

    text_families = {"gemma": ("llama", "LlamaAdapter"), "gemma2": ("gemma2", "Gemma2Adapter")}
    window_bounds_groups = False
    group_name = "the prefix, every token of type 0"

    def _parts(self) -> tuple[ModelPart, ModelPart, Any, ModelPart, int]:
        base = self.model.model
        self.projector = base.multi_modal_projector
        # the language model attends by the mask PaliGemma builds from token_type_ids (required), where its
        # config's use_bidirectional_attention has no effect: the text adapter sees a copy with it off
        text_config = copy.copy(self.model.config.text_config)
        text_config.use_bidirectional_attention = False
        if not forward_caps_logits(self.model):  # the config's cap, which this forward does not apply
            text_config.final_logit_softcapping = None
        return base.language_model, self.model.lm_head, text_config, base.vision_tower, -1

    def types_of(self, groups: Tensor) -> Tensor:
        """0 on the prefix (the group), 1 on the suffix."""
        return (groups != 0).long()

    def groups_of(self, token_type_ids: Tensor) -> Tensor:
        """Every token of type 0 in one group (0), the others causal — as the model's ``block_sequence_ids``."""
        return torch.where(token_type_ids == 0, torch.zeros_like(token_type_ids), torch.full_like(token_type_ids, -1))

    def check_inputs(self, inputs) -> VLMBatch:
        """:meth:`GroupedAttentionVLM.check_inputs` with ``token_type_ids`` required; the default positions count
        from 1 (the model's)."""
        prepared = super().check_inputs(inputs)
        if inputs.get("token_type_ids") is None:
            raise InputError(
                f"{type(self.model).__name__} is explained with the processor's 'token_type_ids' (0 for "
                "the image and the prompt, 1 for a suffix): without them the model attends in both "
                "directions or causally depending on its attention implementation and the padding. "
                "Pass processor(images=..., text=..., return_tensors='pt') whole"
            )
        if inputs.get("position_ids") is None:
            return prepared.replace(position_ids=prepared.position_ids + 1)
        return prepared

    def connect(self, selected: Tensor, r: Replay) -> tuple[dict, Tensor]:
        """post_layernorm → ``multi_modal_projector.linear``."""
        h = r.norm(self.tower.model.post_layernorm, selected)
        return {"post_layernorm": h}, r.module(LINEAR, self.projector.linear, h)


__all__ = ["PaliGemmaAdapter"]

"""Gemma 3 with images (Hugging Face ``Gemma3ForConditionalGeneration``, docs/METHODS.md §2g.3).

* The vision tower is SigLIP (``SiglipVisionModel``, :class:`~lrp_core.adapters.towers.SiglipVisionTower`), read at
  its ``last_hidden_state``: every block, then ``post_layernorm`` (the first operation of the connector here).
* The connector (``Gemma3MultiModalProjector``): the (p × p) patch grid averaged in (k × k) squares
  (``AvgPool2d``) to ``mm_tokens_per_image`` = (p/k)² tokens, Gemma's RMSNorm (weight ``1 + w``, in float32),
  then the matrix product with ``mm_input_projection_weight`` (D_v, D). The image features enter the language model
  as they are: the word embeddings carry Gemma's √D scale inside ``embed_tokens``, the image features none.
* The language model is Gemma 3 text (:class:`~lrp_core.adapters.gemma3.Gemma3Adapter`), with the tokens of one
  image attending each other in both directions where ``token_type_ids`` is given (the processor gives it: 1 at
  the image tokens; each run of 1s is one image): :mod:`~lrp_core.adapters.vlm_groups`. The window of a sliding
  layer bounds those pairs too, as the model's mask has it.

Relevance through the pooling: a pooled token is the average of its k² patches, ``t = Σ_i x_i / k²``, and its
relevance goes back to them by the rule of a weighted sum (the POOL operation, §4.4: ``R_i = (x_i / k²) ⊙
R_t / t``; the modified-gradient methods take its gradient, the same shares for a linear map). The layer-product
methods, whose scores stop at the image tokens, split each pooled token's score equally over its k² patches in
the image map (:meth:`Gemma3VLMAdapter.patch_tokens`).

Shapes: B rows, N_v = p² tower tokens, D_v tower width, P = (p/k)² image tokens, D language-model width.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor, nn

from ..errors import UnsupportedModelError
from ..rules.linear import LinearView
from ..rules.ops import LINEAR, POOL
from .blocks import Replay
from .parts import ModelPart
from .vlm_groups import GroupedAttentionVLM


class MatrixLinear(LinearView):
    """``x @ M`` for a parameter ``M`` (D_in, D_out) of a module (Gemma 3's ``mm_input_projection_weight``), shown
    to the rules as a bias-free Linear of weight ``Mᵀ`` (a view, read at every call; the module owns no
    parameters). ``forward`` computes ``torch.matmul(x, M)`` as the model does."""

    def __init__(self, owner: nn.Module, name: str):
        super().__init__()
        object.__setattr__(self, "owner", owner)  # not a child module: no parameters of its own
        self.name = name
        self.in_features, self.out_features = (int(n) for n in getattr(owner, name).shape)

    @property
    def weight(self) -> Tensor:
        """(D_out, D_in): the matrix transposed."""
        return getattr(self.owner, self.name).T

    @property
    def bias(self) -> Optional[Tensor]:
        return None

    def linear_parts(self) -> tuple[Tensor, Optional[Tensor]]:
        return self.weight, None

    def forward(self, x: Tensor) -> Tensor:
        """(..., D_in) -> (..., D_out)."""
        return torch.matmul(x, getattr(self.owner, self.name))


class Gemma3VLMAdapter(GroupedAttentionVLM):
    """``Gemma3ForConditionalGeneration``: SigLIP tower → post_layernorm → k × k average pooling → RMSNorm →
    projection → the image tokens of the Gemma 3 language model (bidirectional within an image)."""

    #: generated tokens are text, causal: type 0 (as ``generate`` attends them)
    generated_token_values = {"token_type_ids": 0}

    text_families = {"gemma3_text": ("gemma3", "Gemma3Adapter")}
    window_bounds_groups = True
    group_name = "the tokens of one image (each run of 1s)"

    def _parts(self) -> tuple[ModelPart, ModelPart, Any, ModelPart, int]:
        cfg = self.model.config
        base = self.model.model
        p = base.multi_modal_projector
        side, per_side, k = int(p.patches_per_image), int(p.tokens_per_side), int(p.kernel_size)
        if k < 1 or per_side * k != side or per_side**2 != int(cfg.mm_tokens_per_image):
            raise UnsupportedModelError(
                f"the projector pools a {side} × {side} patch grid to mm_tokens_per_image={cfg.mm_tokens_per_image} "
                f"tokens in {k} × {k} squares, which do not tile the grid: explained are square token counts whose "
                "side divides the patch grid's"
            )
        self.projector = p
        self.projection = MatrixLinear(p, "mm_input_projection_weight")
        self.side, self.per_side, self.kernel = side, per_side, k
        return base.language_model, self.model.lm_head, cfg.text_config, base.vision_tower, -1

    def types_of(self, groups: Tensor) -> Tensor:
        """1 on the image tokens (every group), 0 elsewhere."""
        return (groups >= 0).long()

    def groups_of(self, token_type_ids: Tensor) -> Tensor:
        """Each run of ``token_type_ids == 1`` is one group (numbered in order), every other token causal — as
        transformers' ``get_block_sequence_ids_for_mask``."""
        image = token_type_ids == 1
        before = torch.nn.functional.pad(image, (1, 0), value=False)[:, :-1]
        starts = image & ~before
        return torch.where(image, torch.cumsum(starts.long(), dim=1) - 1, torch.full_like(token_type_ids, -1))

    # ------------------------------------------------------------ the connector
    def _pool(self, h: Tensor) -> Tensor:
        """(B, N_v, D_v) -> (B, P, D_v): the projector's ``AvgPool2d`` on the patch grid, as the model runs it."""
        B, _, D = h.shape
        grid = h.transpose(1, 2).reshape(B, D, self.side, self.side).contiguous()
        return self.projector.avg_pool(grid).flatten(2).transpose(1, 2)

    def _squares(self, h: Tensor) -> Tensor:
        """(B, N_v, D_v) -> (B·P, k², D_v): each pooled token's patches (raster order inside the square)."""
        B, _, D = h.shape
        a, k = self.per_side, self.kernel
        return h.reshape(B, a, k, a, k, D).permute(0, 1, 3, 2, 4, 5).reshape(B * a * a, k * k, D)

    def connect(self, selected: Tensor, r: Replay) -> tuple[dict, Tensor]:
        """post_layernorm → average pooling (POOL) → RMSNorm → ``@ mm_input_projection_weight``."""
        h = r.norm(self.tower.model.post_layernorm, selected)
        B, N, D = h.shape
        a, k = self.per_side, self.kernel
        w = torch.full((1, k * k), 1.0 / (k * k), dtype=h.dtype, device=h.device)

        def pool(squares: Tensor, w: Tensor) -> Tensor:  # the model's AvgPool2d, on the squares' patches
            grid = squares.reshape(B, a, a, k, k, D).permute(0, 1, 3, 2, 4, 5).reshape(B, N, D)
            return self._pool(grid).reshape(B * a * a, D)

        # the POOL operation: each pooled token a weighted sum of its square's k² patches (w: its rule's weights)
        pooled = r(POOL, pool, self._squares(h), w).reshape(B, a * a, D)
        # in the layout the model's pooling leaves it (channels first): its float32 RMSNorm reduces in that order
        pooled = pooled.transpose(1, 2).contiguous().transpose(1, 2)
        normed = r.norm(self.projector.mm_soft_emb_norm, pooled)
        out = r.module(LINEAR, self.projection, normed)
        return {"post_layernorm": h, "pooled": pooled, "normed": normed}, out.type_as(selected)

    def patch_tokens(self, grid: tuple) -> Tensor:
        """Patch (r, c) is carried by pooled token ``(r // k) · (p / k) + c // k``."""
        rows = torch.arange(grid[0])[:, None] // self.kernel
        cols = torch.arange(grid[1])[None, :] // self.kernel
        return (rows * self.per_side + cols).flatten()

    def tokens_per_image(self, grid: tuple) -> int:
        return self.per_side**2


__all__ = ["Gemma3VLMAdapter", "MatrixLinear"]

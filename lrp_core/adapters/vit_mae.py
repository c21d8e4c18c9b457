"""Hugging Face ``ViTMAEModel``: the MAE encoder without its decoder, explained with a headless readout.

The model masks at random on every call: it draws noise, shuffles the patches by it and keeps the first
``(1 − mask_ratio)`` of them. With ``mask_ratio = 0`` every patch is kept and only their order is shuffled; the
model's own ``noise`` argument fixes that order, and ascending noise (``0, 1, …, P − 1``) keeps the raster order —
the function the replay computes, and the one its end-to-end check runs the model with (docs/METHODS.md §2v). A
model with ``mask_ratio > 0`` drops a random subset of patches on every call, so it is no function of the image:
refused, with the reason.

It has no head: the readout is the model's own [CLS] token after ``layernorm`` (``num_classes = 0``), so the
class-agnostic methods run, ``cdam`` with a concept target, and the readouts passed as targets where they are
offered (``Projection`` / ``Similarity``).

Shapes: B images, N = 1 + P tokens, D width.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import UnsupportedModelError
from ..rules.ops import PATCH_CONV, POS_ADD
from .batches import ImageBatch
from .blocks import NO_RECORD, Replay
from .parts import ModelPart
from .readouts import TokenReadout
from .records import EmbeddingRecord
from .vit import HFViTAdapter, HFViTEncoder, ViTAdapter


def in_order_noise(images: Tensor, num_patches: int) -> Tensor:
    """(B, P) ascending noise: the model's masking then keeps the patches in raster order."""
    return torch.arange(num_patches, device=images.device, dtype=torch.float32).expand(images.shape[0], -1)


class ViTMAEEncoder(HFViTEncoder):
    """``ViTMAEModel``'s encoder with every patch kept in raster order: the position embedding added to the patches,
    [CLS] plus its own position row prepended, the ViT layers (eager softmax in float32, as the model's)."""

    def embed(self, images: Tensor, r: Replay = NO_RECORD, track: bool = False) -> EmbeddingRecord:
        """The patches plus their positions, then ``cls_token + position 0`` before them (the model's order)."""
        emb = self.module.embeddings
        if track:
            images = images.detach().requires_grad_(True)
        patches = r.module(PATCH_CONV, self.patch_conv, images.to(self.patch_conv.weight.dtype))
        patches = patches.flatten(2).transpose(1, 2)
        pos = emb.position_embeddings
        x_pos = r(POS_ADD, torch.add, patches, pos[:, 1:])
        cls = (emb.cls_token + pos[:, :1]).expand(images.shape[0], -1, -1)
        x0 = torch.cat([cls, x_pos], dim=1)
        return EmbeddingRecord(x0=x0, embeds=patches, tokens=patches, x_pos=x_pos, images=images, patches=patches)


class HFViTMAEAdapter(HFViTAdapter):
    """Hugging Face ``ViTMAEModel`` with ``mask_ratio = 0``: :class:`ViTMAEEncoder`, read at [CLS] after
    ``layernorm``, no head."""

    def __init__(self, model: ModelPart):
        ratio = float(model.config.mask_ratio)
        if ratio != 0.0:
            raise UnsupportedModelError(
                f"{type(model).__name__} with mask_ratio={ratio} drops a random {ratio:.0%} of the patches on every "
                "call (noise drawn at random), so it is not one function of the image; load it with mask_ratio=0 "
                "(e.g. ViTMAEModel.from_pretrained(name, mask_ratio=0.0)): every patch is then kept"
            )
        ViTAdapter.__init__(self, model)  # the model is its own backbone
        self.use_encoder(ViTMAEEncoder(model, ("cls_token",)))
        self.readout = TokenReadout(norm=model.layernorm, head_layers=[])

    def own_output(self, prepared: ImageBatch) -> Tensor:
        """(B, D) the model's own [CLS] embedding, its patches kept in raster order (ascending ``noise``)."""
        images = prepared.images
        noise = in_order_noise(images, self.patch_conv_patches(images))
        return self.model(pixel_values=images, noise=noise).last_hidden_state[:, 0]

    def patch_conv_patches(self, images: Tensor) -> int:
        """P, the number of patches of these images."""
        H, W = images.shape[-2:]
        return (H // self.patch_size[0]) * (W // self.patch_size[1])


__all__ = ["HFViTMAEAdapter", "ViTMAEEncoder", "in_order_noise"]

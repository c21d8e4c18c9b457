"""Idefics3 and SmolVLM (Hugging Face ``Idefics3ForConditionalGeneration`` / ``SmolVLMForConditionalGeneration``,
docs/METHODS.md §2g).

The two classes compute the same thing (SmolVLM's modules are Idefics3's under other names):

* the **vision transformer** (``vision_model``): a SigLIP-like ViT without a class token — a patch convolution
  plus a learned position embedding whose ids are *bucketised* (the image's patch grid laid over the trained
  ``num_patches_per_side``² grid, so any square multiple of the patch size is read), then CLIP's pre-LN blocks
  (:func:`~lrp_core.adapters.clip.clip_block`), all of them;
* the **connector**: ``post_layernorm``, then a **pixel shuffle** (space-to-depth: each language-model image
  token concatenates the features of an s × s square of neighbouring patches, s = ``scale_factor``; a
  permutation of the features, so relevance passes through it exactly, by the inverse permutation), then the
  bias-free ``modality_projection`` Linear;
* a Llama language model.

Inputs: the processor's ``pixel_values`` (B, k, 3, H, W) — k square images per row (with image splitting, a
large image is k − 1 crops and a downscaled global image, each an image of the row) — and its
``pixel_attention_mask`` (B, k, H, W), read as the model reads it (a patch is valid if one of its pixels is; the
valid patches a rectangle at the top left: their bucketised positions, the padded patches masked as keys in the
tower's attention). An all-zero image is the model's padding image, which it drops: refused. One image per row
gives ``pixels`` and ``upsample()``; several (crops, or several images) are scored token by token (the base's
rule; with splitting the global image is the row's last).

Shapes: B rows, k images per row, (h, w) the patch grid, s the scale factor, P = h·w / s² image tokens per image,
D_v the tower's width, D the language model's width.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

import torch
from torch import Tensor, nn

from ..errors import InputError
from ..rules.ops import LINEAR, PATCH_CONV, POS_ADD
from .batches import ImageBatch, VLMBatch
from .blocks import NO_RECORD, BlockSpec, Replay
from .checks import pixel_values
from .clip import clip_block
from .parts import ModelPart
from .records import EmbeddingRecord
from .towers import TOWERS, VisionTower
from .vit import Encoder
from .vlm import VLMAdapter


def bucketised_position_ids(patch_mask: Tensor, per_side: int) -> Tensor:
    """The position ids of the patches, as the model's vision embeddings compute them: an image's valid patches
    form an n_h × n_w rectangle at the top left of its grid; its patch row i takes the bucket of i / n_h on the
    trained ``per_side``-wide grid (column j that of j / n_w; float32, as the model); a padding patch takes id 0.

    Parameters
    ----------
    patch_mask : Tensor
        (B, h, w) bool, the valid patches.
    per_side : int
        ``num_patches_per_side`` of the position embedding.

    Returns
    -------
    Tensor
        (B, h·w) long, raster order.
    """
    B, h, w = patch_mask.shape
    device = patch_mask.device
    boundaries = torch.arange(1 / per_side, 1.0, 1 / per_side, device=device)
    coords = []
    for n, size in ((patch_mask[:, :, 0].sum(dim=1), h), (patch_mask[:, 0, :].sum(dim=1), w)):
        step = 1.0 / n
        frac = torch.arange(size, device=device, dtype=torch.float32)[None, :] * step[:, None]
        coords.append(torch.bucketize(torch.clamp(frac, max=1.0 - 1e-6), boundaries, right=True))
    ids = (coords[0][:, :, None] * per_side + coords[1][:, None, :]).reshape(B, -1)
    return torch.where(patch_mask.reshape(B, -1), ids, torch.zeros_like(ids))


def patch_mask_of(pixel_mask: Tensor, patch_size: tuple) -> Tensor:
    """The valid patches of ``pixel_mask`` (N, H, W): those with a valid pixel, as the model reads them.

    Returns
    -------
    Tensor
        (N, H / ph, W / pw) bool.
    """
    N, H, W = pixel_mask.shape
    ph, pw = patch_size
    return pixel_mask.reshape(N, H // ph, ph, W // pw, pw).sum(dim=(2, 4)) > 0


def pixel_shuffle(x: Tensor, grid: tuple, s: int) -> Tensor:
    """Space-to-depth: token (I, J) of the (h/s, w/s) grid is the channels of patches (I·s + e, J·s + a),
    e, a < s, concatenated e-major — the model's ``pixel_shuffle`` written as one reshape and permutation.

    Parameters
    ----------
    x : Tensor
        (B, h·w, D_v), raster order.
    grid : tuple
        (h, w).
    s : int
        The scale factor.

    Returns
    -------
    Tensor
        (B, h·w / s², s²·D_v).
    """
    B, _, D = x.shape
    h, w = grid
    return x.reshape(B, h // s, s, w // s, s, D).permute(0, 1, 3, 2, 4, 5).reshape(B, -1, s * s * D)


def pixel_unshuffle(x: Tensor, grid: tuple, s: int) -> Tensor:
    """The inverse permutation of :func:`pixel_shuffle`: (B, h·w / s², s²·D_v) -> (B, h·w, D_v)."""
    B, _, SD = x.shape
    h, w = grid
    D = SD // (s * s)
    return x.reshape(B, h // s, w // s, s, s, D).permute(0, 1, 3, 2, 4, 5).reshape(B, h * w, D)


class Idefics3VisionEncoder(Encoder):
    """``Idefics3VisionTransformer`` (SmolVLM's alike): patch convolution, bucketised learned positions, CLIP's
    pre-LN blocks (:func:`~lrp_core.adapters.clip.clip_block`); its ``post_layernorm`` is the connector's first
    step (:class:`Idefics3Adapter`)."""

    def __init__(self, module: ModelPart):
        super().__init__(module)
        emb = module.embeddings
        self.patch_conv = emb.patch_embedding
        ps = emb.patch_size
        self.patch_size = (ps, ps) if isinstance(ps, int) else tuple(ps)
        self.image_size = None  # bucketised positions: any multiple of the patch size
        self.num_prefix_tokens = 0

    @staticmethod
    def layers_of(module: ModelPart) -> ModelPart:
        return module.encoder.layers

    def block(self, i: int, layer: nn.Module) -> BlockSpec:
        return clip_block(layer, self.module.config)

    def embed(
        self, images: Tensor, r: Replay = NO_RECORD, track: bool = False, patch_mask: Optional[Tensor] = None
    ) -> EmbeddingRecord:
        """The patch convolution, plus the position embedding at the bucketised ids
        (:func:`bucketised_position_ids`; ``patch_mask`` (N, h, w) the valid patches, default all)."""
        emb = self.module.embeddings
        if track:
            images = images.detach().requires_grad_(True)
        patches = r.module(PATCH_CONV, self.patch_conv, images.to(self.patch_conv.weight.dtype))
        if patch_mask is None:
            patch_mask = torch.ones(images.shape[0], *patches.shape[-2:], dtype=torch.bool, device=images.device)
        patches = patches.flatten(2).transpose(1, 2)
        ids = bucketised_position_ids(patch_mask.to(images.device), emb.num_patches_per_side)
        x_pos = r(POS_ADD, torch.add, patches, emb.position_embedding(ids))
        return EmbeddingRecord(x0=x_pos, embeds=patches, tokens=patches, x_pos=x_pos, images=images, patches=patches)


class Idefics3VisionTower(VisionTower):
    """The Idefics3 vision transformer as a VLM tower (:class:`Idefics3VisionEncoder`)."""

    tower_class = "Idefics3VisionTransformer"

    @staticmethod
    def encoder_of(module: ModelPart) -> Encoder:
        return Idefics3VisionEncoder(module)

    def embed(self, prepared: ImageBatch, r: Replay = NO_RECORD, track: bool = False) -> EmbeddingRecord:
        """The encoder's input layer; ``prepared.patch_mask`` (N, h, w) the valid patches (default all)."""
        assert isinstance(self.encoder, Idefics3VisionEncoder), "the tower replays its encoder"
        return self.encoder.embed(prepared.images, r, track, prepared.patch_mask)


class SmolVLMVisionTower(Idefics3VisionTower):
    """``SmolVLMVisionTransformer``: Idefics3's vision transformer under SmolVLM's names."""

    tower_class = "SmolVLMVisionTransformer"


TOWERS.update({cls.tower_class: cls for cls in (Idefics3VisionTower, SmolVLMVisionTower)})


class Idefics3Adapter(VLMAdapter):
    """``Idefics3ForConditionalGeneration`` / ``SmolVLMForConditionalGeneration``: the vision transformer (every
    layer) → ``post_layernorm`` → pixel shuffle → ``modality_projection`` → the Llama language model's image
    tokens."""

    image_inputs = ("pixel_values", "pixel_attention_mask")

    def _parts(self) -> tuple[ModelPart, ModelPart, Any, ModelPart, int]:
        cfg = self.model.config
        base = self.model.model
        self.scale = int(cfg.scale_factor)
        self.post_norm = base.vision_model.post_layernorm
        self.projection = base.connector.modality_projection.proj
        return base.text_model, self.model.lm_head, cfg.get_text_config(), base.vision_model, -1

    # ------------------------------------------------------------ validation
    def check_inputs(self, inputs) -> VLMBatch:
        """The processor's output: ``input_ids``, ``attention_mask``, ``pixel_values`` (B, k, 3, H, W) (or
        (B·k, 3, H, W)) of square images whose patch grid the scale factor divides, and ``pixel_attention_mask``
        (B, k, H, W) (or none: no padding). The batch's ``patch_mask`` (B, k, h, w) bool holds the valid patches
        where some image is padded."""
        name = type(self.model).__name__
        if not isinstance(inputs, Mapping) or "input_ids" not in inputs or inputs.get("pixel_values") is None:
            return super().check_inputs(inputs)  # the base's message for what is missing
        images = pixel_values(inputs["pixel_values"])
        if images.dim() == 5:
            mask_shape = images.shape[:2] + images.shape[-2:]
            images = images.reshape(-1, *images.shape[2:])
        elif images.dim() == 4:
            mask_shape = images.shape[:1] + images.shape[-2:]
        else:
            raise InputError(
                f"{name}: pixel_values must be (B, k, 3, H, W) (the processor's) or (B·k, 3, H, W); "
                f"got {tuple(images.shape)}"
            )
        H, W = images.shape[-2:]
        ph, pw = self.tower.patch_size
        if H != W or H % ph or (H // ph) % self.scale:
            raise InputError(
                f"{name} reads square images whose patch grid its pixel shuffle (scale factor "
                f"{self.scale}) divides: a side that is a multiple of {ph * self.scale}; got {H}×{W}"
            )
        if images.is_floating_point():
            zero = (images == 0).flatten(1).all(dim=1)
            if bool(zero.any()):
                raise InputError(
                    f"image {int(zero.nonzero()[0, 0])} of pixel_values is all zeros, which the model "
                    "takes for a padding image and drops: the same number of real images in every "
                    "row is explained"
                )
        mask = inputs.get("pixel_attention_mask")
        patch_mask = None
        if mask is not None:
            mask = torch.as_tensor(mask)
            if tuple(mask.shape) != tuple(mask_shape):
                raise InputError(
                    f"pixel_attention_mask must be {tuple(mask_shape)} (one mask per image); got {tuple(mask.shape)}"
                )
            patch_mask = patch_mask_of(mask.reshape(-1, H, W).to(images.device), self.tower.patch_size)
            n_h, n_w = patch_mask[:, :, 0].sum(dim=1), patch_mask[:, 0, :].sum(dim=1)
            h, w = patch_mask.shape[1:]
            rect = (torch.arange(h, device=n_h.device)[None, :, None] < n_h[:, None, None]) & (
                torch.arange(w, device=n_w.device)[None, None, :] < n_w[:, None, None]
            )
            bad = torch.nonzero(~(patch_mask == rect).flatten(1).all(dim=1) | (n_h == 0)).flatten().tolist()
            if bad:
                raise InputError(
                    f"pixel_attention_mask of image {bad[0]}: the valid pixels must cover a rectangle "
                    "at the image's top left, at least one patch (the processor pads at the bottom "
                    "and the right), as the model's position ids assume"
                )
            if bool(patch_mask.all()):
                patch_mask = None  # unpadded: the tower's default
        rest = {k: v for k, v in inputs.items() if k != "pixel_attention_mask"}
        prepared = super().check_inputs({**rest, "pixel_values": images})
        if patch_mask is None:
            return prepared
        return prepared.replace(patch_mask=patch_mask.reshape(*prepared.pixel_values.shape[:2], *patch_mask.shape[1:]))

    def own_inputs(self, prepared: VLMBatch) -> dict:
        """The text's, the images (B, k, 3, H, W) and, where some image is padded, the pixel mask of its patches."""
        out = {**self.text.own_inputs(prepared), "pixel_values": prepared.pixel_values}
        if prepared.patch_mask is not None:
            ph, pw = self.tower.patch_size
            out["pixel_attention_mask"] = prepared.patch_mask.repeat_interleave(ph, -2).repeat_interleave(pw, -1)
        return out

    # ------------------------------------------------------------ forward
    def _patch_mask(self, prepared: VLMBatch) -> Tensor:
        """(B · k, h, w) bool: the real patches of ``pixel_attention_mask`` (all, where it is not given)."""
        stacked = prepared.pixel_values  # (B, k, 3, H, W)
        B, k = stacked.shape[:2]
        mask = prepared.patch_mask
        if mask is None:
            ph, pw = self.tower.patch_size
            mask = torch.ones(
                B, k, stacked.shape[-2] // ph, stacked.shape[-1] // pw, dtype=torch.bool, device=stacked.device
            )
        return mask.reshape(B * k, *mask.shape[2:])

    def tower_inputs(self, prepared: VLMBatch, images: Tensor) -> ImageBatch:
        """The images and their patch mask: padded patches get position id 0, as in the model."""
        return ImageBatch(images=images, patch_mask=self._patch_mask(prepared))

    def tower_bias(self, prepared: VLMBatch, x: Tensor) -> Optional[Tensor]:
        """A key mask in every tower block (−inf on the padded patches' scores, as the model's attention mask);
        padded patches still reach the connector, as in the model. It is added for unpadded images too (zeros):
        every image's relevance then takes the same path whatever the others in the batch (the explicit rules'
        share of a mask add of zero is the scores' up to their stabiliser)."""
        flat = self._patch_mask(prepared)
        bias = torch.zeros(flat.shape[0], 1, 1, x.shape[1], dtype=x.dtype, device=x.device)
        return bias.masked_fill(~flat.reshape(flat.shape[0], 1, 1, -1).to(x.device), float("-inf"))

    # ------------------------------------------------------------ the connector
    def _grid(self, tokens: int) -> tuple:
        side = int(round(tokens**0.5))
        return side, side

    def connect(self, selected: Tensor, r: Replay) -> tuple[dict, Tensor]:
        """``modality_projection(pixel_shuffle(post_layernorm(selected)))``."""
        normed = r.norm(self.post_norm, selected)
        shuffled = pixel_shuffle(normed, self._grid(selected.shape[1]), self.scale)
        out = r.module(LINEAR, self.projection, shuffled)
        return {"post_layernorm": normed, "shuffled": shuffled}, out

    def patch_tokens(self, grid: tuple) -> Tensor:
        """Patch (i, j) is carried by token (i // s)·(w / s) + j // s."""
        h, w = grid
        rows, cols = torch.div(torch.arange(h * w), w, rounding_mode="floor"), torch.arange(h * w) % w
        return (rows // self.scale) * (w // self.scale) + cols // self.scale

    def tokens_per_image(self, grid: tuple) -> int:
        return grid[0] * grid[1] // (self.scale * self.scale)


__all__ = [
    "Idefics3Adapter",
    "Idefics3VisionEncoder",
    "Idefics3VisionTower",
    "SmolVLMVisionTower",
    "bucketised_position_ids",
    "patch_mask_of",
    "pixel_shuffle",
    "pixel_unshuffle",
]

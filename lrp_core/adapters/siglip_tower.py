"""The SigLIP / SigLIP 2 vision tower (Hugging Face ``SiglipVisionModel`` / ``Siglip2VisionModel``), described once.

The image encoder of the SigLIP classifiers and similarity models (:mod:`~lrp_core.adapters.siglip`) and of
PaliGemma, Gemma 3 and other vision-language models (:mod:`~lrp_core.adapters.towers`): a ViT without a class
token — every token is a patch. Its input layer is a patch embedding plus a learned position embedding (no
pre-norm); its blocks are CLIP's pre-LN blocks (``layer_norm1`` → attention → residual, ``layer_norm2`` →
two-layer MLP → residual); ``post_layernorm`` follows the last block (a reader's norm). docs/METHODS.md §2m.
SigLIP 2 takes its processor's patch vectors ``(B, P, p·p·C)``; the replay lays them back on their grid
(:func:`patches_to_images`) and reads the patch Linear as the convolution it equals (:class:`PatchLinearConv`).

* :class:`SiglipVisionEncoder` ``(vision_model, name, trained_size=False)``: the tower as an
  :class:`~lrp_core.adapters.vit.Encoder` (geometry, :func:`siglip_embed`, :func:`siglip_block` per layer).
* :func:`siglip_vision_blocks` / :func:`siglip_block`: the layers' pre-LN descriptions.
* :func:`siglip_embed` ``(vision_model, images, r=NO_RECORD, track=False, conv=None) -> EmbeddingRecord``:
  images ``(B, C, H, W)`` → block 0's input ``(B, P, D)``, positions as the model computes them for that size.
* :func:`siglip_patch_conv` (the patch embedding as a convolution), :func:`siglip_patch_size`,
  :func:`is_siglip2_tower`, :func:`patches_to_images`, :func:`check_siglip_tower` (refuses a tower the pieces
  do not describe).

Shapes: B batch, P = N patches (no prefix token), D width.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from ..errors import InputError, UnsupportedModelError
from ..rules.linear import is_linear
from ..rules.ops import PATCH_CONV, POS_ADD
from .blocks import NO_RECORD, BlockSpec, Replay
from .clip import clip_block
from .parts import ModelPart
from .records import EmbeddingRecord
from .vit import Encoder


def is_siglip2_tower(vision_model: nn.Module) -> bool:
    """Whether the tower is SigLIP 2's: a Linear patch embedding on patchified pixels, positions resized per image.

    Parameters
    ----------
    vision_model : nn.Module
        A SigLIP or SigLIP 2 vision tower.

    Returns
    -------
    bool
        ``True`` for SigLIP 2's layout (``patch_embedding`` a Linear, ``resize_positional_embeddings`` present).
    """
    emb = getattr(vision_model, "embeddings", None)
    return is_linear(getattr(emb, "patch_embedding", None)) and hasattr(emb, "resize_positional_embeddings")


def check_siglip_tower(vision_model: ModelPart, name: str) -> None:
    """Refuse a SigLIP vision tower whose parts the replay does not describe.

    Parameters
    ----------
    vision_model : nn.Module
        A ``SiglipVisionModel`` or ``Siglip2VisionModel`` (``embeddings.patch_embedding`` a Conv2d, or SigLIP 2's
        Linear with ``resize_positional_embeddings``; ``encoder.layers`` of pre-LN layers; ``post_layernorm``).
    name : str
        The user's model class, for the message.

    Raises
    ------
    UnsupportedModelError
        Where the patch embedding is neither, or a layer's projections are not Linear layers.
    """
    emb = getattr(vision_model, "embeddings", None)
    if not (isinstance(getattr(emb, "patch_embedding", None), nn.Conv2d) or is_siglip2_tower(vision_model)):
        raise UnsupportedModelError(
            f"{name}: the vision tower's patch embedding is neither a Conv2d (SigLIP) nor "
            "SigLIP 2's Linear on patchified pixels"
        )
    for i, layer in enumerate(vision_model.encoder.layers):
        att = layer.self_attn
        parts = (att.q_proj, att.k_proj, att.v_proj, att.out_proj, layer.mlp.fc1, layer.mlp.fc2)
        if not all(is_linear(p) for p in parts):
            raise UnsupportedModelError(f"{name}: layer {i}'s projections are not all Linear layers")


class PatchLinearConv(nn.Module):
    """SigLIP 2's patch Linear (on patch vectors laid out ``(row in patch, column in patch, channel)``, as its
    image processor patchifies) read as the Conv2d it equals on ``(B, C, H, W)`` images: kernel = stride = p,
    weight ``W.reshape(D, p, p, C).permute(0, 3, 1, 2)`` (a view of the model's weight, read at every call; the
    module owns no parameters). The zᴮ rule and the replay see an ordinary patch convolution."""

    linear: ModelPart  # the model's patch Linear (set in __init__, not as a child module)

    def __init__(self, linear: ModelPart, patch_size: int, channels: int):
        super().__init__()
        object.__setattr__(self, "linear", linear)  # not a child module: no parameters of its own
        self.kernel_size = self.stride = (int(patch_size), int(patch_size))
        self.padding = (0, 0)
        self.in_channels, self.out_channels = int(channels), int(linear.weight.shape[0])

    @property
    def weight(self) -> Tensor:
        """(D, C, p, p): the Linear's weight as convolution kernels."""
        p, C = self.kernel_size[0], self.in_channels
        return self.linear.weight.reshape(self.out_channels, p, p, C).permute(0, 3, 1, 2)

    @property
    def bias(self) -> Optional[Tensor]:
        return self.linear.bias

    def forward(self, x: Tensor) -> Tensor:
        """(B, C, H, W) -> (B, D, H/p, W/p)."""
        return torch.nn.functional.conv2d(x, self.weight, self.bias, stride=self.stride)


def siglip_patch_conv(vision_model: ModelPart) -> ModelPart:
    """The tower's patch embedding as a convolution on ``(B, C, H, W)``.

    Parameters
    ----------
    vision_model : nn.Module
        A SigLIP or SigLIP 2 vision tower.

    Returns
    -------
    nn.Module
        SigLIP's Conv2d itself, or SigLIP 2's Linear as a :class:`PatchLinearConv` (a new view per call).
    """
    emb = vision_model.embeddings
    if not is_siglip2_tower(vision_model):
        return emb.patch_embedding
    return PatchLinearConv(emb.patch_embedding, emb.patch_size, vision_model.config.num_channels)


def patches_to_images(
    pixels: Tensor, spatial_shapes: Tensor, mask: Optional[Tensor], patch_size: int, channels: int
) -> Tensor:
    """SigLIP 2's processor output → images: patch vectors ``(B, P_max, p·p·C)`` of one grid ``(h, w)`` for the whole
    batch, the first ``h·w`` of each row real (``pixel_attention_mask`` 1), the rest padding → ``(B, C, h·p, w·p)``.

    The padding is dropped: the model masks it out of every attention (its keys get the dtype's minimum, so their
    weights are exactly 0) and out of the mean, so the images alone give the same logits.

    Parameters
    ----------
    pixels : Tensor
        The patch vectors ``(B, P_max, p·p·C)``, each laid out (row in patch, column in patch, channel).
    spatial_shapes : Tensor
        ``(B, 2)`` each image's grid ``(h, w)``; one grid for the batch.
    mask : Tensor or None
        ``pixel_attention_mask`` ``(B, P_max)``: 1 on the first ``h·w`` patches, 0 after (``None``: not checked).
    patch_size : int
        p.
    channels : int
        C.

    Returns
    -------
    Tensor
        The images ``(B, C, h·p, w·p)``.

    Raises
    ------
    InputError
        For images of different grids in one batch, a mask that is not 1 on the first ``h·w`` patches and 0 after, or
        shapes that do not fit.
    """
    if pixels.dim() != 3 or spatial_shapes.shape != (pixels.shape[0], 2):
        raise InputError(
            f"SigLIP 2's inputs: pixel_values (B, P, {channels}·p·p) and spatial_shapes (B, 2); got "
            f"{tuple(pixels.shape)} and {tuple(spatial_shapes.shape)}"
        )
    shapes = spatial_shapes.long()
    if not (shapes == shapes[:1]).all():
        raise InputError(
            f"the images of one call must share one patch grid; spatial_shapes has "
            f"{sorted({tuple(t) for t in shapes.tolist()})}: explain each grid in a call of its own "
            "(images of one size, or the processor called per image)"
        )
    h, w = (int(v) for v in shapes[0])
    B, P, F = pixels.shape
    p, C = int(patch_size), int(channels)
    if F != p * p * C or h * w > P or h < 1 or w < 1:
        raise InputError(f"pixel_values {tuple(pixels.shape)} does not hold a {h}×{w} grid of {p}×{p}×{C} patches")
    if mask is not None:
        expected = torch.zeros(B, P, dtype=torch.long, device=mask.device)
        expected[:, : h * w] = 1
        if not torch.equal(mask.long(), expected):
            raise InputError(
                "pixel_attention_mask must be 1 on the first h·w patches of every image (its grid, "
                "spatial_shapes) and 0 on the padding after them"
            )
    grid = pixels[:, : h * w].reshape(B, h, w, p, p, C)
    return grid.permute(0, 5, 1, 3, 2, 4).reshape(B, C, h * p, w * p)


def siglip_vision_blocks(vision_model: ModelPart) -> list[BlockSpec]:
    """The blocks of a SigLIP vision tower: CLIP's pre-LN block, one per encoder layer.

    Parameters
    ----------
    vision_model : nn.Module
        The ``SiglipVisionModel`` (``encoder.layers``, ``config``).

    Returns
    -------
    list of BlockSpec
        One pre-LN description per layer, input first (:func:`siglip_block`).
    """
    return [siglip_block(layer, vision_model) for layer in vision_model.encoder.layers]


def siglip_block(layer: nn.Module, vision_model: nn.Module) -> BlockSpec:
    """One encoder layer of a SigLIP vision tower as a pre-LN block (see :func:`siglip_vision_blocks`).

    Parameters
    ----------
    layer : nn.Module
        The ``SiglipEncoderLayer``.
    vision_model : nn.Module
        The tower it belongs to (its ``config``: heads, width, attention implementation).

    Returns
    -------
    BlockSpec
        CLIP's block description (:func:`~lrp_core.adapters.clip.clip_block`: the softmax in float32 under eager
        attention, as the model's kernel).
    """
    return clip_block(layer, vision_model.config)


def siglip_patch_size(vision_model: ModelPart) -> tuple:
    """The patch size.

    Parameters
    ----------
    vision_model : nn.Module
        A SigLIP or SigLIP 2 vision tower.

    Returns
    -------
    tuple of int
        ``(ph, pw)``: the patch convolution's stride (its kernel size).
    """
    ps = siglip_patch_conv(vision_model).kernel_size
    return (ps, ps) if isinstance(ps, int) else tuple(ps)


def siglip_embed(
    vision_model: ModelPart,
    images: Tensor,
    r: Replay = NO_RECORD,
    track: bool = False,
    conv: Optional[ModelPart] = None,
) -> EmbeddingRecord:
    """The tower's input layer: patch convolution, then the position embedding added (no prefix token, no norm).

    SigLIP: the position embedding is the model's own ``interpolate_pos_encoding`` for the image size: the stored
    embedding at the trained square size, Hugging Face's bicubic resampling of the grid elsewhere — what the
    model computes with ``interpolate_pos_encoding=True`` (and, at the trained size, without it). SigLIP 2: the
    patch Linear as a convolution (:class:`PatchLinearConv`) and the model's own ``resize_positional_embeddings``
    to the image's grid (what it computes for these images patchified, without padding).

    Parameters
    ----------
    vision_model : nn.Module
        The ``SiglipVisionModel``.
    images : Tensor
        ``(B, C, H, W)``, H and W multiples of the patch size (validated by the caller).
    r : Replay
        Runs (and records) each operation through its rule; :data:`NO_RECORD` computes plainly.
    track : bool
        Make ``images`` a leaf that requires gradients (input-space relevance of the modified-gradient methods).
    conv : nn.Module, optional
        The patch convolution to run (default :func:`siglip_patch_conv`); pass the one the relevance pass will
        name, so that a composite's first-layer rule finds the same module.

    Returns
    -------
    EmbeddingRecord
        ``x0 = x_pos`` ``(B, P, D)``; ``embeds = tokens = patches`` the convolution's output as tokens.
    """
    emb = vision_model.embeddings
    conv = siglip_patch_conv(vision_model) if conv is None else conv
    if track:
        images = images.detach().requires_grad_(True)
    H, W = images.shape[-2:]
    patches = r.module(PATCH_CONV, conv, images.to(conv.weight.dtype)).flatten(2).transpose(1, 2)  # (B, P, D)
    if is_siglip2_tower(vision_model):
        side = emb.position_embedding_size
        h, w = H // conv.stride[0], W // conv.stride[1]
        shapes = torch.tensor([[h, w]] * images.shape[0], device=images.device)
        pos = emb.resize_positional_embeddings(
            emb.position_embedding.weight.reshape(side, side, -1), shapes, max_length=h * w
        )  # (B, P, D)
    else:
        pos = emb.interpolate_pos_encoding(patches, H, W)  # (1, P, D)
    x_pos = r(POS_ADD, torch.add, patches, pos)
    return EmbeddingRecord(x0=x_pos, embeds=patches, tokens=patches, x_pos=x_pos, images=images, patches=patches)


class SiglipVisionEncoder(Encoder):
    """A SigLIP / SigLIP 2 vision tower as an encoder: no prefix token, :func:`siglip_embed`, one
    :func:`siglip_block` per layer. ``trained_size``: the images must have the config's ``image_size`` (a reader
    whose model runs the tower without ``interpolate_pos_encoding``, as the VLMs do); else any multiple of the
    patch size, the positions resampled as the model's ``interpolate_pos_encoding=True``. ``name``: whose tower,
    for a refusal (:func:`check_siglip_tower`)."""

    def __init__(self, module: ModelPart, name: str, trained_size: bool = False):
        check_siglip_tower(module, name)
        super().__init__(module)
        self.patch_conv = siglip_patch_conv(module)
        self.patch_size = siglip_patch_size(module)
        self.image_size = None
        if trained_size:
            size = module.config.image_size
            self.image_size = (size, size) if isinstance(size, int) else tuple(size)
        self.num_prefix_tokens = 0

    @staticmethod
    def layers_of(module: ModelPart) -> ModelPart:
        return module.encoder.layers

    def block(self, i: int, layer: nn.Module) -> BlockSpec:
        return siglip_block(layer, self.module)

    def embed(self, images: Tensor, r: Replay = NO_RECORD, track: bool = False) -> EmbeddingRecord:
        """:func:`siglip_embed` with the encoder's patch convolution (the module a first-layer rule names)."""
        return siglip_embed(self.module, images, r, track, conv=self.patch_conv)


__all__ = [
    "PatchLinearConv",
    "SiglipVisionEncoder",
    "check_siglip_tower",
    "is_siglip2_tower",
    "patches_to_images",
    "siglip_block",
    "siglip_embed",
    "siglip_patch_conv",
    "siglip_patch_size",
    "siglip_vision_blocks",
]

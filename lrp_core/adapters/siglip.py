"""SigLIP (Hugging Face ``SiglipForImageClassification``) and the SigLIP vision tower as reusable pieces.

The SigLIP vision tower (``SiglipVisionModel``, the image encoder of PaliGemma, Gemma 3, LLaVA-OneVision and
other vision-language models) is a ViT without a class token: every token is a patch. Its input layer is a
patch convolution plus a learned position embedding (no pre-norm); its blocks are CLIP's pre-LN blocks
(``layer_norm1`` → attention → residual, ``layer_norm2`` → two-layer MLP → residual); ``post_layernorm``
follows the last block. ``SiglipForImageClassification`` reads the mean of all tokens after
``post_layernorm`` with one Linear (:class:`~lrp_core.adapters.readouts.MeanReadout` from token 0;
docs/METHODS.md §4.5). The attention-pooling head (``vision_model.head``, present when
``vision_use_head``) is computed by the model but not read by the classifier, so the replay leaves it out.

Reusable pieces, for an adapter whose vision tower is a ``SiglipVisionModel`` (``vision_model`` below is that
module: ``embeddings``, ``encoder.layers``, ``post_layernorm``, ``config``):

* :func:`siglip_vision_blocks` ``(vision_model) -> list[BlockSpec]``: one pre-LN description per encoder
  layer, input first (truncate the list for a feature read at an earlier layer).
* :func:`siglip_embed` ``(vision_model, images, r=NO_RECORD, track=False) -> EmbeddingRecord``: images
  ``(B, C, H, W)`` (H, W multiples of the patch size) → block 0's input ``(B, P, D)``, with the model's own
  ``interpolate_pos_encoding`` (the stored grid itself at the trained size, bicubic resampling elsewhere).
* :func:`siglip_input_relevance` ``(vision_model, emb, R0, prop) -> (scores (B, P), pixels (B, H, W))``: block
  0's input relevance through the position add and the patch convolution (zᴮ) to the pixels.
* :func:`siglip_patch_size` ``(vision_model) -> (ph, pw)``.
* :func:`check_siglip_tower` ``(vision_model, name)``: refuses a tower the pieces do not describe.

Shapes: B batch, P = N patches (no prefix token), D width, C classes.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..errors import UnsupportedModelError
from ..rules.composites import Propagation
from ..rules.linear import is_linear
from ..rules.ops import LINEAR, PATCH_CONV, POS_ADD
from .blocks import NO_RECORD, BlockSpec, Replay
from .clip import clip_block
from .readouts import HeadLayer, MeanReadout, Readout
from .records import EmbeddingRecord, Trace
from .vit import ViTAdapter, hf_linear_head


def check_siglip_tower(vision_model: nn.Module, name: str) -> None:
    """Refuse a SigLIP vision tower whose parts the replay does not describe.

    Parameters
    ----------
    vision_model : nn.Module
        A ``SiglipVisionModel`` (or a module with its layout: ``embeddings.patch_embedding`` a Conv2d,
        ``encoder.layers`` of pre-LN layers, ``post_layernorm``).
    name : str
        The user's model class, for the message.

    Raises
    ------
    UnsupportedModelError
        Where the patch embedding is not a Conv2d or a layer's projections are not Linear layers.
    """
    emb = getattr(vision_model, "embeddings", None)
    if not isinstance(getattr(emb, "patch_embedding", None), nn.Conv2d):
        raise UnsupportedModelError(f"{name}: the vision tower's patch embedding is not a Conv2d (a SigLIP 2 "
                                    "NaFlex tower embeds patchified pixels with a Linear; it is not described)")
    for i, layer in enumerate(vision_model.encoder.layers):
        att = layer.self_attn
        parts = (att.q_proj, att.k_proj, att.v_proj, att.out_proj, layer.mlp.fc1, layer.mlp.fc2)
        if not all(is_linear(p) for p in parts):
            raise UnsupportedModelError(f"{name}: layer {i}'s projections are not all Linear layers")


def _eager(vision_model: nn.Module) -> bool:
    """Whether the tower runs Hugging Face's eager attention (its softmax in float32, cast back)."""
    return getattr(vision_model.config, "_attn_implementation", "eager") == "eager"


def siglip_vision_blocks(vision_model: nn.Module) -> list[BlockSpec]:
    """The blocks of a SigLIP vision tower: CLIP's pre-LN block, one per encoder layer.

    Parameters
    ----------
    vision_model : nn.Module
        The ``SiglipVisionModel`` (``encoder.layers``, ``config``).

    Returns
    -------
    list of BlockSpec
        One pre-LN description per layer, input first. Under eager attention the softmax is described in
        float32 (Hugging Face's eager kernel), so a float64 model is replayed with the model's own round-off.
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
        CLIP's block description, the softmax in float32 under eager attention.
    """
    spec = clip_block(layer, vision_model.config)
    spec.attn.softmax_dtype = torch.float32 if _eager(vision_model) else None
    return spec


def siglip_patch_size(vision_model: nn.Module) -> tuple:
    """``(ph, pw)``: the patch convolution's stride (its kernel size)."""
    ps = vision_model.embeddings.patch_embedding.kernel_size
    return (ps, ps) if isinstance(ps, int) else tuple(ps)


def siglip_embed(vision_model: nn.Module, images: Tensor, r: Replay = NO_RECORD,
                 track: bool = False) -> EmbeddingRecord:
    """The tower's input layer: patch convolution, then the position embedding added (no prefix token, no norm).

    The position embedding is the model's own ``interpolate_pos_encoding`` for the image size: the stored
    embedding at the trained square size, Hugging Face's bicubic resampling of the grid elsewhere — what the
    model computes with ``interpolate_pos_encoding=True`` (and, at the trained size, without it).

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

    Returns
    -------
    EmbeddingRecord
        ``x0 = x_pos`` ``(B, P, D)``; ``embeds = tokens = patches`` the convolution's output as tokens.
    """
    emb = vision_model.embeddings
    conv = emb.patch_embedding
    if track:
        images = images.detach().requires_grad_(True)
    H, W = images.shape[-2:]
    patches = r.module(PATCH_CONV, conv, images.to(conv.weight.dtype)).flatten(2).transpose(1, 2)  # (B, P, D)
    pos = emb.interpolate_pos_encoding(patches, H, W)  # (1, P, D)
    x_pos = r(POS_ADD, torch.add, patches, pos)
    return EmbeddingRecord(x0=x_pos, embeds=patches, tokens=patches, x_pos=x_pos, images=images, patches=patches)


def siglip_input_relevance(vision_model: nn.Module, emb: EmbeddingRecord, R0: Tensor,
                           prop: Propagation) -> tuple[Tensor, Tensor]:
    """Relevance of block 0's input → the patches and the pixels: the position add (the patches' share), then
    the zᴮ rule on the patch convolution (docs/METHODS.md §1.13).

    Parameters
    ----------
    vision_model : nn.Module
        The ``SiglipVisionModel``.
    emb : EmbeddingRecord
        What :func:`siglip_embed` recorded for the batch.
    R0 : Tensor
        The relevance of block 0's input ``(B, P, D)``.
    prop : Propagation
        The composite's rules.

    Returns
    -------
    tuple of Tensor
        ``(scores (B, P), pixels (B, H, W))``: each patch's relevance and the pixel map.
    """
    (R_patch, _) = prop(POS_ADD, (emb.tokens, None), R0, output=emb.x_pos)
    ph, pw = siglip_patch_size(vision_model)
    B, _, H, W = emb.images.shape
    # token-major (B, P, D) before it is laid on the grid: the zᴮ conv's round-off depends on the layout
    R_map = R_patch.contiguous().transpose(1, 2).reshape(B, -1, H // ph, W // pw)
    (R_px,) = prop(PATCH_CONV, (emb.images,), R_map, module=vision_model.embeddings.patch_embedding)
    pixels = R_px.sum(dim=1)  # (B, H, W)
    scores = pixels.reshape(B, H // ph, ph, W // pw, pw).sum(dim=(2, 4)).reshape(B, -1)
    return scores, pixels


class HFSiglipAdapter(ViTAdapter):
    """Hugging Face ``SiglipForImageClassification``: the SigLIP vision tower, the mean of all tokens, a Linear.

    Any image size that is a multiple of the patch size is accepted; the position grid is resampled as the
    model's ``interpolate_pos_encoding=True`` does (at the trained size: the model's default forward).
    """

    def __init__(self, model: nn.Module):
        super().__init__(model)
        vision = model.vision_model
        check_siglip_tower(vision, type(model).__name__)
        self.vision = vision
        self.patch_conv = vision.embeddings.patch_embedding
        self.patch_size = siglip_patch_size(vision)
        self.image_size = None  # the position grid is interpolated: any multiple of the patch size
        self.num_prefix_tokens = 0
        self.blocks = siglip_vision_blocks(vision)
        self.readout = self._readout(model)

    def _block(self, i: int, layer: nn.Module) -> BlockSpec:
        return siglip_block(layer, self.vision)

    def _readout(self, model: nn.Module) -> Readout:
        """post_layernorm → the mean of every token → classifier (HF ``torch.mean(..., dim=1)``)."""
        (clf,) = hf_linear_head(model, "classifier")
        return MeanReadout(norm=self.vision.post_layernorm, head_layers=[HeadLayer(LINEAR, clf)], start=0)

    def embed(self, prepared: dict, r: Replay = NO_RECORD, track: bool = False) -> EmbeddingRecord:
        return siglip_embed(self.vision, prepared["images"], r, track)

    def input_relevance(self, trace: Trace, R0: Tensor, prop: Propagation,
                        prepared: dict) -> tuple[Tensor, Tensor]:
        """Block-0 input relevance → patch scores (B, P) and pixels (B, H, W) (:func:`siglip_input_relevance`)."""
        return siglip_input_relevance(self.vision, trace.embedding, R0, prop)


__all__ = ["HFSiglipAdapter", "check_siglip_tower", "siglip_embed", "siglip_block", "siglip_input_relevance",
           "siglip_patch_size", "siglip_vision_blocks"]

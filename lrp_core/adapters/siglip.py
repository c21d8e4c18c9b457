"""SigLIP / SigLIP 2 (Hugging Face) image classifiers and similarity models, and the vision tower as reusable pieces.

The SigLIP vision tower (``SiglipVisionModel``, the image encoder of PaliGemma, Gemma 3, LLaVA-OneVision and
other vision-language models; ``Siglip2VisionModel`` alike) is a ViT without a class token: every token is a
patch. Its input layer is a patch embedding plus a learned position embedding (no pre-norm); its blocks are
CLIP's pre-LN blocks (``layer_norm1`` → attention → residual, ``layer_norm2`` → two-layer MLP → residual);
``post_layernorm`` follows the last block. docs/METHODS.md §2m.

* ``SiglipForImageClassification`` / ``Siglip2ForImageClassification`` (:class:`HFSiglipAdapter`): the mean of
  all tokens after ``post_layernorm``, one Linear (:class:`~lrp_core.adapters.readouts.MeanReadout` from token
  0). The tower's attention-pooling head, if present, is computed by the model but not read by the classifier.
* ``SiglipModel`` / ``Siglip2Model`` (:class:`SiglipImageAdapter`): the image side of the sigmoid similarity
  ``logit_scale.exp() · cos + logit_bias``, the image pooled by the attention-pooling head
  (:class:`AttentionPoolReadout`); a target is a prompt.
* SigLIP 2 takes its processor's patch vectors ``(B, P, p·p·C)``; the replay lays them back on their grid
  (:func:`patches_to_images`: one grid per call, padding dropped) and reads the patch Linear as the convolution it
  equals (:class:`PatchLinearConv`), so SigLIP 2 is explained on ``(B, C, H, W)`` images like SigLIP.

Reusable pieces, for an adapter whose vision tower is a ``SiglipVisionModel`` or ``Siglip2VisionModel``
(``vision_model`` below: ``embeddings``, ``encoder.layers``, ``post_layernorm``, ``config``):

* :func:`siglip_vision_blocks` ``(vision_model) -> list[BlockSpec]``: one pre-LN description per encoder
  layer, input first (truncate the list for a feature read at an earlier layer; ``post_layernorm`` is not a
  block: a readout's norm).
* :func:`siglip_embed` ``(vision_model, images, r=NO_RECORD, track=False, conv=None) -> EmbeddingRecord``:
  images ``(B, C, H, W)`` (H, W multiples of the patch size) → block 0's input ``(B, P, D)``, positions as the
  model computes them for that size (SigLIP: ``interpolate_pos_encoding``; SigLIP 2:
  ``resize_positional_embeddings``).
* :func:`siglip_patch_conv` ``(vision_model) -> nn.Module`` (the patch embedding as a convolution; pass the same
  module as ``conv`` to :func:`siglip_embed`), :func:`siglip_patch_size` ``(vision_model) -> (ph, pw)``,
  :func:`is_siglip2_tower`, :func:`patches_to_images`.
* :func:`check_siglip_tower` ``(vision_model, name)``: refuses a tower the pieces do not describe.

Shapes: B batch, P = N patches (no prefix token), D width, C classes (or P prompts for the similarity).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from ..errors import InputError, UnsupportedModelError
from ..rules.linear import LinearView, is_linear
from ..rules.ops import ADD, ELEMENTWISE, LAYERNORM, LINEAR, MATMUL_AV, MATMUL_QK, PATCH_CONV, POS_ADD, SOFTMAX
from ..runtime.guard import eval_semantics
from ..runtime.precision import compute_precision
from .base import Adapter
from .blocks import NO_RECORD, BlockSpec, Replay
from .checks import pixel_values
from .clip import L2Normalize, _prompts, _scaled_embeddings, clip_block
from .kernels import matmul, plus, scaled_matmul
from .parts import ModelPart
from .readouts import HeadLayer, MeanReadout, Readout, head_layer
from .records import EmbeddingRecord, ReadoutRecord
from .vit import ViTAdapter, hf_linear_head


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


def _eager(vision_model: nn.Module) -> bool:
    """Whether the tower runs Hugging Face's eager attention (its softmax in float32, cast back)."""
    return getattr(vision_model.config, "_attn_implementation", "eager") == "eager"


def siglip_vision_blocks(vision_model: ModelPart) -> list[BlockSpec]:
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


class _SiglipTowerAdapter(ViTAdapter):
    """What the SigLIP image adapters share: the tower ``model.vision_model`` (embedding, blocks, pixels)."""

    def __init__(self, model: ModelPart):
        super().__init__(model)
        vision = model.vision_model
        check_siglip_tower(vision, type(model).__name__)
        self.vision = vision
        self.patch_conv = siglip_patch_conv(vision)
        self.patch_size = siglip_patch_size(vision)
        self.image_size = None  # the position grid is interpolated: any multiple of the patch size
        self.num_prefix_tokens = 0
        self.blocks = siglip_vision_blocks(vision)

    def _block(self, i: int, layer: ModelPart) -> BlockSpec:
        return siglip_block(layer, self.vision)

    def embed(self, prepared: dict, r: Replay = NO_RECORD, track: bool = False) -> EmbeddingRecord:
        return siglip_embed(self.vision, prepared["images"], r, track, conv=self.patch_conv)

    def own_pixels(self, images: Tensor) -> dict:
        """The model's own pixel inputs for images (B, C, H, W): SigLIP's ``pixel_values`` (positions interpolated
        away from the trained size, as the replay resamples them), or SigLIP 2's patch vectors with their grid."""
        B, C, H, W = images.shape
        p = self.patch_size[0]
        if not is_siglip2_tower(self.vision):
            size = getattr(self.vision.config, "image_size", None)
            return {"pixel_values": images, **({} if (H, W) == (size, size) else {"interpolate_pos_encoding": True})}
        h, w = H // p, W // p
        patches = images.reshape(B, C, h, p, w, p).permute(0, 2, 4, 3, 5, 1).reshape(B, h * w, p * p * C)
        return {
            "pixel_values": patches,
            "pixel_attention_mask": torch.ones(B, h * w, dtype=torch.long, device=images.device),
            "spatial_shapes": torch.tensor([[h, w]] * B, device=images.device),
        }

    def own_output(self, prepared: dict) -> Tensor:
        """The classifier's own logits (B, C)."""
        return self.model(**self.own_pixels(prepared["images"])).logits

    def images(self, inputs) -> Tensor:
        """The images of the inputs (validated by :meth:`ViTAdapter.check_inputs`): a tensor (B, C, H, W) as
        given, or a processor's dict: its ``pixel_values``; SigLIP 2's patch vectors (B, P, p·p·C) are laid back on
        their grid (``spatial_shapes``, one per call; the padding of ``pixel_attention_mask`` dropped:
        :func:`patches_to_images`)."""
        if not isinstance(inputs, Mapping):
            return inputs
        if "pixel_values" not in inputs:
            raise InputError(f"{type(self.model).__name__}: the inputs dict has no 'pixel_values'")
        value = pixel_values(inputs["pixel_values"])
        if is_siglip2_tower(self.vision) and value.dim() == 3:
            if inputs.get("spatial_shapes") is None:
                raise InputError(
                    "SigLIP 2's patch vectors (B, P, p·p·C) need their grid: pass the processor's "
                    "'spatial_shapes' (and 'pixel_attention_mask') with them"
                )
            value = patches_to_images(
                value,
                torch.as_tensor(inputs["spatial_shapes"]),
                inputs.get("pixel_attention_mask"),
                self.patch_size[0],
                self.patch_conv.in_channels,
            )
        return value


class HFSiglipAdapter(_SiglipTowerAdapter):
    """Hugging Face ``SiglipForImageClassification``: the SigLIP vision tower, the mean of all tokens, a Linear.

    Any image size that is a multiple of the patch size is accepted; the position grid is resampled as the
    model's ``interpolate_pos_encoding=True`` does (at the trained size: the model's default forward).
    """

    def __init__(self, model: nn.Module):
        super().__init__(model)
        self.readout = self._readout(model)

    def check_inputs(self, inputs) -> dict:
        """Images (B, 3, H, W), or the processor's dict (:meth:`images`); ``prepared``: ``images``."""
        return super().check_inputs(self.images(inputs))

    def _readout(self, model: ModelPart) -> Readout:
        """post_layernorm → the mean of every token → classifier (HF ``torch.mean(..., dim=1)``)."""
        (clf,) = hf_linear_head(model, "classifier")
        return MeanReadout(norm=self.vision.post_layernorm, head_layers=[HeadLayer(LINEAR, clf)], start=0)


# ----------------------------------------------------------------------------
# SiglipModel: the attention-pooling head and the sigmoid similarity
# ----------------------------------------------------------------------------
class InProjection(LinearView):
    """One of the query / key / value projections packed in an ``nn.MultiheadAttention``: rows
    ``[i·D, (i+1)·D)`` of ``in_proj_weight`` and ``in_proj_bias``, read at every call (a view: no parameters)."""

    owner: nn.MultiheadAttention  # set in __init__, not as a child module
    index: int

    def __init__(self, attention: nn.MultiheadAttention, index: int):
        super().__init__()
        object.__setattr__(self, "owner", attention)  # not a child module: the view owns no parameters
        object.__setattr__(self, "index", index)
        self.out_features = self.in_features = int(attention.embed_dim)

    @property
    def weight(self) -> Tensor:
        """(D, D): the slice of the packed weight."""
        D = self.out_features
        return self.owner.in_proj_weight[self.index * D : (self.index + 1) * D]

    @property
    def bias(self) -> Optional[Tensor]:
        """(D,) or ``None`` where the attention has no input bias."""
        b, D = self.owner.in_proj_bias, self.out_features
        return None if b is None else b[self.index * D : (self.index + 1) * D]

    def linear_parts(self) -> tuple[Tensor, Optional[Tensor]]:
        return self.weight, self.bias

    def forward(self, x: Tensor) -> Tensor:
        return torch.nn.functional.linear(x, self.weight, self.bias)


@dataclass(kw_only=True)  # keyword-only: the fields after the base's need no default
class PoolRecord(ReadoutRecord):
    """The attention-pooling head's forward quantities (one query: the probe).

    ``probe`` (B, 1, D), ``lin`` the projections' outputs (``q`` (B, 1, D), ``k`` / ``v`` (B, N, D), ``proj``
    (B, 1, D)), ``q`` (B, H, 1, d), ``k`` / ``v`` (B, H, N, d), ``A`` (B, H, 1, N), ``ctx`` (B, H, 1, d), ``o``
    (B, 1, D) the heads side by side, ``ln`` the LayerNorm's output, ``fc1`` / ``g`` / ``fc2`` the MLP's, ``y``
    (B, 1, D) the residual sum.
    """

    probe: Tensor
    lin: dict
    q: Tensor
    k: Tensor
    v: Tensor
    A: Tensor
    ctx: Tensor
    o: Tensor
    ln: Tensor
    fc1: Tensor
    g: Tensor
    fc2: Tensor
    y: Tensor


def _softmax(s: Tensor) -> Tensor:
    return s.softmax(dim=-1)


class AttentionPoolReadout(Readout):
    """SigLIP's attention-pooling head (MAP) as a readout: ``norm`` (post_layernorm), then a learned probe token
    attends to every token (``nn.MultiheadAttention`` with one query), then ``y = a + mlp(layernorm(a))``, then the
    head layers (L2 normalisation, the similarity to the prompts and ``logit_bias``).

    The pooling is an attention with one query: in the replay each operation is the same kind as in a block
    (LINEAR projections, MATMUL_QK, SOFTMAX, MATMUL_AV), so every composite applies its attention rules to it;
    the probe is a constant (its query's relevance is absorbed). The token weights the layer-product methods read
    (:meth:`weights`) are the probe's attention averaged over the heads, per image (``probe_attention`` (B, N),
    from a plain replay of the batch): the pooling's own attention row, as [CLS]'s row is a ViT's.
    """

    def __init__(
        self,
        norm: nn.Module,
        head: ModelPart,
        head_layers: Sequence[HeadLayer],
        probe_attention: Optional[Tensor] = None,
    ):
        self.norm, self.head, self.head_layers = (
            norm,
            head,
            [h for h in head_layers if not isinstance(h.module, nn.Identity)],
        )
        att = head.attention
        self.q, self.k, self.v = (InProjection(att, i) for i in range(3))
        self.num_heads, self.head_dim = int(att.num_heads), int(att.head_dim)
        self.probe_attention = probe_attention

    def pool(self, normed: Tensor) -> Tensor:
        """(B, N, D) -> (B, D): the pooling head's output (a plain replay)."""
        return self._pool(normed, NO_RECORD).y[:, 0]

    def weights(self, num_tokens: int) -> Tensor:
        """(B, N): the probe's head-mean attention of the batch."""
        if self.probe_attention is None or self.probe_attention.shape[-1] != num_tokens:
            raise InputError(
                "the attention-pooling readout's token weights come from a batch: build the readout "
                "with adapter.readout_for(prepared)"
            )
        return self.probe_attention.cpu().to(torch.float64)

    def row(self, M: Tensor) -> Tensor:
        """``wᵀ M`` per image for M (B, ..., N, N) -> (B, ..., N), on M's device."""
        w = self.weights(M.shape[-1]).to(dtype=M.dtype, device=M.device)
        return (w.reshape((w.shape[0],) + (1,) * (M.dim() - 3) + (1, w.shape[-1])) @ M).squeeze(-2)

    def after_removal(self, rows: Tensor, removed: Tensor) -> "AttentionPoolReadout":
        """Rows ``rows`` without their token ``removed``: the weights lose that column and are renormalised (the
        pooling itself is recomputed by every replay)."""
        if self.probe_attention is None:
            return self
        w = self.probe_attention.to(rows.device)[rows]
        keep = torch.arange(w.shape[1] - 1, device=rows.device)
        idx = keep[None, :] + (keep[None, :] >= removed.to(rows.device)[:, None]).long()
        w = w.gather(1, idx)
        return AttentionPoolReadout(self.norm, self.head, self.head_layers, w / w.sum(dim=1, keepdim=True))

    def _pool(self, normed: Tensor, r: Replay) -> PoolRecord:
        B, N, D = normed.shape
        H, d = self.num_heads, self.head_dim
        att, mlp = self.head.attention, self.head.mlp
        probe = self.head.probe.expand(B, 1, D)
        for_k, for_v = r.fork(normed, 2)
        lin = {
            "q": r.module(LINEAR, self.q, probe),
            "k": r.module(LINEAR, self.k, for_k),
            "v": r.module(LINEAR, self.v, for_v),
        }
        q, k, v = (lin[n].reshape(B, -1, H, d).transpose(1, 2) for n in "qkv")
        # torch's multi-head attention scales the queries before the product (the rule reads q·kᵀ itself)
        scores = r(MATMUL_QK, scaled_matmul((1.0 / d) ** 0.5, True), q, k.transpose(-2, -1), reuse=False)
        A = r(SOFTMAX, _softmax, scores)
        ctx = r(MATMUL_AV, matmul, A, v)  # (B, H, 1, d)
        o = ctx.transpose(1, 2).reshape(B, 1, D)
        lin["proj"] = r.module(LINEAR, att.out_proj, o)
        proj, for_ln = r.fork(lin["proj"], 2)
        ln = r.norm(self.head.layernorm, for_ln)
        fc1 = r.module(LINEAR, mlp.fc1, ln)
        g = r.module(ELEMENTWISE, mlp.activation_fn, fc1)
        fc2 = r.module(LINEAR, mlp.fc2, g)
        y = r(ADD, plus, proj, fc2)
        return PoolRecord(
            hidden=normed,
            token=y[:, 0],
            inputs=[],
            pooled=y[:, 0],
            logits=y[:, 0],
            probe=probe,
            lin=lin,
            q=q,
            k=k,
            v=v,
            A=A,
            ctx=ctx,
            o=o,
            ln=ln,
            fc1=fc1,
            g=g,
            fc2=fc2,
            y=y,
        )

    def forward(self, hidden: Tensor, r: Replay = NO_RECORD) -> PoolRecord:
        normed = r.norm(self.norm, hidden)
        rec = self._pool(normed, r)
        h, inputs = rec.token, []
        for layer in self.head_layers:
            inputs.append(h)
            h = head_layer(layer, h, r)
        rec.hidden, rec.inputs, rec.logits = hidden, inputs, h
        rec.pooled = inputs[-1] if inputs else h  # the normalised image embedding the similarity reads
        return rec


def similarity_with_bias(weight: Tensor, bias: Tensor) -> nn.Linear:
    """A frozen Linear ``E → P``: the prompts' scaled embeddings (P, E) as rows, ``logit_bias`` (1,) on every one."""
    lin = torch.nn.utils.skip_init(
        nn.Linear, weight.shape[1], weight.shape[0], bias=True, device=weight.device, dtype=weight.dtype
    )
    with torch.no_grad():
        lin.weight.copy_(weight)
        lin.bias.copy_(bias.to(weight.dtype).expand(weight.shape[0]))
    return lin.requires_grad_(False)


class SiglipImageAdapter(_SiglipTowerAdapter):
    """The vision tower of a Hugging Face ``SiglipModel``, read out as its sigmoid similarity to text prompts.

    Inputs as for CLIP (the processor's ``pixel_values`` (B, 3, H, W) and the prompts' ``input_ids`` (P, T),
    optionally ``attention_mask``); the logits are the model's ``logits_per_image`` (B, P) =
    ``logit_scale.exp() · cos(image, prompt) + logit_bias`` (before the sigmoid), a target is a prompt index. The
    image is pooled by the attention-pooling head (:class:`AttentionPoolReadout`). The text side is not explained.
    """

    shared = ("prompt_ids", "prompt_mask", "prompt_embeddings")

    def __init__(self, model: ModelPart):
        super().__init__(model)
        if getattr(self.vision, "head", None) is None:
            raise UnsupportedModelError(
                f"{type(model).__name__} without the vision pooling head "
                "(vision_use_head=False) has no image embedding to compare"
            )
        D = self.vision.config.hidden_size
        ref = self.vision.post_layernorm.weight
        self.readout = self._readout(torch.zeros(1, D, dtype=ref.dtype, device=ref.device), None)

    def _readout(self, prompts: Tensor, probe_attention: Optional[Tensor]) -> AttentionPoolReadout:
        """post_layernorm → pooling head → L2 normalisation → the prompts (P, E) and ``logit_bias``."""
        return AttentionPoolReadout(
            self.vision.post_layernorm,
            self.vision.head,
            [
                HeadLayer(LAYERNORM, L2Normalize()),
                HeadLayer(LINEAR, similarity_with_bias(prompts, self.model.logit_bias)),
            ],
            probe_attention,
        )

    def readout_for(self, prepared: dict) -> AttentionPoolReadout:
        """The batch's readout: its prompts and its images' probe attention (``prepared``)."""
        return self._readout(prepared["prompt_embeddings"], prepared.get("probe_attention"))

    def for_inputs(self, inputs) -> Adapter:
        side = inputs.get("explain", "image") if isinstance(inputs, Mapping) else "image"
        if side != "image":
            raise InputError(
                f"{type(self.model).__name__} is explained on the image only (explain='image'); got explain={side!r}"
            )
        return self

    def own_output(self, prepared: dict) -> Tensor:
        """The model's own ``logits_per_image`` (B, P) against the batch's prompts."""
        text = {"input_ids": prepared["prompt_ids"], "attention_mask": prepared["prompt_mask"]}
        return self.model(**self.own_pixels(prepared["images"]), **text).logits_per_image

    def check_inputs(self, inputs) -> dict:
        """Validate images and prompts; ``prepared``: ``images``, ``prompt_ids`` / ``prompt_mask``, the prompts'
        scaled normalised embeddings ``prompt_embeddings`` (P, E) and the probe's head-mean attention
        ``probe_attention`` (B, N) of a plain replay."""
        if not isinstance(inputs, Mapping) or "pixel_values" not in inputs or "input_ids" not in inputs:
            raise InputError(
                f"{type(self.model).__name__} explains the similarity of images to text prompts: pass the "
                "processor's output, a dict with 'pixel_values' (B, 3, H, W) and the prompts' 'input_ids' (P, T), "
                "e.g. processor(text=['a dog', 'a cat'], images=img, padding='max_length', return_tensors='pt'); "
                f"got {type(inputs).__name__}"
            )
        prepared = super().check_inputs(self.images(inputs))
        ids, mask = _prompts(inputs)
        dtype = prepared["images"].dtype
        with torch.no_grad(), compute_precision(self.model), eval_semantics(self.model):
            text = self.model.get_text_features(input_ids=ids, attention_mask=inputs.get("attention_mask"))
            prepared.update(
                prompt_ids=ids, prompt_mask=mask, prompt_embeddings=_scaled_embeddings(self.model, text, dtype)
            )
            trace = self.forward(prepared)  # the plain replay: the probe's attention of each image
        assert isinstance(trace.readout_record, PoolRecord), "the attention-pooling readout's record"
        prepared["probe_attention"] = trace.readout_record.A.mean(dim=1)[:, 0].detach()
        return prepared


__all__ = [
    "AttentionPoolReadout",
    "HFSiglipAdapter",
    "InProjection",
    "PatchLinearConv",
    "PoolRecord",
    "SiglipImageAdapter",
    "check_siglip_tower",
    "is_siglip2_tower",
    "patches_to_images",
    "siglip_block",
    "siglip_embed",
    "siglip_patch_conv",
    "siglip_patch_size",
    "siglip_vision_blocks",
]

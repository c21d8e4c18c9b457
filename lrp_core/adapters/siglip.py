"""SigLIP / SigLIP 2 (Hugging Face) image classifiers and similarity models over the SigLIP vision tower
(:class:`~lrp_core.adapters.siglip_tower.SiglipVisionEncoder`: no class token, CLIP's pre-LN blocks,
``post_layernorm`` after the last block). docs/METHODS.md §2m.

* ``SiglipForImageClassification`` / ``Siglip2ForImageClassification`` (:class:`HFSiglipAdapter`): the mean of
  all tokens after ``post_layernorm``, one Linear (:class:`~lrp_core.adapters.readouts.MeanReadout` from token
  0). The tower's attention-pooling head, if present, is computed by the model but not read by the classifier.
* ``SiglipModel`` / ``Siglip2Model`` (:class:`SiglipImageAdapter`): the image side of the sigmoid similarity
  ``logit_scale.exp() · cos + logit_bias``, the image pooled by the attention-pooling head
  (:class:`~lrp_core.adapters.attention_pool.AttentionPoolReadout`); a target is a prompt.
* SigLIP 2 takes its processor's patch vectors ``(B, P, p·p·C)``; the replay lays them back on their grid
  (:func:`patches_to_images`: one grid per call, padding dropped) and reads the patch Linear as the convolution it
  equals (:class:`PatchLinearConv`), so SigLIP 2 is explained on ``(B, C, H, W)`` images like SigLIP.

The vision tower itself (embedding, blocks, SigLIP 2's patch vectors) is described once, in
:mod:`~lrp_core.adapters.siglip_tower` (its names are importable from here too).

Shapes: B batch, P = N patches (no prefix token), D width, C classes (or P prompts for the similarity).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional

import torch
from torch import Tensor, nn

from ..errors import InputError, UnsupportedModelError
from ..rules.linear import LinearView
from ..rules.ops import LAYERNORM, LINEAR
from ..runtime.guard import eval_semantics
from ..runtime.precision import compute_precision
from .attention_pool import AttentionPoolReadout, PoolHead, PoolRecord
from .base import Adapter
from .batches import ImageBatch, PromptedImageBatch
from .blocks import MlpSpec
from .checks import pixel_values
from .clip import L2Normalize, _prompts, _scaled_embeddings
from .parts import ModelPart
from .readouts import HeadLayer, MeanReadout, Readout
from .siglip_tower import (
    PatchLinearConv,
    SiglipVisionEncoder,
    check_siglip_tower,
    is_siglip2_tower,
    patches_to_images,
    siglip_block,
    siglip_embed,
    siglip_patch_conv,
    siglip_patch_size,
    siglip_vision_blocks,
)
from .vit import ImageT, ViTAdapter, hf_linear_head


class _SiglipTowerAdapter(ViTAdapter[ImageT]):
    """What the SigLIP image adapters share: the tower ``model.vision_model`` (:class:`SiglipVisionEncoder`), its
    pixels and SigLIP 2's patch vectors."""

    def __init__(self, model: ModelPart):
        super().__init__(model)
        self.vision = model.vision_model
        # the position grid is interpolated: any multiple of the patch size
        self.use_encoder(SiglipVisionEncoder(self.vision, type(model).__name__))

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

    def own_output(self, prepared: ImageT) -> Tensor:
        """The classifier's own logits (B, C)."""
        return self.model(**self.own_pixels(prepared.images)).logits

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


class HFSiglipAdapter(_SiglipTowerAdapter[ImageBatch]):
    """Hugging Face ``SiglipForImageClassification``: the SigLIP vision tower, the mean of all tokens, a Linear.

    Any image size that is a multiple of the patch size is accepted; the position grid is resampled as the
    model's ``interpolate_pos_encoding=True`` does (at the trained size: the model's default forward).
    """

    def __init__(self, model: nn.Module):
        super().__init__(model)
        self.readout = self._readout(model)

    def check_inputs(self, inputs) -> ImageBatch:
        """Images (B, 3, H, W), or the processor's dict (:meth:`images`)."""
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


def siglip_pool_head(head: ModelPart) -> PoolHead:
    """SigLIP's pooling head (``SiglipMultiheadAttentionPoolingHead``: a probe, an ``nn.MultiheadAttention``, a
    LayerNorm and an MLP) as a :class:`~lrp_core.adapters.attention_pool.PoolHead`.

    Parameters
    ----------
    head : ModelPart
        the model's pooling head (``vision_model.head``).

    Returns
    -------
    PoolHead
        the head's parts, read from its own modules (q, k, v split from the fused in-projection).
    """
    att, mlp = head.attention, head.mlp
    d = int(att.head_dim)
    q, k, v = (InProjection(att, i) for i in range(3))
    return PoolHead(
        probe=head.probe,
        q=q,
        k=k,
        v=v,
        proj=att.out_proj,
        num_heads=int(att.num_heads),
        head_dim=d,
        scale=(1.0 / d) ** 0.5,  # torch's multi-head attention scales the queries first
        norm=head.layernorm,
        mlp=MlpSpec(fc1=mlp.fc1, act=mlp.activation_fn, fc2=mlp.fc2),
    )


def similarity_with_bias(weight: Tensor, bias: Tensor) -> nn.Linear:
    """A frozen Linear ``E → P``: the prompts' scaled embeddings (P, E) as rows, ``logit_bias`` (1,) on every one."""
    lin = torch.nn.utils.skip_init(
        nn.Linear, weight.shape[1], weight.shape[0], bias=True, device=weight.device, dtype=weight.dtype
    )
    with torch.no_grad():
        lin.weight.copy_(weight)
        lin.bias.copy_(bias.to(weight.dtype).expand(weight.shape[0]))
    return lin.requires_grad_(False)


class SiglipImageAdapter(_SiglipTowerAdapter[PromptedImageBatch]):
    """The vision tower of a Hugging Face ``SiglipModel``, read out as its sigmoid similarity to text prompts.

    Inputs as for CLIP (the processor's ``pixel_values`` (B, 3, H, W) and the prompts' ``input_ids`` (P, T),
    optionally ``attention_mask``); the logits are the model's ``logits_per_image`` (B, P) =
    ``logit_scale.exp() · cos(image, prompt) + logit_bias`` (before the sigmoid), a target is a prompt index. The
    image is pooled by the attention-pooling head (:class:`AttentionPoolReadout`). The text side is not explained.
    """

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
            siglip_pool_head(self.vision.head),
            [
                HeadLayer(LAYERNORM, L2Normalize()),
                HeadLayer(LINEAR, similarity_with_bias(prompts, self.model.logit_bias)),
            ],
            probe_attention,
        )

    def readout_for(self, prepared: PromptedImageBatch) -> AttentionPoolReadout:
        """The batch's readout: its prompts and its images' probe attention (``prepared``)."""
        return self._readout(prepared.prompt_embeddings, prepared.probe_attention)

    def for_inputs(self, inputs) -> Adapter:
        side = inputs.get("explain", "image") if isinstance(inputs, Mapping) else "image"
        if side != "image":
            raise InputError(
                f"{type(self.model).__name__} is explained on the image only (explain='image'); got explain={side!r}"
            )
        return self

    def own_output(self, prepared: PromptedImageBatch) -> Tensor:
        """The model's own ``logits_per_image`` (B, P) against the batch's prompts."""
        text = {"input_ids": prepared.prompt_ids, "attention_mask": prepared.prompt_mask}
        return self.model(**self.own_pixels(prepared.images), **text).logits_per_image

    def check_inputs(self, inputs) -> PromptedImageBatch:
        """Validate images and prompts: the images, the prompts' ids / mask, their scaled normalised embeddings
        (P, E) and the probe's head-mean attention (B, N) of a plain replay."""
        if not isinstance(inputs, Mapping) or "pixel_values" not in inputs or "input_ids" not in inputs:
            raise InputError(
                f"{type(self.model).__name__} explains the similarity of images to text prompts: pass the "
                "processor's output, a dict with 'pixel_values' (B, 3, H, W) and the prompts' 'input_ids' (P, T), "
                "e.g. processor(text=['a dog', 'a cat'], images=img, padding='max_length', return_tensors='pt'); "
                f"got {type(inputs).__name__}"
            )
        images = super().check_inputs(self.images(inputs)).images
        ids, mask = _prompts(inputs)
        with torch.no_grad(), compute_precision(self.model), eval_semantics(self.model):
            text = self.model.get_text_features(input_ids=ids, attention_mask=inputs.get("attention_mask"))
            embeddings = _scaled_embeddings(self.model, text, images.dtype)
            prepared = PromptedImageBatch(images=images, prompt_ids=ids, prompt_mask=mask, prompt_embeddings=embeddings)
            trace = self.forward(prepared)  # the plain replay: the probe's attention of each image
        assert isinstance(trace.readout, AttentionPoolReadout)
        return prepared.replace(probe_attention=trace.readout.attention_of(trace.readout_record))


__all__ = [
    "AttentionPoolReadout",
    "HFSiglipAdapter",
    "InProjection",
    "PatchLinearConv",
    "PoolRecord",
    "SiglipImageAdapter",
    "siglip_pool_head",
    "check_siglip_tower",
    "is_siglip2_tower",
    "patches_to_images",
    "siglip_block",
    "siglip_embed",
    "siglip_patch_conv",
    "siglip_patch_size",
    "siglip_vision_blocks",
]

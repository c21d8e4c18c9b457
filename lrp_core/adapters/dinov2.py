"""Hugging Face DINOv2: the encoder (``Dinov2Model``: pre-LN blocks with LayerScale, interpolated position
embeddings), shared by ``Dinov2ForImageClassification`` and the vision-language models whose tower it is, and the
classifier on ``concat([CLS], mean of the patch tokens)``.

The embeddings are reproduced with the model's own ``interpolate_pos_encoding``
(bicubic resampling of the position grid for any image size that is a multiple
of the patch size), so the replay equals the model at every resolution. The
readout is :class:`~lrp_core.adapters.readouts.ClsMeanReadout` (token weights
``½ e_0 + ½ · 1/P`` on the patches, docs/METHODS.md §4.2).

Shapes: B batch, N = 1 + P tokens, D width.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import UnsupportedModelError
from ..rules.ops import LINEAR, PATCH_CONV, POS_ADD
from .blocks import NO_RECORD, AttentionSpec, BlockSpec, Replay
from .parts import ModelPart
from .readouts import ClsMeanReadout, HeadLayer, Readout
from .records import EmbeddingRecord
from .vit import Encoder, HFViTAdapter, HFViTEncoder, hf_attention, hf_block_heads, hf_linear_head, hf_mlp


class Dinov2Encoder(HFViTEncoder):
    """``Dinov2Model``: [CLS], the patch convolution, the position grid interpolated to the image size, pre-LN
    blocks with LayerScale (eager attention's softmax in the model's dtype, as its kernel). The final
    ``layernorm`` is the reader's (a classifier's readout norm; a VLM reads the hidden states before it).
    The SwiGLU variant (DINOv2 giant) is refused; ``name`` says whose encoder it is."""

    def __init__(self, module: ModelPart, name: str):
        if getattr(module.config, "use_swiglu_ffn", False):
            raise UnsupportedModelError(
                f"{name} with use_swiglu_ffn=True (DINOv2 giant) is not supported: its MLP multiplies two "
                "activations (a SwiGLU gate), which the block description does not cover; the two-layer-MLP "
                "DINOv2 models (small, base, large) are supported"
            )
        super().__init__(module, ("cls_token",))
        self.image_size = None  # the position grid is interpolated: any multiple of the patch size

    def block(self, i: int, layer: ModelPart) -> BlockSpec:
        q, k, v, proj = hf_attention(layer.attention)
        H, d, scale = hf_block_heads(self.module.config, layer.attention, (q, k, v, proj), f"layer {i}")
        return BlockSpec(
            layout="pre_ln",
            norm1=layer.norm1,
            norm2=layer.norm2,
            ls1=layer.layer_scale1,
            ls2=layer.layer_scale2,
            attn=AttentionSpec(q=q, k=k, v=v, proj=proj, num_heads=H, head_dim=d, scale=scale),
            mlp=hf_mlp(layer),
        )

    def position_embedding(self, tokens: Tensor, images: Tensor) -> Tensor:
        """The model's own interpolation of its position grid to the image size, (1, N, D)."""
        H, W = images.shape[-2:]
        return self.module.embeddings.interpolate_pos_encoding(tokens, H, W)


class Dinov2RegistersEncoder(Dinov2Encoder):
    """``Dinov2WithRegistersModel``: as DINOv2, with ``R`` register tokens inserted after [CLS] once the position
    embedding is added (they take no position): block 0's input is ``[CLS], registers, patches``."""

    def __init__(self, module: ModelPart, name: str):
        super().__init__(module, name)
        R = int(module.embeddings.register_tokens.shape[1])
        self.num_prefix_tokens = 1 + R
        self.registers = tuple(range(1, 1 + R))

    def embed(self, images: Tensor, r: Replay = NO_RECORD, track: bool = False) -> EmbeddingRecord:
        """[CLS] and the patches, the interpolated position embedding added, then the registers after [CLS]."""
        emb = self.module.embeddings
        if track:
            images = images.detach().requires_grad_(True)
        patches = r.module(PATCH_CONV, self.patch_conv, images.to(self.patch_conv.weight.dtype))
        patches = patches.flatten(2).transpose(1, 2)
        tokens = torch.cat([emb.cls_token.expand(images.shape[0], -1, -1), patches], dim=1)
        x_pos = r(POS_ADD, torch.add, tokens, self.position_embedding(tokens, images))
        registers = emb.register_tokens.expand(images.shape[0], -1, -1)
        x0 = torch.cat([x_pos[:, :1], registers, x_pos[:, 1:]], dim=1)
        return EmbeddingRecord(x0=x0, embeds=patches, tokens=tokens, x_pos=x_pos, images=images, patches=patches)


class HFDinov2Adapter(HFViTAdapter):
    """Hugging Face ``Dinov2ForImageClassification`` (two-layer MLP; the SwiGLU variant is refused)."""

    backbone = "dinov2"
    prefix_names = ("cls_token",)

    def encoder_of(self, base: ModelPart) -> Encoder:
        return Dinov2Encoder(base, type(self.model).__name__)

    def _readout(self, model: ModelPart, base: ModelPart) -> Readout:
        (clf,) = hf_linear_head(model, "classifier")
        return ClsMeanReadout(norm=base.layernorm, head_layers=[HeadLayer(LINEAR, clf)], start=self.num_prefix_tokens)


class HFDinov2RegistersAdapter(HFDinov2Adapter):
    """Hugging Face ``Dinov2WithRegistersForImageClassification``: [CLS] and the mean of the patch tokens (the
    registers are not pooled); their relevance is ``Explanation.registers``."""

    backbone = "dinov2_with_registers"

    def encoder_of(self, base: ModelPart) -> Encoder:
        return Dinov2RegistersEncoder(base, type(self.model).__name__)


__all__ = ["Dinov2Encoder", "Dinov2RegistersEncoder", "HFDinov2Adapter", "HFDinov2RegistersAdapter"]

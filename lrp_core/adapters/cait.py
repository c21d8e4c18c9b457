"""timm ``Cait`` (Class-Attention in Image Transformers, docs/METHODS.md §2v): talking-heads blocks over the patch
tokens, then class-attention blocks in which only the class token is updated.

* ``blocks`` (``LayerScaleBlock`` with ``TalkingHeadAttn``): pre-LN blocks on the P patch tokens (no class token),
  LayerScale ``gamma_1`` / ``gamma_2``; the attention's ``proj_l`` mixes the heads' scaled scores before the
  softmax and ``proj_w`` the weights after it (Linear maps across the heads: :class:`~.attention.AttentionSpec`'s
  ``mix_scores`` / ``mix_weights``, §1's Linear rule).
* ``blocks_token_only`` (``LayerScaleBlockClassAttn`` with ``ClassAttn``): each block reads ``[cls, patches]``
  and updates the class token alone — an attention block whose one query is the class token (its keys and values
  from every token), replayed as the block at row 0 (:func:`~.blocks.block_forward`'s ``rows``). They belong to
  the readout (:class:`ClassAttentionReadout`): the class token is a learned constant that joins after the last
  patch block, so the token stream the blocks explain is the P patches, and the patches read by the class blocks
  are the last block's output (each block's reading is one branch of a Clone).
* Readout: ``global_pool='token'``: the final norm on the class token, then the head; ``'avg'``: the mean of the
  normed patch tokens (the class blocks then reach no logit).

Shapes: B batch, P patch tokens, D width, H heads, d head width.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor, nn

from ..errors import InputError, UnsupportedModelError
from ..rules.linear import is_linear
from ..rules.ops import PATCH_CONV, POS_ADD, READOUT
from .batches import ImageBatch
from .blocks import NO_RECORD, AttentionSpec, BlockSpec, MlpSpec, Replay, block_forward
from .eva import GammaScale
from .parts import ModelPart
from .readouts import HeadLayer, MeanReadout, Readout, head_layer
from .records import BlockRecord, EmbeddingRecord, ReadoutRecord
from .vit import ViTAdapter, _head_layers

_NO_CLASS_ROWS = (
    "CaiT's class token joins only in its class-attention blocks (each a 1 × P row of the class token over "
    "[cls, patches]) and its talking-heads blocks mix the heads' P × P maps across heads, so there is no token set "
    "whose attention matrices can be multiplied across blocks, nor a class-token row of the patch blocks' maps"
)
#: method -> why it is refused on CaiT (the methods that read or multiply the blocks' attention maps)
REFUSED_METHODS = {
    "transformer_attribution": _NO_CLASS_ROWS,
    "generic_attention": _NO_CLASS_ROWS,
    "rollout": _NO_CLASS_ROWS,
    "raw_attention": _NO_CLASS_ROWS,
    "attention_gradcam": _NO_CLASS_ROWS,
    "partial_lrp": _NO_CLASS_ROWS,
}


def _selected(t: Tensor) -> Tensor:
    """The class token itself (the READOUT operation: its rule is the selection's)."""
    return t


@dataclass(kw_only=True)
class ClassAttentionRecord(ReadoutRecord):
    """The class-attention readout's forward quantities: ``blocks`` one record per class-attention block (its
    ``out`` (B, 1, D) the class token after it, its ``attn.A`` (B, H, 1, 1 + P))."""

    blocks: list


class ClassAttentionReadout(Readout):
    """CaiT's class-attention blocks as a readout: the class token ``cls`` (1, 1, D) attends to ``[cls, patches]``
    in each block, then the final ``norm`` and the head read it (B, D)."""

    def __init__(self, cls_token: Tensor, blocks: Sequence[BlockSpec], norm: nn.Module, head: Sequence[HeadLayer]):
        self.cls_token, self.blocks, self.norm = cls_token, list(blocks), norm
        self.head_layers = [h for h in head if not isinstance(h.module, nn.Identity)]

    def pool(self, normed: Tensor) -> Tensor:
        """(B, P, D) the last patch block's output -> (B, D) the class token after the class blocks and the norm
        (the norm follows the class blocks in CaiT: ``normed`` is not normed)."""
        return self.forward(normed).token

    def weights(self, num_tokens: int) -> Tensor:
        raise InputError(f"the class-attention readout pools no fixed weights of the tokens: {_NO_CLASS_ROWS}")

    def forward(self, hidden: Tensor, r: Replay = NO_RECORD) -> ClassAttentionRecord:
        B = hidden.shape[0]
        cls = self.cls_token.expand(B, -1, -1)
        rows = torch.zeros(B, dtype=torch.long, device=hidden.device)
        records: list[BlockRecord] = []
        place = r.placement  # a model split over devices: each class-attention block where it computes
        for b, (spec, patches) in enumerate(zip(self.blocks, r.fork(hidden, len(self.blocks)) if self.blocks else ())):
            if place is not None:
                device = place.device(f"class-attention block {b}", spec)
                cls, patches, rows = place.move(cls, device), place.move(patches, device), place.move(rows, device)
            records.append(block_forward(spec, torch.cat((cls, patches), dim=1), None, r, rows=rows))
            cls = records[-1].out  # (B, 1, D)
        token = r(READOUT, _selected, r.norm(self.norm, cls)[:, 0])
        h, inputs = token, []
        for layer in self.head_layers:
            inputs.append(h)
            h = head_layer(layer, h, r)
        pooled = inputs[-1] if inputs else h
        return ClassAttentionRecord(hidden=hidden, token=token, inputs=inputs, pooled=pooled, logits=h, blocks=records)


def _mlp(mlp: ModelPart, where: str) -> MlpSpec:
    """timm's two-layer ``Mlp``."""
    if type(mlp).__name__ != "Mlp" or not (is_linear(getattr(mlp, "fc1", None)) and is_linear(mlp.fc2)):
        raise UnsupportedModelError(f"{where}: MLP {type(mlp).__name__} is not timm's two-layer `Mlp`")
    return MlpSpec(fc1=mlp.fc1, act=mlp.act, fc2=mlp.fc2, mid_norm=getattr(mlp, "norm", nn.Identity()))


def _class_block(i: int, blk: ModelPart) -> BlockSpec:
    """Class-attention block ``i`` (``LayerScaleBlockClassAttn`` with ``ClassAttn``), replayed at row 0."""
    where = f"blocks_token_only.{i} ({type(blk).__name__})"
    attn = blk.attn
    if type(blk).__name__ != "LayerScaleBlockClassAttn" or type(attn).__name__ != "ClassAttn":
        raise UnsupportedModelError(f"{where}: only timm's LayerScaleBlockClassAttn with ClassAttn is supported")
    D, H = int(attn.q.in_features), int(attn.num_heads)
    spec = AttentionSpec(
        q=attn.q,
        k=attn.k,
        v=attn.v,
        proj=attn.proj,
        num_heads=H,
        head_dim=D // H,
        scale=float(attn.scale),
        scale_queries_first=True,
    )
    return _layer_scale_block(blk, spec, where)


def _layer_scale_block(blk: ModelPart, attn: AttentionSpec, where: str) -> BlockSpec:
    """A CaiT block (either kind): pre-LN, LayerScale ``gamma_1`` / ``gamma_2``, the attention ``attn``, the MLP."""
    return BlockSpec(
        layout="pre_ln",
        norm1=blk.norm1,
        norm2=blk.norm2,
        ls1=GammaScale(blk, "gamma_1"),
        ls2=GammaScale(blk, "gamma_2"),
        attn=attn,
        mlp=_mlp(blk.mlp, where),
    )


class TimmCaitAdapter(ViTAdapter[ImageBatch]):
    """timm ``Cait``: talking-heads blocks on the patches, the class-attention blocks in the readout ([CLS]
    pooling) or the mean of the normed patches (``global_pool='avg'``)."""

    refused_methods = REFUSED_METHODS
    num_prefix_tokens = 0  # the blocks' tokens are the patches; the class token joins in the readout

    def __init__(self, model: ModelPart):
        super().__init__(model)
        name, pe = type(model).__name__, model.patch_embed
        if model.global_pool not in ("token", "avg"):
            raise UnsupportedModelError(
                f"{name} with global_pool={model.global_pool!r}: the readouts explained are 'token' (the class "
                "token after the class-attention blocks) and 'avg' (the mean of the patch tokens)"
            )
        if not isinstance(getattr(pe, "proj", None), nn.Conv2d):
            raise UnsupportedModelError(f"{name}: patch embedding {type(pe).__name__} is not a plain Conv2d")
        self.patch_conv, self.patch_size, self.image_size = pe.proj, tuple(pe.patch_size), tuple(pe.img_size)
        self.blocks = [self._block(i, blk) for i, blk in enumerate(model.blocks)]
        head = _head_layers(model.head, "head")
        if model.global_pool == "avg":
            self.readout: Readout = MeanReadout(norm=model.norm, head_layers=head, start=0)
        else:
            cls_blocks = [_class_block(i, blk) for i, blk in enumerate(model.blocks_token_only or ())]
            self.readout = ClassAttentionReadout(model.cls_token, cls_blocks, model.norm, head)

    def _block(self, i: int, blk: ModelPart) -> BlockSpec:
        """Block ``i`` (``LayerScaleBlock`` with ``TalkingHeadAttn``): pre-LN, LayerScale, talking heads."""
        where = f"blocks.{i} ({type(blk).__name__})"
        attn = blk.attn
        if type(blk).__name__ != "LayerScaleBlock" or type(attn).__name__ != "TalkingHeadAttn":
            raise UnsupportedModelError(f"{where}: only timm's LayerScaleBlock with TalkingHeadAttn is supported")
        D, H = int(attn.qkv.in_features), int(attn.num_heads)
        spec = AttentionSpec(
            qkv=attn.qkv,
            proj=attn.proj,
            num_heads=H,
            head_dim=D // H,
            scale=float(attn.scale),
            scale_queries_first=True,
            mix_scores=attn.proj_l,
            mix_weights=attn.proj_w,
        )
        return _layer_scale_block(blk, spec, where)

    @property
    def patch_norm(self) -> ModelPart:
        return self.model.patch_embed.norm

    def embed(self, prepared: ImageBatch, r: Replay = NO_RECORD, track: bool = False) -> EmbeddingRecord:
        """timm's ``patch_embed`` and ``x + pos_embed`` on the patches (no class token yet), through the replay."""
        images = prepared.images
        if track:
            images = images.detach().requires_grad_(True)
        conv = r.module(PATCH_CONV, self.patch_conv, images)  # (B, D, h, w)
        patches = conv.flatten(2).transpose(1, 2)  # (B, P, D)
        flat = r.norm(self.patch_norm, patches)
        x_pos = r(POS_ADD, torch.add, flat, self.model.pos_embed)
        return EmbeddingRecord(x0=x_pos, embeds=flat, tokens=flat, x_pos=x_pos, images=images, patches=patches)


__all__ = ["ClassAttentionReadout", "ClassAttentionRecord", "REFUSED_METHODS", "TimmCaitAdapter"]

"""ViTs with a relative position bias: Hugging Face BEiT and Data2Vec-vision, timm ``Beit`` and timm
``VisionTransformerRelPos`` (``vit_relpos_*``).

Each block adds a learned table, indexed by the token offsets (and the [CLS] rows), to its scaled attention
scores: a constant of the scores (docs/METHODS.md §2v), the MASK_ADD operand of the shared attention, as MPNet's
position bias. The bias is computed by the model's own modules (a per-block table, or one shared by every block,
or both: summed as the model sums them), so the replay adds what the model adds. A token ablation keeps each
remaining token's rows and columns of the bias (its offsets stay its own).

What else differs from the plain ViT: LayerScale as bare parameters (``lambda_1`` / ``gamma_1``, shown as
modules by :class:`~lrp_core.adapters.eva.GammaScale`), a qkv Linear without bias whose q and v biases the
attention adds (:class:`~lrp_core.adapters.eva.BiasedQkv`), mean pooling with its norm after the pooling (HF
``use_mean_pooling``, timm ``global_pool='avg'`` with ``fc_norm``), the eager softmax in float32 (HF BEiT, as the
model), post-norm blocks (timm ``ResPostRelPosBlock``).

Shapes: B batch, N = prefix + P tokens, H heads, D width.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from ..errors import UnsupportedModelError
from ..rules.composites import Composite
from ..rules.linear import is_linear
from ..rules.norms import norm_kind
from ..rules.ops import LINEAR, PATCH_CONV, POS_ADD
from ..runtime.guard import eval_semantics
from .batches import ImageBatch
from .blocks import NO_RECORD, AttentionSpec, BlockSpec, MlpSpec, Replay
from .eva import BiasedQkv, GammaScale, _eva_mlp
from .heads import timm_scale
from .kernels import eager_softmax_dtype
from .parts import IDENTITY, ModelPart
from .readouts import HeadLayer, MeanReadout, Readout, TokenReadout
from .records import EmbeddingRecord, Trace
from .vit import (
    Encoder,
    HFViTAdapter,
    HFViTEncoder,
    TimmViTAdapter,
    hf_attention,
    hf_block_heads,
    hf_linear_head,
    hf_mlp,
)


def _at_positions(bias: Tensor, positions: Tensor) -> Tensor:
    """(1, H, N, N) the bias over all tokens -> (B, H, n, n) its rows and columns at each row's ``positions``
    (B, n): the tokens a token ablation kept, each at its own offsets."""
    idx = positions.to(bias.device)
    return bias[0][:, idx[:, :, None], idx[:, None, :]].transpose(0, 1)


def _summed(parts: list) -> Optional[Tensor]:
    """The per-block and the shared bias added as the model adds them (``None``: neither)."""
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    # a split model: the shared table where the block's own is (each block's bias moves to its block after)
    return parts[0] if len(parts) == 1 else parts[0] + parts[1].to(parts[0].device)


class RelativeBias:
    """What the relative-position-bias adapters share: each block's bias as its attention's additive constant,
    at the positions of the tokens kept (token ablation). A mixin before the family's ViT adapter."""

    blocks: list
    model: ModelPart

    def block_biases(self, like: Tensor) -> list:
        """Per block the bias (1, H, N, N) or (H, N, N) its scores get, or ``None``; ``like`` block 0's input
        (B, N, D)."""
        raise NotImplementedError

    def block_context(
        self, x0: Tensor, mask: Optional[Tensor], positions: Optional[Tensor], fused: bool = False
    ) -> list:
        """Per block (the bias at the tokens' positions, no rotary tables). The bias is computed in eval mode, as
        the model's own forward is checked (timm's bias MLP has a dropout)."""
        with eval_semantics(self.model):
            biases = [None if b is None else b.reshape((1,) + tuple(b.shape[-3:])) for b in self.block_biases(x0)]
        if positions is None:
            return [(b, None) for b in biases]
        return [(None if b is None else _at_positions(b, positions), None) for b in biases]

    def forward(
        self,
        prepared: ImageBatch,
        *,
        grad: bool = False,
        composite: Optional[Composite] = None,
        track: bool = False,
        readout: Optional[Readout] = None,
        read_rows: bool = False,
    ) -> Trace:
        """The replay (:meth:`Adapter.forward`); the trace names each token's position (B, N), which a token
        ablation keeps for the tokens that remain (their rows of the bias)."""
        trace = super().forward(  # type: ignore[misc]
            prepared, grad=grad, composite=composite, track=track, readout=readout, read_rows=read_rows
        )
        B, N = trace.x0.shape[:2]
        trace.positions = torch.arange(N, device=trace.x0.device).expand(B, N)
        return trace


# ----------------------------------------------------------------------------
# Hugging Face BEiT and Data2Vec-vision
# ----------------------------------------------------------------------------
class BeitEncoder(HFViTEncoder):
    """``BeitModel`` / ``Data2VecVisionModel``: [CLS], the patch convolution, the absolute position embedding
    where the config uses one, pre-LN blocks with LayerScale ``lambda_1`` / ``lambda_2`` and the relative
    position biases (per layer and / or shared) at the trained image size."""

    def __init__(self, module: ModelPart):
        super().__init__(module, ("cls_token",))
        self.data2vec = hasattr(module, "encoder") and not hasattr(module, "layers")  # the 4.x layout
        cfg = module.config
        self.softmax_dtype = None if self.data2vec else eager_softmax_dtype(cfg)

    def block(self, i: int, layer: ModelPart) -> BlockSpec:
        q, k, v, proj = hf_attention(layer.attention)
        H, d, scale = hf_block_heads(self.module.config, layer.attention, (q, k, v, proj), f"layer {i}")
        ls = [
            GammaScale(layer, n) if isinstance(getattr(layer, n), nn.Parameter) else IDENTITY
            for n in ("lambda_1", "lambda_2")
        ]
        return BlockSpec(
            layout="pre_ln",
            norm1=layer.layernorm_before,
            norm2=layer.layernorm_after,
            ls1=ls[0],
            ls2=ls[1],
            attn=AttentionSpec(
                q=q, k=k, v=v, proj=proj, num_heads=H, head_dim=d, scale=scale, softmax_dtype=self.softmax_dtype
            ),
            mlp=hf_mlp(layer),
        )

    def biases(self, like: Tensor) -> list:
        """Per layer its bias (1, H, N, N) (its own table plus the shared one), the model's modules' own call at
        the trained grid (``interpolate_pos_encoding=False``, the model's default)."""
        m = self.module
        ph, pw = self.patch_size
        assert self.image_size is not None, "BEiT is replayed at its trained size"
        window = (self.image_size[0] // ph, self.image_size[1] // pw)
        N = like.shape[1]
        shared_mod = (
            m.encoder.relative_position_bias
            if self.data2vec and m.encoder.has_relative_position_bias
            else (getattr(m, "shared_position_bias", None))
        )
        shared = None if shared_mod is None else shared_mod(window, interpolate_pos_encoding=False, dim_size=N)
        out = []
        for layer in self.layers_of(m):
            own = layer.attention.attention if self.data2vec else layer
            table = getattr(own, "relative_position_bias", None)
            mine = None if table is None else table(window, interpolate_pos_encoding=False, dim_size=N)
            out.append(_summed([mine, shared]))
        return out

    def embed(self, images: Tensor, r: Replay = NO_RECORD, track: bool = False) -> EmbeddingRecord:
        """[CLS] before the patches, then the absolute position embedding where there is one (dropout: an
        identity; no ``bool_masked_pos``)."""
        emb = self.module.embeddings
        if track:
            images = images.detach().requires_grad_(True)
        patches = r.module(PATCH_CONV, self.patch_conv, images.to(self.patch_conv.weight.dtype))
        patches = patches.flatten(2).transpose(1, 2)
        tokens = torch.cat([emb.cls_token.expand(images.shape[0], -1, -1), patches], dim=1)
        x_pos = tokens
        if emb.position_embeddings is not None:
            H, W = images.shape[-2:]
            x_pos = r(POS_ADD, torch.add, tokens, emb.interpolate_pos_encoding(tokens, H, W))
        return EmbeddingRecord(x0=x_pos, embeds=patches, tokens=tokens, x_pos=x_pos, images=images, patches=patches)


class HFBeitAdapter(RelativeBias, HFViTAdapter):
    """Hugging Face ``BeitForImageClassification``: :class:`BeitEncoder`, then [CLS] after ``layernorm`` or the
    mean of the patch tokens and the pooler's LayerNorm (``use_mean_pooling``), then the classifier."""

    backbone = "beit"

    def encoder_of(self, base: ModelPart) -> Encoder:
        return BeitEncoder(base)

    def block_biases(self, like: Tensor) -> list:
        assert isinstance(self.encoder, BeitEncoder)
        return self.encoder.biases(like)

    def _readout(self, model: ModelPart, base: ModelPart) -> Readout:
        (clf,) = hf_linear_head(model, "classifier")
        pooler = getattr(base, "pooler", None)
        if pooler is None:
            raise UnsupportedModelError(f"{type(model).__name__}: its backbone has no pooler to read")
        ln = getattr(pooler, "layernorm", None)
        if ln is None:  # [CLS] after the final layernorm
            return TokenReadout(norm=base.layernorm, head_layers=[HeadLayer(LINEAR, clf)])
        return MeanReadout(
            norm=base.layernorm, head_layers=[HeadLayer(norm_kind(ln), ln), HeadLayer(LINEAR, clf)], start=1
        )


class HFData2VecVisionAdapter(HFBeitAdapter):
    """Hugging Face ``Data2VecVisionForImageClassification`` (BEiT's architecture, 4.x module names, the softmax
    in the model's dtype)."""

    backbone = "data2vec_vision"


# ----------------------------------------------------------------------------
# timm Beit and VisionTransformerRelPos
# ----------------------------------------------------------------------------
class TimmBeitAdapter(RelativeBias, TimmViTAdapter):
    """timm ``Beit`` (BEiT, BEiT v2): per-block and / or shared relative position bias, q/v biases added by the
    attention, LayerScale ``gamma_1`` / ``gamma_2``, [CLS] or average pooling with ``fc_norm``."""

    def _block(self, i: int, blk: ModelPart) -> BlockSpec:
        where = f"block {i} ({type(blk).__name__})"
        attn = blk.attn
        if type(blk).__name__ != "Block" or type(attn).__name__ != "Attention" or not hasattr(blk, "gamma_1"):
            raise UnsupportedModelError(f"{where}: only timm's BEiT `Block` with its `Attention` is supported")
        if not is_linear(attn.qkv):
            raise UnsupportedModelError(f"{where}: its qkv {type(attn.qkv).__name__} is not a Linear layer")
        d = int(attn.qkv.out_features) // 3 // int(attn.num_heads)
        return BlockSpec(
            layout="pre_ln",
            norm1=blk.norm1,
            norm2=blk.norm2,
            ls1=IDENTITY if blk.gamma_1 is None else GammaScale(blk, "gamma_1"),
            ls2=IDENTITY if blk.gamma_2 is None else GammaScale(blk, "gamma_2"),
            attn=AttentionSpec(
                qkv=attn.qkv if attn.q_bias is None else BiasedQkv(attn),
                proj=attn.proj,
                num_heads=int(attn.num_heads),
                head_dim=d,
                scale=timm_scale(attn, d),
                scale_queries_first=True,
            ),
            mlp=_eva_mlp(blk.mlp, where),
        )

    def block_biases(self, like: Tensor) -> list:
        m = self.model
        shared = None if m.rel_pos_bias is None else m.rel_pos_bias()
        return [
            _summed([None if b.attn.relative_position_bias_table is None else b.attn._get_rel_pos_bias(), shared])
            for b in m.blocks
        ]


class TimmRelPosViTAdapter(RelativeBias, TimmViTAdapter):
    """timm ``VisionTransformerRelPos`` (``vit_relpos_*``, ``vit_srelpos_*``: a bias table or MLP over the log- or
    linear-spaced offsets, per block or shared; pre-norm blocks with LayerScale or residual post-norm blocks; no
    absolute position embedding; [CLS] or average pooling)."""

    def _block(self, i: int, blk: ModelPart) -> BlockSpec:
        where = f"block {i} ({type(blk).__name__})"
        kind, attn = type(blk).__name__, blk.attn
        if kind not in ("RelPosBlock", "ResPostRelPosBlock") or type(attn).__name__ != "RelPosAttention":
            raise UnsupportedModelError(f"{where}: only timm's RelPosBlock and ResPostRelPosBlock are supported")
        if not (is_linear(attn.qkv) and type(blk.mlp).__name__ == "Mlp"):
            raise UnsupportedModelError(f"{where}: its qkv or MLP is not timm's Linear / two-layer Mlp")
        mlp = blk.mlp
        spec = AttentionSpec(
            qkv=attn.qkv,
            q_norm=attn.q_norm,
            k_norm=attn.k_norm,
            proj=attn.proj,
            num_heads=int(attn.num_heads),
            head_dim=int(attn.head_dim),
            scale=timm_scale(attn, int(attn.head_dim)),
            scale_queries_first=True,
        )
        mlp_spec = MlpSpec(fc1=mlp.fc1, act=mlp.act, fc2=mlp.fc2, mid_norm=getattr(mlp, "norm", IDENTITY))
        if kind == "ResPostRelPosBlock":  # x + norm1(attn(x)), x + norm2(mlp(x))
            return BlockSpec(
                layout="pre_ln",
                norm1=IDENTITY,
                norm2=IDENTITY,
                post1=blk.norm1,
                post2=blk.norm2,
                attn=spec,
                mlp=mlp_spec,
            )
        return BlockSpec(
            layout="pre_ln", norm1=blk.norm1, norm2=blk.norm2, ls1=blk.ls1, ls2=blk.ls2, attn=spec, mlp=mlp_spec
        )

    def block_biases(self, like: Tensor) -> list:
        m = self.model
        shared = None if m.shared_rel_pos is None else m.shared_rel_pos.get_bias()
        return [shared if b.attn.rel_pos is None else b.attn.rel_pos.get_bias() for b in m.blocks]


__all__ = [
    "RelativeBias",
    "BeitEncoder",
    "HFBeitAdapter",
    "HFData2VecVisionAdapter",
    "TimmBeitAdapter",
    "TimmRelPosViTAdapter",
]

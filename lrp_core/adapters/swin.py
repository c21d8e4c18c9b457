"""timm ``SwinTransformer``: windowed attention, shifted windows, patch merging between stages, mean readout.

Each Swin block is a pre-LN block of the shared vocabulary over all the tokens of its stage (docs/METHODS.md
§2i): attention inside a window equals attention over the stage's N tokens with an additive constant
``bias[h, i, j]`` = the relative position bias (plus the shifted windows' −100 region mask) where i and j share a
(shifted) window, and −1e9 elsewhere (a weight of exactly 0) — the MASK_ADD operand, as MPNet's position bias.
Between stages, patch merging is a regrouping of 2×2 neighbours (exact), a LayerNorm and a bias-free Linear.
The readout is the mean of the last stage's tokens (``MeanReadout``); relevance reaches the pixels through the
patch embedding as for a ViT, so the maps are over the first stage's patch grid.

Methods that need one token set across blocks or the last attention over the input patches (the layer products,
raw attention, attention Grad-CAM, partial LRP) or a removable token (token ablation) are refused by method
(:attr:`Adapter.refused_methods`). CDAM reads the tokens entering the last attention, the last stage's: each
input patch gets an equal share of the score of the merged token that covers it (:meth:`block_tokens`).

Shapes: B batch, N tokens of a stage (row-major over its grid), C width, H heads.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch import Tensor, nn

from ..errors import UnsupportedModelError
from ..rules.composites import Composite, Propagation
from ..rules.linear import is_linear
from ..rules.ops import LINEAR, PATCH_CONV, norm_kind
from .blocks import NO_RECORD, AttentionSpec, BlockSpec, MlpSpec, Replay, block_forward, block_relprop
from .readouts import HeadLayer, MeanReadout, Readout
from .records import BlockRelevance, EmbeddingRecord, Trace
from .vit import ViTAdapter

#: the score added between tokens of different windows: its softmax weight is exactly 0
OUTSIDE = -1e9

_LAYER_PRODUCTS = ("attention runs inside local windows and patches are merged between stages, so there is no "
                   "single token set whose attention matrices can be multiplied across blocks")
#: method -> why it is refused on a windowed, hierarchical model
REFUSED_METHODS = {
    "transformer_attribution": _LAYER_PRODUCTS,
    "generic_attention": _LAYER_PRODUCTS,
    "rollout": _LAYER_PRODUCTS,
    "raw_attention": "the last block's attention is between the last stage's merged tokens, not the input patches",
    "attention_gradcam": "the last block's attention is between the last stage's merged tokens, not the input "
                         "patches",
    "partial_lrp": "its map is the last block's attention relevance, between the last stage's merged tokens",
    "token_ablation": "the windows and the patch merging need every grid position: a patch token cannot be removed",
    "pa_lrp": "it adds no position encoding to the tokens that could take relevance (its relative position bias is "
              "a constant inside each window's attention scores)",
}


@dataclass
class MergeRecord:
    """One patch merging: ``x`` (B, N, C) its input, ``flat`` (B, N/4, 4C) the 2×2 groups, ``normed``, ``out``."""

    x: Tensor
    flat: Tensor
    normed: Tensor
    out: Tensor


@dataclass
class StagedTrace(Trace):
    """A :class:`Trace` with the patch mergings: block index → the merging before it."""

    merges: dict = field(default_factory=dict)


def _regroup(x: Tensor, grid: tuple) -> Tensor:
    """(B, h·w, C) -> (B, h/2 · w/2, 4C): timm's ``PatchMerging`` grouping of 2×2 neighbours."""
    B, _, C = x.shape
    h, w = grid
    return x.reshape(B, h // 2, 2, w // 2, 2, C).permute(0, 1, 3, 4, 2, 5).flatten(3).reshape(B, -1, 4 * C)


def _ungroup(R: Tensor, grid: tuple) -> Tensor:
    """The inverse of :func:`_regroup`: (B, h/2 · w/2, 4C) -> (B, h·w, C)."""
    B = R.shape[0]
    h, w = grid
    C = R.shape[-1] // 4
    return R.reshape(B, h // 2, w // 2, 2, 2, C).permute(0, 1, 4, 2, 3, 5).reshape(B, h * w, C)


class TimmSwinAdapter(ViTAdapter):
    """timm ``SwinTransformer`` (fixed image size, grids divisible by the windows, average pooling)."""

    refused_methods = REFUSED_METHODS

    def __init__(self, model: nn.Module):
        super().__init__(model)
        name = type(model).__name__
        if type(model).__name__ != "SwinTransformer":
            raise UnsupportedModelError(f"{name}: only timm's SwinTransformer is replayed")
        pe = model.patch_embed
        if not isinstance(getattr(pe, "proj", None), nn.Conv2d) or not getattr(pe, "strict_img_size", True):
            raise UnsupportedModelError(f"{name}: the patch embedding must be a Conv2d on images of a fixed size")
        self.patch_conv = pe.proj
        self.patch_size = tuple(pe.patch_size)
        self.image_size = tuple(pe.img_size)
        self.num_prefix_tokens = 0
        self.patch_norm = pe.norm
        head = model.head
        pool = getattr(getattr(head, "global_pool", None), "pool_type", None)
        if type(head).__name__ != "ClassifierHead" or pool != "avg" or not is_linear(getattr(head, "fc", None)):
            raise UnsupportedModelError(f"{name}: the head must be timm's ClassifierHead with global_pool='avg' "
                                        "and a Linear fc")
        self.readout: Readout = MeanReadout(norm=model.norm, head_layers=[HeadLayer(LINEAR, head.fc)], start=0)
        grid = tuple(pe.grid_size)
        self.blocks, self.grids, self.merges = [], [], {}
        for s, stage in enumerate(model.layers):
            if not isinstance(stage.downsample, nn.Identity):
                ds = stage.downsample
                if type(ds).__name__ != "PatchMerging" or grid[0] % 2 or grid[1] % 2:
                    raise UnsupportedModelError(f"{name}: stage {s} must merge 2×2 patches of an even grid "
                                                f"(PatchMerging), got {type(ds).__name__} on {grid}")
                self.merges[len(self.blocks)] = (ds, grid)
                grid = (grid[0] // 2, grid[1] // 2)
            for blk in stage.blocks:
                self.blocks.append(self._block(len(self.blocks), blk))
                self.grids.append((grid, blk))

    def _block(self, i: int, blk: nn.Module) -> BlockSpec:
        where = f"block {i} ({type(blk).__name__})"
        if type(blk).__name__ != "SwinTransformerBlock" or type(blk.attn).__name__ != "WindowAttention":
            raise UnsupportedModelError(f"{where}: only timm's SwinTransformerBlock with WindowAttention is supported")
        if getattr(blk, "dynamic_mask", False):
            raise UnsupportedModelError(f"{where}: dynamic masks (always_partition / strict_img_size=False) are not "
                                        "replayed")
        a, mlp = blk.attn, blk.mlp
        if type(mlp).__name__ != "Mlp":
            raise UnsupportedModelError(f"{where}: MLP {type(mlp).__name__} is not timm's Mlp")
        return BlockSpec(layout="pre_ln", norm1=blk.norm1, norm2=blk.norm2,
                         attn=AttentionSpec(qkv=a.qkv, proj=a.proj, num_heads=a.num_heads,
                                            head_dim=a.qkv.out_features // (3 * a.num_heads), scale=a.scale,
                                            scale_queries_first=True),
                         mlp=MlpSpec(fc1=mlp.fc1, act=mlp.act, fc2=mlp.fc2, mid_norm=mlp.norm))

    # ------------------------------------------------------------- forward
    def embed(self, prepared: dict, r: Replay = NO_RECORD, track: bool = False) -> EmbeddingRecord:
        """timm's ``patch_embed``: the patch conv and its norm, tokens row-major over the grid."""
        images = prepared["images"]
        if track:
            images = images.detach().requires_grad_(True)
        patches = r.module(PATCH_CONV, self.patch_conv, images).flatten(2).transpose(1, 2)  # (B, N, C)
        flat = r.module(norm_kind(self.patch_norm), self.patch_norm, patches)
        return EmbeddingRecord(x0=flat, embeds=flat, tokens=flat, x_pos=flat, images=images, patches=patches)

    def window_bias(self, b: int, like: Tensor) -> Tensor:
        """(1, H, N, N) block b's attention as full attention over its stage: the relative position bias (+ the
        shifted windows' region mask) between tokens of one (shifted) window, :data:`OUTSIDE` elsewhere."""
        from timm.models.swin_transformer import window_partition  # only a timm model gets here
        (h, w), blk = self.grids[b]
        ws, shift = tuple(blk.window_size), tuple(blk.shift_size)
        if h % ws[0] or w % ws[1]:
            raise UnsupportedModelError(f"block {b}: its grid {(h, w)} is not a multiple of its window {ws} "
                                        "(timm pads it; the replay does not)")
        idx = torch.arange(h * w, dtype=like.dtype, device=like.device).view(1, h, w, 1)
        if any(shift):
            idx = torch.roll(idx, shifts=(-shift[0], -shift[1]), dims=(1, 2))
        slots = window_partition(idx, ws).reshape(-1, ws[0] * ws[1]).long()  # (windows, A): each slot's token
        rel = blk.attn._get_rel_pos_bias()[0].to(like.dtype)  # (H, A, A)
        mask = blk.attn_mask
        bias = torch.full((rel.shape[0], h * w, h * w), OUTSIDE, dtype=like.dtype, device=like.device)
        for k, tokens in enumerate(slots):
            pair = (slice(None), tokens[:, None], tokens[None, :])
            bias[pair] = rel if mask is None else rel + mask[k].to(like.dtype)
        return bias[None]

    def run_blocks(self, x0: Tensor, mask: Optional[Tensor] = None, r: Replay = NO_RECORD,
                   keep: bool = True, readout: Optional[Readout] = None,
                   positions: Optional[Tensor] = None) -> StagedTrace:
        """Stages of blocks, each stage after the first behind its patch merging, then the mean readout."""
        head = self.readout if readout is None else readout
        trace = StagedTrace(x0=x0, readout=head, first=r.first)
        x = x0
        for b, spec in enumerate(self.blocks):
            if b in self.merges:
                (ds, grid) = self.merges[b]
                flat = _regroup(x, grid)
                normed = r.norm(ds.norm, flat)
                out = r.module(LINEAR, ds.reduction, normed)
                if keep:
                    trace.merges[b] = MergeRecord(x=x, flat=flat, normed=normed, out=out)
                x = out
            rec = block_forward(spec, x, self.window_bias(b, x), r)
            if keep:
                trace.blocks.append(rec)
            x = rec.out
        trace.readout_record = head.forward(x, r)
        return trace

    def block_tokens(self, b: int, row: Tensor) -> Tensor:
        """A block's per-token row (B, N_b) on the input patch grid (B, N_0): each merged token's value spread
        evenly over the patches it covers (sums kept)."""
        (h, w), _ = self.grids[b]
        h0, w0 = self.grids[0][0]
        f = h0 // h
        if f == 1:
            return row
        B = row.shape[0]
        up = row.reshape(B, h, w).repeat_interleave(f, dim=1).repeat_interleave(w0 // w, dim=2)
        return up.reshape(B, h0 * w0) / (f * (w0 // w))

    # ----------------------------------------------------------- relevance
    def _relprop(self, trace: Trace, R_out: Tensor, composite: Composite, stop_block: int, to_input: bool,
                 prepared: Optional[dict], on_attention: Optional[Callable[[int, Tensor], Optional[Tensor]]],
                 release: bool) -> BlockRelevance:
        """The explicit pass of :meth:`Adapter.relprop` with the patch mergings: their Linear rule, their
        norm's rule, and the regrouping undone."""
        assert isinstance(trace, StagedTrace)
        prop = Propagation(composite, names=self._names_for(composite), first=trace.first)
        R = trace.readout.relprop(trace.readout_record, R_out, prop)
        B = R.shape[0]
        L = self.num_blocks
        out = BlockRelevance(attn=[None] * L, tokens=torch.zeros(B, L, trace.x0.shape[1], dtype=R.dtype,
                                                                   device=R.device))
        for b in range(L - 1, stop_block - 1, -1):
            out.tokens[:, b] = self.block_tokens(b, R.sum(-1))
            R, R_A = block_relprop(self.blocks[b], trace.blocks[b], R, prop, deeper=to_input or b > stop_block)
            out.attn[b] = R_A if on_attention is None else on_attention(b, R_A)
            del R_A
            if R is not None and b in self.merges:
                ds, grid = self.merges[b]
                m = trace.merges[b]
                R = prop.linear(ds.reduction, m.normed, R, out=m.out)
                R = _ungroup(prop.unary(norm_kind(ds.norm), m.flat, R, ds.norm), grid)
            if release and not to_input:
                trace.blocks[b] = None
        if R is not None:
            out.inputs = R.sum(-1)
        if to_input:
            out.scores, out.pixels = self.input_relevance(trace, R, prop, prepared)
        return out


__all__ = ["TimmSwinAdapter", "StagedTrace", "MergeRecord", "REFUSED_METHODS"]

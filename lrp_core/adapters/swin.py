"""Swin Transformers (v1 and v2; timm here, Hugging Face in :mod:`.swin_hf`): windowed attention, shifted windows,
patch merging between stages, mean readout.

Each Swin block is a block of the shared vocabulary over all the tokens of its stage (docs/METHODS.md §2i):
attention inside a window equals attention over the stage's N tokens with an additive constant ``bias[h, i, j]``
= the relative position bias (plus the shifted windows' −100 region mask) where i and j share a (shifted)
window, and −1e9 elsewhere (a weight of exactly 0) — the MASK_ADD operand, as MPNet's position bias. A grid that
is not a multiple of the window is filled with the models' zero tokens, which the attention reads after the stage's
tokens (:class:`Windows`, ``AttentionSpec.pad_tokens``). Between
stages, patch merging is a regrouping of 2×2 neighbours (exact), a LayerNorm and a bias-free Linear (v1: norm
first; v2: the Linear first). The readout is the mean of the last stage's tokens (``MeanReadout``); relevance
reaches the pixels through the patch embedding as for a ViT, so the maps are over the first stage's patch grid.

Swin V2 blocks are post-norm (``x + norm(attn(x))``, ``x + norm(mlp(x))``: the pre-LN layout with identity input
norms and branch-output norms) and attend by scaled cosine similarity: q and k are L2-normalised per head
(:class:`CosineNormalize`, a normalisation whose divisor a modified-gradient rule holds constant), their product
is multiplied by a per-head constant ``exp(min(logit_scale, log 100))``, and the position bias is
``16 · sigmoid`` of a small MLP on log-spaced relative coordinates — a constant of the scores, as v1's table.

Methods that need one token set across blocks or the last attention over the input patches (the layer products,
raw attention, attention Grad-CAM, partial LRP) or a removable token (token ablation) are refused by method
(:attr:`Adapter.refused_methods`). CDAM reads the tokens entering the last attention, the last stage's: each
input patch gets an equal share of the score of the merged token that covers it (:meth:`block_tokens`).

Shapes: B batch, N tokens of a stage (row-major over its grid), C width, H heads, A tokens of a window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor, nn

from ..errors import UnsupportedModelError
from ..rules.linear import is_linear
from ..rules.norms import norm_kind
from ..rules.ops import LINEAR, PATCH_CONV
from ..runtime.devices import Placement
from .batches import ImageBatch
from .blocks import NO_RECORD, AttentionSpec, BlockSpec, MlpSpec, Replay, block_forward
from .heads import timm_scale
from .parts import IDENTITY, ModelPart
from .readouts import HeadLayer, MeanReadout, Readout
from .records import EmbeddingRecord, Trace
from .vit import ViTAdapter

#: the score added between tokens of different windows: its softmax weight is exactly 0
OUTSIDE = -1e9
#: Swin V2's bound on the learned per-head logit scale (``log(1 / 0.01)``)
MAX_LOGIT_SCALE = math.log(1.0 / 0.01)

_LAYER_PRODUCTS = (
    "attention runs inside local windows and patches are merged between stages, so there is no "
    "single token set whose attention matrices can be multiplied across blocks"
)
#: method -> why it is refused on a windowed, hierarchical model
REFUSED_METHODS = {
    "transformer_attribution": _LAYER_PRODUCTS,
    "generic_attention": _LAYER_PRODUCTS,
    "rollout": _LAYER_PRODUCTS,
    "raw_attention": "the last block's attention is between the last stage's merged tokens, not the input patches",
    "attention_gradcam": "the last block's attention is between the last stage's merged tokens, not the input patches",
    "partial_lrp": "its map is the last block's attention relevance, between the last stage's merged tokens",
    "token_ablation": "the windows and the patch merging need every grid position: a patch token cannot be removed",
    "pa_lrp": "it adds no position encoding to the tokens that could take relevance (its relative position bias is "
    "a constant inside each window's attention scores)",
}


class CosineNormalize(nn.Module):
    """``x / max(‖x‖, 1e-12)`` over the last dimension, as ``torch.nn.functional.normalize`` computes it (Swin V2's
    cosine attention normalises each head's q and k so).

    A normalisation (operation kind LAYERNORM: identity in the explicit passes); :meth:`denominator` is the
    divisor a modified-gradient rule holds constant (docs/METHODS.md §2i), as LayerNorm's std under AttnLRP.
    """

    eps = 1e-12

    def denominator(self, x: Tensor) -> Tensor:
        """(..., d) -> (..., 1) the clamped L2 norm."""
        return x.norm(2, dim=-1, keepdim=True).clamp_min(self.eps)

    def forward(self, x: Tensor) -> Tensor:
        """(..., d) -> (..., d)."""
        return x / self.denominator(x).expand_as(x)


#: one instance serves every cosine attention (it holds nothing)
COSINE = CosineNormalize()


@dataclass
class Windows:
    """How one block partitions its stage: the stage's ``grid`` (h, w), the window ``size`` and its cyclic
    ``shift`` (both (rows, columns)), and the model's ``block`` (the family reads its bias and mask there).

    A grid that is not a multiple of the window is padded at the bottom and right with zero tokens (at the
    attention's input) up to :attr:`padded`; ``pad_first``: the padding is added before the roll (Hugging Face),
    else after it (timm)."""

    grid: tuple
    size: tuple
    shift: tuple
    block: nn.Module
    pad_first: bool = False

    @property
    def padded(self) -> tuple:
        """(hp, wp) the grid padded to a multiple of the window."""
        return tuple(-(-g // s) * s for g, s in zip(self.grid, self.size))

    @property
    def pad_tokens(self) -> int:
        """How many zero tokens the padding adds."""
        hp, wp = self.padded
        return hp * wp - self.grid[0] * self.grid[1]


@dataclass
class Merge:
    """One patch merging: 2×2 neighbours of ``grid`` regrouped to 4C channels, then ``norm`` and ``reduction``
    (``norm_first``: v1) or ``reduction`` and ``norm`` (v2)."""

    reduction: nn.Module
    norm: nn.Module
    grid: tuple
    norm_first: bool = True


def _regroup(x: Tensor, grid: tuple) -> Tensor:
    """(B, h·w, C) -> (B, h/2 · w/2, 4C): the 2×2 neighbours of each merged token side by side, in the order
    (row 0, col 0), (row 1, col 0), (row 0, col 1), (row 1, col 1) — timm's and Hugging Face's patch merging."""
    B, _, C = x.shape
    h, w = grid
    return x.reshape(B, h // 2, 2, w // 2, 2, C).permute(0, 1, 3, 4, 2, 5).flatten(3).reshape(B, -1, 4 * C)


def window_slots(win: Windows, device: torch.device) -> Tensor:
    """(windows, A) the token at each slot of each window: the grid rolled back by the shift (and padded, before
    or after the roll: :class:`Windows`), cut into windows row-major, each window's slots row-major (the models'
    ``window_partition``). The stage's tokens are 0 … N−1, the padding's N … N + pad_tokens − 1 (row-major)."""
    h, w = win.grid
    (hp, wp), (wh, ww), (sh, sw) = win.padded, win.size, win.shift
    idx = torch.arange(h * w, device=device).view(h, w)

    def pad(t: Tensor) -> Tensor:
        if (hp, wp) == (h, w):
            return t
        full = torch.full((hp, wp), -1, dtype=t.dtype, device=device)
        full[:h, :w] = t
        full[full < 0] = torch.arange(h * w, hp * wp, device=device)
        return full

    if win.pad_first:
        idx = pad(idx)
    if sh or sw:
        idx = torch.roll(idx, shifts=(-sh, -sw), dims=(0, 1))
    if not win.pad_first:
        idx = pad(idx)
    return idx.view(hp // wh, wh, wp // ww, ww).transpose(1, 2).reshape(-1, wh * ww)


def window_softmax(slots: Tensor, dtype: Optional[torch.dtype]) -> Callable[[Tensor], Tensor]:
    """A softmax over each window's keys only, as a windowed model computes it: the masked scores (B, H, N, N) ->
    A (B, H, N, N), each window's (A, A) block taken out, its softmax computed (in ``dtype`` and cast back, or in
    the scores' dtype) and put back; 0 between windows. The same values as the softmax over whole rows with
    :data:`OUTSIDE` between windows, but with the model's own sums (its round-off, e.g. in float32)."""

    def softmax(s: Tensor) -> Tensor:
        at = slots.to(s.device)
        rows, cols = at[:, :, None], at[:, None, :]
        block = s[:, :, rows, cols]  # (B, H, windows, A, A)
        a = block.softmax(dim=-1) if dtype is None else block.softmax(dim=-1, dtype=dtype).to(s.dtype)
        out = s.new_zeros(s.shape)
        out[:, :, rows, cols] = a
        return out

    return softmax


def check_windows(where: str, win: Windows, bias_size: tuple) -> None:
    """Refuse a block whose window is not the one its position bias is made for (the model itself fails there)."""
    ws = win.size
    if tuple(ws) != tuple(bias_size):
        raise UnsupportedModelError(
            f"{where}: its window {ws} differs from the {tuple(bias_size)} window its position bias is made for"
        )


def cpb_bias(mlp: nn.Module, table: Tensor, index: Tensor, heads: int, area: int) -> Tensor:
    """Swin V2's continuous position bias (H, A, A): ``16 · sigmoid`` of the MLP on the log-spaced relative
    coordinates, gathered by relative offset — the models' own operations, in their order."""
    values = mlp(table).view(-1, heads)
    bias = values[index.reshape(-1)].view(area, area, -1).permute(2, 0, 1).contiguous()
    return 16 * torch.sigmoid(bias)


class SwinAdapter(ViTAdapter[ImageBatch]):
    """What the Swin replays share: the patch embedding, the stages (blocks over window biases, patch mergings
    between them), the mean readout and the relevance pass back through the mergings.

    A family sets :attr:`blocks`, :attr:`windows` (one per block), :attr:`merges` (index of the block after
    each merging -> :class:`Merge`), :attr:`logit_scales` (v2: block index -> the attention's learned
    ``logit_scale``) and implements :meth:`window_terms`.
    """

    refused_methods = REFUSED_METHODS
    windows: list
    merges: dict
    logit_scales: dict

    def window_terms(self, b: int, like: Tensor) -> tuple[Tensor, Optional[Tensor]]:
        """Block b's per-window additive terms: the position bias (H, A, A) and the shift's region mask
        (windows, A, A) as the model adds it, or ``None`` without a shift; in ``like``'s dtype and device."""
        raise NotImplementedError

    # ------------------------------------------------------------- forward
    def embed(self, prepared: ImageBatch, r: Replay = NO_RECORD, track: bool = False) -> EmbeddingRecord:
        """The patch conv and its norm, tokens row-major over the grid."""
        images = prepared.images
        if track:
            images = images.detach().requires_grad_(True)
        patches = r.module(PATCH_CONV, self.patch_conv, images).flatten(2).transpose(1, 2)  # (B, N, C)
        flat = r.module(norm_kind(self.patch_norm), self.patch_norm, patches)
        return EmbeddingRecord(x0=flat, embeds=flat, tokens=flat, x_pos=flat, images=images, patches=patches)

    def window_bias(self, b: int, like: Tensor) -> Tensor:
        """(1, H, N, N) block b's attention as full attention over its stage: the position bias (+ the shifted
        windows' region mask) between tokens of one (shifted) window, :data:`OUTSIDE` elsewhere; N counts the
        padding's zero tokens too, after the stage's."""
        win = self.windows[b]
        hp, wp = win.padded
        slots = window_slots(win, like.device)  # (windows, A)
        rel, mask = self.window_terms(b, like)
        terms = rel[:, None] if mask is None else rel[:, None] + mask[None]  # (H, windows or 1, A, A)
        bias = torch.full((rel.shape[0], hp * wp, hp * wp), OUTSIDE, dtype=like.dtype, device=like.device)
        bias[:, slots[:, :, None], slots[:, None, :]] = terms.expand(-1, slots.shape[0], -1, -1)
        return bias[None]

    def logit_scale(self, b: int, like: Tensor) -> Tensor:
        """(H, 1, 1) Swin V2's per-head multiplier of the cosine similarities, ``exp(min(logit_scale, log 100))``:
        a constant of the pass."""
        return torch.clamp(self.logit_scales[b].detach(), max=MAX_LOGIT_SCALE).exp().to(like.dtype)

    def run_blocks(
        self,
        x0: Tensor,
        mask: Optional[Tensor] = None,
        r: Replay = NO_RECORD,
        keep: bool = True,
        readout: Optional[Readout] = None,
        positions: Optional[Tensor] = None,
        rows: Optional[Tensor] = None,
    ) -> Trace:
        """Stages of blocks, each stage after the first behind its patch merging, then the mean readout.

        ``rows`` is always ``None`` here: the mean readout reads every token, so the last block runs at all of them.
        """
        head = self.readout if readout is None else readout
        trace = Trace(x0=x0, readout=head, replay=r)
        place = Placement(self.model, self.module_name)  # split over devices: each block where it computes
        with place.replaying(r):  # and the patch mergings and the readout's modules each on its own
            x = self._stages(x0, r, keep, trace, place)
            trace.readout_record = place.returned(head.forward(x, r), x0.device)
        return trace

    def _stages(self, x0: Tensor, r: Replay, keep: bool, trace: Trace, place: Placement) -> Tensor:
        """The blocks from ``x0`` (each stage after the first behind its patch merging) -> the last block's output."""
        x = x0
        for b, spec in enumerate(self.blocks):
            if b in self.merges:  # its modules where they compute (r.placement): timm's before a stage, HF's after
                m = self.merges[b]
                flat = _regroup(x, m.grid)
                if m.norm_first:
                    mid = r.norm(m.norm, flat)
                    out = r.module(LINEAR, m.reduction, mid)
                else:
                    mid = r.module(LINEAR, m.reduction, flat)
                    out = r.norm(m.norm, mid)
                x = out
            x = place.move(x, place.device(f"block {b}", spec))
            if b in self.logit_scales:  # read now: the parameter's current value, in the pass's dtype
                spec.attn.scale = self.logit_scale(b, x)
            rec = block_forward(spec, x, self.window_bias(b, x), r)
            if keep:
                trace.blocks.append(rec)
            x = rec.out
        return x

    def block_tokens(self, b: int, row: Tensor) -> Tensor:
        """A block's per-token row (B, N_b) on the input patch grid (B, N_0): each merged token's value spread
        evenly over the patches it covers (sums kept)."""
        h, w = self.windows[b].grid
        h0, w0 = self.windows[0].grid
        f = h0 // h
        if f == 1:
            return row
        B = row.shape[0]
        up = row.reshape(B, h, w).repeat_interleave(f, dim=1).repeat_interleave(w0 // w, dim=2)
        return up.reshape(B, h0 * w0) / (f * (w0 // w))


# ----------------------------------------------------------------------------
# timm
# ----------------------------------------------------------------------------
class TimmSwinAdapter(SwinAdapter):
    """timm ``SwinTransformer`` and ``SwinTransformerV2`` (fixed image size, even grids before each merging,
    average pooling; windows padded after the shift, as timm pads them)."""

    def __init__(self, model: ModelPart):
        super().__init__(model)
        name = type(model).__name__
        if name not in ("SwinTransformer", "SwinTransformerV2"):
            raise UnsupportedModelError(f"{name}: only timm's SwinTransformer and SwinTransformerV2 are replayed")
        self.v2 = name == "SwinTransformerV2"
        pe = model.patch_embed
        if not isinstance(getattr(pe, "proj", None), nn.Conv2d) or not getattr(pe, "strict_img_size", True):
            raise UnsupportedModelError(f"{name}: the patch embedding must be a Conv2d on images of a fixed size")
        self.patch_conv = pe.proj
        self.patch_size = tuple(pe.patch_size)
        self.image_size = tuple(pe.img_size)
        self.num_prefix_tokens = 0
        self._patch_norm = pe.norm
        head = model.head
        pool = getattr(getattr(head, "global_pool", None), "pool_type", None)
        if type(head).__name__ != "ClassifierHead" or pool != "avg" or not is_linear(getattr(head, "fc", None)):
            raise UnsupportedModelError(
                f"{name}: the head must be timm's ClassifierHead with global_pool='avg' and a Linear fc"
            )
        self.readout: Readout = MeanReadout(norm=model.norm, head_layers=[HeadLayer(LINEAR, head.fc)], start=0)
        grid = tuple(pe.grid_size)
        self.blocks, self.windows, self.merges, self.logit_scales = [], [], {}, {}
        for s, stage in enumerate(model.layers):
            if not isinstance(stage.downsample, nn.Identity):
                ds = stage.downsample
                if type(ds).__name__ != "PatchMerging" or grid[0] % 2 or grid[1] % 2:
                    raise UnsupportedModelError(
                        f"{name}: stage {s} must merge 2×2 patches of an even grid "
                        f"(PatchMerging), got {type(ds).__name__} on {grid}"
                    )
                self.merges[len(self.blocks)] = Merge(
                    reduction=ds.reduction, norm=ds.norm, grid=grid, norm_first=not self.v2
                )
                grid = (grid[0] // 2, grid[1] // 2)
            for blk in stage.blocks:
                b = len(self.blocks)
                self.blocks.append(self._block(b, blk))
                win = Windows(grid=grid, size=tuple(blk.window_size), shift=tuple(blk.shift_size), block=blk)
                check_windows(f"block {b}", win, blk.attn.window_size)
                self.blocks[b].attn.pad_tokens = win.pad_tokens
                self.windows.append(win)
                if self.v2:
                    self.logit_scales[b] = blk.attn.logit_scale

    def _block(self, i: int, blk: ModelPart) -> BlockSpec:
        where = f"block {i} ({type(blk).__name__})"
        block_name = "SwinTransformerV2Block" if self.v2 else "SwinTransformerBlock"
        if type(blk).__name__ != block_name or type(blk.attn).__name__ != "WindowAttention":
            raise UnsupportedModelError(f"{where}: only timm's {block_name} with WindowAttention is supported")
        if getattr(blk, "dynamic_mask", False):
            raise UnsupportedModelError(
                f"{where}: dynamic masks (always_partition / strict_img_size=False) are not replayed"
            )
        a, mlp = blk.attn, blk.mlp
        if type(mlp).__name__ != "Mlp":
            raise UnsupportedModelError(f"{where}: MLP {type(mlp).__name__} is not timm's Mlp")
        spec = MlpSpec(fc1=mlp.fc1, act=mlp.act, fc2=mlp.fc2, mid_norm=mlp.norm)
        heads, d = a.num_heads, a.qkv.out_features // (3 * a.num_heads)
        if not self.v2:
            return BlockSpec(
                layout="pre_ln",
                norm1=blk.norm1,
                norm2=blk.norm2,
                mlp=spec,
                attn=AttentionSpec(
                    qkv=a.qkv,
                    proj=a.proj,
                    num_heads=heads,
                    head_dim=d,
                    scale=timm_scale(a, d),
                    scale_queries_first=True,
                ),
            )
        from .eva import BiasedQkv  # the same fused projection with its attention-added bias

        qkv = a.qkv if a.q_bias is None else BiasedQkv(a)
        # post-norm block: norm1 / norm2 act on the branch outputs; the scale is set per pass (logit_scale)
        return BlockSpec(
            layout="pre_ln",
            norm1=IDENTITY,
            norm2=IDENTITY,
            post1=blk.norm1,
            post2=blk.norm2,
            mlp=spec,
            attn=AttentionSpec(
                qkv=qkv, proj=a.proj, num_heads=heads, head_dim=d, scale=1.0, q_norm=COSINE, k_norm=COSINE
            ),
        )

    def window_terms(self, b: int, like: Tensor) -> tuple[Tensor, Optional[Tensor]]:
        blk = self.windows[b].block
        a = blk.attn
        with torch.no_grad():
            if self.v2:
                rel = cpb_bias(
                    a.cpb_mlp, a.relative_coords_table, a.relative_position_index, a.num_heads, blk.window_area
                )
            else:
                rel = a._get_rel_pos_bias()[0]  # (H, A, A)
        mask = blk.attn_mask
        return rel.to(like.dtype), None if mask is None else mask.to(like.dtype)


__all__ = [
    "SwinAdapter",
    "TimmSwinAdapter",
    "Merge",
    "Windows",
    "CosineNormalize",
    "REFUSED_METHODS",
    "window_slots",
    "window_softmax",
    "check_windows",
    "cpb_bias",
]

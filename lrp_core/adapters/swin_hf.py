"""Hugging Face ``SwinForImageClassification`` and ``Swinv2ForImageClassification``: the Swin replay of
:mod:`.swin` with transformers' module names.

The arithmetic is timm's (docs/METHODS.md §2i): the patch conv and its LayerNorm, stages of windowed blocks
(each a block over the stage's tokens with the window bias), patch merging at the end of every stage but the
last, the final LayerNorm, the mean of the tokens (``AdaptiveAvgPool1d``) and the classifier. What differs:

* patch merging concatenates ``x[0::2, 0::2], x[1::2, 0::2], x[0::2, 1::2], x[1::2, 1::2]`` — the order of
  timm's regrouping, so :func:`~.swin._regroup` serves both;
* Swin v1 clamps a block's window to its stage's grid when the grid is no larger than the window (and then
  does not shift); it reads the layer's current ``window_size`` / ``shift_size``, so the replay does too;
* v1 computes attention through transformers' attention interface: ``sdpa`` (in the model's dtype) or
  ``eager`` (its softmax in float32, cast back — replayed so);
* Swin V2 adds the shifted windows' region mask twice (−200 between regions; the replay adds it as the model
  does) and is post-norm: ``layernorm_before`` acts on the attention's output, ``layernorm_after`` on the MLP's.

A grid that is not a multiple of the window is padded with zero tokens before the shift, as transformers does
(:class:`~.swin.Windows`). Refused: absolute position embeddings (``use_absolute_embeddings``), odd grids before a
patch merging (transformers pads them; the replay does not), images of another size than the config's.

Shapes: B batch, N tokens of a stage, C width, H heads, A tokens of a window.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from ..errors import UnsupportedModelError
from ..rules.ops import LINEAR
from .blocks import AttentionSpec, BlockSpec
from .kernels import eager_softmax_dtype
from .parts import IDENTITY, ModelPart
from .readouts import HeadLayer, MeanReadout, Readout
from .swin import COSINE, Merge, SwinAdapter, Windows, check_windows, cpb_bias, window_slots, window_softmax
from .vit import hf_linear_head, hf_mlp

#: the attention implementations of transformers' Swin the replay reproduces
ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")


class HFSwinAdapter(SwinAdapter):
    """Hugging Face ``SwinForImageClassification`` (v1) and ``Swinv2ForImageClassification`` (v2)."""

    def __init__(self, model: ModelPart):
        super().__init__(model)
        name = type(model).__name__
        if name not in ("SwinForImageClassification", "Swinv2ForImageClassification"):
            raise UnsupportedModelError(
                f"{name}: only SwinForImageClassification and Swinv2ForImageClassification are replayed"
            )
        self.v2 = name == "Swinv2ForImageClassification"
        cfg = model.config
        base = model.swinv2 if self.v2 else model.swin
        emb = base.embeddings
        if emb.position_embeddings is not None:
            raise UnsupportedModelError(
                f"{name}: absolute position embeddings (use_absolute_embeddings=True) are not replayed"
            )
        if base.pooler is None or not isinstance(base.pooler, nn.AdaptiveAvgPool1d):
            raise UnsupportedModelError(
                f"{name}: the classifier must read the mean of the last stage's tokens (an AdaptiveAvgPool1d pooler)"
            )
        impl = getattr(cfg, "_attn_implementation", None) or "eager"
        if not self.v2 and impl not in ATTENTION_IMPLEMENTATIONS:
            raise UnsupportedModelError(
                f"{name}: attention implementation {impl!r} is not replayed; set "
                f"attn_implementation to one of {sorted(ATTENTION_IMPLEMENTATIONS)}"
            )
        # Swin v2's eager kernel computes its softmax in the model's dtype (it has no other implementation)
        self.softmax_dtype = None if self.v2 else eager_softmax_dtype(cfg)
        pe = emb.patch_embeddings
        self.patch_conv = pe.projection
        self.patch_size = tuple(pe.patch_size)
        size = cfg.image_size
        self.image_size = tuple(size) if isinstance(size, (tuple, list)) else (int(size), int(size))
        self.num_prefix_tokens = 0
        self._patch_norm = emb.norm
        (clf,) = hf_linear_head(model, "classifier")
        self.readout: Readout = MeanReadout(norm=base.layernorm, head_layers=[HeadLayer(LINEAR, clf)], start=0)
        self._read_stages(base, tuple(pe.grid_size), name)

    def _read_stages(self, base: ModelPart, grid: tuple, name: str) -> None:
        """Read every stage's blocks, their windows (and v2's logit scales) and the patch merging after the stage.

        Parameters
        ----------
        base : ModelPart
            The model's ``swin`` / ``swinv2`` module (its ``encoder.layers`` are the stages).
        grid : tuple
            The patch grid ``(h, w)`` of the first stage.
        name : str
            The model's class name, for the refusals.
        """
        self.blocks, self.windows, self.merges, self.logit_scales = [], [], {}, {}
        for s, stage in enumerate(base.encoder.layers):
            for layer in stage.blocks:
                b = len(self.blocks)
                self.blocks.append(self._block(b, layer))
                win = self._windows(layer, grid)
                bias_size = (
                    layer.attention.self.window_size if self.v2 else layer.attention.relative_position_bias.window_size
                )
                check_windows(f"block {b}", win, bias_size)
                self.blocks[b].attn.pad_tokens = win.pad_tokens
                if self.softmax_dtype is not None:  # eager: the float32 softmax over each window, as the model sums
                    self.blocks[b].attn.softmax = window_softmax(
                        window_slots(win, torch.device("cpu")), self.softmax_dtype
                    )
                self.windows.append(win)
                if self.v2:
                    self.logit_scales[b] = layer.attention.self.logit_scale
            if stage.downsample is not None:
                ds = stage.downsample
                if grid[0] % 2 or grid[1] % 2:
                    raise UnsupportedModelError(
                        f"{name}: stage {s} merges patches of the odd grid {grid} "
                        "(transformers pads it; the replay does not)"
                    )
                self.merges[len(self.blocks)] = Merge(
                    reduction=ds.reduction, norm=ds.norm, grid=grid, norm_first=not self.v2
                )
                grid = (grid[0] // 2, grid[1] // 2)

    def _windows(self, layer: ModelPart, grid: tuple) -> Windows:
        """The block's windows on ``grid``: v1 clamps its (current) window to a grid no larger than it and then
        does not shift, as ``SwinLayer.set_shift_and_window_size`` does on every forward; v2 fixed them when built."""
        ws, shift = int(layer.window_size), int(layer.shift_size)
        if not self.v2 and min(grid) <= ws:
            ws, shift = min(grid), 0
        return Windows(grid=grid, size=(ws, ws), shift=(shift, shift), block=layer, pad_first=True)

    def _block(self, i: int, layer: ModelPart) -> BlockSpec:
        where = f"block {i} ({type(layer).__name__})"
        expected = "Swinv2Layer" if self.v2 else "SwinLayer"
        if type(layer).__name__ != expected:
            raise UnsupportedModelError(f"{where}: only transformers' {expected} is supported")
        mlp = hf_mlp(layer)
        if not self.v2:
            a = layer.attention
            d = a.head_dim
            return BlockSpec(
                layout="pre_ln",
                norm1=layer.layernorm_before,
                norm2=layer.layernorm_after,
                mlp=mlp,
                attn=AttentionSpec(
                    q=a.q_proj,
                    k=a.k_proj,
                    v=a.v_proj,
                    proj=a.o_proj,
                    num_heads=a.num_attention_heads,
                    head_dim=d,
                    scale=a.scaling,
                    softmax_dtype=self.softmax_dtype,
                ),
            )
        sa = layer.attention.self
        # post-norm: layernorm_before acts on the attention's output, layernorm_after on the MLP's; the scale is
        # the per-head logit scale, set per pass
        return BlockSpec(
            layout="pre_ln",
            norm1=IDENTITY,
            norm2=IDENTITY,
            post1=layer.layernorm_before,
            post2=layer.layernorm_after,
            mlp=mlp,
            attn=AttentionSpec(
                q=sa.query,
                k=sa.key,
                v=sa.value,
                proj=layer.attention.output.dense,
                num_heads=sa.num_attention_heads,
                head_dim=sa.attention_head_size,
                scale=1.0,
                q_norm=COSINE,
                k_norm=COSINE,
            ),
        )

    def window_terms(self, b: int, like: Tensor) -> tuple[Tensor, Optional[Tensor]]:
        win = self.windows[b]
        layer = win.block
        h, w = win.padded  # the mask covers the padded grid, as the model builds it
        with torch.no_grad():
            if self.v2:
                sa = layer.attention.self
                rel = cpb_bias(
                    sa.continuous_position_bias_mlp,
                    sa.relative_coords_table,
                    sa.relative_position_index,
                    sa.num_attention_heads,
                    win.size[0] * win.size[1],
                )
            else:
                rel = layer.attention.relative_position_bias()[0]  # (H, A, A)
            mask = None
            if any(win.shift):  # the layer's own region mask (its window and shift are the ones replayed then)
                mask = layer.get_attn_mask(h, w, dtype=like.dtype, device=like.device)
                if self.v2:  # Swinv2SelfAttention adds the mask twice
                    mask = mask + mask
        return rel.to(like.dtype), mask


__all__ = ["HFSwinAdapter", "ATTENTION_IMPLEMENTATIONS"]

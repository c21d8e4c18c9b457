"""timm ``Eva`` (EVA, EVA-02 and the rotary-position ViTs timm builds on it): a ViT with one token set across
blocks, so every method of the registry runs on it as on a timm ``VisionTransformer``.

What differs from the plain ViT, and how the replay describes it with the shared block vocabulary
(docs/METHODS.md §2h):

* rotary position embedding of q and k (timm's ``RotaryEmbeddingCat``: one table ``cat(sin, cos)`` (P, 2d) over
  the patch grid), applied after the q/k norms to the patch tokens only — the class and register tokens pass
  unrotated (``AttentionSpec.rope_skip``); timm's default turns the channel pairs (2i, 2i+1)
  (``AttentionSpec.rope_interleaved``), ``rope_rotate_half=True`` the halves (i, i + d/2). The rotation is the
  ROPE operation of the decoders (its rules: docs/METHODS.md §2c);
* a fused qkv Linear without bias, whose bias ``cat(q_bias, 0, v_bias)`` is added by the attention itself:
  :class:`BiasedQkv` shows the pair to the engine as one Linear;
* gated MLPs: ``SwiGLU`` (separate gate and up projections, optionally a norm on the hidden units) and
  ``GluMlp`` (one packed projection, gate first);
* LayerScale as bare parameters ``gamma_1`` / ``gamma_2``: :class:`GammaScale` shows each as a module;
* post-norm blocks (``use_post_norm``: ``x + norm1(attn(x))``, ``x + norm2(mlp(x))``): the branch norms
  ``post1`` / ``post2`` of the pre-LN layout, with no input norms.

Refused, with the reason: timm's ``AttentionRope`` blocks (``attn_type='rope'``), gated attention, and rotary
embeddings other than ``RotaryEmbeddingCat`` (per-depth learned frequencies ``'mixed'``, ``'dinov3'``, ``'mrope'``).

Shapes: B batch, N tokens (prefix tokens + P patches), D width, H heads, d head width.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from ..errors import UnsupportedModelError
from ..rules.composites import Composite
from ..rules.linear import LinearView, effective_linear, is_linear
from .batches import ImageBatch
from .blocks import AttentionSpec, BlockSpec, MlpSpec
from .heads import timm_scale
from .kernels import pairs_to_halves
from .parts import IDENTITY, ModelPart
from .readouts import Readout
from .records import Trace
from .vit import TimmViTAdapter


class BiasedQkv(LinearView):
    """EVA's fused qkv projection and the bias its attention adds: ``x Wᵀ + cat(q_bias, k_bias, v_bias)``.

    Neither the Linear nor the bias tensors are registered here (the view owns no parameters and always reads
    the attention's current ones). ``forward`` computes what the attention computes: ``F.linear`` with the
    concatenated bias, or the Linear then the bias added where the model adds it separately
    (``qkv_bias_separate``).
    """

    attn: ModelPart  # the model's attention (set in __init__: a plain attribute, not a child module)

    def __init__(self, attn: nn.Module):
        super().__init__()
        object.__setattr__(self, "attn", attn)  # plain attribute: not a child module

    def linear_parts(self) -> tuple[Tensor, Tensor]:
        """(weight (3·H·d, D), bias (3·H·d,)) of what ``forward`` computes: where the bias is added after the
        Linear is called, the Linear's effective map (a peft adapter on qkv acts there); inside ``F.linear``, the
        Linear's own weight (the model reads ``qkv.weight``, so an adapter on qkv has no effect)."""
        a = self.attn
        bias = torch.cat((a.q_bias, a.k_bias, a.v_bias))
        if getattr(a, "qkv_bias_separate", False):
            weight, own = effective_linear(a.qkv)
            return weight, bias if own is None else own + bias
        return a.qkv.weight, bias

    @property
    def weight(self) -> Tensor:
        return self.attn.qkv.weight

    @property
    def bias(self) -> Tensor:
        return self.linear_parts()[1]

    @property
    def in_features(self) -> int:
        return int(self.attn.qkv.in_features)

    @property
    def out_features(self) -> int:
        return int(self.attn.qkv.out_features)

    def forward(self, x: Tensor) -> Tensor:
        """(..., D) -> (..., 3·H·d), the attention's own arithmetic."""
        a = self.attn
        bias = torch.cat((a.q_bias, a.k_bias, a.v_bias))
        if getattr(a, "qkv_bias_separate", False):
            return a.qkv(x) + bias
        return torch.nn.functional.linear(x, weight=a.qkv.weight, bias=bias)


class GammaScale(nn.Module):
    """A block's LayerScale parameter (``gamma_1`` or ``gamma_2``) as a module: ``gamma * x``, the block's order."""

    block: ModelPart  # the model's block (set in __init__: a plain attribute)

    def __init__(self, block: nn.Module, name: str):
        super().__init__()
        object.__setattr__(self, "block", block)  # plain attribute: the view owns no parameters
        self.name = name

    def forward(self, x: Tensor) -> Tensor:
        return getattr(self.block, self.name) * x


def _eva_mlp(mlp: ModelPart, where: str) -> MlpSpec:
    """timm ``Mlp``, ``SwiGLU`` or ``GluMlp`` (SwiGLUPacked) as an :class:`MlpSpec`."""
    kind = type(mlp).__name__
    norm = getattr(mlp, "norm", IDENTITY)
    if kind == "Mlp" and is_linear(getattr(mlp, "fc1", None)):
        return MlpSpec(fc1=mlp.fc1, act=mlp.act, fc2=mlp.fc2, mid_norm=norm)
    if kind == "SwiGLU" and is_linear(getattr(mlp, "fc1_g", None)):  # act(fc1_g(x)) * fc1_x(x)
        return MlpSpec(gate=mlp.fc1_g, fc1=mlp.fc1_x, act=mlp.act, fc2=mlp.fc2, mid_norm=norm)
    if kind == "GluMlp" and not mlp.gate_last and getattr(mlp, "chunk_dim", -1) == -1:  # act(x1) * x2
        return MlpSpec(fc1=mlp.fc1, fused_gate=True, act=mlp.act, fc2=mlp.fc2, mid_norm=norm)
    raise UnsupportedModelError(f"{where}: MLP {kind} is not timm's Mlp, SwiGLU or GluMlp with the gate first")


class TimmEvaAdapter(TimmViTAdapter):
    """timm ``Eva`` ([CLS] or average pooling, registers, absolute and / or rotary positions)."""

    def __init__(self, model: nn.Module):
        name = type(model).__name__
        rope = getattr(model, "rope", None)
        if getattr(model, "rope_mixed", False) or (rope is not None and type(rope).__name__ != "RotaryEmbeddingCat"):
            raise UnsupportedModelError(
                f"{name} with rotary embedding {type(rope).__name__} is not supported: only timm's "
                "RotaryEmbeddingCat (rope_type='cat', one table for every block) is replayed"
            )
        if rope is not None and getattr(rope, "aug_active", False):
            raise UnsupportedModelError(
                f"{name}: its rotary embedding draws random coordinate shifts (shift / jitter / rescale_coords), "
                "so the model is not one function of the image"
            )
        if rope is not None and getattr(model, "dynamic_img_size", False):
            raise UnsupportedModelError(
                f"{name} with dynamic_img_size=True and rotary embeddings is not supported: the rotary angles "
                "depend on the image's patch grid; build the model for one image size"
            )
        super().__init__(model)

    def _block(self, i: int, blk: ModelPart) -> BlockSpec:
        where = f"block {i} ({type(blk).__name__})"
        kind = type(blk).__name__
        if kind not in ("EvaBlock", "EvaBlockPostNorm"):
            raise UnsupportedModelError(f"{where}: only timm's EvaBlock and EvaBlockPostNorm are supported")
        attn = blk.attn
        if type(attn).__name__ != "EvaAttention":
            raise UnsupportedModelError(
                f"{where}: attention {type(attn).__name__} is not supported (attn_type='rope' builds timm's "
                "AttentionRope); EvaAttention (attn_type='eva') is"
            )
        if getattr(attn, "gate", None) is not None:
            raise UnsupportedModelError(
                f"{where}: gated attention (a sigmoid gate on the heads' output, gated_attn=True) is not supported"
            )
        if self.model.rope is not None and int(attn.num_prefix_tokens) != self.num_prefix_tokens:
            raise UnsupportedModelError(
                f"{where}: its attention leaves {attn.num_prefix_tokens} tokens unrotated, "
                f"the model has {self.num_prefix_tokens} prefix tokens"
            )
        parts: dict[str, ModelPart]
        if attn.qkv is not None:
            qkv = attn.qkv if attn.q_bias is None else BiasedQkv(attn)
            parts = dict(qkv=qkv)
        else:
            parts = dict(q=attn.q_proj, k=attn.k_proj, v=attn.v_proj)
        spec = AttentionSpec(
            **parts,
            q_norm=attn.q_norm,
            k_norm=attn.k_norm,
            ctx_norm=attn.norm,
            proj=attn.proj,
            num_heads=attn.num_heads,
            head_dim=attn.head_dim,
            scale=timm_scale(attn, int(attn.head_dim)),
            scale_queries_first=True,
            rotary=self.model.rope is not None,
            rope_skip=int(attn.num_prefix_tokens),
            rope_interleaved=not getattr(attn, "rotate_half", False),
        )
        mlp = _eva_mlp(blk.mlp, where)
        if kind == "EvaBlockPostNorm":  # x + norm1(attn(x)), x + norm2(mlp(x))
            return BlockSpec(
                layout="pre_ln", norm1=IDENTITY, norm2=IDENTITY, post1=blk.norm1, post2=blk.norm2, attn=spec, mlp=mlp
            )
        return BlockSpec(
            layout="pre_ln",
            norm1=blk.norm1,
            norm2=blk.norm2,
            attn=spec,
            mlp=mlp,
            ls1=IDENTITY if blk.gamma_1 is None else GammaScale(blk, "gamma_1"),
            ls2=IDENTITY if blk.gamma_2 is None else GammaScale(blk, "gamma_2"),
        )

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
        """The replay (:meth:`Adapter.forward`); with rotary embeddings the trace names each token's position
        (B, N), which a token ablation keeps for the tokens that remain (their rotary angles stay theirs)."""
        trace = super().forward(
            prepared, grad=grad, composite=composite, track=track, readout=readout, read_rows=read_rows
        )
        if self.model.rope is not None:
            B, N = trace.x0.shape[:2]
            trace.positions = torch.arange(N, device=trace.x0.device).expand(B, N)
        return trace

    def rotary_tables(self, like: Tensor) -> tuple[Tensor, Tensor]:
        """(cos, sin), each (P, d), of the model's rotary embedding over its patch grid (the model's own call), in
        the replay's channel order (pairs laid out as halves where the model turns interleaved pairs)."""
        rope = self.model.rope
        emb = (
            rope.get_embed() if hasattr(rope, "feat_shape") else rope.get_embed(shape=self.model.patch_embed.grid_size)
        )
        sin, cos = emb.to(like.dtype).chunk(2, dim=-1)  # timm's layout: cat(sin, cos)
        if self.blocks[0].attn.rope_interleaved:
            sin, cos = pairs_to_halves(sin), pairs_to_halves(cos)
        return cos, sin

    def block_context(
        self, x0: Tensor, mask: Optional[Tensor], positions: Optional[Tensor], fused: bool = False
    ) -> list:
        """Per block (no mask, the rotary tables of the patch tokens (B, N − prefix, d) at their positions)."""
        if self.model.rope is None:
            return [(None, None)] * len(self.blocks)
        P0 = self.num_prefix_tokens
        if positions is None:
            positions = torch.arange(x0.shape[1], device=x0.device)[None]
        rows = positions[:, P0:] - P0  # the patches' places on the grid (the prefix tokens are not rotated)
        cos, sin = self.rotary_tables(x0)
        if cos.shape[0] != self.model.patch_embed.num_patches:
            raise UnsupportedModelError(
                f"{type(self.model).__name__}: its rotary table has {cos.shape[0]} rows "
                f"for {self.model.patch_embed.num_patches} patches"
            )
        rope = (cos[rows.to(cos.device)], sin[rows.to(cos.device)])
        return [(None, rope)] * len(self.blocks)


__all__ = ["TimmEvaAdapter", "BiasedQkv", "GammaScale"]

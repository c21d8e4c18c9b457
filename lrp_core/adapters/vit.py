"""Pre-LayerNorm Vision Transformers: timm ``VisionTransformer`` and Hugging Face ``ViTForImageClassification``.

The adapter never changes the model. It reads the model's own submodules and
replays the forward pass with the attention computed explicitly (whatever the
model's fused-attention flag says), so that the attention maps, their
gradients and every activation the relevance rules need are at hand. The
replay reproduces the model's logits to float32 round-off (tested).

Shapes: B batch, N tokens (prefix tokens + P patches), D width, H heads,
d = D_attn / H head width, C classes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from ..errors import InputError, UnsupportedModelError
from ..rules import Composite, safe_div, select, zbox_conv2d
from .base import Adapter, BlockRelevance, Trace


@dataclass
class BlockParts:
    """The submodules of one pre-LN block, named the same for every source."""

    norm1: nn.Module
    qkv: Optional[nn.Linear]  # fused (timm) ...
    q: Optional[nn.Linear]  # ... or separate projections (Hugging Face)
    k: Optional[nn.Linear]
    v: Optional[nn.Linear]
    q_norm: nn.Module
    k_norm: nn.Module
    attn_norm: nn.Module
    proj: nn.Linear
    ls1: nn.Module
    norm2: nn.Module
    fc1: nn.Linear
    act: nn.Module
    mlp_norm: nn.Module
    fc2: nn.Linear
    ls2: nn.Module
    num_heads: int
    head_dim: int
    scale: float
    scale_queries_first: bool  # timm scales q before q·kᵀ, Hugging Face after


_IDENTITY = nn.Identity()


def _is_identity_like(m: Optional[nn.Module]) -> bool:
    return m is None or isinstance(m, (nn.Identity, nn.Dropout))


class PreLNViTAdapter(Adapter):
    """The replay and the relevance pass shared by timm and Hugging Face ViTs."""

    family = "vit"

    # set by the subclasses
    blocks: list[BlockParts]
    final_norm: nn.Module
    fc_norm: nn.Module
    head: Optional[nn.Linear]
    patch_conv: nn.Conv2d
    patch_norm: nn.Module
    num_prefix_tokens: int
    image_size: Optional[tuple[int, int]]  # None: any multiple of the patch size
    patch_size: tuple[int, int]

    # ------------------------------------------------------------------ facts
    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_heads(self) -> int:
        return self.blocks[0].num_heads

    @property
    def num_classes(self) -> int:
        return 0 if self.head is None else self.head.out_features

    def output_slice(self) -> slice:
        return slice(self.num_prefix_tokens, None)

    # ------------------------------------------------------------ validation
    def check_inputs(self, inputs) -> dict:
        if isinstance(inputs, dict) or not isinstance(inputs, Tensor):
            raise InputError(
                f"{type(self.model).__name__} explains images: pass a float tensor of shape (B, 3, H, W), "
                f"got {type(inputs).__name__}"
            )
        if inputs.dim() == 3:
            raise InputError(f"images must be batched (B, 3, H, W); got {tuple(inputs.shape)} — add a batch "
                             "dimension with images.unsqueeze(0)")
        if inputs.dim() != 4 or inputs.shape[1] != self.patch_conv.in_channels:
            raise InputError(f"images must have shape (B, {self.patch_conv.in_channels}, H, W); "
                             f"got {tuple(inputs.shape)}")
        if inputs.shape[0] == 0:
            raise InputError("the batch is empty (B = 0)")
        if not inputs.is_floating_point():
            raise InputError(f"images must be a float tensor (normalised), got dtype {inputs.dtype}")
        H, W = inputs.shape[-2:]
        if self.image_size is not None and (H, W) != tuple(self.image_size):
            raise InputError(
                f"{type(self.model).__name__} expects images of size {tuple(self.image_size)}, got ({H}, {W}); "
                "resize them (e.g. with the model's preprocess)"
            )
        ph, pw = self.patch_size
        if H % ph or W % pw:
            raise InputError(f"image size ({H}, {W}) is not a multiple of the patch size {self.patch_size}")
        if not torch.isfinite(inputs).all():
            raise InputError("images contain NaN or infinite values")
        return {"images": inputs}

    def grid(self, prepared: dict) -> tuple[int, int]:
        H, W = prepared["images"].shape[-2:]
        return H // self.patch_size[0], W // self.patch_size[1]

    # --------------------------------------------------------------- forward
    def embed(self, prepared: dict) -> tuple[Tensor, Tensor]:
        """Patch tokens with prefix tokens and position embedding.

        Returns:
            tokens: (B, N, D) the tokens before the position embedding (prefix tokens first).
            x_pos: (B, N, D) tokens + position embedding (before ``norm_pre``).
        """
        raise NotImplementedError

    norm_pre: nn.Module = _IDENTITY

    def forward(self, prepared: dict, *, grad: bool = False) -> Trace:
        with torch.set_grad_enabled(grad):
            tokens, x_pos = self.embed(prepared)
            x0 = self.norm_pre(x_pos)  # identity in most ViTs; a LayerNorm passes relevance unchanged
            if grad and not x0.requires_grad:  # frozen models still need a graph to the attention maps
                x0 = x0.detach().requires_grad_(True)
            trace = self.run_blocks(x0)
            trace.tokens, trace.x_pos = tokens, x_pos
        return trace

    def run_blocks(self, x0: Tensor, mask: Optional[Tensor] = None) -> Trace:
        """Blocks, final norm, pooling and head from the block-0 input ``x0`` (B, N, D)."""
        trace = Trace(x0=x0)
        x = x0
        for p in self.blocks:
            x, acts = _block_forward(p, x)
            trace.acts.append(acts)
        trace.cls_token = self.final_norm(x)[:, 0]
        trace.pooled = self.fc_norm(trace.cls_token)
        trace.logits = self.head(trace.pooled) if self.head is not None else trace.pooled
        return trace

    def cdam_tokens(self, trace: Trace) -> Tensor:
        return trace.acts[-1]["h1"]

    # ------------------------------------------------------------- relevance
    def relprop(self, trace: Trace, R_out: Tensor, composite: Composite, stop_block: int = 0,
                to_pixels: bool = False, prepared: Optional[dict] = None) -> BlockRelevance:
        B, N, D = trace.x0.shape
        L = self.num_blocks
        cache: dict = {}  # the weights' signed parts, computed once per pass
        R_pooled = composite.linear(self.head, trace.pooled, R_out)  # fc_norm: identity
        R = torch.zeros(B, N, D, dtype=R_pooled.dtype, device=R_pooled.device)
        R[:, 0] = select(trace.cls_token, R_pooled)  # [CLS] select; final norm: identity
        out = BlockRelevance(attn=[None] * L,
                             tokens=torch.zeros(B, L, N, dtype=R.dtype, device=R.device))
        for b in range(L - 1, stop_block - 1, -1):
            out.tokens[:, b] = R.sum(-1)  # leaving block b
            deeper = to_pixels or b > stop_block
            R, out.attn[b] = _block_relprop(self.blocks[b], trace.acts[b], R, composite, deeper, cache)
        if R is not None:
            out.inputs = R.sum(-1)
        if to_pixels:
            out.pixels = self._relprop_pixels(trace, R, composite, prepared)
        return out

    def _relprop_pixels(self, trace: Trace, R: Tensor, composite: Composite, prepared: dict) -> Tensor:
        """Block-0 input relevance -> (B, H, W) pixels: position add, drop prefix, zᴮ conv."""
        R_tok = trace.tokens * safe_div(R, trace.x_pos)  # position add, generic rule: keep the token part
        R_patch = R_tok[:, self.num_prefix_tokens:]  # patch_norm: identity
        h, w = self.grid(prepared)
        R_map = R_patch.transpose(1, 2).reshape(R.shape[0], -1, h, w)
        conv = self.patch_conv
        R_px = zbox_conv2d(prepared["images"], conv.weight, R_map, stride=conv.stride, padding=conv.padding)
        return R_px.sum(dim=1)


# ----------------------------------------------------------------------------
# one block, forward and backward
# ----------------------------------------------------------------------------
def _block_forward(p: BlockParts, x: Tensor) -> tuple[Tensor, dict]:
    B, N, _ = x.shape
    H, d = p.num_heads, p.head_dim
    h1 = p.norm1(x)
    if p.qkv is not None:
        qkv_out = p.qkv(h1)  # (B, N, 3·H·d)
        q, k, v = qkv_out.reshape(B, N, 3, H, d).permute(2, 0, 3, 1, 4).unbind(0)
        lin_out = {"qkv": qkv_out}
    else:
        lin_out = {n: lin(h1) for n, lin in (("q", p.q), ("k", p.k), ("v", p.v))}
        q, k, v = (lin_out[n].reshape(B, N, H, d).transpose(1, 2) for n in "qkv")
    q, k = p.q_norm(q), p.k_norm(k)
    if p.scale_queries_first:
        scores = (q * p.scale) @ k.transpose(-2, -1)
    else:
        scores = (q @ k.transpose(-2, -1)) * p.scale
    A = scores.softmax(dim=-1)  # (B, H, N, N)
    ctx = A @ v  # (B, H, N, d)
    o = p.attn_norm(ctx.transpose(1, 2).reshape(B, N, H * d))
    lin_out["proj"] = p.proj(o)
    a = p.ls1(lin_out["proj"])
    x2 = x + a
    h2 = p.norm2(x2)
    lin_out["fc1"] = p.fc1(h2)
    g = p.mlp_norm(p.act(lin_out["fc1"]))
    lin_out["fc2"] = p.fc2(g)
    f = p.ls2(lin_out["fc2"])
    x3 = x2 + f
    return x3, {"x": x, "h1": h1, "q": q, "k": k, "v": v, "A": A, "ctx": ctx, "o": o, "a": a,
                "x2": x2, "h2": h2, "g": g, "f": f, "out": lin_out}


def _block_relprop(p: BlockParts, act: dict, R: Tensor, c: Composite, deeper: bool, cache: dict):
    """Relevance of the block output -> (relevance of the block input or None, R^A)."""
    add, matmul, clone = c.op("add"), c.op("matmul"), c.op("clone")
    B, N, _ = R.shape
    H, d = p.num_heads, p.head_dim
    out = act["out"]
    lin = lambda m, name, x, r: c.linear(m, x, r, out=out[name], cache=cache)  # noqa: E731
    # MLP branch (ls2, GELU, norms: identity)
    R_x2, R_f = add(act["x2"], act["f"], R)
    R_g = lin(p.fc2, "fc2", act["g"], R_f)
    R_x2 = clone(R_x2, lin(p.fc1, "fc1", act["h2"], R_g), x=act["x2"])
    # attention branch
    R_x, R_a = add(act["x"], act["a"], R_x2)
    R_o = lin(p.proj, "proj", act["o"], R_a).reshape(B, N, H, d).transpose(1, 2)
    R_A, R_v = matmul(act["A"], act["v"], R_o, z=act["ctx"])
    if not deeper:
        return None, R_A
    R_q, R_kT = matmul(act["q"], act["k"].transpose(-2, -1), R_A)  # softmax: identity
    R_k = R_kT.transpose(-2, -1)
    h1 = act["h1"]
    if p.qkv is not None:
        R_qkv = torch.stack([R_q, R_k, R_v], dim=2).transpose(1, 3).reshape(B, N, 3 * H * d)
        R_h1 = lin(p.qkv, "qkv", h1, R_qkv)
    else:
        flat = lambda t: t.transpose(1, 2).reshape(B, N, H * d)  # noqa: E731
        R_h1 = clone(lin(p.q, "q", h1, flat(R_q)), lin(p.k, "k", h1, flat(R_k)),
                     lin(p.v, "v", h1, flat(R_v)), x=h1)  # the three-way Clone
    return clone(R_x, R_h1, x=act["x"]), R_A


# ----------------------------------------------------------------------------
# timm
# ----------------------------------------------------------------------------
class TimmViTAdapter(PreLNViTAdapter):
    """timm ``VisionTransformer`` (ViT, DeiT, DINO, DINOv2 with LayerScale, register tokens)."""

    def __init__(self, model: nn.Module):
        self.model = model
        name = type(model).__name__
        if getattr(model, "attn_pool", None) is not None or model.global_pool != "token":
            raise UnsupportedModelError(
                f"{name} with global_pool={model.global_pool!r} is not supported: relevance is read at the "
                "[CLS] token, so the model must pool with global_pool='token'")
        if getattr(model, "cls_token", None) is None:
            raise UnsupportedModelError(f"{name} without a class token is not supported (no [CLS] to explain)")
        if getattr(model, "head_dist", None) is not None:
            raise UnsupportedModelError(f"{name} is a distilled model with two heads; not supported")
        pe = model.patch_embed
        if not isinstance(getattr(pe, "proj", None), nn.Conv2d):
            raise UnsupportedModelError(f"{name}: patch embedding {type(pe).__name__} is not a plain Conv2d")
        self.patch_conv = pe.proj
        self.patch_norm = getattr(pe, "norm", _IDENTITY)
        self.patch_size = tuple(pe.patch_size)
        dynamic = bool(getattr(model, "dynamic_img_size", False)) or not getattr(pe, "strict_img_size", True)
        self.image_size = None if dynamic else tuple(pe.img_size)
        self.num_prefix_tokens = int(model.num_prefix_tokens)
        self.blocks = [self._parts(i, blk) for i, blk in enumerate(model.blocks)]
        self.norm_pre = model.norm_pre
        self.final_norm = model.norm
        self.fc_norm = model.fc_norm
        self.head = model.head if isinstance(model.head, nn.Linear) else None
        if self.head is None and not isinstance(model.head, nn.Identity):
            raise UnsupportedModelError(f"{name}: head {type(model.head).__name__} is not a Linear layer")

    @staticmethod
    def _parts(i: int, blk: nn.Module) -> BlockParts:
        where = f"block {i} ({type(blk).__name__})"
        needed = ("norm1", "attn", "ls1", "norm2", "mlp", "ls2")
        if not all(hasattr(blk, n) for n in needed) or type(blk).__name__ != "Block":
            raise UnsupportedModelError(
                f"{where}: only timm's pre-norm `Block` (norm1 → attn → ls1, norm2 → mlp → ls2) is supported")
        attn, mlp = blk.attn, blk.mlp
        if type(attn).__name__ != "Attention" or not isinstance(getattr(attn, "qkv", None), nn.Linear):
            raise UnsupportedModelError(f"{where}: attention {type(attn).__name__} is not timm's `Attention`")
        if getattr(attn, "gate", None) is not None:
            raise UnsupportedModelError(f"{where}: gated attention is not supported")
        if not (isinstance(getattr(mlp, "fc1", None), nn.Linear) and isinstance(getattr(mlp, "fc2", None), nn.Linear)) \
                or type(mlp).__name__ != "Mlp":
            raise UnsupportedModelError(f"{where}: MLP {type(mlp).__name__} is not timm's two-layer `Mlp`")
        return BlockParts(
            norm1=blk.norm1, qkv=attn.qkv, q=None, k=None, v=None,
            q_norm=attn.q_norm, k_norm=attn.k_norm, attn_norm=getattr(attn, "norm", _IDENTITY),
            proj=attn.proj, ls1=blk.ls1, norm2=blk.norm2, fc1=mlp.fc1, act=mlp.act,
            mlp_norm=getattr(mlp, "norm", _IDENTITY), fc2=mlp.fc2, ls2=blk.ls2,
            num_heads=attn.num_heads, head_dim=attn.head_dim, scale=attn.scale, scale_queries_first=True)

    def embed(self, prepared: dict) -> tuple[Tensor, Tensor]:
        m = self.model
        images = prepared["images"]
        patches = m.patch_embed(images)
        if patches.dim() == 4:  # dynamic image size: NHWC
            patches_flat = patches.reshape(patches.shape[0], -1, patches.shape[-1])
        else:
            patches_flat = patches
        x = m._pos_embed(patches)  # prefix tokens + position embedding, as the model does it
        prefix = [t.expand(images.shape[0], -1, -1) for t in (m.cls_token, getattr(m, "reg_token", None))
                  if t is not None]
        tokens = torch.cat(prefix + [patches_flat], dim=1)
        return tokens, x


# ----------------------------------------------------------------------------
# Hugging Face
# ----------------------------------------------------------------------------
class HFViTAdapter(PreLNViTAdapter):
    """Hugging Face ``ViTForImageClassification`` (transformers 4.x and 5.x layouts)."""

    def __init__(self, model: nn.Module):
        self.model = model
        vit = model.vit
        emb = vit.embeddings
        self.patch_conv = emb.patch_embeddings.projection
        self.patch_norm = _IDENTITY
        ps = emb.patch_embeddings.patch_size
        self.patch_size = tuple(ps) if not isinstance(ps, int) else (ps, ps)
        self.image_size = tuple(emb.patch_embeddings.image_size)
        self.num_prefix_tokens = 1
        layers = getattr(vit, "layers", None)
        if layers is None:
            layers = vit.encoder.layer
        cfg = model.config
        self.blocks = [self._parts(layer, cfg) for layer in layers]
        self.final_norm = vit.layernorm
        self.fc_norm = _IDENTITY
        self.head = model.classifier if isinstance(model.classifier, nn.Linear) else None

    @staticmethod
    def _parts(layer: nn.Module, cfg) -> BlockParts:
        H = cfg.num_attention_heads
        d = getattr(cfg, "head_dim", None) or cfg.hidden_size // H
        if hasattr(layer, "mlp"):  # transformers >= 5
            att = layer.attention
            q, k, v, proj = att.q_proj, att.k_proj, att.v_proj, att.o_proj
            fc1, act, fc2 = layer.mlp.fc1, layer.mlp.activation_fn, layer.mlp.fc2
        else:  # transformers 4.x
            sa = layer.attention.attention
            q, k, v, proj = sa.query, sa.key, sa.value, layer.attention.output.dense
            fc1, act, fc2 = layer.intermediate.dense, layer.intermediate.intermediate_act_fn, layer.output.dense
        return BlockParts(
            norm1=layer.layernorm_before, qkv=None, q=q, k=k, v=v, q_norm=_IDENTITY, k_norm=_IDENTITY,
            attn_norm=_IDENTITY, proj=proj, ls1=_IDENTITY, norm2=layer.layernorm_after, fc1=fc1, act=act,
            mlp_norm=_IDENTITY, fc2=fc2, ls2=_IDENTITY, num_heads=H, head_dim=d, scale=d ** -0.5,
            scale_queries_first=False)

    def embed(self, prepared: dict) -> tuple[Tensor, Tensor]:
        emb = self.model.vit.embeddings
        images = prepared["images"]
        patches = self.patch_conv(images).flatten(2).transpose(1, 2)
        tokens = torch.cat([emb.cls_token.expand(images.shape[0], -1, -1), patches], dim=1)
        return tokens, tokens + emb.position_embeddings


__all__ = ["BlockParts", "PreLNViTAdapter", "TimmViTAdapter", "HFViTAdapter"]

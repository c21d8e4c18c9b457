"""Pre-LayerNorm Vision Transformers: timm ``VisionTransformer`` (incl. distilled DeiT), Hugging Face ViT and DeiT.

Readouts: [CLS] (``global_pool='token'``), the mean of the patch tokens
(``global_pool='avg'``, also without a class token) and the two heads of a
distilled DeiT (docs/METHODS.md §4). HF DINOv2 is :mod:`.dinov2`.

The adapter never changes the model: it names the model's own submodules
(block descriptions, readout) and replays the forward pass with the attention
computed explicitly, whatever the fused-attention flag says. The replay
reproduces the model's logits to float32 round-off (tested).

Shapes: B batch, N tokens (prefix tokens + P patches), D width, C classes.
"""

from __future__ import annotations

from typing import Optional, TypeVar

import torch
from torch import Tensor, nn

from ..errors import InputError, UnsupportedModelError
from ..rules.linear import is_linear
from ..rules.norms import norm_kind
from ..rules.ops import ELEMENTWISE, LINEAR, PATCH_CONV, POS_ADD
from .base import Adapter
from .batches import ImageBatch
from .blocks import NO_RECORD, AttentionSpec, BlockSpec, MlpSpec, Replay
from .checks import to_model_dtype
from .heads import hf_heads, timm_scale
from .kernels import eager_softmax_dtype
from .mlp_head import head_layers
from .parts import IDENTITY, ModelPart
from .predicates import is_base_model
from .readouts import HeadLayer, MeanReadout, Readout, TokenReadout, TwoHeadReadout
from .records import EmbeddingRecord, TokenLayout, Trace

#: the batch a vision adapter reads: images, or images with the prompts they are compared with (CLIP, SigLIP)
ImageT = TypeVar("ImageT", bound=ImageBatch)


class Encoder:
    """An image encoder (a ViT) as its replay reads it from its own module ``module``: the geometry, the input
    layer and one pre-LN description per layer. One subclass per encoder (CLIP vision, DINOv2, SigLIP, HF ViT,
    Idefics3), shared by the classifier and the vision-language adapters (:meth:`ViTAdapter.use_encoder`).

    Shapes: B images, N = prefix + P patch tokens, D width.
    """

    patch_conv: ModelPart  # the patch embedding as a convolution on (B, C, H, W)
    patch_size: tuple  # (ph, pw)
    image_size: Optional[tuple]  # None: any multiple of the patch size
    num_prefix_tokens: int
    norm_pre: nn.Module = IDENTITY  # the norm before block 0 (CLIP's pre_layrnorm)
    registers: tuple = ()  # the register tokens' positions among the prefix tokens

    def __init__(self, module: nn.Module):
        self.module: ModelPart = module  # read by the names of its Hugging Face class

    @staticmethod
    def layers_of(module: nn.Module) -> ModelPart:
        """The encoder layers of ``module``, input first."""
        raise NotImplementedError

    def block(self, i: int, layer: nn.Module) -> BlockSpec:
        """Layer ``i`` (``layer``) as a block description."""
        raise NotImplementedError

    def blocks(self, depth: Optional[int] = None) -> list[BlockSpec]:
        """The first ``depth`` layers' descriptions (``None``: all), input first."""
        return [self.block(i, layer) for i, layer in enumerate(self.layers_of(self.module)[:depth])]

    def embed(self, images: Tensor, r: Replay = NO_RECORD, track: bool = False) -> EmbeddingRecord:
        """Images (B, C, H, W) -> block 0's input (B, N, D), each operation through the replay ``r``; ``track``:
        the images are a leaf that requires gradients."""
        raise NotImplementedError


class ViTAdapter(Adapter[ImageT]):
    """What timm and Hugging Face ViTs share: image validation, layout, pixel relevance; with an
    :class:`Encoder` (:meth:`use_encoder`), its blocks and input layer."""

    modality = "image"
    patch_conv: nn.Conv2d
    num_prefix_tokens: int
    image_size: Optional[tuple]  # None: any multiple of the patch size
    patch_size: tuple

    # ------------------------------------------------------------ validation
    def check_inputs(self, inputs) -> ImageBatch:
        name = type(self.model).__name__
        if isinstance(inputs, dict) or not isinstance(inputs, Tensor):
            raise InputError(
                f"{name} explains images: pass a float tensor of shape (B, 3, H, W), got {type(inputs).__name__}"
            )
        if inputs.dim() == 3:
            raise InputError(
                f"images must be batched (B, 3, H, W); got {tuple(inputs.shape)} — add a batch "
                "dimension with images.unsqueeze(0)"
            )
        if inputs.dim() != 4 or inputs.shape[1] != self.patch_conv.in_channels:
            raise InputError(
                f"images must have shape (B, {self.patch_conv.in_channels}, H, W); got {tuple(inputs.shape)}"
            )
        if inputs.shape[0] == 0:
            raise InputError("the batch is empty (B = 0)")
        if not inputs.is_floating_point():
            raise InputError(f"images must be a float tensor (normalised), got dtype {inputs.dtype}")
        inputs = to_model_dtype(inputs, self.patch_conv.weight.dtype)  # float64 on a float32 model, and back
        H, W = inputs.shape[-2:]
        if self.image_size is not None and (H, W) != tuple(self.image_size):
            raise InputError(
                f"{name} expects images of size {self.image_size[0]}\u00d7{self.image_size[1]}, "
                f"got {H}\u00d7{W}; resize them (e.g. with the model's preprocess)"
            )
        ph, pw = self.patch_size
        if H % ph or W % pw:
            raise InputError(f"image size ({H}, {W}) is not a multiple of the patch size {self.patch_size}")
        if not torch.isfinite(inputs).all():
            raise InputError("images contain NaN or infinite values")
        return ImageBatch(images=inputs)

    def layout(self, prepared: ImageT) -> TokenLayout:
        H, W = prepared.images.shape[-2:]
        grid = (H // self.patch_size[0], W // self.patch_size[1])
        return TokenLayout(
            modality="image",
            num_tokens=self.num_prefix_tokens + grid[0] * grid[1],
            output_start=self.num_prefix_tokens,
            readout_tokens=self.readout.tokens,
            grid=grid,
            image_size=(H, W),
            registers=self.registers,
        )

    #: the positions of the register tokens in block 0's input (their relevance: ``Explanation.registers``)
    registers: tuple = ()

    # ------------------------------------------------------------- relevance
    def relevance_inputs(self, trace: Trace) -> list:
        """Block 0's input and the pixels (the embedding's norms, position add and zᴮ patch conv are the replay's
        operations; docs/METHODS.md §1.13). The pixels are a leaf of a tracked replay."""
        emb = trace.embedding
        assert emb is not None and emb.images is not None, "a vision replay records its images (embed)"
        return [trace.x0, emb.images]

    def input_relevance(self, trace: Trace, R: list, prepared: ImageT) -> tuple[Tensor, Tensor]:
        """The pixels' relevance -> pixels (B, H, W, channels summed) and each patch's sum (B, P)."""
        pixels = R[1].sum(dim=1)  # (B, H, W)
        ph, pw = self.patch_size
        B, H, W = pixels.shape
        scores = pixels.reshape(B, H // ph, ph, W // pw, pw).sum(dim=(2, 4)).reshape(B, -1)
        return scores, pixels

    norm_pre: nn.Module = IDENTITY
    _patch_norm: nn.Module = IDENTITY  # what patch_norm gives, where a family sets it when built (Swin)

    @property
    def patch_norm(self) -> nn.Module:
        """The norm inside the patch embedding (timm's ``PatchEmbed.norm``), identity where there is none."""
        return self._patch_norm

    #: the encoder whose blocks and input layer are replayed (``None``: the family's own, e.g. timm's)
    encoder: Optional[Encoder] = None

    def use_encoder(self, encoder: Encoder, depth: Optional[int] = None) -> None:
        """Replay ``encoder``: its geometry, its input layer and its first ``depth`` blocks (``None``: all)."""
        self.encoder = encoder
        self.patch_conv, self.patch_size, self.image_size = encoder.patch_conv, encoder.patch_size, encoder.image_size
        self.num_prefix_tokens, self.norm_pre = encoder.num_prefix_tokens, encoder.norm_pre
        self.registers = encoder.registers
        self.blocks = encoder.blocks(depth)

    def _block(self, i: int, layer: nn.Module) -> BlockSpec:
        assert self.encoder is not None, "an adapter without an encoder describes its own blocks"
        return self.encoder.block(i, layer)

    def embed(self, prepared: ImageT, r: Replay = NO_RECORD, track: bool = False) -> EmbeddingRecord:
        """The encoder's input layer on ``prepared.images`` (:meth:`Encoder.embed`)."""
        assert self.encoder is not None, "an adapter without an encoder embeds its own inputs"
        return self.encoder.embed(prepared.images, r, track)


# ----------------------------------------------------------------------------
# timm
# ----------------------------------------------------------------------------
class TimmViTAdapter(ViTAdapter[ImageBatch]):
    """timm ``VisionTransformer`` (ViT, DeiT, DINO, DINOv2 with LayerScale, register tokens) and
    ``VisionTransformerDistilled``; [CLS] or average pooling, with or without a class token."""

    def __init__(self, model: ModelPart):
        super().__init__(model)
        name = type(model).__name__
        pooled_by_attention = model.global_pool == "map" and getattr(model, "attn_pool", None) is not None
        if not pooled_by_attention and (
            getattr(model, "attn_pool", None) is not None or model.global_pool not in ("token", "avg")
        ):
            raise UnsupportedModelError(
                f"{name} with global_pool={model.global_pool!r} is not supported: the readout must be a weighted "
                "sum of tokens — global_pool='token' ([CLS]) or 'avg' (mean of the patch tokens) — or timm's "
                "attention pooling ('map'); max pooling ('max', 'avgmax') and 'prr' are not"
            )
        pe = model.patch_embed
        if not isinstance(getattr(pe, "proj", None), nn.Conv2d):
            raise UnsupportedModelError(f"{name}: patch embedding {type(pe).__name__} is not a plain Conv2d")
        self.patch_conv = pe.proj
        self.patch_size = tuple(pe.patch_size)
        dynamic = bool(getattr(model, "dynamic_img_size", False)) or not getattr(pe, "strict_img_size", True)
        self.image_size = None if dynamic else tuple(pe.img_size)
        self.num_prefix_tokens = int(model.num_prefix_tokens)
        reg = getattr(model, "reg_token", None)  # the registers come last among the prefix tokens
        R = 0 if reg is None else int(reg.shape[1])
        self.registers = tuple(range(self.num_prefix_tokens - R, self.num_prefix_tokens))
        self.blocks = [self._block(i, blk) for i, blk in enumerate(model.blocks)]
        self.norm_pre = getattr(model, "norm_pre", IDENTITY)  # timm Beit, VisionTransformerRelPos: none
        self.readout = self._readout(model)

    @staticmethod
    def _readout(model: ModelPart) -> Readout:
        """[CLS], the mean of the tokens after the prefix, the attention pool, or the distilled model's two heads."""
        heads = [model.head] + ([model.head_dist] if getattr(model, "head_dist", None) is not None else [])
        for h in heads:
            mlp = len(heads) == 1 and isinstance(h, nn.Sequential)  # an MLP head (lrp_core.adapters.mlp_head)
            if not (is_linear(h) or isinstance(h, nn.Identity) or mlp):
                raise UnsupportedModelError(f"{type(model).__name__}: head {type(h).__name__} is not a Linear layer")
        if len(heads) == 2:  # timm's distilled forward_head reads tokens 0 and 1, no fc_norm
            return TwoHeadReadout(norm=model.norm, head=model.head, head_dist=model.head_dist)
        head = [HeadLayer(norm_kind(model.fc_norm), model.fc_norm)] + _head_layers(model.head, "head")
        if model.global_pool == "map":
            from .attention_pool import AttentionPoolReadout, timm_pool_head

            return AttentionPoolReadout(norm=model.norm, pool=timm_pool_head(model), head_layers=head)
        if model.global_pool == "avg":
            start = 0 if getattr(model, "pool_include_prefix", False) else int(model.num_prefix_tokens)
            return MeanReadout(norm=model.norm, head_layers=head, start=start)
        return TokenReadout(norm=model.norm, head_layers=head)

    def readout_for(self, prepared: ImageBatch) -> Readout:
        """:attr:`readout`; an attention pool's with the batch's probe attention (B, N), from a plain replay (its
        token weights, :class:`~lrp_core.adapters.attention_pool.AttentionPoolReadout`)."""
        from .attention_pool import AttentionPoolReadout

        pool = self.readout
        if not isinstance(pool, AttentionPoolReadout):
            return pool
        with torch.no_grad():
            trace = self.forward(prepared, readout=pool)
        return pool.with_attention(pool.attention_of(trace.readout_record))

    def _block(self, i: int, blk: ModelPart) -> BlockSpec:
        where = f"block {i} ({type(blk).__name__})"
        needed = ("norm1", "attn", "ls1", "norm2", "mlp", "ls2")
        if not all(hasattr(blk, n) for n in needed) or type(blk).__name__ != "Block":
            raise UnsupportedModelError(
                f"{where}: only timm's pre-norm `Block` (norm1 → attn → ls1, norm2 → mlp → ls2) is supported"
            )
        attn, mlp = blk.attn, blk.mlp
        if type(attn).__name__ != "Attention" or not is_linear(getattr(attn, "qkv", None)):
            raise UnsupportedModelError(f"{where}: attention {type(attn).__name__} is not timm's `Attention`")
        if getattr(attn, "gate", None) is not None:
            raise UnsupportedModelError(f"{where}: gated attention is not supported")
        if (
            not (is_linear(getattr(mlp, "fc1", None)) and is_linear(getattr(mlp, "fc2", None)))
            or type(mlp).__name__ != "Mlp"
        ):
            raise UnsupportedModelError(f"{where}: MLP {type(mlp).__name__} is not timm's two-layer `Mlp`")
        return BlockSpec(
            layout="pre_ln",
            norm1=blk.norm1,
            norm2=blk.norm2,
            ls1=blk.ls1,
            ls2=blk.ls2,
            attn=AttentionSpec(
                qkv=attn.qkv,
                q_norm=attn.q_norm,
                k_norm=attn.k_norm,
                ctx_norm=getattr(attn, "norm", IDENTITY),
                proj=attn.proj,
                num_heads=attn.num_heads,
                head_dim=attn.head_dim,
                scale=timm_scale(attn, int(attn.head_dim)),
                scale_queries_first=True,
            ),
            mlp=MlpSpec(fc1=mlp.fc1, act=mlp.act, fc2=mlp.fc2, mid_norm=getattr(mlp, "norm", IDENTITY)),
        )

    @property
    def patch_norm(self) -> ModelPart:
        return self.model.patch_embed.norm

    def embed(self, prepared: ImageBatch, r: Replay = NO_RECORD, track: bool = False) -> EmbeddingRecord:
        """timm's ``patch_embed`` and ``_pos_embed``, each operation through the replay: the patch conv, its
        norm, the prefix tokens (cls, dist, reg) and the position add (after them, or on the patches alone
        with ``no_embed_class``). Dropout and patch dropout: inference (identities)."""
        m = self.model
        images = prepared.images
        if track:
            images = images.detach().requires_grad_(True)
        conv = r.module(PATCH_CONV, self.patch_conv, images)  # (B, D, h, w); the size is a multiple of the patch
        patches = conv.flatten(2).transpose(1, 2)  # (B, P, D)
        flat = r.norm(self.patch_norm, patches)  # the token embeddings gradients are read at
        prefix = [
            t.expand(images.shape[0], -1, -1)
            for t in (m.cls_token, getattr(m, "dist_token", None), getattr(m, "reg_token", None))
            if t is not None
        ]
        # no prefix: the patches themselves, in their layout (a copy would change the round-off of what follows)
        tokens = torch.cat(prefix + [flat], dim=1) if prefix else flat
        pos = self._position_embedding(conv.shape[-2:])
        if pos is None:
            x_pos = tokens
        elif getattr(m, "no_embed_class", False):  # DeiT-3: the position embedding covers the patches only
            x_pos = torch.cat(prefix + [r(POS_ADD, torch.add, flat, pos)], dim=1)
        else:
            x_pos = r(POS_ADD, torch.add, tokens, pos)
        x0 = r.norm(self.norm_pre, x_pos)
        return EmbeddingRecord(x0=x0, embeds=flat, tokens=tokens, x_pos=x_pos, images=images, patches=patches)

    def _position_embedding(self, grid: tuple) -> Optional[Tensor]:
        """(1, N or P, D) what timm's ``_pos_embed`` adds, resampled to the grid (h, w) with ``dynamic_img_size``
        as timm does it; ``None`` for a model without one."""
        m = self.model
        pos_embed = getattr(m, "pos_embed", None)  # VisionTransformerRelPos: none
        if pos_embed is None or not getattr(m, "dynamic_img_size", False):
            return pos_embed
        from timm.layers import resample_abs_pos_embed  # only a timm model gets here

        prefix = 0 if getattr(m, "no_embed_class", False) else m.num_prefix_tokens
        return resample_abs_pos_embed(
            m.pos_embed,
            new_size=(int(grid[0]), int(grid[1])),
            old_size=m.patch_embed.grid_size,
            num_prefix_tokens=prefix,
        )


# ----------------------------------------------------------------------------
# Hugging Face
# ----------------------------------------------------------------------------
def hf_attention(att: ModelPart) -> tuple:
    """The query, key, value and output projections of a Hugging Face ViT-style attention.

    Parameters
    ----------
    att : nn.Module
        The layer's attention module, with transformers 5.x names (``q_proj`` …) or 4.x names
        (``attention.query`` …, ``output.dense``).

    Returns
    -------
    tuple of nn.Module
        ``(q, k, v, output projection)``.
    """
    if hasattr(att, "q_proj"):  # transformers >= 5
        return att.q_proj, att.k_proj, att.v_proj, att.o_proj
    sa = att.attention
    return sa.query, sa.key, sa.value, att.output.dense


def hf_block_heads(cfg: ModelPart, att: ModelPart, parts: tuple, where: str) -> tuple[int, int, float]:
    """(heads, head width, scale) of a Hugging Face ViT-style attention as its module computes them
    (:func:`~lrp_core.adapters.heads.hf_heads`: pruned heads, a changed ``scaling``).

    Parameters
    ----------
    cfg : PretrainedConfig
        The model's config (the head width where the module names none).
    att : nn.Module
        The layer's attention module (transformers 5: itself; 4.x: its ``attention`` holds the heads).
    parts : tuple of nn.Module
        ``(q, k, v, output projection)`` (:func:`hf_attention`).
    where : str
        The layer, for a refusal.

    Returns
    -------
    tuple
        ``(H, d, scale)``.
    """
    H = cfg.num_attention_heads
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // H
    holder = att if hasattr(att, "q_proj") else att.attention
    q, k, v, proj = parts
    return hf_heads(holder, q, k, v, proj, where, d)


def hf_mlp(layer: ModelPart) -> MlpSpec:
    """The two-layer MLP of a Hugging Face ViT-style layer.

    Parameters
    ----------
    layer : nn.Module
        The encoder layer: ``mlp`` in transformers 5.x, ``intermediate`` / ``output`` in 4.x.

    Returns
    -------
    MlpSpec
        The first Linear, the activation and the second Linear.
    """
    if hasattr(layer, "mlp"):
        mlp = layer.mlp
        act: ModelPart = getattr(mlp, "activation_fn", None) or getattr(mlp, "activation", None)
        return MlpSpec(fc1=mlp.fc1, act=act, fc2=mlp.fc2)
    return MlpSpec(fc1=layer.intermediate.dense, act=layer.intermediate.intermediate_act_fn, fc2=layer.output.dense)


def hf_layers(base: ModelPart) -> ModelPart:
    """The encoder layers of a Hugging Face ViT-style backbone.

    Parameters
    ----------
    base : nn.Module
        The backbone: its ``layers``, or else ``encoder.layer``.

    Returns
    -------
    nn.ModuleList
        The layers, input first.
    """
    layers = getattr(base, "layers", None)
    return base.encoder.layer if layers is None else layers


def hf_linear_head(model: nn.Module, *names: str) -> list:
    """The named Linear classifiers of a Hugging Face model.

    Parameters
    ----------
    model : nn.Module
        The model holding the classifiers as attributes.
    *names
        The attribute names of the classifiers.

    Returns
    -------
    list of nn.Module
        The classifiers, in the order of ``names``: each a Linear, or ``Identity`` where the model has no labels.

    Raises
    ------
    UnsupportedModelError
        When a named module is neither a Linear layer nor ``Identity``.
    """
    out = []
    for n in names:
        m = getattr(model, n)
        if not (is_linear(m) or isinstance(m, nn.Identity)):
            raise UnsupportedModelError(f"{type(model).__name__}: {n} {type(m).__name__} is not a Linear layer")
        out.append(m)
    return out


def _head_layers(head: ModelPart, where: str) -> list:
    """A timm head as head layers: a Linear (or Identity), or an MLP ``nn.Sequential`` expanded layer by layer."""
    if isinstance(head, nn.Sequential):
        return head_layers(head, where)
    return [HeadLayer(LINEAR, head)]


class HFViTEncoder(Encoder):
    """Hugging Face ``ViTModel`` / ``DeiTModel`` (``model.vit``, ``model.deit``): the prefix tokens
    ``prefix_names``, the patch convolution, the learned position embedding at the trained size, pre-LN blocks
    (``layernorm_before`` / ``layernorm_after``; eager attention's softmax in float32, as the model's)."""

    def __init__(self, module: ModelPart, prefix_names: tuple = ("cls_token",)):
        super().__init__(module)
        pe = module.embeddings.patch_embeddings
        self.prefix_names = prefix_names
        self.patch_conv = pe.projection
        ps = pe.patch_size
        self.patch_size = tuple(ps) if not isinstance(ps, int) else (ps, ps)
        self.image_size = tuple(pe.image_size)
        self.num_prefix_tokens = len(prefix_names)

    @staticmethod
    def layers_of(module: ModelPart) -> ModelPart:
        return hf_layers(module)

    def block(self, i: int, layer: ModelPart) -> BlockSpec:
        q, k, v, proj = hf_attention(layer.attention)
        cfg = self.module.config
        H, d, scale = hf_block_heads(cfg, layer.attention, (q, k, v, proj), f"layer {i}")
        return BlockSpec(
            layout="pre_ln",
            norm1=layer.layernorm_before,
            norm2=layer.layernorm_after,
            attn=AttentionSpec(
                q=q, k=k, v=v, proj=proj, num_heads=H, head_dim=d, scale=scale, softmax_dtype=eager_softmax_dtype(cfg)
            ),
            mlp=hf_mlp(layer),
        )

    def position_embedding(self, tokens: Tensor, images: Tensor) -> Tensor:
        """(1, N, D) the position embedding added to ``tokens``; fixed image size: the parameter itself."""
        return self.module.embeddings.position_embeddings

    def embed(self, images: Tensor, r: Replay = NO_RECORD, track: bool = False) -> EmbeddingRecord:
        """The prefix tokens before the patches, then the position embedding added (dropout: an identity)."""
        emb = self.module.embeddings
        if track:
            images = images.detach().requires_grad_(True)
        patches = r.module(PATCH_CONV, self.patch_conv, images.to(self.patch_conv.weight.dtype))
        patches = patches.flatten(2).transpose(1, 2)
        prefix = [getattr(emb, n).expand(images.shape[0], -1, -1) for n in self.prefix_names]
        tokens = torch.cat(prefix + [patches], dim=1)
        x_pos = r(POS_ADD, torch.add, tokens, self.position_embedding(tokens, images))
        return EmbeddingRecord(x0=x_pos, embeds=patches, tokens=tokens, x_pos=x_pos, images=images, patches=patches)


class HFViTAdapter(ViTAdapter[ImageBatch]):
    """Hugging Face ``ViTForImageClassification`` (transformers 4.x and 5.x layouts): :class:`HFViTEncoder`,
    the [CLS] token after ``layernorm``, the classifier."""

    #: the attribute holding the backbone (``model.vit``)
    backbone = "vit"
    #: the prefix tokens the embeddings prepend, in order
    prefix_names: tuple = ("cls_token",)

    def __init__(self, model: nn.Module):
        super().__init__(model)
        base = model if is_base_model(model) else getattr(model, self.backbone)
        self.use_encoder(self.encoder_of(base))
        self.pooler_layers = _pooler(base)
        self.readout = self._readout(model, base)

    def encoder_of(self, base: ModelPart) -> Encoder:
        """The backbone's encoder description."""
        return HFViTEncoder(base, self.prefix_names)

    def _readout(self, model: ModelPart, base: ModelPart) -> Readout:
        if base is model:  # ViTModel / DeiTModel: no head; the embedding is the pooler's output (else [CLS])
            return TokenReadout(norm=base.layernorm, head_layers=list(self.pooler_layers))
        clf = model.classifier
        if isinstance(clf, nn.Sequential):  # an MLP head (lrp_core.adapters.mlp_head)
            return TokenReadout(norm=base.layernorm, head_layers=head_layers(clf, f"{type(model).__name__}.classifier"))
        (clf,) = hf_linear_head(model, "classifier")
        return TokenReadout(norm=base.layernorm, head_layers=[HeadLayer(LINEAR, clf)])


def _pooler(base: ModelPart) -> list:
    """A Hugging Face ViT's pooler on [CLS] (dense + activation), or ``[]`` (``add_pooling_layer=False``)."""
    pooler = getattr(base, "pooler", None)
    if pooler is None or not is_linear(getattr(pooler, "dense", None)):
        return []
    return [HeadLayer(LINEAR, pooler.dense), HeadLayer(ELEMENTWISE, pooler.activation)]


class HFDeiTAdapter(HFViTAdapter):
    """Hugging Face ``DeiTForImageClassification`` ([CLS] head; the distillation token is present but not read)
    and ``DeiTForImageClassificationWithTeacher`` (the mean of the [CLS] and distillation heads)."""

    backbone = "deit"
    prefix_names = ("cls_token", "distillation_token")

    def _readout(self, model: ModelPart, base: ModelPart) -> Readout:
        if base is not model and hasattr(model, "distillation_classifier"):
            head, head_dist = hf_linear_head(model, "cls_classifier", "distillation_classifier")
            return TwoHeadReadout(norm=base.layernorm, head=head, head_dist=head_dist)
        return super()._readout(model, base)


class HFIJepaAdapter(HFViTAdapter):
    """Hugging Face ``IJepaForImageClassification`` (I-JEPA): no class token, the ViT layers, the classifier on the
    mean of every token after ``layernorm``."""

    backbone = "ijepa"
    prefix_names = ()

    def _readout(self, model: ModelPart, base: ModelPart) -> Readout:
        (clf,) = hf_linear_head(model, "classifier")
        return MeanReadout(norm=base.layernorm, head_layers=[HeadLayer(LINEAR, clf)], start=0)


__all__ = [
    "Encoder",
    "ViTAdapter",
    "TimmViTAdapter",
    "HFViTAdapter",
    "HFViTEncoder",
    "HFDeiTAdapter",
    "HFIJepaAdapter",
    "hf_attention",
    "hf_block_heads",
    "hf_mlp",
    "hf_layers",
    "hf_linear_head",
]

"""CLIP (Hugging Face ``CLIPModel``): the image–text similarity explained on the image.

The inputs are what CLIP's processor gives — ``pixel_values`` (B, 3, H, W) and
the tokenized prompts ``input_ids`` / ``attention_mask`` (P, T) — and the
"logits" are the model's own ``logits_per_image`` (B, P): the scaled cosine
similarity of each image with each prompt. A target is a prompt index, so
one map per prompt is ``target=[0, 1, …]``, and every method reads the same
vision tower: pre-LN blocks, [CLS] readout, ``post_layernorm`` →
``visual_projection`` → L2 normalisation → the prompts' normalised text
embeddings × ``logit_scale.exp()`` (a Linear built for the call; the model is
not changed). The text tower runs once, without gradients, to embed the prompts.

Shapes: B images, P prompts, T prompt tokens, N = 1 + patches, D width, E projection width.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional

import torch
from torch import Tensor, nn

from ..errors import InputError
from ..rules.norms import norm_kind
from ..rules.ops import LAYERNORM, LINEAR, PATCH_CONV, POS_ADD
from ..runtime.guard import eval_semantics
from ..runtime.precision import compute_precision
from .base import Adapter
from .batches import PromptBatch, PromptedImageBatch
from .bert import MASK_VALUE
from .blocks import NO_RECORD, AttentionSpec, BlockSpec, MlpSpec, Replay
from .checks import attention_mask, pixel_values, token_ids
from .kernels import eager_softmax_dtype
from .parts import ModelPart
from .readouts import HeadLayer, PositionReadout, TokenReadout
from .records import EmbeddingRecord, TokenLayout, Trace
from .vit import Encoder, ViTAdapter


class L2Normalize(nn.Module):
    """``x / ‖x‖`` over the last dimension, written as CLIP writes it; a module so a composite can choose its rule.

    ``denominator`` is the divisor a modified-gradient rule may hold constant (as LayerNorm's std under AttnLRP).
    """

    def denominator(self, x: Tensor) -> Tensor:
        return x.pow(2).sum(dim=-1, keepdim=True).pow(0.5)

    def forward(self, x: Tensor) -> Tensor:
        return x / self.denominator(x)


def clip_block(layer: ModelPart, cfg) -> BlockSpec:
    """The block of a CLIP-layout encoder layer (CLIP's towers, SigLIP's, Idefics3's): pre-LN, q/k/v/out
    projections, two-layer MLP; under eager attention the softmax in float32, as the model's kernel
    (:func:`~lrp_core.adapters.kernels.eager_softmax_dtype`).

    Parameters
    ----------
    layer : nn.Module
        The encoder layer (``self_attn``, ``layer_norm1`` / ``layer_norm2``, ``mlp``).
    cfg : object
        The tower's config (``num_attention_heads``, ``hidden_size``, ``_attn_implementation``).

    Returns
    -------
    BlockSpec
        The pre-LN block with its attention and MLP.
    """
    att = layer.self_attn
    H = cfg.num_attention_heads
    d = cfg.hidden_size // H
    return BlockSpec(
        layout="pre_ln",
        norm1=layer.layer_norm1,
        norm2=layer.layer_norm2,
        attn=AttentionSpec(
            q=att.q_proj,
            k=att.k_proj,
            v=att.v_proj,
            proj=att.out_proj,
            num_heads=H,
            head_dim=d,
            scale=att.scale,
            softmax_dtype=eager_softmax_dtype(cfg),
        ),
        mlp=MlpSpec(fc1=layer.mlp.fc1, act=layer.mlp.activation_fn, fc2=layer.mlp.fc2),
    )


class CLIPVisionEncoder(Encoder):
    """Hugging Face ``CLIPVisionModel`` (``CLIPModel.vision_model``, LLaVA's tower): the class embedding, the
    patch convolution, learned positions at the trained size (no interpolation), ``pre_layrnorm``, pre-LN blocks
    (:func:`clip_block`). ``post_layernorm`` reads the pooled token only: a reader's, not the encoder's."""

    def __init__(self, module: ModelPart):
        super().__init__(module)
        emb = module.embeddings
        self.patch_conv = emb.patch_embedding
        ps = emb.patch_size
        self.patch_size = (ps, ps) if isinstance(ps, int) else tuple(ps)
        self.image_size = (emb.image_size, emb.image_size)
        self.num_prefix_tokens = 1
        self.norm_pre = module.pre_layrnorm

    @staticmethod
    def layers_of(module: ModelPart) -> ModelPart:
        return module.encoder.layers

    def block(self, i: int, layer: ModelPart) -> BlockSpec:
        return clip_block(layer, self.module.config)

    def embed(self, images: Tensor, r: Replay = NO_RECORD, track: bool = False) -> EmbeddingRecord:
        """``CLIPVisionEmbeddings`` (without position interpolation) and ``pre_layrnorm``."""
        emb = self.module.embeddings
        if track:
            images = images.detach().requires_grad_(True)
        conv = r.module(PATCH_CONV, self.patch_conv, images.to(self.patch_conv.weight.dtype))  # (B, D, h, w)
        patches = conv.flatten(2).transpose(1, 2)
        tokens = torch.cat([emb.class_embedding.expand(images.shape[0], 1, -1), patches], dim=1)
        x_pos = r(POS_ADD, torch.add, tokens, emb.position_embedding(emb.position_ids))
        x0 = r.norm(self.norm_pre, x_pos)
        return EmbeddingRecord(x0=x0, embeds=patches, tokens=tokens, x_pos=x_pos, images=images, patches=patches)


def similarity_linear(weight: Tensor) -> nn.Linear:
    """A frozen bias-free Linear holding ``weight``: the "classes" a CLIP readout compares with.

    Built without initialising random weights first (``skip_init``): making a readout draws no random numbers.

    Parameters
    ----------
    weight : Tensor
        The weight ``(C, E)``: one row per class (the prompts' or the images' embeddings).

    Returns
    -------
    nn.Linear
        ``E → C``, without bias and gradient, on the weight's device and in its dtype.
    """
    lin = torch.nn.utils.skip_init(
        nn.Linear, weight.shape[1], weight.shape[0], bias=False, device=weight.device, dtype=weight.dtype
    )
    with torch.no_grad():
        lin.weight.copy_(weight)
    return lin.requires_grad_(False)


def _scaled_embeddings(model: ModelPart, features: Tensor, dtype: torch.dtype) -> Tensor:
    """The other tower's output → its normalised embeddings × ``logit_scale.exp()`` (K, E), in ``dtype``
    (or float32 where a half-precision model computed them in float32, lrp_core.runtime.precision)."""
    emb = L2Normalize()(getattr(features, "pooler_output", features))
    return (emb * model.logit_scale.exp()).to(dtype)


class CLIPImageAdapter(ViTAdapter[PromptedImageBatch]):
    """The vision tower of a Hugging Face ``CLIPModel``, read out as similarity to text prompts.

    ``check_inputs`` embeds the prompts (the text tower, without gradients) into ``prepared.prompt_embeddings``
    (P, E): they are shared by every image of the batch, and :meth:`readout_for` builds the batch's readout
    from them. The adapter itself never changes.
    """

    def __init__(self, model: ModelPart):
        super().__init__(model)
        self.use_encoder(CLIPVisionEncoder(model.vision_model))
        # without a batch: one placeholder prompt (zero weight); readout_for builds the batch's readout
        self.readout = self._readout(
            torch.zeros(
                1,
                model.visual_projection.out_features,
                dtype=model.visual_projection.weight.dtype,
                device=model.visual_projection.weight.device,
            )
        )

    def _readout(self, prompts: Tensor) -> TokenReadout:
        """[CLS] → post_layernorm → visual_projection → L2 normalisation → ``prompts`` (P, E)."""
        vision = self.model.vision_model
        return TokenReadout(
            norm=nn.Identity(),
            head_layers=[
                HeadLayer(norm_kind(vision.post_layernorm), vision.post_layernorm),
                HeadLayer(LINEAR, self.model.visual_projection),
                HeadLayer(LAYERNORM, L2Normalize()),
                HeadLayer(LINEAR, similarity_linear(prompts)),
            ],
        )

    def readout_for(self, prepared: PromptedImageBatch) -> TokenReadout:
        """The readout of a batch: the similarity to its prompts' embeddings ``prepared.prompt_embeddings``."""
        return self._readout(prepared.prompt_embeddings)

    def for_inputs(self, inputs) -> Adapter:
        """``inputs["explain"] == "text"``: the text side (the prompts' tokens given the images)."""
        side = inputs.get("explain", "image") if isinstance(inputs, Mapping) else "image"
        if side not in SIDES:
            raise InputError(f"inputs['explain'] must be one of {SIDES}, got {side!r}")
        return CLIPTextAdapter(self.model) if side == "text" else self

    # ------------------------------------------------------------ validation
    def check_inputs(self, inputs) -> PromptedImageBatch:
        """Validate the images and prompts: the images, the prompts' ids and mask and their scaled normalised
        embeddings (P, E)."""
        if not isinstance(inputs, Mapping) or "pixel_values" not in inputs or "input_ids" not in inputs:
            raise InputError(
                f"{type(self.model).__name__} explains the similarity of images to text prompts: pass CLIP's "
                "processor output, a dict with 'pixel_values' (B, 3, H, W) and the prompts' 'input_ids' / "
                "'attention_mask' (P, T), e.g. processor(text=['a dog', 'a cat'], images=img, padding=True, "
                f"return_tensors='pt'); got {type(inputs).__name__}"
            )
        images = super().check_inputs(pixel_values(inputs["pixel_values"])).images
        ids, mask = _prompts(inputs)
        embeddings = self.embed_prompts(ids, mask, images.dtype)
        return PromptedImageBatch(images=images, prompt_ids=ids, prompt_mask=mask, prompt_embeddings=embeddings)

    def own_output(self, prepared: PromptedImageBatch) -> Tensor:
        """The model's own ``logits_per_image`` (B, P) against the batch's prompts."""
        return self.model(
            pixel_values=prepared.images, input_ids=prepared.prompt_ids, attention_mask=prepared.prompt_mask
        ).logits_per_image

    def embed_prompts(self, ids: Tensor, mask: Tensor, dtype: torch.dtype) -> Tensor:
        """The prompts' normalised text embeddings × logit_scale.exp() (P, E), without gradients.

        A half-precision model embeds the prompts in float32, and they stay float32 (lrp_core.runtime.precision).
        """
        with torch.no_grad(), compute_precision(self.model), eval_semantics(self.model):  # no dropout, as the replay
            return _scaled_embeddings(
                self.model, self.model.get_text_features(input_ids=ids, attention_mask=mask), dtype
            )


def _prompts(inputs: Mapping) -> tuple[Tensor, Tensor]:
    """The prompts' ids and 0/1 mask (P, T), long; at least one prompt of at least one token."""
    ids = token_ids(inputs["input_ids"], rows="P")
    if ids.numel() == 0:
        raise InputError(
            f"CLIP needs at least one text prompt (of at least one token) to compare the images with; "
            f"input_ids has shape {tuple(ids.shape)} — pass e.g. processor(text=['a dog', 'a cat'], "
            "images=..., padding=True, return_tensors='pt')"
        )
    return ids, attention_mask(inputs.get("attention_mask"), ids)


#: ``inputs["explain"]`` chooses the side: "image" (default) or "text".
SIDES = ("image", "text")


class CLIPTextAdapter(Adapter[PromptBatch]):
    """The text tower of a Hugging Face ``CLIPModel``: the prompts' tokens, read out as similarity to the images.

    The batch is the prompts (P) and the "classes" are the images (B): the logits are the model's
    ``logits_per_text`` (P, B), a target is an image index. Blocks are pre-LN with a causal mask;
    the readout (:class:`~lrp_core.adapters.readouts.PositionReadout`) reads each prompt's end-of-text
    token, after ``final_layer_norm`` → ``text_projection`` → L2 normalisation → the images' normalised
    embeddings × ``logit_scale.exp()`` (``prepared.image_embeddings``, shared by all prompts). ``explain``
    explains a right-padded batch one length at a time (``docs/METHODS.md`` §5.8) for round-off parity
    with explaining each prompt alone; the readout reads the right token with or without that grouping.
    """

    modality = "text"
    mask_value = MASK_VALUE

    def __init__(self, model: ModelPart):
        super().__init__(model)
        text = model.text_model
        self.blocks = [self._block(i, layer) for i, layer in enumerate(text.encoder.layers)]
        # without a batch: one placeholder image (zero weight), read at the last position; see readout_for
        placeholder = torch.zeros(
            1,
            model.text_projection.out_features,
            dtype=model.text_projection.weight.dtype,
            device=model.text_projection.weight.device,
        )
        self.readout = TokenReadout(norm=text.final_layer_norm, head_layers=self._head(placeholder), index=-1)
        self.max_length = int(text.embeddings.position_embedding.weight.shape[0])

    def _block(self, i: int, layer: ModelPart) -> BlockSpec:
        return clip_block(layer, self.model.config.text_config)

    def _head(self, images: Tensor) -> list:
        """text_projection → L2 normalisation → ``images`` (B, E)."""
        return [
            HeadLayer(LINEAR, self.model.text_projection),
            HeadLayer(LAYERNORM, L2Normalize()),
            HeadLayer(LINEAR, similarity_linear(images)),
        ]

    def readout_for(self, prepared: PromptBatch) -> PositionReadout:
        """Each prompt's end-of-text token, compared with the batch's images ``prepared.image_embeddings``."""
        return PositionReadout(
            norm=self.model.text_model.final_layer_norm,
            head_layers=self._head(prepared.image_embeddings),
            positions=self._end_of_text(prepared.input_ids),
        )

    def check_inputs(self, inputs) -> PromptBatch:
        """Validate prompts and images; ``prepared``: ``input_ids`` / ``attention_mask`` (P, T) and the
        images' scaled normalised embeddings ``image_embeddings`` (B, E)."""
        if not isinstance(inputs, Mapping) or "input_ids" not in inputs:
            raise InputError(
                "explaining CLIP's prompts needs CLIP's processor output: a dict with the prompts' "
                f"'input_ids' / 'attention_mask' (P, T) and the 'pixel_values' (B, 3, H, W) they are "
                f"compared with, and explain='text'; got {type(inputs).__name__}"
            )
        ids, mask = _prompts(inputs)
        if ids.shape[1] > self.max_length:
            raise InputError(
                f"the prompts are {ids.shape[1]} tokens long; the text tower accepts at most "
                f"{self.max_length}: tokenize with truncation=True"
            )
        last = mask.sum(dim=1) - 1
        if not torch.equal(self._end_of_text(ids), last):
            raise InputError(
                "the end-of-text token must be the last real token of every prompt (right padding, "
                "as CLIP's tokenizer gives with padding=True)"
            )
        if "pixel_values" not in inputs:
            raise InputError("explaining the prompts needs the images they are compared with: 'pixel_values'")
        pixels = pixel_values(inputs["pixel_values"])
        if pixels.dim() == 4 and pixels.shape[0] == 0:
            raise InputError(
                "explaining the prompts needs at least one image to compare them with: 'pixel_values' has B = 0 images"
            )
        images = ViTAdapter.check_inputs(CLIPImageAdapter(self.model), pixels).images
        return PromptBatch(input_ids=ids, attention_mask=mask, image_embeddings=self.embed_images(images))

    def own_output(self, prepared: PromptBatch) -> Tensor:
        """The model's own ``logits_per_text`` (P, B): its text tower's normalised embeddings against the images'
        (``prepared.image_embeddings``, the model's own image features, scaled)."""
        text = self.model.get_text_features(input_ids=prepared.input_ids, attention_mask=prepared.attention_mask)
        emb = L2Normalize()(getattr(text, "pooler_output", text))
        return emb @ prepared.image_embeddings.to(emb.dtype).T

    def _end_of_text(self, ids: Tensor) -> Tensor:
        """(P,) where the model pools, by its own rule (the highest id for old configs, else the first EOS)."""
        eos = self.model.text_model.eos_token_id
        return ids.argmax(dim=-1) if eos == 2 else (ids == eos).int().argmax(dim=-1)

    def embed_images(self, images: Tensor) -> Tensor:
        """The images' normalised embeddings × logit_scale.exp() (B, E), without gradients.

        A half-precision model embeds the images in float32, and they stay float32 (lrp_core.runtime.precision).
        """
        with torch.no_grad(), compute_precision(self.model), eval_semantics(self.model):  # no dropout, as the replay
            return _scaled_embeddings(self.model, self.model.get_image_features(pixel_values=images), images.dtype)

    def layout(self, prepared: PromptBatch) -> TokenLayout:
        mask = prepared.attention_mask
        return TokenLayout(
            modality="text",
            num_tokens=mask.shape[1],
            output_start=0,
            readout_tokens=(),
            mask=mask,
            readout_rows=self._end_of_text(prepared.input_ids),
        )

    def attention_bias(self, x0: Tensor, mask: Optional[Tensor]) -> Optional[Tensor]:
        """Padding mask (B, 1, 1, T) plus the causal mask (1, 1, T, T): a token sees only itself and earlier ones."""
        T = x0.shape[1]
        causal = torch.ones(T, T, dtype=torch.bool, device=x0.device).triu(1)
        future = causal.to(x0.dtype)[None, None] * self.mask_value
        padding = super().attention_bias(x0, mask)
        assert padding is not None, "the text tower has a padding mask value"
        return padding + future

    def embed(self, prepared: PromptBatch, r: Replay = NO_RECORD, track: bool = False) -> EmbeddingRecord:
        emb = self.model.text_model.embeddings
        ids = prepared.input_ids
        words = emb.token_embedding(ids)
        if track:
            words = words.detach().requires_grad_(True)
        x0 = r(POS_ADD, torch.add, words, emb.position_embedding(emb.position_ids[:, : ids.shape[1]]))
        return EmbeddingRecord(x0=x0, embeds=words)

    def input_relevance(self, trace: Trace, R: list, prepared: PromptBatch) -> tuple[Tensor, None]:
        """Relevance at the embedding output, summed over channels; padding scores 0."""
        return R[0].sum(-1) * prepared.attention_mask.to(R[0].dtype), None


__all__ = [
    "CLIPImageAdapter",
    "CLIPTextAdapter",
    "CLIPVisionEncoder",
    "L2Normalize",
    "SIDES",
    "clip_block",
    "similarity_linear",
]

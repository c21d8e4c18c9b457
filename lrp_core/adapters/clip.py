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

import torch
from torch import Tensor, nn

from ..composites import LAYERNORM, LINEAR, POS_ADD
from ..errors import InputError
from .blocks import PLAIN, AttentionSpec, BlockSpec, MlpSpec, Replay
from .readouts import HeadLayer, TokenReadout
from .records import EmbeddingRecord
from .vit import ViTAdapter


class L2Normalize(nn.Module):
    """``x / ‖x‖`` over the last dimension, written as CLIP writes it; a module so a composite can choose its rule.

    ``denominator`` is the divisor a modified-gradient rule may hold constant (as LayerNorm's std under AttnLRP).
    """

    def denominator(self, x: Tensor) -> Tensor:
        return x.pow(2).sum(dim=-1, keepdim=True).pow(0.5)

    def forward(self, x: Tensor) -> Tensor:
        return x / self.denominator(x)


class CLIPImageAdapter(ViTAdapter):
    """The vision tower of a Hugging Face ``CLIPModel``, read out as similarity to text prompts."""

    def __init__(self, model: nn.Module):
        self.model = model
        vision = model.vision_model
        emb = vision.embeddings
        self.patch_conv = emb.patch_embedding
        ps = emb.patch_size
        self.patch_size = (ps, ps) if isinstance(ps, int) else tuple(ps)
        self.image_size = (emb.image_size, emb.image_size)
        self.num_prefix_tokens = 1
        self.norm_pre = vision.pre_layrnorm
        cfg = model.config.vision_config
        self.blocks = [self._block(layer, cfg) for layer in vision.encoder.layers]
        self.prompts = nn.Linear(model.visual_projection.out_features, 1, bias=False)  # replaced per call
        self.readout = TokenReadout(norm=nn.Identity(), head=[
            HeadLayer(LAYERNORM, vision.post_layernorm), HeadLayer(LINEAR, model.visual_projection),
            HeadLayer(LAYERNORM, L2Normalize()), HeadLayer(LINEAR, self.prompts)])

    @staticmethod
    def _block(layer: nn.Module, cfg) -> BlockSpec:
        att = layer.self_attn
        H = cfg.num_attention_heads
        d = cfg.hidden_size // H
        return BlockSpec(layout="pre_ln", norm1=layer.layer_norm1, norm2=layer.layer_norm2,
                         attn=AttentionSpec(q=att.q_proj, k=att.k_proj, v=att.v_proj, proj=att.out_proj,
                                            num_heads=H, head_dim=d, scale=att.scale),
                         mlp=MlpSpec(fc1=layer.mlp.fc1, act=layer.mlp.activation_fn, fc2=layer.mlp.fc2))

    # ------------------------------------------------------------ validation
    def check_inputs(self, inputs) -> dict:
        if not isinstance(inputs, Mapping) or "pixel_values" not in inputs or "input_ids" not in inputs:
            raise InputError(
                f"{type(self.model).__name__} explains the similarity of images to text prompts: pass CLIP's "
                "processor output, a dict with 'pixel_values' (B, 3, H, W) and the prompts' 'input_ids' / "
                "'attention_mask' (P, T), e.g. processor(text=['a dog', 'a cat'], images=img, padding=True, "
                f"return_tensors='pt'); got {type(inputs).__name__}")
        prepared = super().check_inputs(torch.as_tensor(inputs["pixel_values"]))
        ids = torch.as_tensor(inputs["input_ids"])
        if ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32) or ids.numel() == 0:
            raise InputError(f"input_ids must be an integer tensor (P, T) of tokenized prompts; got "
                             f"{tuple(ids.shape)} {ids.dtype}")
        mask = inputs.get("attention_mask")
        mask = torch.ones_like(ids) if mask is None else torch.as_tensor(mask)
        if mask.shape != ids.shape:
            raise InputError(f"attention_mask has shape {tuple(mask.shape)}, input_ids {tuple(ids.shape)}")
        self._set_prompts(ids.long(), mask.long(), prepared["images"].dtype)
        prepared.update(prompt_ids=ids.long(), prompt_mask=mask.long())
        return prepared

    def _set_prompts(self, ids: Tensor, mask: Tensor, dtype: torch.dtype) -> None:
        """The readout's last Linear: the prompts' normalised text embeddings × logit_scale.exp() (P, E)."""
        with torch.no_grad():
            out = self.model.get_text_features(input_ids=ids, attention_mask=mask)
            text = getattr(out, "pooler_output", out)
            text = L2Normalize()(text)
            weight = (text * self.model.logit_scale.exp()).to(dtype)
        self.prompts = nn.Linear(weight.shape[1], weight.shape[0], bias=False).to(dtype)
        self.prompts.weight.data.copy_(weight)
        self.prompts.requires_grad_(False)
        self.readout.head[-1] = HeadLayer(LINEAR, self.prompts)

    # --------------------------------------------------------------- forward
    def embed(self, prepared: dict, r: Replay = PLAIN, track: bool = False) -> EmbeddingRecord:
        emb = self.model.vision_model.embeddings
        images = prepared["images"]
        if track:
            images = images.detach().requires_grad_(True)
        patches = self.patch_conv(images.to(self.patch_conv.weight.dtype)).flatten(2).transpose(1, 2)
        cls = emb.class_embedding.expand(images.shape[0], 1, -1)
        tokens = torch.cat([cls, patches], dim=1)
        x_pos = r(POS_ADD, torch.add, tokens, emb.position_embedding(emb.position_ids))
        x0 = r.module(LAYERNORM, self.norm_pre, x_pos)
        return EmbeddingRecord(x0=x0, embeds=patches, tokens=tokens, x_pos=x_pos, images=images)


__all__ = ["CLIPImageAdapter", "L2Normalize"]

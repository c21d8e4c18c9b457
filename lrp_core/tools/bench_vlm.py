"""The benchmark's vision-language rows (``python -m lrp_core.tools.bench --vlm``): a LLaVA-shaped random model.

``llava``: a Hugging Face ``LlavaForConditionalGeneration`` with random weights — a CLIP ViT-B/16 vision tower at
224 px (D 768, 12 blocks, 12 heads: 196 patches + [CLS]; LLaVA's defaults: features of the second-to-last
block, [CLS] dropped), the Linear-GELU-Linear projector, and the Llama of the decoder rows
(:func:`lrp_core.tools.bench_models.llama_config`: D 512, 8 blocks, 8 / 2 heads), sdpa everywhere. One row holds
1 image (its 196 image tokens) and :data:`TEXT_TOKENS` random text tokens: 1 × 260 tokens. ``tiny-llava`` is a
seconds-fast stand-in (a 2-block CLIP at 32 px, 16 image tokens, the 2-block Llama, 8 text tokens).

What is explained is the next-token logit at the last position, as for the decoder rows; the baseline is a
forward with the LM head on the last position and a backward into the parameters
(:func:`lrp_core.tools.bench.forward_backward`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

#: the LLaVA-shaped rows: the ViT-B/16 + D 512 model and its stand-in
VLM_MODELS = ("llava", "tiny-llava")
#: text tokens after the image in a row
TEXT_TOKENS = 64
TINY_TEXT_TOKENS = 8
#: the image token's id: past the text vocabulary of random ids (as llava-1.5's 32000 in 32064)
IMAGE_TOKEN = 32000
#: the methods timed by default: the LRP family, then the layer-product methods
VLM_BENCH_METHODS = ("attnlrp", "cp_lrp", "lrp", "transformer_attribution", "generic_attention", "rollout")


def is_vlm(name: str) -> bool:
    """Whether ``name`` is a vision-language row (:data:`VLM_MODELS`).

    Parameters
    ----------
    name : str
        The benchmark's model name.

    Returns
    -------
    bool
        True for ``llava`` and ``tiny-llava``.
    """
    return name in VLM_MODELS


def build_vlm(name: str, text: Any) -> nn.Module:
    """The random LLaVA ``name`` in eval mode (seed torch first for reproducible weights).

    Parameters
    ----------
    name : str
        ``"llava"`` or ``"tiny-llava"``.
    text : LlamaConfig
        The language model's configuration (the decoder rows', :func:`lrp_core.tools.bench_models.llama_config`);
        its vocabulary is widened to hold the image token.

    Returns
    -------
    LlavaForConditionalGeneration
        The model, sdpa attention in the tower and the language model.
    """
    from transformers import CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration

    # read by the configs' __post_init__(**kwargs), which the dataclass signatures mypy reads do not list
    sdpa: dict[str, Any] = {"attn_implementation": "sdpa"}
    image: dict[str, Any] = {"image_token_id": IMAGE_TOKEN, **sdpa}
    tiny = name == "tiny-llava"
    text.vocab_size = IMAGE_TOKEN + 64
    vision = (
        CLIPVisionConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=32,
            patch_size=8,
            **sdpa,
        )
        if tiny
        else CLIPVisionConfig(
            hidden_size=768,
            intermediate_size=3072,
            num_hidden_layers=12,
            num_attention_heads=12,
            image_size=224,
            patch_size=16,
            projection_dim=512,
            **sdpa,
        )
    )
    cfg = LlavaConfig(vision_config=vision, text_config=text, vision_feature_select_strategy="default", **image)
    return LlavaForConditionalGeneration(cfg).eval()


def vlm_tokens(name: str) -> int:
    """A row's length: image tokens + text tokens (260 for ``llava``, 24 for ``tiny-llava``).

    Parameters
    ----------
    name : str
        ``"llava"`` or ``"tiny-llava"``.

    Returns
    -------
    int
        The tokens the language model sees per row.
    """
    return 16 + TINY_TEXT_TOKENS if name == "tiny-llava" else 196 + TEXT_TOKENS


def vlm_inputs(model: Any, batch: int, seed: int = 0) -> dict:
    """Seeded random inputs: per row the image's tokens, then random text tokens; one random image per row.

    Parameters
    ----------
    model : LlavaForConditionalGeneration
        The row's model (:func:`build_vlm`).
    batch : int
        Rows B.
    seed : int
        The generator's seed.

    Returns
    -------
    dict
        ``input_ids`` and ``attention_mask`` (B, T) (mask all ones), ``pixel_values`` (B, 3, H, W).
    """
    g = torch.Generator().manual_seed(seed)
    vision = model.config.vision_config
    n_image = (vision.image_size // vision.patch_size) ** 2
    n_text = TINY_TEXT_TOKENS if vision.image_size == 32 else TEXT_TOKENS
    text = torch.randint(0, IMAGE_TOKEN, (batch, n_text), generator=g)
    ids = torch.cat([torch.full((batch, n_image), IMAGE_TOKEN), text], dim=1)
    pixels = torch.randn(batch, 3, vision.image_size, vision.image_size, generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": pixels}


__all__ = ["VLM_MODELS", "VLM_BENCH_METHODS", "TEXT_TOKENS", "is_vlm", "build_vlm", "vlm_tokens", "vlm_inputs"]

"""Tiny LLaVA models for the tests, built in milliseconds, every parameter random.

``make_llava(tower, ...)`` gives a seeded ``LlavaForConditionalGeneration`` with a CLIP-vision or DINOv2 tower
(hidden 24, 3 layers, 2 heads, patch 7 on 28-pixel images: a 4 × 4 grid) and a Llama language model (hidden 32,
2 layers, 4 query / 2 key-value heads, vocabulary 96, image token 95); ``prompt(...)`` lays a row out as
``bos, text, image tokens, text``. ``make_gemma3`` / ``make_paligemma`` give Gemma 3 with images and PaliGemma 1 / 2
on the same images (a SigLIP tower); ``gemma3_prompt``, ``paligemma_prompt``, ``image_types`` and ``with_types`` lay
out their rows and ``token_type_ids``.
"""

from __future__ import annotations

from typing import Optional

import torch

VOCAB = 96
IMAGE = 95
PAD = 0
SIZE = 28
PATCH = 7
GRID = SIZE // PATCH


def _norms(model: torch.nn.Module, seed: int, bias_free: bool) -> None:
    """Random LayerNorm / RMSNorm scales (and LayerNorm shifts unless ``bias_free``), so the rules see non-trivial
    activations."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            elif "norm" in name and name.endswith("bias"):
                p.copy_(torch.zeros_like(p) if bias_free else 0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))


def make_llava(
    tower: str = "dinov2",
    seed: int = 0,
    layer: int = -1,
    strategy: str = "default",
    bias_free: bool = False,
    attn: str = "sdpa",
    dtype: torch.dtype = torch.float64,
    text: Optional[dict] = None,
    family: str = "llama",
):
    """A tiny LLaVA. ``bias_free``: every additive constant zero (Linear / Conv biases, LayerNorm shifts, position
    embeddings, [CLS]), for the conservation checks. ``family``: the language model's (llama, mistral, qwen2)."""
    import transformers
    from transformers import CLIPVisionConfig, Dinov2Config, LlavaConfig, LlavaForConditionalGeneration

    text_config = getattr(
        transformers, {"llama": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config"}[family]
    )
    torch.manual_seed(seed)
    tcfg = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=PAD,
        bos_token_id=1,
        eos_token_id=1,
        tie_word_embeddings=False,
        attn_implementation=attn,
    )
    if family == "llama":
        tcfg["attention_bias"] = False
    if family == "mistral":
        tcfg["sliding_window"] = 8
    tcfg.update(text or {})
    vision = dict(
        hidden_size=24,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=2,
        image_size=SIZE,
        patch_size=PATCH,
        attn_implementation=attn,
    )
    vcfg = Dinov2Config(**vision, qkv_bias=not bias_free) if tower == "dinov2" else CLIPVisionConfig(**vision)
    cfg = LlavaConfig(
        vision_config=vcfg,
        text_config=text_config(**tcfg),
        image_token_id=IMAGE,
        vision_feature_layer=layer,
        vision_feature_select_strategy=strategy,
        multimodal_projector_bias=not bias_free,
        attn_implementation=attn,
    )
    model = LlavaForConditionalGeneration(cfg).eval().to(dtype)
    _norms(model, seed, bias_free)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_scale" in name or "lambda1" in name:
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            if bias_free and (
                name.endswith(".bias")
                or "position_embedding" in name
                or "cls_token" in name
                or "class_embedding" in name
            ):
                p.zero_()
    return model


def image_tokens(strategy: str = "default") -> int:
    """The image tokens of one image."""
    return GRID * GRID + (1 if strategy == "full" else 0)


def prompt(before: list, after: list, strategy: str = "default") -> list:
    """``[1, *before, IMAGE × P, *after]``."""
    return [1, *before] + [IMAGE] * image_tokens(strategy) + list(after)


def inputs(rows: list, side: str = "left", seed: int = 0, dtype: torch.dtype = torch.float64) -> dict:
    """The processor's output for id rows (padded on ``side`` with PAD), one random image per row."""
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        sl = slice(T - len(r), T) if side == "left" else slice(0, len(r))
        ids[i, sl] = torch.tensor(r)
        mask[i, sl] = 1
    g = torch.Generator().manual_seed(seed)
    pixels = torch.randn(len(rows), 3, SIZE, SIZE, generator=g, dtype=dtype)
    return {"input_ids": ids, "attention_mask": mask, "pixel_values": pixels}


# ------------------------------------------------------------------------------------------- Idefics3 / SmolVLM
#: SmolVLM / Idefics3: 32-pixel images, patch 4 (an 8 × 8 grid), scale factor 2 (16 image tokens per image)
SMOL_SIZE = 32
SMOL_PATCH = 4
SMOL_GRID = SMOL_SIZE // SMOL_PATCH


def make_smolvlm(
    cls: str = "SmolVLM",
    seed: int = 0,
    scale: int = 2,
    bias_free: bool = False,
    attn: str = "sdpa",
    dtype: torch.dtype = torch.float64,
    image_size: int = SMOL_SIZE,
):
    """A tiny ``SmolVLMForConditionalGeneration`` (``cls="Idefics3"``: ``Idefics3ForConditionalGeneration``): the
    vision transformer (hidden 24, 2 layers, 2 heads, patch 4; its position grid ``image_size`` / 4 per side), the
    pixel shuffle at ``scale`` and a Llama language model as :func:`make_llava`'s. ``bias_free``: every additive
    constant zero (Linear / Conv biases, LayerNorm shifts, the position embedding)."""
    import transformers

    config = getattr(transformers, f"{cls}Config")
    torch.manual_seed(seed)
    tcfg = dict(
        model_type="llama",
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=PAD,
        bos_token_id=1,
        eos_token_id=1,
        tie_word_embeddings=False,
        attention_bias=False,
    )
    vcfg = dict(
        hidden_size=24,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=image_size,
        patch_size=SMOL_PATCH,
    )
    cfg = config(
        text_config=tcfg, vision_config=vcfg, scale_factor=scale, image_token_id=IMAGE, tie_word_embeddings=False
    )
    cfg._attn_implementation = attn
    for sub in (cfg.text_config, cfg.vision_config):
        sub._attn_implementation = attn
    model = getattr(transformers, f"{cls}ForConditionalGeneration")(cfg).eval().to(dtype)
    _norms(model, seed, bias_free)
    if bias_free:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(".bias") or "position_embedding" in name:
                    p.zero_()
    return model


def smol_prompt(before: list, after: list, images: int = 1, scale: int = 2) -> list:
    """``[1, *before, IMAGE × k·P, *after]``."""
    return [1, *before] + [IMAGE] * (images * SMOL_GRID**2 // scale**2) + list(after)


def smol_inputs(
    rows: list,
    side: str = "left",
    seed: int = 0,
    images: int = 1,
    size: int = SMOL_SIZE,
    dtype: torch.dtype = torch.float64,
) -> dict:
    """The processor's output for id rows: ``pixel_values`` (B, k, 3, size, size) random, ``pixel_attention_mask``
    all ones (B, k, size, size)."""
    x = inputs(rows, side=side, seed=seed, dtype=dtype)
    g = torch.Generator().manual_seed(seed)
    pixels = torch.randn(len(rows), images, 3, size, size, generator=g, dtype=dtype)
    return {
        "input_ids": x["input_ids"],
        "attention_mask": x["attention_mask"],
        "pixel_values": pixels,
        "pixel_attention_mask": torch.ones(len(rows), images, size, size, dtype=torch.long),
    }


# ---------------------------------------------------------------------------------------------- Qwen2.5-VL
#: Qwen2.5-VL: patch 4, 2 × 2 merge, windows of 16 pixels (2 × 2 merged tokens); a 6 × 8 patch grid is 3 × 4
#: merged tokens, so the windows at the bottom edge are cut (uneven windows)
QWEN_PATCH = 4
QWEN_GRID = (6, 8)
QWEN_IMAGE, QWEN_VIDEO, QWEN_START, QWEN_END = 90, 91, 92, 93


def make_qwen_vl(
    seed: int = 0,
    bias_free: bool = False,
    attn: str = "sdpa",
    dtype: torch.dtype = torch.float64,
    fullatt: tuple = (1,),
    version: str = "2.5",
):
    """A tiny Qwen2.5-VL (``version="2"``: Qwen2-VL): a vision tower of 3 blocks (hidden 24, 2 heads, patch 4,
    temporal patch 2, window 16 pixels, full attention in the blocks ``fullatt``), the patch merger, and a
    language model (hidden 32, 2 layers, 4 query / 2 key-value heads, M-RoPE sections (2, 1, 1)).
    ``bias_free``: every Linear bias zero (the vision q/k/v, MLP and merger biases, the text q/k/v biases)."""
    import transformers

    torch.manual_seed(seed)
    text = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=PAD,
        bos_token_id=1,
        eos_token_id=1,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]},
    )
    vision = dict(depth=3, num_heads=2, patch_size=QWEN_PATCH, spatial_merge_size=2, temporal_patch_size=2)
    if version == "2.5":
        vision.update(
            hidden_size=24,
            intermediate_size=32,
            window_size=16,
            out_hidden_size=32,
            fullatt_block_indexes=list(fullatt),
        )
    else:  # Qwen2-VL: embed_dim is the tower's width, hidden_size the merger's output
        vision.update(embed_dim=24, hidden_size=32, mlp_ratio=2)
    prefix = "Qwen2_5_VL" if version == "2.5" else "Qwen2VL"
    cfg = getattr(transformers, f"{prefix}Config")(
        text_config=text,
        vision_config=vision,
        image_token_id=QWEN_IMAGE,
        video_token_id=QWEN_VIDEO,
        vision_start_token_id=QWEN_START,
        vision_end_token_id=QWEN_END,
        tie_word_embeddings=False,
        attn_implementation=attn,
    )
    model = getattr(transformers, f"{prefix}ForConditionalGeneration")(cfg).eval().to(dtype)
    _norms(model, seed, bias_free)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias") and not ("norm" in name or "ln_q" in name):
                p.copy_(torch.zeros_like(p) if bias_free else 0.1 * torch.randn_like(p))
    return model


def qwen_tokens(grid: tuple = QWEN_GRID) -> int:
    """The image tokens of one image: its merged tokens, (h / 2) · (w / 2)."""
    return grid[0] // 2 * (grid[1] // 2)


def qwen_prompt(before: list, after: list, grid: tuple = QWEN_GRID) -> list:
    """``[1, *before, vision_start, IMAGE × P, vision_end, *after]``."""
    return [1, *before, QWEN_START] + [QWEN_IMAGE] * qwen_tokens(grid) + [QWEN_END, *after]


def qwen_inputs(
    rows: list, side: str = "left", seed: int = 0, grid: tuple = QWEN_GRID, dtype: torch.dtype = torch.float64
) -> dict:
    """The processor's output for id rows (padded on ``side``), one random image of patch grid ``grid`` per row:
    ``pixel_values`` (B · h · w, 3 · 2 · 4 · 4), ``image_grid_thw`` (B, 3), ``mm_token_type_ids`` (1 at the image
    tokens)."""
    x = inputs(rows, side=side, seed=seed, dtype=dtype)
    g = torch.Generator().manual_seed(seed)
    n = len(rows) * grid[0] * grid[1]
    x["pixel_values"] = torch.randn(n, 3 * 2 * QWEN_PATCH * QWEN_PATCH, generator=g, dtype=dtype)
    x["image_grid_thw"] = torch.tensor([[1, *grid]] * len(rows))
    x["mm_token_type_ids"] = (x["input_ids"] == QWEN_IMAGE).long()
    return x


# ------------------------------------------------------------------------------------- Gemma 3 and PaliGemma
#: Gemma 3's begin / end-of-image tokens around an image's tokens
BOI, EOI = 93, 94
#: Gemma 3's image tokens per image: the 4 × 4 patch grid pooled in 2 × 2 squares
GEMMA3_TOKENS = 4


def _siglip(attn: str):
    from transformers import SiglipVisionConfig

    return SiglipVisionConfig(
        hidden_size=24,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=SIZE,
        patch_size=PATCH,
        vision_use_head=False,
        attn_implementation=attn,
    )


def _randomise(model: torch.nn.Module, seed: int, bias_free: bool) -> torch.nn.Module:
    """Every parameter random (norm weights around 1, LayerNorm shifts random unless ``bias_free``; Gemma's norms
    multiply by ``1 + w``, so theirs are around 0 and 1 + w around 1); ``bias_free``: every Linear / Conv bias and
    the tower's position embedding zero."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype)
            gemma_norm = "norm" in name and ("language_model" in name or "mm_soft_emb_norm" in name)
            if gemma_norm:
                p.copy_(0.3 * noise)
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.3 * noise)
            elif bias_free and (name.endswith(".bias") or "position_embedding" in name):
                p.zero_()
            else:
                p.copy_(0.3 * noise)
    return model


def make_gemma3(
    seed: int = 0, attn: str = "sdpa", dtype: torch.dtype = torch.float64, bias_free: bool = False, window: int = 4
):
    """A tiny ``Gemma3ForConditionalGeneration``: the SigLIP tower (hidden 24, 2 layers, patch 7 on 28 pixels: a 4 × 4
    grid) pooled to 4 image tokens, and a Gemma 3 language model (hidden 32, a sliding layer of window ``window`` then
    a global one, vocabulary 96; image token 95 between ``BOI`` and ``EOI``)."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3TextConfig

    torch.manual_seed(seed)
    text = Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        query_pre_attn_scalar=12,
        sliding_window=window,
        layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=128,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
            "full_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
        pad_token_id=PAD,
        bos_token_id=1,
        eos_token_id=1,
        tie_word_embeddings=False,
        attn_implementation=attn,
    )
    cfg = Gemma3Config(
        vision_config=_siglip(attn),
        text_config=text,
        mm_tokens_per_image=GEMMA3_TOKENS,
        boi_token_index=BOI,
        eoi_token_index=EOI,
        image_token_index=IMAGE,
        tie_word_embeddings=False,
        attn_implementation=attn,
    )
    return _randomise(Gemma3ForConditionalGeneration(cfg).eval().to(dtype), seed, bias_free)


def make_paligemma(
    version: int = 2, seed: int = 0, attn: str = "eager", dtype: torch.dtype = torch.float64, bias_free: bool = False
):
    """A tiny ``PaliGemmaForConditionalGeneration``: the SigLIP tower (as :func:`make_gemma3`'s: 16 image tokens) and
    a Gemma (``version`` 1) or Gemma 2 language model (``version`` 2: a sliding layer of window 4 then a global one,
    attention scores capped at 5 and logits at 3, eager attention as transformers runs Gemma 2)."""
    from transformers import Gemma2Config, GemmaConfig, PaliGemmaConfig, PaliGemmaForConditionalGeneration

    torch.manual_seed(seed)
    common = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=128,
        pad_token_id=PAD,
        bos_token_id=1,
        eos_token_id=1,
        tie_word_embeddings=False,
        attn_implementation=attn,
    )
    text = (
        GemmaConfig(**common)
        if version == 1
        else Gemma2Config(
            **common,
            query_pre_attn_scalar=12,
            sliding_window=4,
            attn_logit_softcapping=5.0,
            final_logit_softcapping=3.0,
        )
    )
    cfg = PaliGemmaConfig(
        vision_config=_siglip(attn),
        text_config=text,
        image_token_index=IMAGE,
        projection_dim=32,
        hidden_size=32,
        tie_word_embeddings=False,
        attn_implementation=attn,
    )
    return _randomise(PaliGemmaForConditionalGeneration(cfg).eval().to(dtype), seed, bias_free)


def gemma3_prompt(before: list, after: list, images: int = 1) -> list:
    """``[1, *before, (BOI, IMAGE × 4, EOI) × images, *after]``."""
    return [1, *before] + [BOI, *[IMAGE] * GEMMA3_TOKENS, EOI] * images + list(after)


def paligemma_prompt(prefix: list, suffix: list = ()) -> tuple:
    """PaliGemma's layout ``[IMAGE × 16, 1, *prefix, 2 (newline), *suffix]`` and its token types (0 for the image
    and the prefix, 1 for the suffix)."""
    row = [IMAGE] * GRID * GRID + [1, *prefix, 2]
    return row + list(suffix), [0] * len(row) + [1] * len(suffix)


def with_types(x: dict, types: list, side: str = "left") -> dict:
    """``x`` with ``token_type_ids`` from per-row type lists (padding: type 0, as the processor pads them)."""
    T = x["input_ids"].shape[1]
    tt = torch.zeros(len(types), T, dtype=torch.long)
    for i, t in enumerate(types):
        sl = slice(T - len(t), T) if side == "left" else slice(0, len(t))
        tt[i, sl] = torch.tensor(t, dtype=torch.long)
    return {**x, "token_type_ids": tt}


def image_types(x: dict) -> dict:
    """``x`` with Gemma 3's ``token_type_ids``: 1 at the image tokens."""
    return {**x, "token_type_ids": (x["input_ids"] == IMAGE).long()}


def per_token_family(family: str) -> tuple:
    """A tiny model of a family whose processor gives per-token entries, one prompt's processor output, the entry's
    name and the value ``generate`` gives a written token there: ``"gemma3"`` (``token_type_ids``, 0),
    ``"paligemma"`` (``token_type_ids``, 1), ``"qwen"`` / ``"qwen2"`` (Qwen2.5-VL / Qwen2-VL,
    ``mm_token_type_ids``, 0)."""
    if family == "gemma3":
        return make_gemma3(), image_types(inputs([gemma3_prompt([5, 6], [7, 8])])), "token_type_ids", 0
    if family == "paligemma":
        row, types = paligemma_prompt([5, 6, 7])
        return make_paligemma(2), with_types(inputs([row]), [types]), "token_type_ids", 1
    return (
        make_qwen_vl(version="2" if family == "qwen2" else "2.5"),
        qwen_inputs([qwen_prompt([5, 6], [7, 8])]),
        "mm_token_type_ids",
        0,
    )


def relative_deviation(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-10) -> float:
    """max |a − b| relative to the larger of the two maps' max |·|; asserted ≤ tol."""
    dev = float((a - b).abs().max() / max(float(a.abs().max()), float(b.abs().max()), 1e-300))
    assert dev <= tol, dev
    return dev


def model_state(model: torch.nn.Module) -> dict:
    """What a call must leave as it was: parameters and buffers, modes, requires_grad, .grad, hook counts."""
    return {
        "params": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "training": [m.training for m in model.modules()],
        "requires_grad": [p.requires_grad for p in model.parameters()],
        "grads": [p.grad for p in model.parameters()],
        "hooks": [(len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks)) for m in model.modules()],
    }

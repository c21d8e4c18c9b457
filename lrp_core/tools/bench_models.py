"""The benchmark's models and inputs: which model a case name builds, with what random inputs.

Separate from :mod:`lrp_core.tools.bench` (the measuring and the tables) so each stays one concept.
"""

from __future__ import annotations

from typing import Any, Union

import torch
from torch import Tensor, nn

from .bench_vlm import VLM_MODELS, build_vlm, is_vlm, vlm_inputs

Inputs = Union[Tensor, dict]
# The models are read by attribute name (timm's patch_embed, a transformers model's config) through values typed
# Any: torch types every submodule attribute as ``Tensor | Module``. transformers' configs take
# ``attn_implementation`` and ``num_labels`` through ``__post_init__(**kwargs)``, which the dataclass signature
# mypy reads does not list: those travel in a ``dict[str, Any]``.
_SDPA: dict[str, Any] = {"attn_implementation": "sdpa"}
_TWO_LABELS: dict[str, Any] = {"num_labels": 2}

IMAGE_MODELS = ("deit_tiny_patch16_224", "deit_small_patch16_224", "vit_base_patch16_224")
TEXT_MODELS = ("bert-base",)
#: Decoder-only causal LMs, explained at their next-token logit. ``qwen3-moe``: a mixture of experts.
DECODER_MODELS = ("llama", "qwen3-moe")
#: Seconds-fast stand-ins for the tests and a smoke run (2 blocks, random weights).
TINY_MODELS = ("tiny-vit", "tiny-bert", "tiny-llama")


def is_text(name: str) -> bool:
    """Whether the case ``name`` is a text model (BERT, its stand-in, or a decoder).

    Parameters
    ----------
    name : str
        The benchmark's model name.

    Returns
    -------
    bool
        True for a text model, False for an image model.
    """
    return name in TEXT_MODELS or name == "tiny-bert" or is_decoder(name)


def is_decoder(name: str) -> bool:
    """Whether ``name`` is a decoder-only causal LM (explained at its next-token logit).

    Parameters
    ----------
    name : str
        The benchmark's model name.

    Returns
    -------
    bool
        True for a decoder row or the tiny Llama stand-in.
    """
    return name in DECODER_MODELS or name == "tiny-llama"


def llama_config(tiny: bool = False) -> Any:
    """The ``LlamaConfig`` of the decoder rows, or of their 2-block stand-in.

    Parameters
    ----------
    tiny : bool
        False: the decoder rows' shape (D 512, 8 blocks, 8 / 2 heads, F 1376, V 32,000, sdpa); True: the
        stand-in's (D 32, 2 blocks, 4 / 2 heads, F 48, V 100).

    Returns
    -------
    LlamaConfig
        The configuration, with sdpa attention and 4096 positions.
    """
    from transformers import LlamaConfig

    if tiny:
        return LlamaConfig(
            vocab_size=100,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=48,
            max_position_embeddings=4096,
            **_SDPA,
        )
    return LlamaConfig(
        vocab_size=32000,
        hidden_size=512,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        intermediate_size=1376,
        max_position_embeddings=4096,
        **_SDPA,
    )


def qwen3_moe_config() -> Any:
    """The mixture-of-experts row's ``Qwen3MoeConfig``: the Llama row's shape (D 512, 8 blocks, 8 / 2 heads of 64,
    V 32,000, sdpa) with 8 experts of F 688 per block, top-2 renormalised (k·F = the Llama row's 1376)."""
    from transformers import Qwen3MoeConfig

    shape: dict[str, Any] = {"head_dim": 64, **_SDPA}  # read by the config's __post_init__(**kwargs)
    return Qwen3MoeConfig(
        vocab_size=32000,
        hidden_size=512,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=688,
        norm_topk_prob=True,
        max_position_embeddings=4096,
        **shape,
    )


def build_model(name: str) -> nn.Module:
    """The model ``name`` with random weights, in eval mode (seed torch first for reproducible weights).

    Parameters
    ----------
    name : str
        A timm ViT name, ``"bert-base"`` (``BertConfig()`` defaults, 2 labels), ``"llama"`` (:func:`llama_config`),
        ``"llava"`` / ``"tiny-llava"`` (:func:`lrp_core.tools.bench_vlm.build_vlm`),
        ``"qwen3-moe"`` (:func:`qwen3_moe_config`, router weights drawn at random), or a tiny stand-in.

    Returns
    -------
    nn.Module
        The model, in eval mode.
    """
    if is_vlm(name):
        return build_vlm(name, llama_config(tiny=name == "tiny-llava"))
    if name == "qwen3-moe":
        from transformers import Qwen3MoeForCausalLM

        model = Qwen3MoeForCausalLM(qwen3_moe_config()).eval()
        with torch.no_grad():  # the router is initialised at 0 (every expert tied): random, as trained ones are not
            for layer in model.model.layers:
                layer.mlp.gate.weight.normal_(0.0, 0.02)
        return model
    if is_decoder(name):
        from transformers import LlamaForCausalLM

        return LlamaForCausalLM(llama_config(tiny=name == "tiny-llama")).eval()
    if name == "bert-base":
        from transformers import BertConfig, BertForSequenceClassification

        return BertForSequenceClassification(BertConfig(**_TWO_LABELS)).eval()
    if name == "tiny-bert":
        from transformers import BertConfig, BertForSequenceClassification

        cfg = BertConfig(
            vocab_size=100,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            **_TWO_LABELS,
        )
        return BertForSequenceClassification(cfg).eval()
    if name == "tiny-vit":
        from timm.models.vision_transformer import VisionTransformer

        return VisionTransformer(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=5).eval()
    import timm

    return timm.create_model(name, pretrained=False).eval()


def image_tokens(name: str) -> int:
    """The sequence length of the ViT ``name``, read from a weightless (meta) copy.

    Parameters
    ----------
    name : str
        A timm ViT name.

    Returns
    -------
    int
        Patches + prefix tokens.
    """
    with torch.device("meta"):
        model: Any = build_model(name)
    return int(model.patch_embed.num_patches + model.num_prefix_tokens)


def make_inputs(model: nn.Module, case: Any, seed: int = 0) -> Inputs:
    """Seeded random inputs for ``case``.

    Parameters
    ----------
    model : nn.Module
        The case's model (its vocabulary size, or its image size).
    case : Case
        The case (:class:`lrp_core.tools.bench_table.Case`): ``batch`` B, ``tokens`` T, ``text``.
    seed : int
        The generator's seed.

    Returns
    -------
    Tensor or dict
        Images ``(B, 3, H, W)``, or for text ``{"input_ids", "attention_mask"}``, each ``(B, T)`` (mask all ones);
        a VLM row also ``pixel_values`` (:func:`lrp_core.tools.bench_vlm.vlm_inputs`).
    """
    if is_vlm(case.model):
        return vlm_inputs(model, case.batch, seed)
    g = torch.Generator().manual_seed(seed)
    named: Any = model
    if case.text:
        ids = torch.randint(0, named.config.vocab_size, (case.batch, case.tokens), generator=g)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    h, w = named.patch_embed.img_size
    return torch.randn(case.batch, 3, h, w, generator=g)


def prepare(case: Any, seed: int = 0) -> tuple[nn.Module, Inputs]:
    """The model and the inputs of ``case``.

    Parameters
    ----------
    case : Case
        The case (:class:`lrp_core.tools.bench_table.Case`): model name, size and ``dtype``.
    seed : int
        Seeds torch before the model is built, and the inputs' generator.

    Returns
    -------
    tuple
        ``(model, inputs)``: the model built in ``case.dtype``, and the inputs of :func:`make_inputs` (images cast
        to ``case.dtype``).
    """
    torch.manual_seed(seed)
    model = build_in(case.model, getattr(torch, case.dtype))
    inputs = make_inputs(model, case, seed)
    return model, (inputs.to(getattr(torch, case.dtype)) if isinstance(inputs, Tensor) else inputs)


def build_in(name: str, dtype: torch.dtype) -> nn.Module:
    """:func:`build_model` with its weights made in ``dtype``.

    ``dtype`` is the default dtype while the model is built: a half model never exists in float32, so the
    process's peak RSS is that of the half model.

    Parameters
    ----------
    name : str
        The benchmark's model name.
    dtype : torch.dtype
        The weights' dtype.

    Returns
    -------
    nn.Module
        The model in ``dtype`` (buffers too), in eval mode.
    """
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return build_model(name).to(dtype)  # .to: buffers built with an explicit float32 dtype
    finally:
        torch.set_default_dtype(old)


__all__ = [
    "VLM_MODELS",
    "IMAGE_MODELS",
    "TEXT_MODELS",
    "DECODER_MODELS",
    "TINY_MODELS",
    "Inputs",
    "is_text",
    "is_decoder",
    "llama_config",
    "qwen3_moe_config",
    "build_model",
    "image_tokens",
    "make_inputs",
    "prepare",
    "build_in",
]

"""How a model is recognised: by class name, Hugging Face model type or config values, never by loading it.

The predicates the ``ADAPTERS`` and ``REFUSED`` tables of :mod:`lrp_core.adapters` are written with.
"""

from __future__ import annotations

from typing import Callable

from torch import nn


def mro_names(model: nn.Module) -> set:
    return {c.__name__ for c in type(model).__mro__}


def is_timm_vit(model: nn.Module) -> bool:
    return "VisionTransformer" in mro_names(model) and hasattr(model, "blocks") and hasattr(model, "patch_embed")


def is_hf_vit(model: nn.Module) -> bool:
    return type(model).__name__ == "ViTForImageClassification" or (
        hasattr(model, "vit") and hasattr(model, "classifier")
    )


def is_hf_sequence_classifier(model: nn.Module) -> bool:
    return type(model).__name__.endswith("ForSequenceClassification")


def is_base_model(model: nn.Module) -> bool:
    """A Hugging Face base model without a head (``BertModel``, ``ViTModel``, ...): it is its own base model."""
    return getattr(model, "base_model", None) is model


def hf_base(*model_types: str) -> Callable[[nn.Module], bool]:
    """A Hugging Face base model (no head) whose ``config.model_type`` is one of ``model_types``."""
    return lambda model: (
        is_base_model(model) and getattr(getattr(model, "config", None), "model_type", None) in model_types
    )


def hf_text(*model_types: str) -> Callable[[nn.Module], bool]:
    """A Hugging Face sequence classifier whose ``config.model_type`` is one of ``model_types``."""
    return lambda model: (
        is_hf_sequence_classifier(model) and getattr(getattr(model, "config", None), "model_type", None) in model_types
    )


#: the class-name endings of the Hugging Face heads an encoder adapter reads (lrp_core.adapters.task_heads)
TEXT_HEADS = (
    "ForSequenceClassification",
    "ForTokenClassification",
    "ForQuestionAnswering",
    "ForMaskedLM",
    "ForMultipleChoice",
)


def hf_text_head(*model_types: str) -> Callable[[nn.Module], bool]:
    """A Hugging Face encoder with a sequence-classification or task head (:data:`TEXT_HEADS`) whose
    ``config.model_type`` is one of ``model_types``."""
    return lambda model: (
        type(model).__name__.endswith(TEXT_HEADS)
        and getattr(getattr(model, "config", None), "model_type", None) in model_types
    )


def named(*class_names: str) -> Callable[[nn.Module], bool]:
    """A model whose class (or a base class) has one of these names."""
    return lambda model: bool(mro_names(model) & set(class_names))


def hf_type(*model_types: str) -> Callable[[nn.Module], bool]:
    """A Hugging Face model (any head) whose ``config.model_type`` is one of ``model_types``."""
    return lambda model: getattr(getattr(model, "config", None), "model_type", None) in model_types


#: ``config.model_type`` of the encoders the BERT adapter replays exactly (post-LN blocks with attention.self /
#: attention.output / intermediate / output, absolute positions, a pooler or dense + out_proj head). Recognised
#: positively: any other ``*ForSequenceClassification`` (a decoder, BigBird, LayoutLM, ...) is not sent there.
BERT_FAMILY = ("bert", "roberta", "xlm-roberta", "electra", "camembert", "data2vec-text")


def model_types(model: nn.Module) -> set:
    """``config.model_type`` of a Hugging Face model and of its text sub-config, if any (empty for other models)."""
    cfg = getattr(model, "config", None)
    types = {getattr(c, "model_type", None) for c in (cfg, getattr(cfg, "text_config", None)) if c is not None}
    return {t for t in types if isinstance(t, str)}


def config_values(model: nn.Module, *names: str) -> list:
    """The values of the named attributes on the config, its text sub-config and DBRX's ``ffn_config``."""
    cfg = getattr(model, "config", None)
    configs = [c for c in (cfg, getattr(cfg, "text_config", None), getattr(cfg, "ffn_config", None)) if c is not None]
    return [getattr(c, n) for c in configs for n in names if getattr(c, n, None) is not None]


def is_mixture_of_experts(model: nn.Module) -> bool:
    """A mixture-of-experts model: a ``*moe*`` model type, or a config naming more than one expert."""
    counts = config_values(model, "num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
    return any(
        "moe" in t or t in ("mixtral", "dbrx", "jamba", "gpt_oss", "deepseek_v2", "deepseek_v3")
        for t in model_types(model)
    ) or any(isinstance(c, int) and c > 1 for c in counts)


#: the mixture-of-experts decoders an adapter explains (their rows in ADAPTERS)
MOE_CLASSES = (
    "MixtralForCausalLM",
    "MixtralForSequenceClassification",
    "Qwen2MoeForCausalLM",
    "Qwen2MoeForSequenceClassification",
    "Qwen3MoeForCausalLM",
    "Qwen3MoeForSequenceClassification",
    "OlmoeForCausalLM",
    "GptOssForCausalLM",
    "GptOssForSequenceClassification",
)


def is_other_mixture_of_experts(model: nn.Module) -> bool:
    """A mixture-of-experts model (:func:`is_mixture_of_experts`) of a family no adapter row names."""
    return is_mixture_of_experts(model) and not named(*MOE_CLASSES)(model)


def is_soft_capped(model: nn.Module) -> bool:
    """A decoder other than Gemma 2's two classes and PaliGemma (whose Gemma 2 language model the Gemma 2 adapter
    replays, soft-caps included) whose config turns attention- or final-logit soft-capping on (multimodal Gemma 2
    relatives, Gemma 2 subclasses of other names)."""
    if named("Gemma2ForCausalLM", "Gemma2ForSequenceClassification", "PaliGemmaForConditionalGeneration")(model):
        return False
    return bool(config_values(model, "attn_logit_softcapping", "final_logit_softcapping"))


def is_multimodal_decoder(model: nn.Module) -> bool:
    """A generative vision-language model (Llava, Gemma 3 multimodal, Qwen2-VL, ...): its model type is one that
    transformers' image-text-to-text task lists, or it has a vision config and generates
    (``...ForConditionalGeneration``). CLIP (``CLIPModel``: a similarity, no generation) is neither."""
    cfg = getattr(model, "config", None)
    if cfg is None or not model_types(model):
        return False
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES as IMAGE_TEXT

    generates = type(model).__name__.endswith(("ForConditionalGeneration", "ForImageTextToText"))
    return getattr(cfg, "model_type", None) in IMAGE_TEXT or (generates and hasattr(cfg, "vision_config"))


#: the encoder-decoders an adapter explains (their rows in ADAPTERS); every other encoder-decoder is refused
SEQ2SEQ_CLASSES = (
    "BartForConditionalGeneration",
    "MarianMTModel",
    "MBartForConditionalGeneration",
    "PegasusForConditionalGeneration",
    "BlenderbotSmallForConditionalGeneration",
    "BartForSequenceClassification",
    "MBartForSequenceClassification",
    "T5ForConditionalGeneration",
    "MT5ForConditionalGeneration",
    "WhisperForConditionalGeneration",
)


def is_other_encoder_decoder(model: nn.Module) -> bool:
    """An encoder-decoder (``config.is_encoder_decoder``) of a class no row names."""
    config = getattr(model, "config", None)
    return bool(getattr(config, "is_encoder_decoder", False)) and not named(*SEQ2SEQ_CLASSES)(model)

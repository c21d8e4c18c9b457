"""Model adapters: which model family gets which treatment, in one table.

:data:`ADAPTERS` is the only place a model is dispatched; ``explain``, the
widgets and the evaluation all go through :func:`get_adapter`. A new family
is one adapter module and one row here.
"""
from __future__ import annotations

from typing import Callable

from torch import nn

from ..errors import UnsupportedModelError
from ..wrappers import unwrap
from .base import Adapter, BlockRelevance, TokenLayout, Trace


def _mro_names(model: nn.Module) -> set:
    return {c.__name__ for c in type(model).__mro__}


def _is_timm_vit(model: nn.Module) -> bool:
    return "VisionTransformer" in _mro_names(model) and hasattr(model, "blocks") and hasattr(model, "patch_embed")


def _is_hf_vit(model: nn.Module) -> bool:
    return type(model).__name__ == "ViTForImageClassification" or (hasattr(model, "vit") and hasattr(model, "classifier"))


def _is_hf_sequence_classifier(model: nn.Module) -> bool:
    return type(model).__name__.endswith("ForSequenceClassification")


def _hf_text(*model_types: str) -> Callable[[nn.Module], bool]:
    """A Hugging Face sequence classifier whose ``config.model_type`` is one of ``model_types``."""
    return lambda model: _is_hf_sequence_classifier(model) and \
        getattr(getattr(model, "config", None), "model_type", None) in model_types


def _named(*class_names: str) -> Callable[[nn.Module], bool]:
    """A model whose class (or a base class) has one of these names."""
    return lambda model: bool(_mro_names(model) & set(class_names))


def _hf_type(*model_types: str) -> Callable[[nn.Module], bool]:
    """A Hugging Face model (any head) whose ``config.model_type`` is one of ``model_types``."""
    return lambda model: getattr(getattr(model, "config", None), "model_type", None) in model_types


def _hf_deit(model):
    from .vit import HFDeiTAdapter
    return HFDeiTAdapter(model)


def _hf_dinov2(model):
    from .dinov2 import HFDinov2Adapter
    return HFDinov2Adapter(model)


def _is_hf_clip(model: nn.Module) -> bool:
    return hasattr(model, "vision_model") and hasattr(model, "text_model") and hasattr(model, "logit_scale")


def _clip(model):
    from .clip import CLIPImageAdapter
    return CLIPImageAdapter(model)


def _timm_vit(model):
    from .vit import TimmViTAdapter
    return TimmViTAdapter(model)


def _hf_vit(model):
    from .vit import HFViTAdapter
    return HFViTAdapter(model)


def _bert(model):
    from .bert import BertAdapter
    return BertAdapter(model)


def _distilbert(model):
    from .distilbert import DistilBertAdapter
    return DistilBertAdapter(model)


def _albert(model):
    from .albert import AlbertAdapter
    return AlbertAdapter(model)


def _mpnet(model):
    from .mpnet import MPNetAdapter
    return MPNetAdapter(model)


def _decoder(module: str, cls: str) -> Callable[[nn.Module], Adapter]:
    """A decoder family's adapter, imported when first used."""
    def build(model):
        import importlib
        return getattr(importlib.import_module(f"{__name__}.{module}"), cls)(model)
    return build


#: (family, how to recognise a model, why it is refused and what to use instead), checked before ADAPTERS.
REFUSED: list[tuple[str, Callable[[nn.Module], bool], str]] = [
    ("DeBERTa / DeBERTa-v2", _hf_text("deberta", "deberta-v2"),
     "its disentangled attention adds content-to-position and position-to-content score terms that depend on "
     "the tokens (relative position embeddings multiplied with the queries and keys), so the scores are not "
     "q·kᵀ plus a constant and the block replay and its relevance rules do not apply. Use a BERT, RoBERTa, "
     "DistilBERT, ALBERT, ELECTRA or MPNet classifier instead"),
    ("ModernBERT", _hf_text("modernbert"),
     "it rotates queries and keys by their position (rotary embeddings, a product the rules do not cover), "
     "alternates global with sliding-window local attention, and uses gated (GLU) MLPs without biases, none of "
     "which the post-LN/pre-LN block replay describes. Use a BERT, RoBERTa, DistilBERT, ALBERT, ELECTRA or MPNet "
     "classifier instead"),
    ("Swin and other windowed / hierarchical vision transformers",
     lambda m: _named("SwinTransformer", "SwinTransformerV2", "SwinTransformerV2Cr", "PyramidVisionTransformerV2",
                      "MultiScaleVit", "Twins", "Hiera", "Davit", "MaxxVit", "NextViT", "FocalNet")(m)
     or _hf_type("swin", "swinv2", "donut-swin", "maskformer-swin", "pvt", "pvt_v2", "hiera", "focalnet",
                 "dinat", "nat")(m),
     "attention runs inside local windows and patch tokens are merged between stages, so there is no single "
     "token set whose token-to-token attention matrices can be multiplied across blocks (rollout, "
     "transformer_attribution and the other layer-product methods have no meaning) and the block replay does "
     "not describe window shifts or patch merging. Use a plain ViT / DeiT / DINOv2 (timm or Hugging Face) to "
     "explain with this library, or gradient-based input attributions (e.g. Captum's IntegratedGradients, "
     "LayerGradCam on the last stage) for this model"),
    ("EVA / EVA-02 and rotary-position ViTs", _named("Eva"),
     "the attention rotates queries and keys by their position (rotary embedding applied to q and k inside "
     "every attention) — a position-dependent product the block replay and its relevance rules do not describe "
     "— and its blocks use SwiGLU MLPs. Use a timm VisionTransformer / DeiT / DINOv2 instead"),
    ("BEiT / Data2Vec-vision", lambda m: _named("Beit")(m) or _hf_type("beit", "data2vec-vision")(m),
     "every block adds its own learned relative position bias (a table indexed by token offsets, one per block) "
     "to the attention scores; the block description carries no per-block score bias, so the replay would not "
     "be the model. Use a ViT / DeiT / DINOv2 instead"),
]

#: (what the family is called, how to recognise a model, its adapter), tried in order.
ADAPTERS: list[tuple[str, Callable[[nn.Module], bool], Callable[[nn.Module], Adapter]]] = [
    ("timm VisionTransformer (ViT, DeiT, DINO, DINOv2; [CLS] or average pooling, with or without a class token) "
     "and VisionTransformerDistilled (distilled DeiT: [CLS] and distillation heads averaged)", _is_timm_vit,
     _timm_vit),
    ("Hugging Face ViTForImageClassification", _is_hf_vit, _hf_vit),
    ("Hugging Face DeiTForImageClassification and DeiTForImageClassificationWithTeacher",
     _named("DeiTForImageClassification", "DeiTForImageClassificationWithTeacher"), _hf_deit),
    ("Hugging Face Dinov2ForImageClassification ([CLS] and mean of the patch tokens)",
     _named("Dinov2ForImageClassification"), _hf_dinov2),
    ("Hugging Face CLIPModel (image–text similarity, explained on the image; target = a prompt)", _is_hf_clip,
     _clip),
    ("Hugging Face LlamaForCausalLM / LlamaForSequenceClassification (Llama 2 / 3, TinyLlama, SmolLM)",
     _named("LlamaForCausalLM", "LlamaForSequenceClassification"), _decoder("llama", "LlamaAdapter")),
    ("Hugging Face MistralForCausalLM / MistralForSequenceClassification (sliding window)",
     _named("MistralForCausalLM", "MistralForSequenceClassification"), _decoder("mistral", "MistralAdapter")),
    ("Hugging Face Qwen2ForCausalLM / Qwen2ForSequenceClassification (Qwen2, Qwen2.5)",
     _named("Qwen2ForCausalLM", "Qwen2ForSequenceClassification"), _decoder("qwen2", "Qwen2Adapter")),
    ("Hugging Face Qwen3ForCausalLM / Qwen3ForSequenceClassification",
     _named("Qwen3ForCausalLM", "Qwen3ForSequenceClassification"), _decoder("qwen3", "Qwen3Adapter")),
    ("Hugging Face DistilBertForSequenceClassification", _hf_text("distilbert"), _distilbert),
    ("Hugging Face AlbertForSequenceClassification (shared layers, factorised embeddings)", _hf_text("albert"),
     _albert),
    ("Hugging Face MPNetForSequenceClassification (relative position bias)", _hf_text("mpnet"), _mpnet),
    ("Hugging Face BertForSequenceClassification and BERT-family encoders with a pooler/[CLS] classification "
     "head (RoBERTa, XLM-RoBERTa, ELECTRA)", _is_hf_sequence_classifier, _bert),
]

SUPPORTED = "; ".join(name for name, _, _ in ADAPTERS)


def get_adapter(model: nn.Module) -> Adapter:
    """The adapter for ``model``, or :class:`UnsupportedModelError` naming what is supported.

    ``torch.compile``, ``DataParallel`` and ``DistributedDataParallel`` wrappers are looked through
    (:func:`lrp_core.wrappers.unwrap`); TorchScript is refused.
    """
    if not isinstance(model, nn.Module):
        raise UnsupportedModelError(f"expected a torch.nn.Module, got {type(model).__name__}. "
                                    f"Supported: {SUPPORTED}")
    model = unwrap(model)
    for family, recognise, reason in REFUSED:
        if recognise(model):
            raise UnsupportedModelError(f"{type(model).__name__} ({family}) is not supported: {reason}. "
                                        f"Supported: {SUPPORTED}")
    for _, recognise, build in ADAPTERS:
        if recognise(model):
            return build(model)
    raise UnsupportedModelError(f"{type(model).__name__} is not supported. Supported: {SUPPORTED}")


__all__ = ["ADAPTERS", "REFUSED", "Adapter", "BlockRelevance", "TokenLayout", "Trace", "get_adapter",
           "SUPPORTED"]

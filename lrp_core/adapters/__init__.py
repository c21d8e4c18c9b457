"""Model adapters: which model family gets which treatment, in one table.

:data:`ADAPTERS` is the only place a model is dispatched; ``explain``, the
widgets and the evaluation all go through :func:`get_adapter`. A new family
is one adapter module and one row here.
"""
from __future__ import annotations

from typing import Callable

from torch import nn

from ..errors import UnsupportedModelError
from .base import Adapter, BlockRelevance, TokenLayout, Trace


def _mro_names(model: nn.Module) -> set:
    return {c.__name__ for c in type(model).__mro__}


def _is_timm_vit(model: nn.Module) -> bool:
    return "VisionTransformer" in _mro_names(model) and hasattr(model, "blocks") and hasattr(model, "patch_embed")


def _is_hf_vit(model: nn.Module) -> bool:
    return type(model).__name__ == "ViTForImageClassification" or (hasattr(model, "vit") and hasattr(model, "classifier"))


def _is_hf_sequence_classifier(model: nn.Module) -> bool:
    return type(model).__name__.endswith("ForSequenceClassification")


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


#: (what the family is called, how to recognise a model, its adapter), tried in order.
ADAPTERS: list[tuple[str, Callable[[nn.Module], bool], Callable[[nn.Module], Adapter]]] = [
    ("timm VisionTransformer (ViT, DeiT, DINO, DINOv2; token pooling)", _is_timm_vit, _timm_vit),
    ("Hugging Face ViTForImageClassification", _is_hf_vit, _hf_vit),
    ("Hugging Face CLIPModel (image–text similarity, explained on the image; target = a prompt)", _is_hf_clip,
     _clip),
    ("Hugging Face BertForSequenceClassification and BERT-family encoders with a pooler/[CLS] classification "
     "head (e.g. RoBERTa)", _is_hf_sequence_classifier, _bert),
]

SUPPORTED = "; ".join(name for name, _, _ in ADAPTERS)


def get_adapter(model: nn.Module) -> Adapter:
    """The adapter for ``model``, or :class:`UnsupportedModelError` naming what is supported."""
    if not isinstance(model, nn.Module):
        raise UnsupportedModelError(f"expected a torch.nn.Module, got {type(model).__name__}. "
                                    f"Supported: {SUPPORTED}")
    for _, recognise, build in ADAPTERS:
        if recognise(model):
            return build(model)
    raise UnsupportedModelError(f"{type(model).__name__} is not supported. Supported: {SUPPORTED}")


def modality_of(model: nn.Module) -> str:
    """``"image"`` or ``"text"`` for a supported model (raises :class:`UnsupportedModelError` otherwise)."""
    return get_adapter(model).modality


__all__ = ["ADAPTERS", "Adapter", "BlockRelevance", "TokenLayout", "Trace", "get_adapter", "modality_of",
           "SUPPORTED"]

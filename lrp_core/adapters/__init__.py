"""Model adapters: replay an unmodified model's forward pass and propagate relevance through it."""
from __future__ import annotations

from torch import nn

from ..errors import UnsupportedModelError
from .base import Adapter, BlockRelevance, Trace

SUPPORTED = (
    "timm VisionTransformer (ViT, DeiT, DINO, DINOv2; token pooling), "
    "Hugging Face BertForSequenceClassification and BERT-family encoders with a pooler/[CLS] "
    "classification head (e.g. RoBERTa), Hugging Face ViTForImageClassification"
)


def get_adapter(model: nn.Module) -> Adapter:
    """The adapter for ``model``, or :class:`UnsupportedModelError` naming what is supported."""
    if not isinstance(model, nn.Module):
        raise UnsupportedModelError(f"expected a torch.nn.Module, got {type(model).__name__}. Supported: {SUPPORTED}")
    name = type(model).__name__
    mro = {c.__name__ for c in type(model).__mro__}
    if "VisionTransformer" in mro and hasattr(model, "blocks") and hasattr(model, "patch_embed"):
        from .vit import TimmViTAdapter
        return TimmViTAdapter(model)
    if name == "ViTForImageClassification" or (hasattr(model, "vit") and hasattr(model, "classifier")):
        from .vit import HFViTAdapter
        return HFViTAdapter(model)
    if name.endswith("ForSequenceClassification"):
        from .bert import BertAdapter
        return BertAdapter(model)
    raise UnsupportedModelError(f"{name} is not supported. Supported: {SUPPORTED}")


__all__ = ["Adapter", "BlockRelevance", "Trace", "get_adapter", "SUPPORTED"]

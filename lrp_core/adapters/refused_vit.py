"""The ViT variants refused by name, with the reason and what to use (rows of
:data:`lrp_core.adapters.REFUSED`): the BEiT / Data2Vec-vision and I-JEPA heads without a classifier, XCiT,
NaFlexViT and the ViTs built on timm's ``AttentionRope``."""

from __future__ import annotations

from typing import Callable

from torch import nn

from .predicates import hf_type, named

#: the Hugging Face relative-position-bias ViTs an adapter replays (other heads of those types are refused)
HF_RELPOS_CLASSIFIERS = ("BeitForImageClassification", "Data2VecVisionForImageClassification")

#: (family, how to recognise a model, why it is refused and what to use instead)
VIT_VARIANTS_REFUSED: list[tuple[str, Callable[[nn.Module], bool], str]] = [
    (
        "BEiT / Data2Vec-vision without an image-classification head",
        lambda m: hf_type("beit", "data2vec-vision")(m) and not named(*HF_RELPOS_CLASSIFIERS)(m),
        "only BeitForImageClassification and Data2VecVisionForImageClassification are explained (one class per "
        "image); the backbones, the masked-image-modelling and segmentation heads predict no class, or one per "
        "patch. Load the checkpoint as BeitForImageClassification / Data2VecVisionForImageClassification",
    ),
    (
        "XCiT",
        named("Xcit"),
        "its cross-covariance attention (XCA) attends across channels — a d × d map per head between the features "
        "of q and k — not across tokens, so there is no token × token attention map for the layer-product methods, "
        "and its local patch interaction (depth-wise convolutions between the tokens), Fourier positions and "
        "class-attention blocks are described by no adapter. Use a ViT / DeiT / DINOv2 / Eva (timm or Hugging Face)",
    ),
    (
        "NaFlexViT",
        named("NaFlexVit"),
        "it takes variable sets of patches with their coordinates and a patch mask (native-aspect, flexible "
        "resolution inputs, optionally with rotary attention), while the replay describes one fixed patch grid per "
        "call. Use timm's VisionTransformer or Eva at a fixed image size",
    ),
    (
        "DeepSeek ViT and other AttentionRope / 2D-rotary ViTs (Gemma 4, Qwen3 ViT, SAM's ViT)",
        named(
            "DeepseekVitEncoder",
            "DeepseekVitClassifier",
            "Gemma4VitEncoder",
            "Gemma4VitClassifier",
            "Qwen3VitEncoder",
            "Qwen3VitClassifier",
            "VisionTransformerSAM",
        ),
        "its blocks use timm's AttentionRope or a 2D rotary embedding of their own (rotary q/k with their own tables "
        "and layout; SAM: windowed attention with decomposed relative positions), which no adapter describes; the "
        "rotary ViT explained is timm's Eva with EvaAttention (attn_type='eva', RotaryEmbeddingCat)",
    ),
    (
        "I-JEPA without an image-classification head",
        lambda m: hf_type("ijepa")(m) and not named("IJepaForImageClassification")(m),
        "IJepaModel is an encoder with no head: no class to explain. Use IJepaForImageClassification (the mean of "
        "the tokens and a Linear classifier)",
    ),
]

__all__ = ["HF_RELPOS_CLASSIFIERS", "VIT_VARIANTS_REFUSED"]

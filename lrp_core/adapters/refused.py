"""The families the replay refuses, each with the reason and what to use instead: :data:`REFUSED`.

Checked before :data:`lrp_core.adapters.ADAPTERS`, so a model whose class resembles an explained family but whose
computation differs is refused by name (its message says why), never explained wrongly.
"""

from __future__ import annotations

from typing import Callable

from torch import nn

from .predicates import (
    hf_text_head,
    hf_type,
    is_hf_sequence_classifier,
    is_multimodal_decoder,
    is_other_encoder_decoder,
    is_other_mixture_of_experts,
    is_soft_capped,
    named,
)
from .refused_vit import VIT_VARIANTS_REFUSED

#: the SigLIP / SigLIP 2 classes :data:`ADAPTERS` names
SIGLIP_CLASSES = ("SiglipForImageClassification", "Siglip2ForImageClassification", "SiglipModel", "Siglip2Model")


def _is_other_siglip(model: nn.Module) -> bool:
    """A SigLIP / SigLIP 2 model other than the :data:`SIGLIP_CLASSES`: a tower alone."""
    return hf_type(
        "siglip", "siglip2", "siglip_vision_model", "siglip2_vision_model", "siglip_text_model", "siglip2_text_model"
    )(model) and not named(*SIGLIP_CLASSES)(model)


#: the vision-language models an adapter explains (their rows in ADAPTERS)
VLM_CLASSES = (
    "LlavaForConditionalGeneration",
    "Idefics3ForConditionalGeneration",
    "SmolVLMForConditionalGeneration",
    "Qwen2_5_VLForConditionalGeneration",
    "Qwen2VLForConditionalGeneration",
    "Gemma3ForConditionalGeneration",
    "PaliGemmaForConditionalGeneration",
)
#: the Hugging Face Swin classes an adapter replays (their row in ADAPTERS); other heads of those types are refused
HF_SWIN_CLASSIFIERS = ("SwinForImageClassification", "Swinv2ForImageClassification")


#: (family, how to recognise a model, why it is refused and what to use instead), checked before ADAPTERS.
REFUSED: list[tuple[str, Callable[[nn.Module], bool], str]] = [
    (
        "Other encoder-decoders (Blenderbot, LED, ProphetNet, FSMT, M2M100, NLLB-MoE, "
        "EncoderDecoderModel, Speech2Text, T5's other heads, ...)",
        is_other_encoder_decoder,
        "the encoder-decoder replay describes the BART layout (BART, Marian, mBART, Pegasus, BlenderbotSmall: "
        "learned or sinusoidal positions added to the word embeddings, post- or pre-LN blocks, cross-attention) and "
        "T5's (relative position bias) and Whisper's speech model; Blenderbot's "
        "and M2M100's position and norm placement, LED's global / windowed attention, ProphetNet's n-stream "
        "decoder and the composite EncoderDecoderModel's two separate models are described by none, and a model "
        "without an LM head has no next token to explain. Use BartForConditionalGeneration, MarianMTModel, "
        "MBartForConditionalGeneration, PegasusForConditionalGeneration, "
        "BlenderbotSmallForConditionalGeneration, T5ForConditionalGeneration / MT5ForConditionalGeneration, "
        "WhisperForConditionalGeneration or "
        "BartForSequenceClassification",
    ),
    (
        "DeBERTa-v2 / v3 without a sequence-classification head",
        lambda m: hf_type("deberta-v2")(m) and not is_hf_sequence_classifier(m),
        "only DebertaV2ForSequenceClassification is explained (one prediction per text, read at token 0 through "
        "the ContextPooler); the masked-LM, token-classification, question-answering and multiple-choice heads "
        "predict per token or per choice, and DebertaV2Model has no head. Load the checkpoint as "
        "DebertaV2ForSequenceClassification",
    ),
    (
        "DeBERTa (v1)",
        hf_type("deberta"),
        "its disentangled attention is laid out differently from DeBERTa-v2's, and that layout is not described: "
        "one fused in_proj whose outputs interleave q, k, v per head, separate q_bias / v_bias parameters, the "
        "queries scaled before the products, unbucketed relative positions cut to the sequence's span, optional "
        "talking-heads mixes across heads, and its own float32 DebertaLayerNorm. Use a DeBERTa-v2 / v3 classifier "
        "(DebertaV2ForSequenceClassification) or a BERT-family one",
    ),
    (
        "RoFormer and ESM other than EsmForSequenceClassification",
        lambda m: hf_type("roformer")(m) or (hf_type("esm")(m) and not is_hf_sequence_classifier(m)),
        "RoFormer rotates q and k (and, with rotary_value, v) by sinusoidal tables in the interleaved-pair layout "
        "inside post-LN layers, which no adapter describes; the ESM masked-LM, token-classification and folding "
        "models predict per token or have no head. Use EsmForSequenceClassification, ModernBERT (rotary) or a "
        "DeBERTa-v2 / v3 classifier",
    ),
    (
        "Longformer and BigBird",
        hf_type("longformer", "big_bird", "bigbird_pegasus"),
        "their attention is sparse: Longformer's sliding windows with global tokens (separate global q/k/v "
        "projections) and BigBird's block-sparse pattern of window, global and random key blocks, so a token's "
        "attention is not one softmax over every key and the N × N maps the layer-product methods multiply do not "
        "exist as the model computes them. Use a dense-attention encoder (BERT family, ModernBERT, DeBERTa-v2 / v3)",
    ),
    (
        "ModernBERT without a head",
        lambda m: hf_type("modernbert")(m) and not hf_text_head("modernbert")(m),
        "ModernBertModel has no head, so there is no prediction to explain. Load the checkpoint with its head: "
        "ModernBertForSequenceClassification, ModernBertForTokenClassification, ModernBertForQuestionAnswering, "
        "ModernBertForMaskedLM or ModernBertForMultipleChoice",
    ),
    (
        "SwinTransformerV2Cr, Hugging Face Swin models without an image-classification head and other windowed / "
        "hierarchical vision transformers",
        lambda m: (
            named(
                "SwinTransformerV2Cr",
                "PyramidVisionTransformerV2",
                "MultiScaleVit",
                "Twins",
                "Hiera",
                "Davit",
                "MaxxVit",
                "NextViT",
                "FocalNet",
            )(m)
            or hf_type("donut-swin", "maskformer-swin", "pvt", "pvt_v2", "hiera", "focalnet", "dinat", "nat")(m)
            or (hf_type("swin", "swinv2")(m) and not named(*HF_SWIN_CLASSIFIERS)(m))
        ),
        "attention runs inside local windows and patch tokens are merged between stages, so there is no single "
        "token set whose token-to-token attention matrices can be multiplied across blocks (rollout, "
        "transformer_attribution and the other layer-product methods have no meaning), and the replay describes "
        "the windows, patch merging and mean readout of timm's SwinTransformer / SwinTransformerV2 and Hugging Face's "
        "SwinForImageClassification / Swinv2ForImageClassification only: not SwinTransformerV2Cr (attention scaled "
        "by a learned temperature, its own position-bias network, extra norms inside stages), the Swin backbones and "
        "masked-image-modelling heads (no class to explain) or the other hierarchical designs. Use one of those four "
        "Swin classifiers or a plain ViT / DeiT / DINOv2 (timm or Hugging Face) to explain with this library, or "
        "gradient-based input attributions (e.g. Captum's IntegratedGradients, LayerGradCam on the last stage) for "
        "this model",
    ),
    (
        "other multimodal decoders (LLaVA-NeXT, Qwen3-VL, Mllama, ...)",
        lambda m: is_multimodal_decoder(m) and not named(*VLM_CLASSES)(m),
        "images enter the token stream through a vision tower and a projector (image features replace placeholder "
        "tokens), and the vision tower and connector of these families are described by no adapter. Use an explained "
        "vision-language model (LLaVA, SmolVLM / Idefics3, Qwen2-VL / Qwen2.5-VL, Gemma 3 with images, PaliGemma), "
        "explain the language model alone (e.g. Gemma3ForCausalLM, a Qwen2 / Llama causal LM) on text, or the image "
        "side with a ViT / CLIP",
    ),
    (
        "other mixture-of-experts decoders (DeepSeek, DBRX, Jamba, ...)",
        is_other_mixture_of_experts,
        "a router picks a few experts per token in a way no adapter describes (grouped or biased top-k, sigmoid "
        "scoring, experts fused or sliced differently, or recurrent mixers beside them). The mixture-of-experts "
        "decoders explained are Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE and GPT-OSS; or use a dense decoder (Llama, "
        "Mistral, Qwen2 / Qwen2.5, Qwen3, Gemma 3, Phi-3, GPT-2)",
    ),
    (
        "soft-capped decoders other than Gemma 2",
        is_soft_capped,
        "attention-logit and final-logit soft-capping (cap · tanh(x / cap) on the attention scores and on the "
        "logits) is replayed for Gemma2ForCausalLM / Gemma2ForSequenceClassification only; this model's other parts "
        "are not described. Use Gemma 2 (Gemma2ForCausalLM), Gemma 3 or another dense decoder",
    ),
    (
        "SigLIP / SigLIP 2 towers alone",
        _is_other_siglip,
        "SiglipVisionModel, Siglip2VisionModel and the text towers have no prediction to explain (no classifier, no "
        "similarity). Use SiglipForImageClassification / Siglip2ForImageClassification (mean of the tokens and a "
        "Linear classifier) or SiglipModel / Siglip2Model (image–text sigmoid similarity)",
    ),
    *VIT_VARIANTS_REFUSED,  # BEiT heads, XCiT, NaFlexViT, AttentionRope ViTs, IJepaModel (.refused_vit)
]

__all__ = ["REFUSED", "SIGLIP_CLASSES", "VLM_CLASSES", "HF_SWIN_CLASSIFIERS"]

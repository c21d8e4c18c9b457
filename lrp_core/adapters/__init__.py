"""Model adapters: which model family gets which treatment, in one table.

:data:`ADAPTERS` is the only place a model is dispatched; ``explain``, the
widgets and the evaluation all go through :func:`get_adapter`. A new family
is one adapter module and one row here.
"""

from __future__ import annotations

from typing import Callable

from torch import nn

from ..errors import UnsupportedModelError
from ..rules.linear import check_peft_layers
from ..rules.quantised import check_quantised_layers
from ..runtime.versions import check_versions, installed
from ..runtime.wrappers import unwrap
from .base import Adapter, BlockRelevance, TokenLayout, Trace
from .embeddings import Basis, EmbeddingTarget, Projection, Similarity, embedding_width, with_target
from .predicates import (
    BERT_FAMILY,
    SEQ2SEQ_CLASSES,
    hf_base,
    hf_text,
    hf_text_head,
    is_base_model,
    is_hf_vit,
    is_timm_vit,
    named,
)
from .refused import HF_SWIN_CLASSIFIERS, REFUSED, SIGLIP_CLASSES, VLM_CLASSES
from .refused_vit import HF_RELPOS_CLASSIFIERS
from .task_heads import decoder_task_family


def _lazy(module: str, cls: str) -> Callable[[nn.Module], Adapter]:
    """The adapter ``cls`` of the family module ``module``, imported when first used."""

    def build(model):
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{module}"), cls)(model)

    return build


_hf_deit = _lazy("vit", "HFDeiTAdapter")


_hf_dinov2 = _lazy("dinov2", "HFDinov2Adapter")


def _is_hf_clip(model: nn.Module) -> bool:
    return hasattr(model, "vision_model") and hasattr(model, "text_model") and hasattr(model, "logit_scale")


_clip = _lazy("clip", "CLIPImageAdapter")


_siglip = _lazy("siglip", "HFSiglipAdapter")


_siglip_model = _lazy("siglip", "SiglipImageAdapter")


_timm_vit = _lazy("vit", "TimmViTAdapter")


_timm_eva = _lazy("eva", "TimmEvaAdapter")


_timm_swin = _lazy("swin", "TimmSwinAdapter")


_hf_swin = _lazy("swin_hf", "HFSwinAdapter")


_hf_vit = _lazy("vit", "HFViTAdapter")


_bert = _lazy("bert", "BertAdapter")


_distilbert = _lazy("distilbert", "DistilBertAdapter")


_albert = _lazy("albert", "AlbertAdapter")


_mpnet = _lazy("mpnet", "MPNetAdapter")


_deberta_v2 = _lazy("deberta", "DebertaV2Adapter")


_esm = _lazy("esm", "EsmAdapter")


_modernbert = _lazy("modernbert", "ModernBertAdapter")


def _base_text(model):
    """A BERT-family base model: the family's adapter, without a classification head."""
    kind = model.config.model_type
    return _distilbert(model) if kind == "distilbert" else _mpnet(model) if kind == "mpnet" else _bert(model)


def _sentence(model):
    from .sentence import sentence_adapter

    return sentence_adapter(model, get_adapter)


def _decoder(module: str, cls: str) -> Callable[[nn.Module], Adapter]:
    """A decoder family's adapter, imported when first used."""

    def build(model):
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{module}"), cls)(model)

    return build


def _decoder_task_head(model: nn.Module) -> Adapter:
    """A decoder task head's adapter: its family's (:data:`~lrp_core.adapters.task_heads.DECODER_TASK_HEADS`)."""
    found = decoder_task_family(model)
    assert found is not None, "the row's predicate found the family"
    return _decoder(*found)(model)


#: (what the family is called, how to recognise a model, its adapter), tried in order.
ADAPTERS: list[tuple[str, Callable[[nn.Module], bool], Callable[[nn.Module], Adapter]]] = [
    (
        "timm VisionTransformer (ViT, DeiT, DINO, DINOv2; [CLS] or average pooling, with or without a class token) "
        "and VisionTransformerDistilled (distilled DeiT: [CLS] and distillation heads averaged)",
        is_timm_vit,
        _timm_vit,
    ),
    (
        "timm Eva (EVA, EVA-02: rotary q/k, SwiGLU MLPs, registers, LayerScale, post-norm blocks)",
        named("Eva"),
        _timm_eva,
    ),
    (
        "timm Beit (BEiT, BEiT v2: relative position bias per block and / or shared, LayerScale, [CLS] or average "
        "pooling)",
        named("Beit"),
        _lazy("relpos", "TimmBeitAdapter"),
    ),
    (
        "timm VisionTransformerRelPos (vit_relpos, vit_srelpos: relative position bias tables or MLPs, pre-norm or "
        "residual post-norm blocks)",
        named("VisionTransformerRelPos"),
        _lazy("relpos", "TimmRelPosViTAdapter"),
    ),
    (
        "timm Cait (CaiT: talking-heads blocks, class-attention blocks; lrp, attnlrp, cp_lrp, cdam, token_ablation, "
        "the Captum baselines)",
        named("Cait"),
        _lazy("cait", "TimmCaitAdapter"),
    ),
    (
        "timm SwinTransformer and SwinTransformerV2 (windowed attention, shifted windows, patch merging; V2's cosine "
        "attention and continuous position bias; lrp, attnlrp, cp_lrp, cdam, the Captum baselines)",
        lambda m: type(m).__name__ in ("SwinTransformer", "SwinTransformerV2"),
        _timm_swin,
    ),
    (
        "Hugging Face SwinForImageClassification / Swinv2ForImageClassification (as timm's Swin and Swin V2)",
        named(*HF_SWIN_CLASSIFIERS),
        _hf_swin,
    ),
    (
        "Hugging Face BeitForImageClassification (BEiT: relative position bias per layer and / or shared, LayerScale, "
        "[CLS] or mean pooling)",
        named(HF_RELPOS_CLASSIFIERS[0]),
        _lazy("relpos", "HFBeitAdapter"),
    ),
    (
        "Hugging Face Data2VecVisionForImageClassification (as BEiT)",
        named(HF_RELPOS_CLASSIFIERS[1]),
        _lazy("relpos", "HFData2VecVisionAdapter"),
    ),
    ("Hugging Face ViTForImageClassification", is_hf_vit, _hf_vit),
    (
        "Hugging Face DeiTForImageClassification and DeiTForImageClassificationWithTeacher",
        named("DeiTForImageClassification", "DeiTForImageClassificationWithTeacher"),
        _hf_deit,
    ),
    (
        "Hugging Face Dinov2ForImageClassification ([CLS] and mean of the patch tokens)",
        named("Dinov2ForImageClassification"),
        _hf_dinov2,
    ),
    (
        "Hugging Face ViTMAEModel (the MAE encoder with mask_ratio=0, every patch kept in raster order; no head: "
        "the [CLS] embedding, class-agnostic methods)",
        named("ViTMAEModel"),
        _lazy("vit_mae", "HFViTMAEAdapter"),
    ),
    (
        "Hugging Face IJepaForImageClassification (I-JEPA: no class token, mean of the tokens)",
        named("IJepaForImageClassification"),
        _lazy("vit", "HFIJepaAdapter"),
    ),
    (
        "Hugging Face Dinov2WithRegistersForImageClassification ([CLS] and mean of the patch tokens; the register "
        "tokens' relevance in exp.registers)",
        named("Dinov2WithRegistersForImageClassification"),
        _lazy("dinov2", "HFDinov2RegistersAdapter"),
    ),
    (
        "Hugging Face SiglipForImageClassification / Siglip2ForImageClassification (no class token, mean of all "
        "tokens; SigLIP 2: one patch grid per call)",
        named("SiglipForImageClassification", "Siglip2ForImageClassification"),
        _siglip,
    ),
    (
        "Hugging Face SiglipModel / Siglip2Model (image–text sigmoid similarity explained on the image: "
        "attention-pooling head, logit_scale.exp() · cos + logit_bias; target = a prompt)",
        named("SiglipModel", "Siglip2Model"),
        _siglip_model,
    ),
    (
        "Hugging Face CLIPVisionModelWithProjection / CLIPTextModelWithProjection (one tower: image_embeds / "
        "text_embeds, explained with target=Projection(v) / Similarity(e_ref))",
        named("CLIPVisionModelWithProjection", "CLIPTextModelWithProjection"),
        lambda m: _decoder(
            "clip_towers",
            "CLIPTextProjectionAdapter" if named("CLIPTextModelWithProjection")(m) else "CLIPVisionProjectionAdapter",
        )(m),
    ),
    ("Hugging Face CLIPModel (image–text similarity, explained on the image; target = a prompt)", _is_hf_clip, _clip),
    (
        "Hugging Face LlavaForConditionalGeneration (LLaVA: a CLIP-vision or DINOv2 tower, the MLP projector, a "
        "Llama / Mistral / Qwen2 language model; the same number of images in every row)",
        named("LlavaForConditionalGeneration"),
        _decoder("llava", "LlavaAdapter"),
    ),
    (
        "Hugging Face Idefics3ForConditionalGeneration / SmolVLMForConditionalGeneration (Idefics3, SmolVLM: the "
        "SigLIP-like vision transformer, the pixel-shuffle connector, a Llama language model; the same number of "
        "images in every row, image splitting's crops included)",
        named("Idefics3ForConditionalGeneration", "SmolVLMForConditionalGeneration"),
        _decoder("idefics3", "Idefics3Adapter"),
    ),
    (
        "Hugging Face Qwen2_5_VLForConditionalGeneration / Qwen2VLForConditionalGeneration (Qwen2.5-VL, Qwen2-VL: "
        "the vision tower with 2D rotary positions (Qwen2.5-VL: and window attention), the 2 × 2 patch merger, the "
        "M-RoPE Qwen2 language model; images of one grid, the same number in every row)",
        named("Qwen2_5_VLForConditionalGeneration", "Qwen2VLForConditionalGeneration"),
        _decoder("qwen2_5_vl", "Qwen2_5_VLAdapter"),
    ),
    (
        "Hugging Face Gemma3ForConditionalGeneration (Gemma 3 with images: the SigLIP tower, the pooling projector, "
        "the Gemma 3 language model, bidirectional within each image given token_type_ids; the same number of images "
        "in every row)",
        named("Gemma3ForConditionalGeneration"),
        _decoder("gemma3_vl", "Gemma3VLMAdapter"),
    ),
    (
        "Hugging Face PaliGemmaForConditionalGeneration (PaliGemma 1 / 2: the SigLIP tower, the linear projector, a "
        "Gemma or Gemma 2 language model, the prefix attended bidirectionally given token_type_ids)",
        named("PaliGemmaForConditionalGeneration"),
        _decoder("paligemma", "PaliGemmaAdapter"),
    ),
    (
        "Hugging Face decoder *ForTokenClassification (target=class, position=token) and *ForQuestionAnswering "
        "(target='start' | 'end') heads of the decoder families below (Llama, Mistral, Qwen2, Qwen3, Qwen2-MoE, "
        "Qwen3-MoE, Mixtral, GPT-OSS, GPT-2, Phi-3, GPT-NeoX, Phi, Falcon, Gemma 2)",
        lambda m: decoder_task_family(m) is not None,
        _decoder_task_head,
    ),
    (
        "Hugging Face BartForConditionalGeneration and MarianMTModel (encoder-decoders, post-LN blocks, learned / "
        "sinusoidal positions; the next-token logit given source and decoder prefix: exp.source, exp.prefix)",
        named("BartForConditionalGeneration", "MarianMTModel"),
        _decoder("seq2seq", "Seq2SeqAdapter"),
    ),
    (
        "Hugging Face MBartForConditionalGeneration and PegasusForConditionalGeneration (as BART, pre-LN blocks "
        "and a final norm per stack)",
        named("MBartForConditionalGeneration", "PegasusForConditionalGeneration"),
        _decoder("seq2seq", "PreNormSeq2SeqAdapter"),
    ),
    (
        "Hugging Face BlenderbotSmallForConditionalGeneration (as BART; its decoder normalises the word embeddings "
        "before the positions are added)",
        named("BlenderbotSmallForConditionalGeneration"),
        _decoder("seq2seq", "BlenderbotSmallAdapter"),
    ),
    (
        "Hugging Face BartForSequenceClassification / MBartForSequenceClassification (the encoder-decoder read at "
        "the source's last end-of-text token by its classification head)",
        named("BartForSequenceClassification", "MBartForSequenceClassification"),
        lambda m: _decoder(
            "bart_classifier",
            "MBartClassifierAdapter" if named("MBartForSequenceClassification")(m) else "BartClassifierAdapter",
        )(m),
    ),
    (
        "Hugging Face WhisperForConditionalGeneration (speech: the log-mel frames through the two-convolution stem, "
        "a pre-LN encoder-decoder; exp.source over the encoder positions, exp.frames over the frames in time)",
        named("WhisperForConditionalGeneration"),
        _decoder("whisper", "WhisperAdapter"),
    ),
    (
        "Hugging Face T5ForConditionalGeneration and MT5ForConditionalGeneration (T5 v1.0 ReLU and v1.1 gated-GELU "
        "feed-forward, RMSNorm, relative position bias as a constant of the scores)",
        named("T5ForConditionalGeneration", "MT5ForConditionalGeneration"),
        _decoder("t5", "T5Adapter"),
    ),
    (
        "Hugging Face LlamaForCausalLM / LlamaForSequenceClassification (Llama 2 / 3, TinyLlama, SmolLM)",
        named("LlamaForCausalLM", "LlamaForSequenceClassification"),
        _decoder("llama", "LlamaAdapter"),
    ),
    (
        "Hugging Face MistralForCausalLM / MistralForSequenceClassification (sliding window)",
        named("MistralForCausalLM", "MistralForSequenceClassification"),
        _decoder("mistral", "MistralAdapter"),
    ),
    (
        "Hugging Face Qwen2ForCausalLM / Qwen2ForSequenceClassification (Qwen2, Qwen2.5)",
        named("Qwen2ForCausalLM", "Qwen2ForSequenceClassification"),
        _decoder("qwen2", "Qwen2Adapter"),
    ),
    (
        "Hugging Face Qwen3ForCausalLM / Qwen3ForSequenceClassification",
        named("Qwen3ForCausalLM", "Qwen3ForSequenceClassification"),
        _decoder("qwen3", "Qwen3Adapter"),
    ),
    (
        "Hugging Face Qwen3MoeForCausalLM / Qwen3MoeForSequenceClassification (mixture of experts)",
        named("Qwen3MoeForCausalLM", "Qwen3MoeForSequenceClassification"),
        _decoder("qwen3_moe", "Qwen3MoeAdapter"),
    ),
    (
        "Hugging Face Qwen2MoeForCausalLM / Qwen2MoeForSequenceClassification (mixture of experts, shared expert)",
        named("Qwen2MoeForCausalLM", "Qwen2MoeForSequenceClassification"),
        _decoder("qwen2_moe", "Qwen2MoeAdapter"),
    ),
    (
        "Hugging Face MixtralForCausalLM / MixtralForSequenceClassification (mixture of experts, sliding window)",
        named("MixtralForCausalLM", "MixtralForSequenceClassification"),
        _decoder("mixtral", "MixtralAdapter"),
    ),
    (
        "Hugging Face OlmoeForCausalLM (OLMoE: mixture of experts, q/k norms over all heads)",
        named("OlmoeForCausalLM"),
        _decoder("olmoe", "OlmoeAdapter"),
    ),
    (
        "Hugging Face GptOssForCausalLM / GptOssForSequenceClassification (GPT-OSS: mixture of experts with biased "
        "router and clamped SwiGLU experts, attention sinks, sliding-window and full layers)",
        named("GptOssForCausalLM", "GptOssForSequenceClassification"),
        _decoder("gpt_oss", "GptOssAdapter"),
    ),
    (
        "Hugging Face GPT2LMHeadModel / GPT2ForSequenceClassification (GPT-2, DistilGPT-2)",
        named("GPT2LMHeadModel", "GPT2ForSequenceClassification"),
        _decoder("gpt2", "GPT2Adapter"),
    ),
    (
        "Hugging Face Gemma3ForCausalLM / Gemma3TextForSequenceClassification (Gemma 3 text: gemma-3-270m, 1b)",
        named("Gemma3ForCausalLM", "Gemma3TextForSequenceClassification"),
        _decoder("gemma3", "Gemma3Adapter"),
    ),
    (
        "Hugging Face Phi3ForCausalLM / Phi3ForSequenceClassification (Phi-3; fused qkv and gate_up)",
        named("Phi3ForCausalLM", "Phi3ForSequenceClassification"),
        _decoder("phi3", "Phi3Adapter"),
    ),
    (
        "Hugging Face GPTNeoXForCausalLM / GPTNeoXForSequenceClassification (Pythia, GPT-NeoX; parallel or sequential "
        "residual, fused per-head qkv, partial rotary)",
        named("GPTNeoXForCausalLM", "GPTNeoXForSequenceClassification"),
        _decoder("gpt_neox", "GPTNeoXAdapter"),
    ),
    (
        "Hugging Face PhiForCausalLM / PhiForSequenceClassification (Phi-1, Phi-1.5, Phi-2; parallel blocks)",
        named("PhiForCausalLM", "PhiForSequenceClassification"),
        _decoder("phi", "PhiAdapter"),
    ),
    (
        "Hugging Face FalconForCausalLM / FalconForSequenceClassification (rotary Falcon: parallel or sequential "
        "blocks, multi-query and grouped fused qkv)",
        named("FalconForCausalLM", "FalconForSequenceClassification"),
        _decoder("falcon", "FalconAdapter"),
    ),
    (
        "Hugging Face Gemma2ForCausalLM / Gemma2ForSequenceClassification (Gemma 2; attention- and final-logit "
        "soft-capping)",
        named("Gemma2ForCausalLM", "Gemma2ForSequenceClassification"),
        _decoder("gemma2", "Gemma2Adapter"),
    ),
    (
        "Hugging Face Olmo2ForCausalLM / Olmo3ForCausalLM (OLMo-2, OLMo-3; branch-output norms, whole-projection q/k "
        "norms)",
        named(
            "Olmo2ForCausalLM", "Olmo3ForCausalLM", "Olmo2ForSequenceClassification", "Olmo3ForSequenceClassification"
        ),
        _decoder("olmo2", "Olmo2Adapter"),
    ),
    (
        "Hugging Face DistilBertForSequenceClassification (and its token-classification, question-answering, "
        "masked-LM and multiple-choice heads)",
        hf_text_head("distilbert"),
        _distilbert,
    ),
    (
        "Hugging Face AlbertForSequenceClassification (shared layers, factorised embeddings; and its task heads)",
        hf_text_head("albert"),
        _albert,
    ),
    (
        "Hugging Face MPNetForSequenceClassification (relative position bias; and its task heads)",
        hf_text_head("mpnet"),
        _mpnet,
    ),
    (
        "Hugging Face DebertaV2ForSequenceClassification (DeBERTa-v2 / v3: disentangled attention with bucketed "
        "relative positions, shared or separate position projections; ContextPooler head)",
        hf_text("deberta-v2"),
        _deberta_v2,
    ),
    (
        "Hugging Face EsmForSequenceClassification (ESM-2 / ESM-1b protein models: pre-LN layers, rotary or absolute "
        "positions, token dropout)",
        hf_text("esm"),
        _esm,
    ),
    (
        "Hugging Face ModernBertForSequenceClassification (rotary positions, global and sliding-window layers, GLU "
        "MLPs; [CLS] or mean pooling) and its token-classification, question-answering, masked-LM and "
        "multiple-choice heads",
        hf_text_head("modernbert"),
        _modernbert,
    ),
    (
        "Hugging Face BertForSequenceClassification and BERT-family encoders with a pooler/[CLS] classification "
        "head (RoBERTa, XLM-RoBERTa, ELECTRA, CamemBERT, Data2Vec-text); their *ForTokenClassification "
        "(target=class, position=token), *ForQuestionAnswering (target='start' | 'end'), *ForMaskedLM (the mask "
        "position) and *ForMultipleChoice ((B, C, T) inputs) heads; MLP classifiers (an nn.Sequential of Linear, "
        "activation, Dropout, LayerNorm)",
        hf_text_head(*BERT_FAMILY),
        _bert,
    ),
    (
        "sentence-transformers SentenceTransformer (Transformer → Pooling (mean or cls) → Normalize, on a base model "
        "named here; explained with target=Projection(v) / Similarity(e_ref))",
        named("SentenceTransformer"),
        _sentence,
    ),
    (
        "Hugging Face BertModel and the BERT-family base models (RobertaModel, XLMRobertaModel, ElectraModel, "
        "CamembertModel, Data2VecTextModel, DistilBertModel, MPNetModel): no head, explained with "
        "target=Projection(v) / Similarity(e_ref) on the pooler output ([CLS] without a pooler) or pooling='cls' / "
        "'mean' / 'pooler'",
        hf_base(*BERT_FAMILY, "distilbert", "mpnet"),
        _base_text,
    ),
    (
        "Hugging Face ViTModel / DeiTModel (no head: target=Projection(v) / Similarity(e_ref) on the pooler output, "
        "or [CLS] after the final norm)",
        lambda m: is_base_model(m) and named("ViTModel", "DeiTModel")(m),
        lambda m: _hf_deit(m) if named("DeiTModel")(m) else _hf_vit(m),
    ),
]

SUPPORTED = "; ".join(name for name, _, _ in ADAPTERS)


def get_adapter(model: nn.Module) -> Adapter:
    """The adapter for ``model``, or :class:`UnsupportedModelError` naming what is supported.

    ``torch.compile``, ``DataParallel``, ``DistributedDataParallel`` and peft ``PeftModel`` wrappers are looked
    through (:func:`lrp_core.runtime.wrappers.unwrap`); TorchScript is refused, and so are peft layers the relevance
    rules do not read (:func:`lrp_core.rules.linear.check_peft_layers`) and quantised layers whose forward quantises
    its activations (:func:`lrp_core.rules.quantised.check_quantised_layers`). The choice reads the structure only
    (a model on the meta device gets its adapter); a call that computes refuses weights never loaded
    (:func:`lrp_core.runtime.offload.check_loaded`). A decoder no row names (or a subclass of a
    listed decoder defined outside transformers) is recognised by its structure and checked against its own logits
    (:mod:`lrp_core.adapters.recognise`).

    Parameters
    ----------
    model : nn.Module
        The user's model, possibly inside one of the wrappers above; it is not modified.

    Returns
    -------
    Adapter
        The family's adapter for the unwrapped model (or the structural one for an unlisted decoder).

    Raises
    ------
    UnsupportedModelError
        When ``model`` is not an ``nn.Module``, belongs to a refused family, carries peft layers the rules do not
        read, or matches no family; the message lists the supported families. Also when an imported torch,
        transformers or timm lies outside the admitted range (:mod:`lrp_core.runtime.versions`; the message names
        the installed version and the range); a refused layout names the transformers / timm it was read with.
    """
    if not isinstance(model, nn.Module):
        raise UnsupportedModelError(f"expected a torch.nn.Module, got {type(model).__name__}. Supported: {SUPPORTED}")
    check_versions()
    model = unwrap(model)
    check_quantised_layers(model)  # quantised activations: refused naming the quantisation
    check_peft_layers(model)
    for family, recognise, reason in REFUSED:  # a structure no replay describes: refused first, loaded or not
        if recognise(model):
            raise UnsupportedModelError(
                f"{type(model).__name__} ({family}) is not supported: {reason}. Supported: {SUPPORTED}"
            )
    from . import probe as open_recognition  # imported here: it builds on the decoder adapter

    for _, recognise, build in ADAPTERS:
        if recognise(model):
            try:
                adapter = build(model)
            except UnsupportedModelError as err:  # a layout the family's code read does not match
                raise UnsupportedModelError(f"{err}{_read_with()}") from None
            if adapter.is_decoder and not type(model).__module__.startswith("transformers."):
                # a user's subclass of a listed decoder may compute something else: checked like an unlisted one
                _supported(open_recognition.verify, adapter)
            return adapter
    adapter = _supported(open_recognition.open_adapter, model)
    if adapter is not None:
        return adapter
    raise UnsupportedModelError(f"{type(model).__name__} is not supported{_read_with()}. Supported: {SUPPORTED}")


def _supported(check: Callable, *args):
    """``check(*args)``, its refusal completed with the versions it was read with and the supported families."""
    try:
        return check(*args)
    except UnsupportedModelError as err:
        raise UnsupportedModelError(f"{err}{_read_with()}. Supported: {SUPPORTED}") from None


def _read_with() -> str:
    """`` (read with transformers 5.24.0, timm 1.0.31)``: the installed code a layout refusal was read from."""
    found = [f"{name} {v}" for name in ("transformers", "timm") if (v := installed(name)) is not None]
    return f" (read with {', '.join(found)})" if found else ""


__all__ = [
    "ADAPTERS",
    "BERT_FAMILY",
    "REFUSED",
    "SIGLIP_CLASSES",
    "VLM_CLASSES",
    "HF_SWIN_CLASSIFIERS",
    "SEQ2SEQ_CLASSES",
    "Adapter",
    "BlockRelevance",
    "Basis",
    "EmbeddingTarget",
    "embedding_width",
    "Projection",
    "Similarity",
    "with_target",
    "TokenLayout",
    "Trace",
    "get_adapter",
    "SUPPORTED",
]

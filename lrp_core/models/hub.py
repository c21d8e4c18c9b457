"""Models from the timm and Hugging Face hubs, failing fast when the hub is unreachable.

- timm names (``deit_small_patch16_224``, ``vit_base_patch16_224.augreg_in1k``,
  ``timm/<repo>``): :func:`timm.create_model`, preprocess from the model's
  data config, ImageNet class names from the files timm ships.
- Hugging Face repo ids (``google/vit-base-patch16-224``,
  ``textattack/bert-base-uncased-SST-2``): transformers Auto classes, labels
  from ``config.id2label``. A repo whose config declares a causal LM (``gpt2``,
  ``Qwen/Qwen2.5-0.5B``, ...) loads as ``AutoModelForCausalLM`` with its
  tokenizer (:mod:`.lm`).
- vision-language models (:data:`KNOWN_VLMS`, any config AutoModelForImageTextToText
  builds): the model with its ``AutoProcessor``, ``kind == "vlm"``; offline, the
  error names the embedded ``tiny-vlm``.

With ``pretrained=False`` a timm architecture is built with random weights and
no network access. Pretrained weights come from the local cache when present;
otherwise the hub is contacted only after a short connectivity check, and an
unreachable hub raises :class:`HubUnavailableError` at once, naming the
embedded alternatives.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Optional, Sequence
from urllib.parse import urlparse

import torch

from ..data.photos import as_pil_image
from ..errors import InputError, LRPError
from .base import LoadedModel
from .hub_names import KNOWN_HF_MODELS, KNOWN_VLMS, guess_kind
from .lm import is_causal_lm, lm_alternative, lm_labels, lm_preprocess
from .reachability import hub_endpoint, hub_reachable

__all__ = [
    "HubUnavailableError",
    "KNOWN_HF_MODELS",
    "KNOWN_VLMS",
    "hub_endpoint",
    "hub_reachable",
    "imagenet_class_names",
    "load_hub",
]

_IMAGE_ALTERNATIVES = "load('toy-vit') or load('dinov2-s14')"
_TEXT_ALTERNATIVES = "load('minilm-sentiment')"
_VLM_ALTERNATIVES = "load('tiny-vlm') (a LLaVA with the DINOv2 tower, trained on questions about the scenes)"


class HubUnavailableError(LRPError, OSError):
    """Pretrained weights were asked for, but the hub is unreachable and nothing is cached."""


def _unavailable(name: str, kind: str, detail: str = "") -> HubUnavailableError:
    alt = {
        "text": _TEXT_ALTERNATIVES,
        "image": _IMAGE_ALTERNATIVES,
        "lm": lm_alternative(),
        "vlm": _VLM_ALTERNATIVES,
    }.get(kind, f"{_IMAGE_ALTERNATIVES} for images, {_TEXT_ALTERNATIVES} for text")
    extra = f" ({detail})" if detail else ""
    random_hint = (
        ", or load(name, pretrained=False) for random weights"
        if kind == "image" and ("/" not in name or name.startswith("timm/"))
        else ""
    )
    return HubUnavailableError(
        f"cannot load pretrained {name!r}: the Hugging Face hub is unreachable and the "
        f"weights are not in the local cache{extra}. Embedded models work offline: "
        f"{alt}{random_hint}."
    )


def _is_network_error(err: BaseException) -> bool:
    """A failure to talk to the hub (refused, timed out, dropped, HTTP error), not a fault of the files."""
    root = type(err).__module__.split(".")[0]
    return isinstance(err, OSError) or root in ("httpx", "httpx2", "httpcore", "requests", "urllib3")


def _download_error(name: str, kind: str, err: BaseException) -> Exception:
    """The error for a download that failed although the hub answered the connectivity check: the repo (or a
    file, or the revision) is not on the hub -> :class:`InputError`; anything else -> unreachable."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"the hub at {hub_endpoint()}"
    if isinstance(err, GatedRepoError):
        return InputError(
            f"{name!r} is gated on {where}: accept its conditions on its page and log in "
            f"(`hf auth login`) to download it"
        )
    if isinstance(err, (RepositoryNotFoundError, RevisionNotFoundError)) or (
        isinstance(err, EntryNotFoundError) and not isinstance(err, LocalEntryNotFoundError)
    ):
        return InputError(
            f"{name!r} was not found on {where} ({type(err).__name__}): check the spelling, or use "
            f"a timm model name (timm.list_models()) or a Hugging Face repo id 'owner/name'"
        )
    return _unavailable(name, kind, f"{type(err).__name__}: {err}")


# ---------------------------------------------------------------------------
# timm
# ---------------------------------------------------------------------------


def imagenet_class_names(subset: str = "imagenet-1k") -> list[str]:
    """Readable ImageNet class names, taken from the files timm ships.

    Parameters
    ----------
    subset : str, optional
        The timm ImageNet subset (``"imagenet-1k"`` by default).

    Returns
    -------
    list[str]
        One name per class index: the first lemma of each synset.
    """
    from timm.data import ImageNetInfo

    info = ImageNetInfo(subset)
    return [info.index_to_description(i).split(",")[0].strip() for i in range(info.num_classes())]


def _is_timm_name(name: str) -> bool:
    import timm

    if name.startswith(("hf-hub:", "hf_hub:", "timm/")):
        return True
    try:
        return bool(timm.is_model(name))
    except Exception:  # pragma: no cover - very old timm
        return name.split(".")[0] in timm.list_models()


def _timm_cached_file(name: str) -> str | None:
    """Path of the cached pretrained weights of a timm model, or None."""
    import timm

    try:
        cfg = timm.models.get_pretrained_cfg(name, allow_unregistered=False)
    except Exception:
        cfg = None
    if cfg is None:
        return None
    hub_id = getattr(cfg, "hf_hub_id", None)
    if hub_id:
        from huggingface_hub import try_to_load_from_cache

        repo = hub_id.split("@")[0]
        for fname in ("model.safetensors", "open_clip_pytorch_model.bin", "pytorch_model.bin"):
            hit = try_to_load_from_cache(repo, fname)
            if isinstance(hit, str):
                return hit
    url = getattr(cfg, "url", None)
    if url:
        path = Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(urlparse(url).path)
        if path.is_file():
            return str(path)
    return None


_TIMM_HUB_PREFIXES = ("hf-hub:", "hf_hub:", "timm/")
_TIMM_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "pytorch_model.pth", "model.pth")  # timm reads these


def _timm_hub_cached_dir(name: str) -> str | None:
    """The cached snapshot folder of a timm hub repo (``timm/<repo>[@revision]``, ``hf-hub:<repo>``) holding
    its config.json and weights, or None. timm's ``local-dir:`` source loads such a folder offline."""
    from huggingface_hub import try_to_load_from_cache

    repo = name.split(":", 1)[1] if name.startswith(("hf-hub:", "hf_hub:")) else name
    repo, _, revision = repo.partition("@")
    try:
        config = try_to_load_from_cache(repo, "config.json", revision=revision or None)
    except Exception:  # a malformed repo id: not cached
        return None
    if not isinstance(config, str):
        return None
    folder = Path(config).parent
    return str(folder) if any((folder / f).is_file() for f in _TIMM_WEIGHT_FILES) else None


def _timm_labels(model: torch.nn.Module) -> list[str]:
    n = int(getattr(model, "num_classes", 0) or 0)
    try:
        from timm.data import ImageNetInfo, infer_imagenet_subset

        subset = infer_imagenet_subset(model)
        if subset:
            info = ImageNetInfo(subset)
            if info.num_classes() == n:
                return [info.index_to_description(i).split(",")[0].strip() for i in range(n)]
    except Exception:  # fall back to the 1k names below / generic names
        pass
    if n == 1000:
        return imagenet_class_names()
    return [f"class {i}" for i in range(n)]


def _timm_random(name: str) -> torch.nn.Module:
    """The architecture ``name`` stands for, with random weights. A hub name (``timm/<arch>.<tag>``) of an
    architecture timm registers is built offline; any other hub name needs its config.json from the hub."""
    import timm

    if not name.startswith(_TIMM_HUB_PREFIXES):
        return timm.create_model(name, pretrained=False)
    repo = name.split(":", 1)[1] if name.startswith(("hf-hub:", "hf_hub:")) else name
    owner, _, rest = repo.partition("@")[0].partition("/")
    if owner == "timm" and timm.is_model(rest):
        return timm.create_model(rest, pretrained=False)
    if _timm_hub_cached_dir(name) is None and not hub_reachable():
        raise _unavailable(name, "image", "pretrained=False still needs its config.json, which is not cached")
    return timm.create_model("hf-hub:" + repo, pretrained=False)


def _load_timm(name: str, pretrained: bool) -> LoadedModel:
    import timm
    from timm.data import create_transform, resolve_data_config

    source = "random weights (architecture only)"
    if not pretrained:
        model = _timm_random(name)
    else:
        on_hub = name.startswith(_TIMM_HUB_PREFIXES)
        cached = _timm_hub_cached_dir(name) if on_hub else _timm_cached_file(name)
        if cached is not None and on_hub:  # config.json and weights from the hub cache, no network
            model = timm.create_model("local-dir:" + cached, pretrained=True)
            source = f"timm pretrained (cache: {cached})"
        elif cached is not None:
            model = timm.create_model(name, pretrained=True, pretrained_cfg_overlay={"file": cached})
            source = f"timm pretrained (cache: {cached})"
        else:
            if not hub_reachable():
                raise _unavailable(name, "image")
            hub_name = "hf-hub:" + name if name.startswith("timm/") else name
            try:
                model = timm.create_model(hub_name, pretrained=True)
            except Exception as err:
                if not _is_network_error(err):  # e.g. weights that do not fit the architecture: as they are
                    raise
                raise _download_error(name, "image", err) from err
            source = "timm pretrained (downloaded)"
    model.eval()
    data_cfg = resolve_data_config({}, model=model)
    transform = create_transform(**data_cfg)

    def preprocess(image: Any) -> torch.Tensor:
        """PIL image / (H, W, 3) array -> (1, 3, H, W) tensor normalised as the model expects."""
        return transform(as_pil_image(image)).unsqueeze(0)

    pcfg = getattr(model, "pretrained_cfg", {}) or {}
    info = {
        "source": source,
        "library": "timm",
        "pretrained": bool(pretrained),
        "image_size": tuple(data_cfg["input_size"][1:]),
        "mean": tuple(data_cfg["mean"]),
        "std": tuple(data_cfg["std"]),
        "licence": pcfg.get("license", "see the model card"),
        "data_config": data_cfg,
    }
    return LoadedModel(
        name=name, model=model, preprocess=preprocess, labels=_timm_labels(model), kind="image", info=info
    )


# ---------------------------------------------------------------------------
# Hugging Face transformers
# ---------------------------------------------------------------------------


def _hf_config(name: str, online: bool) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(name, local_files_only=not online)


def _is_image_config(config: Any) -> bool:
    return hasattr(config, "image_size") or hasattr(config, "num_channels")


def _is_clip_config(config: Any) -> bool:
    return getattr(config, "model_type", None) == "clip"


def _is_vlm_config(config: Any) -> bool:
    """Whether ``config`` is an image-text-to-text model (AutoModelForImageTextToText builds it)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    return getattr(config, "model_type", None) in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES


def _hf_config_anywhere(name: str, pretrained: bool) -> tuple[Any, Optional[bool]]:
    """The repo's config, from the cache or else the hub, and whether the hub was found reachable (None: not asked)."""
    try:
        return _hf_config(name, online=False), None
    except OSError:
        pass
    if not hub_reachable():
        detail = (
            "its config is not cached either"
            if pretrained
            else "pretrained=False still needs its config.json, which is not cached"
        )
        raise _unavailable(name, guess_kind(name), detail) from None
    try:
        return _hf_config(name, online=True), True
    except OSError as err:
        raise InputError(
            f"{name!r} is neither an embedded model (toy-vit, dinov2-s14, minilm-sentiment), "
            f"a timm model name, nor a loadable repo id on the hub at {hub_endpoint()}: {err}"
        ) from err


class _Fetch:
    """``fetch(Cls.from_pretrained, **kw)``: from the cache first (unless the hub was needed for the config),
    else from the hub, asking once whether it is reachable; a clear error when neither has it."""

    def __init__(self, name: str, kind: str, online: Optional[bool]):
        self.name, self.kind, self.online = name, kind, online
        self.local_only = not online if online is not None else True

    def __call__(self, fn: Any, **kw: Any) -> Any:
        try:
            return fn(self.name, local_files_only=self.local_only, **kw)
        except OSError:
            if self.online is None:
                self.online = hub_reachable()
            if not self.online:
                raise _unavailable(self.name, self.kind) from None
            try:
                return fn(self.name, local_files_only=False, **kw)
            except OSError as err:
                raise _download_error(self.name, self.kind, err) from err


def _auto_class(config: Any, kind: str) -> tuple[Any, str]:
    """The transformers class that builds ``config``'s model, and the attention implementation to load it with."""
    if _is_clip_config(config):
        from transformers import CLIPModel

        return CLIPModel, "eager"
    if is_causal_lm(config):  # sdpa: AttnLRP / CP-LRP then never form the (T, T) attention matrices
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM, "sdpa"
    if kind == "image":
        from transformers import AutoModelForImageClassification

        return AutoModelForImageClassification, "eager"
    if is_embedding_model(config):  # a base model (sentence embeddings): no head to add
        from transformers import AutoModel

        return AutoModel, "eager"
    head = text_head(config)
    if head is not None:  # a task head (token classification, question answering, masked LM, multiple choice)
        import transformers

        return getattr(transformers, TEXT_HEAD_CLASSES[head]), "eager"
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification, "eager"


def is_embedding_model(config: Any) -> bool:
    """A text base model saved without a head (``architectures`` ``["BertModel"]``, ``["MPNetModel"]``, ...):
    sentence embeddings, loaded with ``AutoModel`` and explained with ``Projection`` / ``Similarity``."""
    archs = getattr(config, "architectures", None) or []
    return bool(archs) and all(a.endswith("Model") and "For" not in a for a in archs)


#: the task of a text model's head (the config's architecture ends with it) -> the transformers auto class
TEXT_HEAD_CLASSES = {
    "token-classification": "AutoModelForTokenClassification",
    "question-answering": "AutoModelForQuestionAnswering",
    "fill-mask": "AutoModelForMaskedLM",
    "multiple-choice": "AutoModelForMultipleChoice",
}
_HEAD_SUFFIXES = {
    "ForTokenClassification": "token-classification",
    "ForQuestionAnswering": "question-answering",
    "ForMaskedLM": "fill-mask",
    "ForMultipleChoice": "multiple-choice",
}


def text_head(config: Any) -> str | None:
    """The task of the head the config's ``architectures`` name (``"token-classification"``, ...), or ``None``
    (a sequence classifier, or no architecture named)."""
    for arch in getattr(config, "architectures", None) or ():
        for suffix, task in _HEAD_SUFFIXES.items():
            if str(arch).endswith(suffix):
                return task
    return None


def _hf_model(config: Any, kind: str, pretrained: bool, fetch: _Fetch) -> tuple[torch.nn.Module, str]:
    """The transformers model (eval mode) for ``config``, and the words for its weights' source."""
    Auto, attention = _auto_class(config, kind)
    if pretrained:
        try:
            model = fetch(Auto.from_pretrained, attn_implementation=attention)
        except TypeError:  # older transformers without attn_implementation
            model = fetch(Auto.from_pretrained)
        source = "Hugging Face pretrained"
    else:  # random weights; a causal LM as it will be explained (sdpa), the others as transformers builds them
        model = Auto.from_config(config, **({"attn_implementation": attention} if is_causal_lm(config) else {}))
        source = "random weights (architecture only)"
    return model.eval(), source


def _clip_preprocess(fetch: _Fetch, info: dict[str, Any]) -> tuple[Callable, Any]:
    """CLIP's ``preprocess(image, prompts)`` and tokenizer; the image normalisation goes into ``info``."""
    from transformers import CLIPProcessor

    clip_processor = fetch(CLIPProcessor.from_pretrained)

    def preprocess(image: Any, prompts: Sequence[str] = ("a photo",)) -> Any:
        """An image (or a list) and the text prompts -> ``pixel_values`` + tokenized prompts."""
        images = [as_pil_image(i) for i in image] if isinstance(image, (list, tuple)) else as_pil_image(image)
        return clip_processor(text=list(prompts), images=images, padding=True, return_tensors="pt")

    improc = clip_processor.image_processor
    info.update(mean=tuple(improc.image_mean), std=tuple(improc.image_std), task="image-text similarity")
    return preprocess, clip_processor.tokenizer


def _image_preprocess(fetch: _Fetch, info: dict[str, Any]) -> tuple[Callable, Any]:
    """An image classifier's ``preprocess(image)`` (no tokenizer); its normalisation goes into ``info``."""
    from transformers import AutoImageProcessor

    processor = fetch(AutoImageProcessor.from_pretrained)

    def preprocess(image: Any) -> torch.Tensor:
        """PIL image / (H, W, 3) array -> (1, 3, H, W) ``pixel_values``."""
        return processor(images=as_pil_image(image), return_tensors="pt")["pixel_values"]

    info.update(
        mean=tuple(getattr(processor, "image_mean", ()) or ()), std=tuple(getattr(processor, "image_std", ()) or ())
    )
    return preprocess, None


def _text_preprocess(fetch: _Fetch, info: dict[str, Any]) -> tuple[Callable, Any]:
    """A text classifier's ``preprocess(texts)`` and tokenizer."""
    from transformers import AutoTokenizer

    tokenizer = fetch(AutoTokenizer.from_pretrained)
    if info.get("task") == "causal-lm":
        return lm_preprocess(tokenizer), tokenizer

    def preprocess(texts: str | Sequence[str]) -> Any:
        """One text or a list of texts -> padded batch (``input_ids``, ``attention_mask``)."""
        if isinstance(texts, str):
            texts = [texts]
        return tokenizer(list(texts), padding=True, truncation=True, return_tensors="pt")

    return preprocess, tokenizer


def _load_vlm(name: str, config: Any, pretrained: bool, fetch: _Fetch) -> LoadedModel:
    """A vision-language model with its processor: ``preprocess(image, text)`` gives the processor's batch."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    if pretrained:
        model = fetch(AutoModelForImageTextToText.from_pretrained, attn_implementation="eager")
        source = "Hugging Face pretrained"
    else:
        model = AutoModelForImageTextToText.from_config(config, attn_implementation="eager")
        source = "random weights (architecture only)"
    processor = fetch(AutoProcessor.from_pretrained)

    def preprocess(image: Any, text: str | Sequence[str]) -> Any:
        """An image and a prompt (or equally long lists of both) -> the processor's batch."""
        images = [as_pil_image(i) for i in image] if isinstance(image, (list, tuple)) else [as_pil_image(image)]
        texts = [text] if isinstance(text, str) else list(text)
        return processor(images=images, text=texts, padding=True, return_tensors="pt")

    tokenizer = getattr(processor, "tokenizer", None)
    info = {
        "source": source,
        "library": "transformers",
        "pretrained": bool(pretrained),
        "model_type": config.model_type,
        "task": "image-text-to-text",
        "processor": processor,
    }
    labels = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))) if tokenizer is not None else []
    two_arguments: Callable[..., Any] = preprocess  # LoadedModel.preprocess is typed for one argument
    return LoadedModel(
        name=name,
        model=model.eval(),
        preprocess=two_arguments,
        labels=labels,
        kind="vlm",
        tokenizer=tokenizer,
        info=info,
    )


def _load_hf(name: str, pretrained: bool) -> LoadedModel:
    from transformers import AutoConfig  # noqa: F401 - fail early if transformers is missing

    config, online = _hf_config_anywhere(name, pretrained)  # online: None until the hub had to be asked
    if _is_vlm_config(config):
        return _load_vlm(name, config, pretrained, _Fetch(name, "vlm", online))
    clip = _is_clip_config(config)
    kind = "image" if _is_image_config(config) or clip else "text"
    fetch = _Fetch(name, kind, online)
    model, source = _hf_model(config, kind, pretrained, fetch)
    id2label = getattr(config, "id2label", None) or {}
    labels: Sequence[str] = [str(id2label.get(i, id2label.get(str(i), f"class {i}"))) for i in range(len(id2label))]
    if clip:
        labels = []  # CLIP has no classes (its config's default LABEL_0/LABEL_1 mean nothing): targets are prompts
    info: dict[str, Any] = {
        "source": source,
        "library": "transformers",
        "pretrained": bool(pretrained),
        "model_type": config.model_type,
    }
    if is_causal_lm(config):
        info["task"] = "causal-lm"
    elif kind == "text" and is_embedding_model(config):
        info["task"] = "embedding"
        labels = []  # no classes: the targets are Projection / Similarity readouts of the embedding
    elif kind == "text" and text_head(config) is not None:
        info["task"] = text_head(config)
    make = _clip_preprocess if clip else _image_preprocess if kind == "image" else _text_preprocess
    preprocess, tokenizer = make(fetch, info)
    if info.get("task") == "causal-lm":
        labels = lm_labels(model, tokenizer)
    return LoadedModel(
        name=name, model=model, preprocess=preprocess, labels=labels, kind=kind, tokenizer=tokenizer, info=info
    )


# ---------------------------------------------------------------------------


def load_hub(name: str, pretrained: str | bool = "auto") -> LoadedModel:
    """Load a model from the timm or Hugging Face hub.

    Parameters
    ----------
    name : str
        A timm model name (``deit_small_patch16_224``), ``timm/<repo>``, or a Hugging Face repo id
        ``owner/name``.
    pretrained : str | bool, optional
        ``"auto"`` or ``True``: the pretrained weights, read from the local cache when there, else from the
        hub (:class:`HubUnavailableError` at once when the hub is unreachable). ``False``: the architecture
        with random weights (for timm, entirely offline).

    Returns
    -------
    LoadedModel
        The model in eval mode with its ``preprocess``, labels and kind.

    Raises
    ------
    InputError
        If the name is neither a known model nor on the hub (a ``ValueError``).
    HubUnavailableError
        If pretrained weights are asked for, nothing is cached and the hub is unreachable.
    """
    if pretrained not in ("auto", True, False):
        raise InputError(f"pretrained must be 'auto', True or False, got {pretrained!r}")
    if not isinstance(name, str) or not name.strip():
        raise InputError(f"model name must be a non-empty string, got {name!r}")
    name = name.strip()
    if _is_timm_name(name):
        return _load_timm(name, bool(pretrained))
    if "/" in name or name in KNOWN_HF_MODELS:  # legacy ids without an owner, e.g. distilbert-base-…-sst-2-english
        return _load_hf(name, bool(pretrained))
    raise InputError(
        f"unknown model {name!r}: use an embedded model ('toy-vit', 'dinov2-s14', "
        "'minilm-sentiment'), a timm model name (see timm.list_models(), e.g. "
        "'deit_small_patch16_224'), or a Hugging Face repo id 'owner/name' "
        "(e.g. 'google/vit-base-patch16-224')."
    )

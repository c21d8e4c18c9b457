"""The generation explorer's pure helpers: which methods it offers, the prompt and the tokens it shows, the
photo of a VLM prompt, token ids from typed text, and the slider's stops over an explanation's layers."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from lrp_core.adapters import get_adapter
from lrp_core.errors import InputError, UnsupportedModelError
from lrp_core.methods import registry
from lrp_core.methods.continuation import greedy_continuation
from lrp_core.methods.prompts import given_continuation, text_prompts
from lrp_core.models import LoadedModel
from lrp_core.viz.text import NEWLINE_MARKS, SPACE_MARKS, readable

from . import _engine, views
from ._cache import Cached
from ._common import ResolvedModel

#: greedy tokens written when neither ``max_new_tokens`` nor a continuation is given
DEFAULT_NEW_TOKENS = 5
MAP_LABEL = "input: the map"

Stop = tuple[str, tuple[str, int]]  # (slider label, (view, block))


def decoder_methods(methods: Optional[Sequence[str]] = None, sources: bool = False) -> list[str]:
    """The methods offered: ``methods`` (default: every method that runs on decoders; with ``sources``, the
    source methods too), each checked."""
    accepted = registry.DECODER_METHODS + (registry.SOURCE_METHOD_NAMES if sources else ())
    chosen = list(accepted if methods is None else ([methods] if isinstance(methods, str) else methods))
    if not chosen:
        raise InputError(f"no method given; choose from {', '.join(accepted)}")
    for name in chosen:
        if name not in accepted:
            why = "does not run on decoder language models" if name in registry.METHODS else "is not a method"
            raise InputError(f"method {name!r} {why}; a GenerationExplorer accepts {', '.join(accepted)}")
    return chosen


def resolve_lm(model: Any, tokenizer: Any) -> ResolvedModel:
    """A causal LM the engine explains (a module or a ``LoadedModel``) and its tokenizer."""
    loaded = model if isinstance(model, LoadedModel) else None
    module = loaded.model if loaded is not None else model
    if tokenizer is None and loaded is not None:
        tokenizer = loaded.tokenizer
    try:
        adapter = get_adapter(module)
    except UnsupportedModelError as err:
        raise UnsupportedModelError(
            f"GenerationExplorer got {type(module).__name__}, not a model lrp_core can explain: {err}"
        ) from None
    lm_head = getattr(module, "get_output_embeddings", lambda: None)()
    if not getattr(adapter, "is_decoder", False) or lm_head is None:
        raise UnsupportedModelError(
            f"GenerationExplorer explains causal language models (LlamaForCausalLM, GPT2LMHeadModel, ...); "
            f"{type(module).__name__} has no language-model head: use widgets.TokenRelevance for classifiers"
        )
    return ResolvedModel(module=module, adapter=adapter, labels=[], tokenizer=tokenizer)


def prompt_ids(tokenizer: Any, prompt: Any) -> torch.Tensor:
    """The prompt as one row of token ids (1, P): a text, a list / 1-D tensor of ids, or a tokenizer dict."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise InputError("the prompt is empty: give a text for the model to continue (or token ids)")
        return text_prompts(tokenizer, prompt)[0]
    if isinstance(prompt, (list, tuple, torch.Tensor)) and not isinstance(prompt, dict):
        ids = torch.as_tensor(prompt)
        if ids.dim() == 2 and ids.shape[0] == 1:
            ids = ids[0]
        if ids.dim() != 1 or ids.numel() == 0 or ids.is_floating_point():
            raise InputError(
                f"a prompt of token ids must be a non-empty 1-D list or tensor of ints, got shape {tuple(ids.shape)}"
            )
        return ids.long()[None]
    if isinstance(prompt, dict) or hasattr(prompt, "keys"):
        ids, mask = text_prompts(tokenizer, prompt)
        if ids.shape[0] != 1:
            raise InputError(f"a GenerationExplorer continues one prompt; got {ids.shape[0]}")
        return ids[:, mask[0].bool()]
    raise InputError(f"prompt must be a non-empty text, token ids or a tokenizer dict, got {type(prompt).__name__}")


def new_tokens(
    module: torch.nn.Module,
    tokenizer: Any,
    ids: torch.Tensor,
    max_new_tokens: Any,
    continuation: Any,
    images: Optional[dict] = None,
    per_token: Optional[dict] = None,
    extend: Optional[Callable[[dict, torch.Tensor], dict]] = None,
) -> torch.Tensor:
    """The K tokens (1, K) to explain: the given continuation, or the model's greedy choices (a vision-language
    model: with its ``images``, the same at every step, and its ``per_token`` entries (1, P) extended by
    ``extend`` for each token written, as :func:`lrp_core.methods.continuation.greedy_continuation` extends them)."""
    if continuation is not None:
        return given_continuation(tokenizer, continuation, 1, max_new_tokens)
    K = DEFAULT_NEW_TOKENS if max_new_tokens is None else max_new_tokens
    if isinstance(K, bool) or not isinstance(K, int) or K < 1:
        raise InputError(f"max_new_tokens must be a positive integer (the tokens to write), got {max_new_tokens!r}")
    return greedy_continuation(module, ids, torch.ones_like(ids), K, images=images, per_token=per_token, extend=extend)


def photo_and_mask(image: Any, mask: Any, vlm: bool) -> tuple[Optional[np.ndarray], Optional[np.ndarray]]:
    """The photo (H, W, 3) uint8 a vision-language model's image map is drawn over and the mask (H, W) bool
    outlined on it (each ``None`` when not given), checked."""
    if image is None and mask is None:
        return None, None
    if not vlm:
        raise InputError("image= and mask= draw a vision-language model's image map; this model reads text only")
    if image is None:
        raise InputError("mask= is outlined on the photo: give image= too (the picture the processor read)")
    from lrp_core.viz.maps import to_rgb_uint8
    from lrp_core.viz.thumbnails import checked_mask

    photo = to_rgb_uint8(image)
    return photo, None if mask is None else checked_mask(mask, photo.shape[:2])


def word_scheme(tokenizer: Any) -> Optional[str]:
    """``"marks"`` when the tokenizer's pieces mark a word's start (``Ġ`` / ``▁``), else ``None``.

    Without marks (a word-level tokenizer such as tiny-lm's) every piece is a word already, and
    :func:`lrp_core.textview.merge_words` must not join them.
    """
    try:
        pieces = tokenizer.convert_ids_to_tokens(tokenizer(" the cat", add_special_tokens=False)["input_ids"])
    except Exception:  # noqa: BLE001 - no tokenizer, or one that cannot say: show the pieces as they are
        return None
    return "marks" if any(m in str(p) for p in pieces for m in SPACE_MARKS + NEWLINE_MARKS) else None


def shown_token(piece: str) -> str:
    """A piece as a short label: its text without the space mark, newlines as ↵, a lone space as ␣."""
    text = readable(piece).replace("\n", "\u21b5")
    return text.strip() or ("\u2423" if text else repr(text))


def token_id(tokenizer: Any, text: str, vocab_size: int, hint: str = "") -> int:
    """One token typed in a box: ``#17`` (an id), a piece of the vocabulary, or a word that is one token."""
    text = text.strip()
    if text.startswith("#") and text[1:].isdigit():
        i = int(text[1:])
    elif tokenizer is None:
        if not text.isdigit():
            raise InputError(f"{text!r}: without a tokenizer, type a token id (e.g. #17){hint}")
        i = int(text)
    else:
        i = _vocabulary_id(tokenizer, text, hint)
    if not 0 <= i < vocab_size:
        raise InputError(f"token id {i} is outside the vocabulary [0, {vocab_size}){hint}")
    return i


def _vocabulary_id(tokenizer: Any, text: str, hint: str) -> int:
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    if text in vocab:
        return int(vocab[text])
    unk = getattr(tokenizer, "unk_token_id", None)
    for candidate in (" " + text, text):  # a word after a space is one piece in most LM vocabularies
        ids = tokenizer(candidate, add_special_tokens=False)["input_ids"]
        if len(ids) == 1 and ids[0] != unk:
            return int(ids[0])
    pieces = tokenizer.convert_ids_to_tokens(tokenizer(text, add_special_tokens=False)["input_ids"])
    raise InputError(
        f"{text!r} is not one token of this model's vocabulary (the tokenizer reads it as "
        f"{[str(p) for p in pieces]}); type a single token, or #id{hint}"
    )


def stops(exp: Any) -> list[Stop]:
    """The layer slider's stops for one explanation, left to right; the last one shows the method's map."""
    L = views.n_blocks(exp)
    if exp.layers is not None and _engine.takes(exp.method, "start_layer"):
        start = exp.start_layer or 0
        return [(f"blocks {start}\u2026{b}", ("accumulated", b)) for b in range(start, L)]
    if exp.layers is not None:
        return [(f"block {b}", ("block", b)) for b in range(L)]
    if exp.token_relevance is not None:
        computed = [b for b in range(L) if bool(exp.token_relevance[0, b].abs().sum() > 0)]
        return [(f"leaving block {b}", ("residual", b)) for b in reversed(computed)] + [(MAP_LABEL, ("output", 0))]
    return [(MAP_LABEL, ("output", 0))]


def stop_values(entry: Cached, stop: tuple[str, int]) -> np.ndarray:
    """The (P+k,) values of one stop of a cached explanation (memoised in the entry)."""
    view, block = stop
    start = (entry.explanation.start_layer or 0) if view == "accumulated" else 0
    return entry.view(view, block, start, None)

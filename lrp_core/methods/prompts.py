"""The prompts, continuations and contrasts :func:`lrp_core.explain_generation` takes, checked and as tensors.

Prompts become left-padded ``(input_ids, attention_mask)`` (B, P), so every prompt ends at the last column; a
vision-language model's processor output is split into its text, its image entries (B·k, …) and its other
per-token entries (B, P). Token ids given as ids or single-token pieces are checked against the vocabulary
before any step is computed.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from ..errors import InputError, UnsupportedModelError


def left_padded(ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """The same rows re-padded on the left, so every prompt ends at the last column.

    Parameters
    ----------
    ids, mask : Tensor
        (B, P) the ids and their attention mask (0 at padding), padded on either side.

    Returns
    -------
    tuple[Tensor, Tensor]
        ``(ids, mask)`` (B, P), left-padded.
    """
    order = torch.argsort(mask.to(torch.int8), dim=1, stable=True)  # padding (0) first, real tokens in order
    return ids.gather(1, order), mask.gather(1, order)


def text_prompts(tokenizer: Any, prompts: Any) -> tuple[Tensor, Tensor]:
    """Text prompts as left-padded ids.

    Parameters
    ----------
    tokenizer : Any
        The model's tokenizer (needed for text prompts), or ``None``.
    prompts : Any
        A string, a list of strings, or a tokenizer dict (``input_ids`` and optionally ``attention_mask``).

    Returns
    -------
    tuple[Tensor, Tensor]
        ``(input_ids, attention_mask)`` (B, P) long, left-padded.

    Raises
    ------
    InputError
        If the prompts are empty, of another kind, misshapen, or a row has no real token.
    """
    if isinstance(prompts, str):
        prompts = [prompts]
    if isinstance(prompts, (list, tuple)):
        if not prompts or not all(isinstance(p, str) and p for p in prompts):
            raise InputError(
                "prompts must be a non-empty string, a list of non-empty strings, or a tokenizer's "
                "output dict with 'input_ids' (and 'attention_mask')"
            )
        if tokenizer is None:
            raise InputError("text prompts need the model's tokenizer: explain_generation(model, tokenizer, prompts)")
        enc = tokenizer(list(prompts), return_tensors="pt", padding=True)
        ids, mask = enc["input_ids"], enc["attention_mask"]
    elif isinstance(prompts, dict) or hasattr(prompts, "keys"):
        if "input_ids" not in prompts:
            raise InputError("a prompts dict needs 'input_ids' (B, P) and, if padded, 'attention_mask'")
        ids = torch.as_tensor(prompts["input_ids"])
        mask = torch.as_tensor(prompts.get("attention_mask", torch.ones_like(ids)))
    else:
        raise InputError(
            f"prompts must be a string, a list of strings or a tokenizer dict, got {type(prompts).__name__}"
        )
    if ids.dim() != 2 or mask.shape != ids.shape:
        raise InputError(
            f"input_ids must be (B, P) with an attention_mask of the same shape, got {tuple(ids.shape)} "
            f"and {tuple(mask.shape)}"
        )
    if bool((mask.sum(1) == 0).any()):
        raise InputError("a prompt has no real token (its attention_mask row is all 0)")
    return left_padded(ids.long(), mask.long())


def vlm_prompts(adapter: Any, tokenizer: Any, prompts: Any) -> tuple[Any, dict, dict, dict]:
    """A vision-language model's prompts split into text, images and the other per-token entries.

    ``explain_generation(vlm, processor_output)`` is accepted (the tokenizer left out), and a processor gives its
    tokenizer. The processor's output is checked as :func:`lrp_core.explain` checks it. A family whose processor
    gives per-token entries the loop does not extend is refused (``VLMAdapter.generation_refused``); the ones it
    extends are ``VLMAdapter.generated_token_values``.

    Parameters
    ----------
    adapter : Any
        The model's VLM adapter.
    tokenizer : Any
        Its tokenizer or processor, the processor's output itself, or ``None``.
    prompts : Any
        The processor's output (``input_ids``, ``attention_mask``, ``pixel_values``, …), or ``None``.

    Returns
    -------
    tuple[Any, dict, dict, dict]
        ``(tokenizer, text, images, per_token)``: the tokenizer that gives the pieces, ``input_ids`` /
        ``attention_mask``, the image entries (B·k, …) and the per-token entries (B, P), re-padded on the left as
        :func:`text_prompts` re-pads the ids.
    """
    if adapter.generation_refused is not None:
        raise UnsupportedModelError(
            f"explain_generation does not run on {type(adapter.model).__name__}: {adapter.generation_refused}"
        )
    if prompts is None and isinstance(tokenizer, Mapping):
        prompts, tokenizer = tokenizer, None
    if tokenizer is not None and not hasattr(tokenizer, "convert_ids_to_tokens") and hasattr(tokenizer, "tokenizer"):
        tokenizer = tokenizer.tokenizer  # a processor: its tokenizer gives the pieces
    if not isinstance(prompts, Mapping) or "input_ids" not in prompts or prompts.get("pixel_values") is None:
        raise InputError(
            f"{type(adapter.model).__name__} reads an image with its text: pass the processor's output "
            "(a dict with 'input_ids', 'attention_mask' and 'pixel_values', e.g. processor(images=image, "
            "text=prompt, return_tensors='pt')) as prompts, got "
            f"{type(prompts).__name__}"
        )
    adapter.check_inputs(prompts)
    ids = torch.as_tensor(prompts["input_ids"])
    text = {"input_ids": ids, "attention_mask": torch.as_tensor(prompts.get("attention_mask", torch.ones_like(ids)))}
    names = adapter.generated_token_values
    images = {
        k: torch.as_tensor(prompts[k]) for k in adapter.image_inputs if prompts.get(k) is not None and k not in names
    }
    order = torch.argsort(text["attention_mask"].to(torch.int8), dim=1, stable=True)  # as _left_padded
    per_token = {
        k: torch.as_tensor(prompts[k]).reshape(ids.shape).gather(1, order.to(ids.device))
        for k in names
        if prompts.get(k) is not None
    }
    return tokenizer, text, images, per_token


def model_prompts(adapter: Any, tokenizer: Any, prompts: Any) -> tuple[Any, Tensor, Tensor, dict, dict]:
    """The prompts as the model's inputs, a vision-language model's image and per-token entries split off.

    Parameters
    ----------
    adapter : Any
        The engine's adapter of the model.
    tokenizer : Any
        Its tokenizer or, for a vision-language model, its processor or the processor's output; or ``None``.
    prompts : Any
        The prompts as :func:`explain_generation` takes them.

    Returns
    -------
    tuple[Any, Tensor, Tensor, dict, dict]
        ``(tokenizer, input_ids (B, P), attention_mask (B, P), images, per_token)``: the tokenizer that gives
        the pieces, the left-padded ids and mask, a vision-language model's image entries (B·k, …) and its
        other per-token entries (B, P) (both ``{}`` for a text model).
    """
    images: dict = {}
    per_token: dict = {}
    if adapter.is_vlm:
        tokenizer, prompts, images, per_token = vlm_prompts(adapter, tokenizer, prompts)
    ids, mask = text_prompts(tokenizer, prompts)
    return tokenizer, ids, mask, images, per_token


def token_ids(tokenizer: Any, values: Any, what: str) -> list:
    """Token ids from ids or single-token strings.

    Parameters
    ----------
    tokenizer : Any
        The tokenizer (for strings), or ``None``.
    values : Any
        Ids, single-token pieces or ``None`` (kept).
    what : str
        What the values are, for messages.

    Returns
    -------
    list
        The ids (``None`` kept).
    """
    out = []
    for v in values:
        if v is None or (isinstance(v, numbers.Integral) and not isinstance(v, bool)):
            out.append(None if v is None else int(v))
        elif isinstance(v, str):
            if tokenizer is None:
                raise InputError(f"{what} {v!r} is text: a token piece needs the tokenizer (or give its id)")
            ids = tokenizer.convert_tokens_to_ids([v])
            if ids[0] is None or ids[0] == tokenizer.unk_token_id:
                enc = tokenizer(v, add_special_tokens=False)["input_ids"]
                if len(enc) != 1:
                    raise InputError(f"{what} {v!r} is {len(enc)} tokens; give single tokens (ids or pieces)")
                ids = enc
            out.append(int(ids[0]))
        else:
            raise InputError(f"{what} must be token ids (int) or single-token strings, got {type(v).__name__}")
    return out


def check_ids(ids: Sequence[Sequence[Optional[int]]], vocab: int, what: str) -> None:
    """Every id checked to lie in ``0 … vocab − 1``, on Python ints (an id too large for int64 is named).

    Parameters
    ----------
    ids : Sequence[Sequence[Optional[int]]]
        Rows of ids (``None``: no token).
    vocab : int
        The vocabulary size.
    what : str
        What the ids are, for messages.

    Raises
    ------
    InputError
        Naming the ids outside the vocabulary.
    """
    bad = sorted({v for row in ids for v in row if v is not None and not 0 <= v < vocab})
    if bad:
        raise InputError(f"{what} ids must lie in 0 … {vocab - 1} (the model's vocabulary), got {bad[:5]}")


def given_continuation(
    tokenizer: Any, continuation: Any, batch: int, steps: Optional[int], vocab: Optional[int] = None
) -> Tensor:
    """A given continuation as ids, one row per prompt.

    Parameters
    ----------
    tokenizer : Any
        The tokenizer (text and pieces), or ``None``.
    continuation : Any
        A string or token ids for every prompt, or one per prompt (a (B, K) tensor or array too).
    batch : int
        B, the prompts.
    steps : Optional[int]
        ``max_new_tokens`` if given: it must be the continuation's length.
    vocab : Optional[int], optional
        The vocabulary size every id is checked against.

    Returns
    -------
    Tensor
        (B, K) long.
    """
    if getattr(continuation, "ndim", 1) == 2:  # a (B, K) tensor or array (``.targets``): one row per prompt
        continuation = continuation.tolist()
    rows = (
        continuation
        if isinstance(continuation, (list, tuple))
        and continuation
        and isinstance(continuation[0], (list, tuple, str))
        and not isinstance(continuation, str)
        else [continuation]
    )
    if len(rows) == 1 and batch > 1:
        rows = rows * batch
    ids = []
    for r in rows:
        if isinstance(r, str):
            if tokenizer is None:
                raise InputError("a text continuation needs the tokenizer")
            ids.append(tokenizer(r, add_special_tokens=False)["input_ids"])
        else:
            flat = (
                list(r)
                if isinstance(r, (list, tuple))
                else r.reshape(-1).tolist()
                if hasattr(r, "reshape") and hasattr(r, "tolist")
                else [r]
            )  # tensor / array
            ids.append(token_ids(tokenizer, flat, "continuation"))
    if len(ids) != batch or len({len(r) for r in ids}) != 1 or not ids[0]:
        raise InputError(
            f"continuation must give the same, non-zero number of tokens for each of the {batch} prompts "
            f"(got lengths {[len(r) for r in ids]})"
        )
    if steps is not None and steps != len(ids[0]):
        raise InputError(f"max_new_tokens={steps} but the continuation has {len(ids[0])} tokens; give one or the other")
    if any(v is None for r in ids for v in r):
        raise InputError("continuation must be token ids or text, without None")
    if vocab is not None:
        check_ids(ids, vocab, "continuation")
    return torch.tensor(ids, dtype=torch.long)


def contrasts(tokenizer: Any, contrast: Any, batch: int, steps: int, vocab: int) -> Optional[Tensor]:
    """The contrasted token of every step.

    Parameters
    ----------
    tokenizer : Any
        The tokenizer (pieces), or ``None``.
    contrast : Any
        One token for every step, a list of K (``None`` for none) or B such lists; ``None``: no contrast.
    batch, steps : int
        B prompts, K steps.
    vocab : int
        The vocabulary size every id is checked against.

    Returns
    -------
    Optional[Tensor]
        (B, K) long, −1 where a step has none; ``None`` without contrasts.
    """
    if contrast is None:
        return None
    if isinstance(contrast, (numbers.Integral, str)) and not isinstance(contrast, bool):
        grid = [[contrast] * steps] * batch
    elif (
        isinstance(contrast, (list, tuple))
        and len(contrast) == steps
        and not any(isinstance(c, (list, tuple)) for c in contrast)
    ):
        grid = [list(contrast)] * batch
    elif (
        isinstance(contrast, (list, tuple))
        and len(contrast) == batch
        and all(isinstance(c, (list, tuple)) and len(c) == steps for c in contrast)
    ):
        grid = [list(c) for c in contrast]
    else:
        raise InputError(
            f"contrast must be one token (id or piece) for every step, a list of {steps} (one per step, "
            f"None for none) or {batch} such lists (one per prompt)"
        )
    ids = [token_ids(tokenizer, row, "contrast") for row in grid]
    check_ids(ids, vocab, "contrast")  # before −1 stands for "none": a negative id is an error, not "none"
    return torch.tensor([[-1 if v is None else v for v in row] for row in ids], dtype=torch.long)


__all__ = [
    "check_ids",
    "contrasts",
    "given_continuation",
    "left_padded",
    "model_prompts",
    "text_prompts",
    "token_ids",
    "vlm_prompts",
]

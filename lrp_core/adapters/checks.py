"""Input checks the families share: token ids, attention masks, pixel values, the model's dtype.

Each turns what a user may pass (tensors, NumPy arrays, nested lists) into
the tensor the replay needs, or raises :class:`~lrp_core.errors.InputError`
naming what was wrong and what is accepted — never a raw ``ValueError`` from
``torch.as_tensor`` or a silent reinterpretation (a mask of 0.5s read as 0).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from ..errors import InputError

_PAD_HINT = "tokenize with padding=True and return_tensors='pt' (or pad the lists to one length yourself)"


def _tensor(value: Any, name: str) -> Tensor:
    """``value`` as a tensor; ragged lists and non-numbers are an :class:`InputError`."""
    if isinstance(value, Tensor):
        return value
    try:
        return torch.as_tensor(value)  # tensors, arrays and rectangular lists alike
    except (ValueError, TypeError, RuntimeError):
        lengths = sorted({len(v) for v in value if hasattr(v, "__len__")}) if isinstance(value, (list, tuple)) else []
        ragged = f" of different lengths {lengths}" if len(lengths) > 1 else ""
        raise InputError(
            f"{name} must be a rectangular batch (B, T) of integer ids: a tensor, an array, or lists of "
            f"one length; got a {type(value).__name__} of lists{ragged} — {_PAD_HINT}"
        ) from None


def token_ids(value: Any, name: str = "input_ids", rows: str = "B") -> Tensor:
    """Token ids as a long tensor of shape ``(rows, T)``: integers only (int32 / int64 / lists of ints).

    Parameters
    ----------
    value : Any
        The ids: a tensor, a NumPy array or rectangular nested lists, of shape ``(B, T)``.
    name : str
        The input's name, for the message.
    rows : str
        What the rows are called in the message (``"B"``).

    Returns
    -------
    Tensor
        The ids ``(B, T)``, ``torch.long``.

    Raises
    ------
    InputError
        When the ids are ragged, not numbers, unbatched (one dimension), not two-dimensional or not integers.
    """
    ids = _tensor(value, name)
    if ids.dim() == 1:
        raise InputError(f"{name} must be batched ({rows}, T); got shape {tuple(ids.shape)} — use ids.unsqueeze(0)")
    if ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32):
        raise InputError(
            f"{name} must be an integer tensor of shape ({rows}, T) (int64 or int32 token ids); got "
            f"shape {tuple(ids.shape)} and dtype {ids.dtype}"
        )
    return ids.long()


def attention_mask(value: Any, ids: Tensor) -> Tensor:
    """The attention mask as 1 (token) / 0 (padding), long; ``None`` means every token is real.

    Any dtype is accepted as long as every value is 0 or 1 (bools, ints, 0.0 / 1.0): a value in
    between has no meaning for the model, which adds it to the scores as a large negative bias.

    Parameters
    ----------
    value : Any
        The mask ``(B, T)`` (tensor, array or lists), or ``None``.
    ids : Tensor
        The token ids ``(B, T)`` the mask belongs to; its shape and device are the mask's.

    Returns
    -------
    Tensor
        The mask ``(B, T)``, ``torch.long``, on the ids' device.

    Raises
    ------
    InputError
        When the mask's shape differs from the ids' or a value is neither 0 nor 1.
    """
    if value is None:
        return torch.ones_like(ids)
    mask = _tensor(value, "attention_mask").to(ids.device)
    if mask.shape != ids.shape:
        raise InputError(
            f"attention_mask has shape {tuple(mask.shape)}, input_ids {tuple(ids.shape)}: they must be "
            "the same (one 0/1 per token)"
        )
    if mask.is_complex() or not bool(((mask == 0) | (mask == 1)).all()):
        odd = mask[(mask != 0) & (mask != 1)].unique()[:5].tolist()
        raise InputError(
            f"attention_mask must hold 1 (a token) and 0 (padding) only, e.g. the tokenizer's mask; "
            f"got the values {odd}"
        )
    return mask.long()


def tokenized(inputs: Any, model_name: str) -> tuple[Tensor, Tensor]:
    """The token ids and mask of a tokenizer's output, checked.

    The inputs must not be raw strings, must be a mapping with ``input_ids``, hold at least one token, and have no
    row that is all padding.

    Parameters
    ----------
    inputs : Any
        The tokenizer's output (a dict / BatchEncoding with ``input_ids`` and optionally ``attention_mask``).
    model_name : str
        The model's class name, for the message.

    Returns
    -------
    tuple of Tensor
        ``(input_ids, attention_mask)``, both ``(B, T)`` long.

    Raises
    ------
    InputError
        For raw text, a value that is not a mapping with ``input_ids``, an empty text, or a row of padding only.
    """
    if isinstance(inputs, str) or (isinstance(inputs, (list, tuple)) and inputs and isinstance(inputs[0], str)):
        raise InputError(
            "text must be tokenized first: pass the tokenizer's output (a dict / BatchEncoding with "
            "input_ids and attention_mask), e.g. tokenizer(texts, padding=True, return_tensors='pt')"
        )
    if not isinstance(inputs, Mapping) or "input_ids" not in inputs:
        raise InputError(
            f"{model_name} explains text: pass a dict / BatchEncoding with 'input_ids' (and "
            f"'attention_mask'), got {type(inputs).__name__}"
        )
    ids = token_ids(inputs["input_ids"])
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        raise InputError("the text is empty: no tokens to explain")
    mask = attention_mask(inputs.get("attention_mask"), ids)
    empty = torch.nonzero(mask.sum(dim=1) == 0).flatten().tolist()
    if empty:
        raise InputError(f"row(s) {empty} are empty: all padding (attention_mask all zeros), nothing to explain")
    return ids, mask


#: keys of a tokenizer's or a user's inputs that change none of the logits an explanation reads: a loss's labels,
#: what the model returns, whether it builds a cache for later calls
NO_EFFECT = (
    "labels",
    "return_dict",
    "return_loss",
    "output_attentions",
    "output_hidden_states",
    "use_cache",
    "logits_to_keep",
    "num_items_in_batch",
)


def input_keys(
    inputs: Mapping,
    model_name: str,
    honoured: Sequence[str],
    refused: Mapping[str, str] = {},
    no_effect: Sequence[str] = NO_EFFECT,
) -> None:
    """Every key of ``inputs`` with a value is honoured by the replay, changes no logit, or is an :class:`InputError`.

    A key the model would use and the replay ignored would explain another computation than the model's:
    it is refused, never dropped. A key whose value is ``None`` is the model's default, and accepted.

    Parameters
    ----------
    inputs : Mapping
        The user's inputs (a dict / BatchEncoding).
    model_name : str
        The model's class name, for the message.
    honoured : Sequence of str
        The keys the replay reads as the model does.
    refused : Mapping of str to str
        Key -> why the replay cannot honour it and what to pass instead.
    no_effect : Sequence of str
        Keys that change nothing the explanation reads (:data:`NO_EFFECT`).

    Raises
    ------
    InputError
        For a key with a value that is refused or neither honoured nor without effect.
    """
    for key, value in inputs.items():
        if value is None or key in honoured or key in no_effect:
            continue
        if key in refused:
            raise InputError(f"{model_name} is explained without {key!r}: {refused[key]}")
        raise InputError(
            f"{model_name}: the input {key!r} is not one the explanation reads; it reads "
            f"{', '.join(honoured)} (and ignores {', '.join(no_effect)}, which change no logit) — drop "
            f"{key!r} from the inputs (e.g. inputs.pop({key!r}))"
        )


def pixel_values(value: Any, name: str = "pixel_values") -> Tensor:
    """Pixel values as a tensor: a tensor is returned as is, a NumPy array converted.

    Parameters
    ----------
    value : Any
        The images ``(B, 3, H, W)``: a tensor or a NumPy array.
    name : str
        The input's name, for the message.

    Returns
    -------
    Tensor
        The images ``(B, 3, H, W)``.

    Raises
    ------
    InputError
        For a list (or anything else), with the fix: a tensor from the processor, or ``torch.stack``.
    """
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    if isinstance(value, Tensor):
        return value
    what = (
        f"a list of {len(value)} {type(value[0]).__name__}"
        if isinstance(value, (list, tuple)) and value
        else f"a {type(value).__name__}"
    )
    raise InputError(
        f"{name} must be a float tensor (B, 3, H, W) (or a NumPy array); got {what} — ask the "
        "processor for return_tensors='pt', or torch.stack the images into one batch"
    )


def to_model_dtype(images: Tensor, dtype: torch.dtype) -> Tensor:
    """Floating images in the model's dtype, as Hugging Face pipelines cast them (float64 → float32, ...).

    The explanation is then that of the cast images, exactly.

    Parameters
    ----------
    images : Tensor
        The images ``(B, 3, H, W)``.
    dtype : torch.dtype
        The model's floating dtype.

    Returns
    -------
    Tensor
        The images ``(B, 3, H, W)`` in ``dtype`` (the same tensor when already so).
    """
    return images if images.dtype == dtype else images.to(dtype)


__all__ = ["token_ids", "attention_mask", "tokenized", "input_keys", "NO_EFFECT", "pixel_values", "to_model_dtype"]

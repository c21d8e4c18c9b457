"""Decoder inputs: position ids from the attention mask, given positions and caches checked, the token a
sequence classifier pools, rotary tables per row, and the causal (windowed) additive mask.

Shapes: B batch, T tokens (padding included), d head width.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

import torch
from torch import Tensor, nn

from ..errors import InputError
from .checks import token_ids
from .parts import ModelPart


def position_ids(mask: Tensor) -> Tensor:
    """Position ids from the 0/1 mask, as ``generate`` computes them: real tokens count 0, 1, …

    Parameters
    ----------
    mask : Tensor
        The attention mask ``(B, T)``, 1 for a real token and 0 for padding.

    Returns
    -------
    Tensor
        The position ids ``(B, T)`` (padding before the first real token gets 0).
    """
    return (mask.cumsum(-1) - 1).clamp(min=0)


def last_real(mask: Tensor) -> Tensor:
    """The index of each row's last real token, with padding on either side.

    Parameters
    ----------
    mask : Tensor
        The attention mask ``(B, T)``, 1 for a real token and 0 for padding.

    Returns
    -------
    Tensor
        The indices ``(B,)``, long.
    """
    idx = torch.arange(mask.shape[1], device=mask.device)
    return (idx[None, :] * mask).argmax(dim=-1)


_CACHE = (
    "a cache holds the keys and values of earlier tokens, which the replay does not see, so the explanation "
    "would miss them: pass the whole sequence (the earlier tokens and the new ones) as input_ids with its "
    "attention_mask, without past_key_values / cache (use_cache may stay: it changes no logit)"
)

#: input keys a decoder's forward reads that the replay does not, and what to pass instead
REFUSED_INPUTS = {
    "past_key_values": _CACHE,
    "cache": _CACHE,
    "inputs_embeds": "the token scores are read at the model's own embeddings of input_ids (embed_tokens), so "
    "embeddings given directly are refused: pass input_ids (and attention_mask)",
    "encoder_hidden_states": "the replay explains a decoder-only model, without cross-attention",
}


def given_position_ids(value: Any, mask: Tensor, limit: Optional[int], has_mask: bool, windowed: bool) -> Tensor:
    """The ``position_ids`` given with the inputs, checked.

    They must be ``(B, T)`` or ``(1, T)`` (one row for all rows), integers in ``[0, limit)``.

    Parameters
    ----------
    value : Any
        The user's position ids.
    mask : Tensor
        The attention mask ``(B, T)``.
    limit : int or None
        The model's number of positions (``None``: no limit).
    has_mask : bool
        Whether an attention mask was given: without one, Hugging Face reads position ids that restart inside a
        row as packed sequences (a block-diagonal mask), which the replay does not build.
    windowed : bool
        Whether the model has a sliding window, which Hugging Face counts in tokens and the replay in positions:
        the two agree where consecutive real tokens are one position apart.

    Returns
    -------
    Tensor
        The position ids ``(B, T)``, long, on the mask's device.

    Raises
    ------
    InputError
        For a wrong shape, a value outside ``[0, limit)``, ids that restart or jump inside a row without a mask,
        or (with a sliding window) consecutive real tokens not one position apart.
    """
    pos = token_ids(value, "position_ids")
    B, T = mask.shape
    if pos.shape[0] == 1 and pos.shape[1] == T:
        pos = pos.expand(B, T)
    if pos.shape != (B, T):
        raise InputError(
            f"position_ids has shape {tuple(pos.shape)}, input_ids {(B, T)}: give one position per "
            "token, (B, T) or (1, T)"
        )
    pos = pos.to(mask.device)
    if int(pos.min()) < 0 or (limit is not None and int(pos.max()) >= limit):
        raise InputError(
            f"position_ids must lie in [0, {limit}) (max_position_embeddings); got {int(pos.min())} … {int(pos.max())}"
            if limit is not None
            else f"position_ids must be ≥ 0; got {int(pos.min())}"
        )
    step = pos[:, 1:] - pos[:, :-1]
    if not has_mask and bool((step != 1).any()):
        raise InputError(
            "position_ids restart or jump inside a row and no attention_mask is given: the model "
            "would read the row as packed sequences (attention within each run only). Pass each "
            "sequence as its own row, with an attention_mask"
        )
    real = (mask[:, 1:] * mask[:, :-1]).bool()
    if windowed and bool((step[real] != 1).any()):
        raise InputError(
            "position_ids of consecutive tokens differ by other than 1: the model's sliding window "
            "counts tokens, the explanation counts positions, and the two would disagree. Pass "
            "position ids that count 0, 1, … along each row's tokens, or none (they then follow the "
            "attention mask)"
        )
    return pos


def check_cache_position(value: Any, T: int) -> None:
    """Check the ``cache_position`` given with the inputs: it must be 0 … T−1 (a sequence without a cache).

    Other values count from the start of a cache the replay does not see.

    Parameters
    ----------
    value : Any
        The user's ``cache_position`` (``None``: nothing to check).
    T : int
        The sequence length.

    Raises
    ------
    InputError
        When the positions are not 0 … T−1.
    """
    if value is None:
        return
    pos = torch.as_tensor(value)
    if pos.shape[-1:] != (T,) or not bool((pos == torch.arange(T, device=pos.device)).all()):
        raise InputError(
            f"cache_position must be 0 … {T - 1} (the whole sequence, no cache); other values continue "
            f"a cache: {_CACHE}"
        )


def pooled_position(ids: Tensor, mask: Tensor, pad_id: Optional[int]) -> Tensor:
    """(B,) where a Hugging Face decoder ``*ForSequenceClassification`` reads each row.

    The rightmost token whose id is not ``pad_id``, whatever the attention mask (so where the padding id is
    also the end-of-text token, a row ending in it is read at the token before; a row of padding ids only
    at token 0); without a padding id the model reads the last column, here each row's last real token (the
    row alone). A read position that is padding (the batch padded with another id than ``pad_id``) is an
    :class:`InputError`: the model would pool a padding token there.

    Parameters
    ----------
    ids : Tensor
        The token ids ``(B, T)``.
    mask : Tensor
        The attention mask ``(B, T)``.
    pad_id : int or None
        The model's padding token id (``config.pad_token_id``), or ``None``.

    Returns
    -------
    Tensor
        The read positions ``(B,)``, long.

    Raises
    ------
    InputError
        When a read position is a padding token.
    """
    if pad_id is None:
        return last_real(mask)
    idx = torch.arange(ids.shape[1], device=ids.device)
    read = (idx[None, :] * (ids != pad_id)).argmax(dim=-1)
    bad = torch.nonzero(mask.gather(1, read[:, None])[:, 0] == 0).flatten().tolist()
    if bad:
        raise InputError(
            f"the classifier reads row {bad[0]} at its last token that is not config.pad_token_id "
            f"({pad_id}), position {int(read[bad[0]])}, which is padding (attention_mask 0): pad the "
            f"batch with the id {pad_id} (tokenizer.pad_token_id = model.config.pad_token_id)"
        )
    return read


#: rotary types whose tables depend on the longest position of the call (transformers' ``dynamic_rope_update``)
BATCH_DEPENDENT_ROPE = ("dynamic", "longrope")


class _RowRotary:
    """The model's rotary module seen with one row's inverse frequencies (read-only: writes nothing to it)."""

    def __init__(self, module: nn.Module, name: str, inv_freq: Tensor):
        self.__dict__["_module"] = module
        self.__dict__[name] = inv_freq

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_module"], name)


def _fresh_inv_freq(module: ModelPart, kind: str, seq_len: Tensor, layer_type: Optional[str]) -> Tensor:
    """The inverse frequencies the module uses, freshly loaded, for a call whose longest position is ``seq_len − 1``.

    ``longrope``: the long factors past ``original_max_position_embeddings``, else the short ones; ``dynamic``:
    the NTK-scaled base for ``seq_len`` past the original length, else the original frequencies — the
    choices of transformers' ``dynamic_rope_update``, without its state (a dynamic module keeps the longest
    length it has seen, so its tables depend on the calls before).
    """
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    prefix = "" if layer_type is None else f"{layer_type}_"
    original = getattr(module, f"{prefix}original_inv_freq")
    params = module.config.rope_parameters if layer_type is None else module.config.rope_parameters[layer_type]
    if kind == "longrope":
        limit = int(params["original_max_position_embeddings"])
        if int(seq_len) <= limit:
            return original
        return ROPE_INIT_FUNCTIONS[kind](module.config, original.device, seq_len=limit + 1, layer_type=layer_type)[0]
    if int(seq_len) <= int(module.original_max_seq_len):
        return original
    return ROPE_INIT_FUNCTIONS[kind](module.config, original.device, seq_len=seq_len, layer_type=layer_type)[0]


def row_rotary_tables(
    module: ModelPart, x: Tensor, positions: Tensor, mask: Optional[Tensor], layer_type: Optional[str] = None
) -> tuple[Tensor, Tensor]:
    """The rotary tables of the model's rotary ``module`` at ``positions``, each row's as for the row alone.

    Parameters
    ----------
    module : nn.Module
        The model's rotary embedding (``rope_type`` a string, or a dict by layer type).
    x : Tensor
        Block 0's input ``(B, T, D)`` (for its dtype and device).
    positions : Tensor
        The position ids ``(B, T)``.
    mask : Tensor or None
        ``(B, T)``, 1 for a real token (``None``: all real): a row's longest position is that of its real tokens.
    layer_type : str or None
        The layer type the module takes (Gemma 3), or ``None``.

    Returns
    -------
    tuple of Tensor
        The module's own ``(cos, sin)``, each ``(B, T, r)``. Where its rotary type chooses its frequencies by the
        longest position of the call (:data:`BATCH_DEPENDENT_ROPE`), the choice is made per row, and the module's
        undecorated forward computes each row's tables with them (the module itself is not written to).
    """
    kinds: ModelPart = getattr(module, "rope_type", "default")  # a str, or a dict by layer type (Gemma 3)
    kind = kinds if layer_type is None else kinds[layer_type]
    args = () if layer_type is None else (layer_type,)
    if not isinstance(kind, str) or not any(k in kind for k in BATCH_DEPENDENT_ROPE):
        return module(x, positions, *args)
    kind = "longrope" if kind == "longrope" else "dynamic"
    real = positions if mask is None else positions.masked_fill(mask == 0, -1)
    longest = real.max(dim=1).values + 1  # (B,) long, as transformers' seq_len
    raw = inspect.unwrap(type(module).forward)
    name = "inv_freq" if layer_type is None else f"{layer_type}_inv_freq"
    tables = [
        raw(
            _RowRotary(module, name, _fresh_inv_freq(module, kind, longest[b], layer_type)),
            x[b : b + 1],
            positions[b : b + 1],
            *args,
        )
        for b in range(x.shape[0])
    ]
    return torch.cat([c for c, _ in tables]), torch.cat([s for _, s in tables])


def causal_bias(mask: Tensor, positions: Tensor, window: Optional[int], dtype: torch.dtype) -> Tensor:
    """The additive causal mask: 0 where query i may attend key j, the dtype's minimum elsewhere.

    Allowed: j ≤ i, key j real, and (sliding window) ``pos_i − pos_j < window``. A padding query row
    attends itself only, so no row is fully masked (its output reaches no real token either way).

    Parameters
    ----------
    mask : Tensor
        The attention mask ``(B, T)``, 1 for a real token.
    positions : Tensor
        The position ids ``(B, T)``, read by the sliding window.
    window : int or None
        The sliding window in positions, or ``None`` for none.
    dtype : torch.dtype
        The scores' dtype, whose minimum marks a forbidden pair.

    Returns
    -------
    Tensor
        The bias ``(B, 1, T, T)`` in ``dtype``.
    """
    T = mask.shape[1]
    idx = torch.arange(T, device=mask.device)
    allowed = (idx[None, :] <= idx[:, None])[None] & mask[:, None, :].bool()
    if window is not None:
        allowed &= (positions[:, :, None] - positions[:, None, :]) < window
    allowed |= torch.eye(T, dtype=torch.bool, device=mask.device)[None] & ~mask[:, :, None].bool()
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)[:, None]


__all__ = [
    "BATCH_DEPENDENT_ROPE",
    "REFUSED_INPUTS",
    "causal_bias",
    "check_cache_position",
    "given_position_ids",
    "last_real",
    "pooled_position",
    "position_ids",
    "row_rotary_tables",
]

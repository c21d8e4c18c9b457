"""Greedy continuation: the tokens a causal LM (or a vision-language model) writes after its prompts.

:func:`greedy_continuation` runs the model's own forward step by step, each row as it would run alone; the
prompts are left-padded (B, P) and the result is (B, K), K the steps of the longest row.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor, nn

from ..errors import InputError
from ..runtime.guard import eval_semantics, model_guard
from ..runtime.own_forward import no_new_observers as _no_new_observers
from ..runtime.own_forward import rotary_state_kept as _rotary
from ..runtime.wrappers import unwrap


def _token_set(value: Any) -> list[int]:
    """An ``eos_token_id`` (int, list or tensor; ``None``: none) as a list of ints."""
    return [] if value is None else [int(v) for v in torch.as_tensor(value).reshape(-1).tolist()]


def end_of_text(model: nn.Module) -> tuple[list[int], Optional[int]]:
    """The end-of-text ids and the pad id ``generate`` would use: ``generation_config``'s, else ``config``'s.

    The pad id falls back to the first end-of-text id, as in ``generate``; both are empty / ``None`` when the
    model names no end-of-text token.

    Parameters
    ----------
    model : nn.Module
        The causal LM.

    Returns
    -------
    tuple[list[int], Optional[int]]
        ``(eos_ids, pad_id)``: the end-of-text ids (empty when the model names none) and the
        pad id (else the first end-of-text id, else ``None``).
    """
    sources = [getattr(model, "generation_config", None), getattr(model, "config", None)]
    eos = next((ids for ids in (_token_set(getattr(c, "eos_token_id", None)) for c in sources) if ids), [])
    pad = next((int(p) for p in (getattr(c, "pad_token_id", None) for c in sources) if p is not None), None)
    return eos, (pad if pad is not None else (eos[0] if eos else None))


@torch.no_grad()
def greedy_continuation(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    steps: int,
    eos_token_id: Optional[Sequence[int]] = None,
    pad_token_id: Optional[int] = None,
    images: Optional[dict] = None,
    per_token: Optional[dict] = None,
    extend: Optional[Callable[[dict, Tensor], dict]] = None,
) -> Tensor:
    """Up to ``steps`` greedy tokens after left-padded prompts (B, P): (B, K), K ≤ ``steps``.

    The model runs in eval semantics (:func:`eval_semantics`; no dropout, its modes restored) and as found
    otherwise (:func:`lrp_core.runtime.guard.model_guard` undoes what its forward hooks change; a length-dependent
    rotary module starts fresh and is put back as found, :func:`lrp_core.runtime.own_forward.rotary_state_kept`).

    Rows of equal length run together and unpadded, so each row continues exactly as it would alone: the model
    never sees a padding position (Hugging Face's eager attention in float64 turns fully masked padding rows
    into NaN, and 0 × NaN reaches the real rows of a padded batch).

    Parameters
    ----------
    model : nn.Module
        The causal LM.
    input_ids : Tensor
        (B, P) left-padded prompt ids.
    attention_mask : Tensor
        (B, P) the prompts' attention mask, 0 at the padding.
    steps : int
        Number of greedy steps at most.
    eos_token_id : Optional[Sequence[int]], optional
        End-of-text ids: a row stops after writing one (it is kept), and its later columns hold ``pad_token_id``
        (default: the first end-of-text id), as ``generate`` pads them; K is the number of steps of the longest
        row. ``None`` / empty: no stopping, K = ``steps``.
    pad_token_id : Optional[int], optional
        The id written after a row has stopped.
    images : Optional[dict], optional
        A vision-language model's image inputs (``pixel_values``, …), each (B·k, …): the k images of every row,
        in row order, as the processor stacks them; passed unchanged with their rows at every step.
    per_token : Optional[dict], optional
        A vision-language model's other per-token entries (``token_type_ids``, …), each (B, P) left-padded as the
        prompts; extended by ``extend`` for the tokens written (needed with them).
    extend : Optional[Callable[[dict, Tensor], dict]], optional
        (entries each (b, T), new tokens (b, n)) -> entries each (b, T + n), e.g.
        :meth:`lrp_core.adapters.vlm.VLMAdapter.extend_for_generation`.

    Returns
    -------
    Tensor
        (B, K) the tokens written, on the device of ``input_ids``.
    """
    if per_token and extend is None:
        raise InputError(
            "per-token entries (per_token=) need extend=, the function that appends a written token's "
            "values to them (a VLM adapter's extend_for_generation)"
        )
    eos = torch.tensor(sorted(set(eos_token_id or ())), dtype=torch.long, device=input_ids.device)
    if pad_token_id is None:
        pad_token_id = int(eos[0]) if len(eos) else 0  # without an end-of-text id every column is written
    out = torch.full((input_ids.shape[0], steps), pad_token_id, dtype=torch.long, device=input_ids.device)
    taken = 0
    lengths = attention_mask.sum(1)
    with eval_semantics(model), model_guard(unwrap(model)), _no_new_observers(unwrap(model)), _rotary(unwrap(model)):
        for n in lengths.unique().tolist():
            rows = (lengths == n).nonzero().squeeze(1)
            ids = input_ids[rows, input_ids.shape[1] - n :]  # left-padded: the real tokens are the last n columns
            tokens = {name: v[rows, v.shape[1] - n :] for name, v in (per_token or {}).items()}
            for k in range(steps):
                seen = image_rows(images, rows, input_ids.shape[0])
                nxt = model(input_ids=ids, attention_mask=torch.ones_like(ids), **seen, **tokens).logits[:, -1]
                nxt = nxt.argmax(-1)
                out[rows, k] = nxt
                taken = max(taken, k + 1)
                if len(eos):  # rows that wrote an end-of-text token stop here
                    going = ~torch.isin(nxt, eos)
                    rows, ids, nxt = rows[going], ids[going], nxt[going]
                    tokens = {name: v[going] for name, v in tokens.items()}
                    if not len(rows):
                        break
                ids = torch.cat([ids, nxt[:, None]], 1)
                if tokens and extend is not None:  # always given with per_token (checked above)
                    tokens = extend(tokens, nxt[:, None])
    return out[:, :taken] if len(eos) else out


def image_rows(images: Optional[dict], rows: Tensor, batch: int) -> dict:
    """The image inputs of some rows, k images per row in row order.

    Parameters
    ----------
    images : Optional[dict]
        The image inputs, each (B·k, …); ``None``: none.
    rows : Tensor
        (R,) the rows taken.
    batch : int
        B, the rows the inputs hold.

    Returns
    -------
    dict
        Each input at the rows' images, (R·k, …).
    """
    out = {}
    for name, value in (images or {}).items():
        k = value.shape[0] // batch
        idx = (rows.to(value.device)[:, None] * k + torch.arange(k, device=value.device)[None, :]).reshape(-1)
        out[name] = value[idx]
    return out


def greedy_steps(
    model: nn.Module,
    adapter: Any,
    ids: Tensor,
    mask: Tensor,
    K: int,
    stop_at_eos: bool,
    images: dict,
    per_token: dict,
) -> tuple[Tensor, Tensor]:
    """The greedy continuation of the prompts and the tokens each row wrote.

    Parameters
    ----------
    model : nn.Module
        The causal LM (or vision-language model).
    adapter : Any
        Its adapter (a vision-language model's extends the per-token entries for each written token).
    ids, mask : Tensor
        (B, P) the left-padded prompt ids and attention mask.
    K : int
        The greedy steps at most.
    stop_at_eos : bool
        Whether a row stops after writing an end-of-text token.
    images, per_token : dict
        A vision-language model's image entries (B·k, …) and per-token entries (B, P); ``{}`` for a text model.

    Returns
    -------
    tuple[Tensor, Tensor]
        ``(continuation (B, K'), written (B,))``: K' ≤ K (the longest row), and the tokens each row wrote, up
        to its first end-of-text token included.
    """
    eos, pad = end_of_text(unwrap(model)) if stop_at_eos else ([], None)
    gen = greedy_continuation(
        model,
        ids,
        mask,
        K,
        eos_token_id=eos,
        pad_token_id=pad,
        images=images,
        per_token=per_token,
        extend=getattr(adapter, "extend_for_generation", None),
    )
    return gen, steps_written(gen, eos)


def steps_written(gen: Tensor, eos: Sequence[int]) -> Tensor:
    """The tokens each row of a greedy continuation wrote: up to its first end-of-text id, included.

    Parameters
    ----------
    gen : Tensor
        (B, K) the continuation.
    eos : Sequence[int]
        The end-of-text ids.

    Returns
    -------
    Tensor
        (B,) long, on the CPU.
    """
    K = gen.shape[1]
    hit = torch.isin(gen, torch.tensor(list(eos), dtype=torch.long, device=gen.device))
    first = torch.where(hit, torch.arange(K, device=gen.device)[None, :], K).min(1).values
    return torch.where(first < K, first + 1, K).cpu()


__all__ = ["end_of_text", "greedy_continuation", "greedy_steps", "image_rows", "steps_written"]

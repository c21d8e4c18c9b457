"""Explaining what a language model writes: one relevance map per generated token.

For a prompt of P tokens and a continuation ``g_1 … g_K`` (the model's greedy
choice, or given), step k explains the logit of ``g_k`` at the last position
of the prefix "prompt + g_1 … g_{k−1}" (teacher forcing): a row of P+K−1
scores, zero from the prefix's end on (``docs/METHODS.md`` §2c, Generation). A
step may be a contrast: ``y_{g_k} − y_{a_k}``, "this token rather than that".

All steps of all prompts are explained in one :func:`lrp_core.explain` call:
each (prompt, step) is a row over the whole sequence, read at its own
position with its own target — the causal mask keeps later tokens out of every
map, so the row equals the explanation of the prefix alone (up to round-off).

The greedy steps run the model in eval semantics (no dropout), as every explanation does, and stop at the
end-of-text token like ``generate``; the ids, the positions and every token id given are checked before any
step is computed.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any, Callable, Optional, Sequence, Union

import torch
from torch import Tensor, nn

from ..errors import InputError, UnsupportedModelError
from ..runtime.guard import eval_semantics, model_guard
from ..runtime.own_forward import no_new_observers as _no_new_observers
from ..runtime.own_forward import rotary_state_kept as _rotary
from ..runtime.wrappers import unwrap
from .call import Contrast
from .generation_result import GenerationExplanation
from .options import Method

TokenLike = Union[int, str]


def _left_padded(ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """The same rows re-padded on the left (so every prompt ends at the last column)."""
    order = torch.argsort(mask.to(torch.int8), dim=1, stable=True)  # padding (0) first, real tokens in order
    return ids.gather(1, order), mask.gather(1, order)


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
                seen = _image_rows(images, rows, input_ids.shape[0])
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


def _image_rows(images: Optional[dict], rows: Tensor, batch: int) -> dict:
    """The image inputs (each (B·k, …), k images per row in row order) of the rows ``rows``: (len(rows)·k, …)."""
    out = {}
    for name, value in (images or {}).items():
        k = value.shape[0] // batch
        idx = (rows.to(value.device)[:, None] * k + torch.arange(k, device=value.device)[None, :]).reshape(-1)
        out[name] = value[idx]
    return out


def _vlm_prompts(adapter: Any, tokenizer: Any, prompts: Any) -> tuple[Any, dict, dict, dict]:
    """A vision-language model's prompts: (the tokenizer, the text entries, the image entries (B·k, …), the other
    per-token entries (B, P), re-padded on the left as :func:`_prompts` re-pads the ids).

    ``explain_generation(vlm, processor_output)`` is accepted (the tokenizer left out), and a processor gives its
    tokenizer. The processor's output is checked as :func:`lrp_core.explain` checks it. A family whose processor
    gives per-token entries the loop does not extend is refused (``VLMAdapter.generation_refused``); the ones it
    extends are ``VLMAdapter.generated_token_values``.
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


def _token_ids(tokenizer: Any, values: Any, what: str) -> list:
    """Token ids from ids or single-token strings (``None`` kept)."""
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


def _check_ids(ids: Sequence[Sequence[Optional[int]]], vocab: int, what: str) -> None:
    """Every id (rows of ints; ``None``: no token) in ``0 … vocab − 1``, else an InputError naming the others.

    Checked on Python ints, before any tensor is made: an id too large for int64 is named, not an OverflowError.
    """
    bad = sorted({v for row in ids for v in row if v is not None and not 0 <= v < vocab})
    if bad:
        raise InputError(f"{what} ids must lie in 0 … {vocab - 1} (the model's vocabulary), got {bad[:5]}")


def _step_groups(negative: Optional[Tensor], steps: int, size: int) -> list[list[int]]:
    """Steps in runs of at most ``size`` that agree on having a contrast (one explain call each)."""
    has = [negative is not None and bool((negative[:, k] >= 0).all()) for k in range(steps)]
    if negative is not None and any(bool((negative[:, k] >= 0).any()) and not has[k] for k in range(steps)):
        raise InputError("within one step, give a contrast for every prompt or for none")
    groups: list[list[int]] = []
    for k in range(steps):
        if groups and len(groups[-1]) < size and has[groups[-1][0]] == has[k]:
            groups[-1].append(k)
        else:
            groups.append([k])
    return groups


class _StepBar:
    """A progress bar over the steps (tqdm, notebook-aware), or nothing."""

    def __init__(self, total: int, show: bool, method: str):
        self.bar = None
        if show:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc=f"{method}: steps", unit="step", leave=False)

    def __enter__(self) -> "_StepBar":
        return self

    def update(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.close()


def _prompts(tokenizer: Any, prompts: Any) -> tuple[Tensor, Tensor]:
    """Prompts (a string, a list of strings, or a tokenizer dict) -> left-padded (input_ids, attention_mask)."""
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
    return _left_padded(ids.long(), mask.long())


def _continuation(
    tokenizer: Any, continuation: Any, batch: int, steps: Optional[int], vocab: Optional[int] = None
) -> Tensor:
    """A given continuation: a string / token ids for every prompt, or one per prompt -> (B, K); each id checked
    against the vocabulary size ``vocab`` when given."""
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
            ids.append(_token_ids(tokenizer, flat, "continuation"))
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
        _check_ids(ids, vocab, "continuation")
    return torch.tensor(ids, dtype=torch.long)


def _contrasts(tokenizer: Any, contrast: Any, batch: int, steps: int, vocab: int) -> Optional[Tensor]:
    """Per-step contrasted token ids (B, K), −1 where a step has none; ``None`` without contrasts."""
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
    ids = [_token_ids(tokenizer, row, "contrast") for row in grid]
    _check_ids(ids, vocab, "contrast")  # before −1 stands for "none": a negative id is an error, not "none"
    return torch.tensor([[-1 if v is None else v for v in row] for row in ids], dtype=torch.long)


def _language_model(model: nn.Module) -> tuple[Any, int]:
    """(the engine's adapter of a causal LM or a vision-language model, its vocabulary size V = the LM head's
    outputs); others refused."""
    from ..adapters import get_adapter

    adapter = get_adapter(model)
    inner: Any = unwrap(model)
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    if not adapter.is_decoder or not isinstance(head, nn.Linear):
        raise UnsupportedModelError(
            f"explain_generation explains what a causal language model writes (a decoder "
            f"with an LM head, e.g. LlamaForCausalLM); {type(inner).__name__} has none"
        )
    return adapter, int(head.out_features)


def _check_method(method: str, options: dict, contrast: Any, adapter: Any) -> None:
    """The method, its options and a contrast checked as each step's :func:`lrp_core.explain` call will check
    them, before the first step; ``position`` and ``target`` are set per step and cannot be given."""
    from . import registry
    from .options import SHARED_OPTIONS, Shared

    spec = registry.get(method)
    if method in adapter.refused_methods:  # as explain refuses it, before any step is generated
        runs = [m for m in registry.METHODS if m not in adapter.refused_methods]
        raise UnsupportedModelError(
            f"method {method!r} is not defined on {type(adapter.model).__name__}: "
            f"{adapter.refused_methods[method]}. Methods that run on it: {', '.join(runs)}"
        )
    fixed = sorted({"position", "target"} & set(options))
    if fixed:
        raise InputError(
            f"explain_generation sets {fixed} itself (each step is read at its own position, with the "
            "generated token as target); use continuation= and contrast= instead"
        )
    shared = {k: v for k, v in options.items() if k in SHARED_OPTIONS}
    registry.bound(method, {k: v for k, v in options.items() if k not in shared}, adapter)
    Shared(**shared)
    if contrast is not None and spec.class_agnostic:
        raise InputError(
            f"{method!r} does not depend on the target token, so a contrast explains nothing; use a "
            "class-sensitive method"
        )


def explain_generation(
    model: nn.Module,
    tokenizer: Any,
    prompts: Any = None,
    method: Union[str, Method] = "attnlrp",
    max_new_tokens: Optional[int] = None,
    continuation: Any = None,
    contrast: Any = None,
    progress: Optional[bool] = None,
    step_batch: int = 8,
    stop_at_eos: bool = True,
    **options: Any,
) -> GenerationExplanation:
    """Explain each token a causal LM writes after ``prompts`` (``docs/METHODS.md`` §2c, Generation).

    Everything given is checked before any step is computed: the prompts' ids, prompt length + steps against
    the model's positions, and the continuation's and contrasts' token ids against its vocabulary. The greedy
    steps run the model in eval semantics (no dropout; its modes are restored afterwards), as every explanation
    is computed.

    Parameters
    ----------
    model : nn.Module
        a causal LM the engine supports (``LlamaForCausalLM``, ``GPT2LMHeadModel``, …), or a vision-language
        model (``LlavaForConditionalGeneration``, ``docs/METHODS.md`` §2g, Generation).
    tokenizer : Any
        its tokenizer (text prompts, pieces for the pictures); may be ``None`` for id inputs. A
        vision-language model: its tokenizer or processor, or the processor's output itself
        (``explain_generation(vlm, processor_output)``).
    prompts : Any
        a string, a list of strings, or a tokenizer dict (padded on either side). A vision-language model:
        the processor's output (``input_ids``, ``attention_mask``, ``pixel_values``); the images stay the same
        at every step, and their placeholder tokens are part of every prefix.
    method : str or Method, optional
        any method of :func:`lrp_core.explain` that takes a target, by name (its options as keywords) or as an
        object (``AttnLRP(composite=...)``).
    max_new_tokens : Optional[int], optional
        K, the greedy steps at most (default 1 without a continuation). The model must have
        positions for P + K − 1 tokens (P: the padded prompt width).
    continuation : Any, optional
        the tokens to explain instead of the greedy ones (text or ids; one for all prompts or one
        per prompt); all are explained, end-of-text or not.
    contrast : Any, optional
        per step the token to contrast with (``y_{g_k} − y_{a_k}``): one for every step, a list per step
        (``None`` for none) or one such list per prompt; ids in ``0 … V − 1``.
    progress : Optional[bool], optional
        a progress bar over the steps (default: when there are 8 or more).
    step_batch : int, optional
        how many steps are explained in one call (their rows batched; memory grows with it).
    stop_at_eos : bool, optional
        greedy only: a row stops after writing an end-of-text token (``generation_config`` /
        ``config.eos_token_id``, one id or a list), as ``generate`` stops; the result has as many steps as
        the longest row, and a row that stopped earlier is padded (see :class:`GenerationExplanation`).
        ``False``: every row writes ``max_new_tokens`` tokens.
    **options
        the method's options (see ``lrp_core.METHODS``).

    Returns
    -------
    GenerationExplanation
        ``scores`` (B, K, P+K−1), with ``.show()`` and ``.save_html(path)``; a vision-language model adds
        ``image_tokens``, ``patch_map()`` (B, K, h, w), ``upsample()`` (B, K, H, W) and, where the method
        reaches the pixels, ``pixels`` (B, K, H, W).

    Raises
    ------
    InputError
        If ``step_batch`` or ``max_new_tokens`` is not a positive integer,
        ``stop_at_eos`` is not a bool, or the prompts, lengths, continuation or
        contrasts do not fit the model (checked before any step is computed).
    """
    _check_step_options(step_batch, stop_at_eos)
    if isinstance(method, Method):  # an object: its name, and its fields as the keywords of each step's call
        options = {**method.keywords(), **options}
        method = method.name
    adapter, vocab = _language_model(model)
    _check_method(method, options, contrast, adapter)
    tokenizer, ids, mask, images, per_token = _model_prompts(adapter, tokenizer, prompts)
    B, P = ids.shape
    gen, K = _given_steps(tokenizer, continuation, B, max_new_tokens, vocab)
    _check_positions(adapter, P, K)
    adapter.check_inputs({"input_ids": ids, "attention_mask": mask, **images, **per_token})  # ids vs the vocabulary
    negative = _contrasts(tokenizer, contrast, B, K, vocab)
    # a rotary table chosen by the length of the call (Phi-3's longrope, dynamic NTK): each step alone, on its prefix
    cut = bool(getattr(getattr(adapter, "text", adapter), "length_dependent", False))
    groups = _step_groups(negative, K, 1 if cut else step_batch)  # checked before the steps are computed
    if gen is None:
        gen, written = _greedy_steps(model, adapter, ids, mask, K, stop_at_eos, images, per_token)
        if gen.shape[1] < K:  # every row stopped early: the steps all rows skipped go
            K, negative, groups = _drop_skipped_steps(gen.shape[1], negative, groups)
    else:
        written = torch.full((B,), K, dtype=torch.long)
    full_ids = torch.cat([ids, gen.to(ids.device)], 1)  # (B, P+K)
    active = torch.arange(K)[None, :] < written[:, None]  # (B, K): the steps each row took
    full_mask = torch.cat([mask, active.to(mask)], 1)
    inputs = _step_inputs(adapter, full_ids, mask, gen, per_token)
    if images:
        options = {**options, "image_token_id": _image_token(adapter, gen)}
    scores, logits, sources, probabilities, seen = _explain_steps(
        model, method, inputs, gen, negative, groups, active, P, progress, options, images, cut
    )
    if negative is not None:
        negative = torch.where(active, negative, -1)  # steps after a row's end-of-text token are not explained
    id_to_token, pieces = _token_pieces(tokenizer, full_ids, negative)
    return GenerationExplanation(
        method=method,
        input_ids=full_ids,
        attention_mask=full_mask,
        prompt_length=P,
        scores=scores,
        tokens=pieces,
        targets=gen,
        logits=logits,
        contrasts=negative,
        options={"id_to_token": id_to_token, "continuation_given": continuation is not None, **options},
        sources=sources,
        probabilities=probabilities,
        **seen,
    )


def _check_step_options(step_batch: Any, stop_at_eos: Any) -> None:
    """``step_batch`` checked a positive integer and ``stop_at_eos`` a bool.

    Parameters
    ----------
    step_batch : Any
        How many steps one :func:`lrp_core.explain` call explains.
    stop_at_eos : Any
        Whether greedy rows stop at an end-of-text token.

    Raises
    ------
    InputError
        If either is not of its kind.
    """
    if isinstance(step_batch, bool) or not isinstance(step_batch, int) or step_batch < 1:
        raise InputError(f"step_batch must be a positive integer, got {step_batch!r}")
    if not isinstance(stop_at_eos, bool):
        raise InputError(f"stop_at_eos must be True or False, got {stop_at_eos!r}")


def _model_prompts(adapter: Any, tokenizer: Any, prompts: Any) -> tuple[Any, Tensor, Tensor, dict, dict]:
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
    from ..adapters.vlm import VLMAdapter

    images: dict = {}
    per_token: dict = {}
    if isinstance(adapter, VLMAdapter):
        tokenizer, prompts, images, per_token = _vlm_prompts(adapter, tokenizer, prompts)
    ids, mask = _prompts(tokenizer, prompts)
    return tokenizer, ids, mask, images, per_token


def _greedy_steps(
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
    return gen, _steps_written(gen, eos)


def _drop_skipped_steps(
    K: int, negative: Optional[Tensor], groups: list[list[int]]
) -> tuple[int, Optional[Tensor], list[list[int]]]:
    """The contrasts and step groups without the steps from ``K`` on, which every row skipped.

    Parameters
    ----------
    K : int
        The steps the longest row took.
    negative : Optional[Tensor]
        (B, K₀) the contrasted ids (−1: none), or ``None``.
    groups : list[list[int]]
        The steps of each :func:`lrp_core.explain` call.

    Returns
    -------
    tuple[int, Optional[Tensor], list[list[int]]]
        ``(K, negative (B, K) or None, groups)``, empty groups left out.
    """
    negative = None if negative is None else negative[:, :K]
    groups = [g for g in ([k for k in group if k < K] for group in groups) if g]
    return K, negative, groups


def _step_inputs(adapter: Any, full_ids: Tensor, mask: Tensor, gen: Tensor, per_token: dict) -> dict:
    """The explained rows' inputs: the prompts and the continuation without its last token.

    The rows see every written column: causal attention keeps the later ones out of each map.

    Parameters
    ----------
    adapter : Any
        The model's adapter (a vision-language model's extends its per-token entries).
    full_ids : Tensor
        (B, P+K) the prompts and the continuation.
    mask : Tensor
        (B, P) the prompts' attention mask.
    gen : Tensor
        (B, K) the continuation.
    per_token : dict
        A vision-language model's per-token entries (B, P); ``{}`` for a text model.

    Returns
    -------
    dict
        ``input_ids`` and ``attention_mask`` (B, P+K−1) and any per-token entries extended to that width.
    """
    inputs = {"input_ids": full_ids[:, :-1], "attention_mask": torch.cat([mask, torch.ones_like(gen)], 1)[:, :-1]}
    if per_token:  # each written token with the entries the model's generate gives it
        inputs.update(adapter.extend_for_generation(per_token, gen[:, :-1].to(full_ids.device)))
    return inputs


def _token_pieces(tokenizer: Any, full_ids: Tensor, negative: Optional[Tensor]) -> tuple[dict, list[list[str]]]:
    """The pieces of the ids shown: a map of every id used, and each row's pieces.

    Parameters
    ----------
    tokenizer : Any
        The tokenizer, or ``None`` (the ids are shown as numbers, and the map is empty).
    full_ids : Tensor
        (B, P+K) the prompts and continuation.
    negative : Optional[Tensor]
        (B, K) the contrasted ids (−1: none), or ``None``.

    Returns
    -------
    tuple[dict, list[list[str]]]
        ``(id → piece for every id and contrast used, the B rows of P+K pieces)``.
    """
    used = sorted(
        set(full_ids.flatten().tolist()) | set([] if negative is None else negative.flatten().tolist()) - {-1}
    )
    id_to_token = {} if tokenizer is None else dict(zip(used, tokenizer.convert_ids_to_tokens(used)))
    pieces = [
        [str(t) for t in (tokenizer.convert_ids_to_tokens(r.tolist()) if tokenizer is not None else r.tolist())]
        for r in full_ids
    ]
    return id_to_token, pieces


def _given_steps(
    tokenizer: Any, continuation: Any, B: int, max_new_tokens: Optional[int], vocab: int
) -> tuple[Optional[Tensor], int]:
    """The continuation (B, K) to explain, or ``None`` for greedy steps, and K.

    Parameters
    ----------
    tokenizer : Any
        The tokenizer (text continuations), or ``None``.
    continuation : Any
        The given tokens, or ``None``: K = ``max_new_tokens`` (default 1) greedy steps.
    B : int
        The prompts.
    max_new_tokens : int, optional
        K for greedy steps; with a continuation, the most of its tokens explained.
    vocab : int
        The vocabulary size the ids are checked against.

    Returns
    -------
    tuple[Optional[Tensor], int]
        ``(continuation (B, K) or None, K)``.
    """
    if continuation is not None:
        gen = _continuation(tokenizer, continuation, B, max_new_tokens, vocab)
        return gen, gen.shape[1]
    K = 1 if max_new_tokens is None else max_new_tokens
    if isinstance(K, bool) or not isinstance(K, int) or K < 1:
        raise InputError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    return None, K


def _image_token(adapter: Any, gen: Tensor) -> int:
    """A vision-language model's image token id, checked absent from the continuation (B, K) before its last
    step (it would be one more image token than the images have features)."""
    image_id = int(adapter.image_token_id)
    if bool((gen[:, :-1] == image_id).any()):
        raise InputError(
            f"the continuation holds the image token (id {image_id}) before its last step: the image "
            "tokens of the prompt are the only ones its images fill; give another continuation"
        )
    return image_id


def _check_positions(adapter: Any, P: int, K: int) -> None:
    """Prompts P tokens wide and K steps: the last step reads P + K − 1 tokens, which the model must have."""
    limit = getattr(getattr(adapter, "text", adapter), "max_length", None)  # a VLM: its language model's
    if limit is not None and P + K - 1 > limit:
        raise InputError(
            f"the prompts ({P} tokens) and {K} new tokens need P + K − 1 = {P + K - 1} positions; "
            f"{type(adapter.model).__name__} has {limit} (max_position_embeddings): "
            f"shorten the prompts or write at most {limit - P + 1} tokens"
        )


def _explain_steps(
    model: nn.Module,
    method: str,
    inputs: dict,
    gen: Tensor,
    negative: Optional[Tensor],
    groups: list[list[int]],
    active: Tensor,
    P: int,
    progress: Optional[bool],
    options: dict,
    images: Optional[dict] = None,
    cut: bool = False,
) -> tuple[Tensor, Tensor, Optional[Tensor], Tensor, dict]:
    """The maps (B, K, P+K−1), explained logits (B, K), with ``sources=`` source scores (B, K, S), the
    model's probabilities of the explained tokens (B, K) of the steps each row took (``active`` (B, K)), and a
    vision-language model's image fields (``pixels`` (B, K, H, W) or ``None``, ``grid``, ``image_size``,
    ``image_tokens`` (B, k·h·w); empty for a text model). ``images``: its image inputs (B·k, …), the same at
    every step.

    ``inputs``: prompts and continuation without its last token (B, P+K−1); each group of steps is one
    :func:`lrp_core.explain` call over its (step, prompt) pairs, each read at its own position, with its
    prompt's sources (spans count from the row's first real token, so the left padding does not move them).
    ``cut``: every group is one step k, its rows cut to the prefix (P + k tokens) — for a model whose rotary
    tables depend on the length of the call (``longrope``, ``dynamic``), which the later columns would change.
    """
    from ..api import explain

    B, K = gen.shape
    scores = torch.zeros(B, K, P + K - 1, dtype=torch.float64)
    logits = torch.zeros(B, K, dtype=torch.float64)
    probabilities = torch.zeros(B, K, dtype=torch.float64)
    spans = _source_spans(options.get("sources"), B)
    sources = None if spans is None else torch.zeros(B, K, spans.shape[1], dtype=torch.float64)
    options = {k: v for k, v in options.items() if k not in ("sources", "image_token_id")}
    seen: dict = {}
    with _StepBar(K, progress or (progress is None and K >= 8), method) as bar:
        for steps in groups:  # steps as rows: (step, prompt) pairs, each read at its own position
            pairs = [(k, b) for k in steps for b in range(B) if active[b, k]]
            ks, bs = torch.tensor([k for k, _ in pairs]), torch.tensor([b for _, b in pairs])
            width = P + steps[0] if cut else P + K - 1  # a cut group is one step: its prefix only
            rows = {
                **{name: v[bs.to(v.device), :width] for name, v in inputs.items()},
                **_image_rows(images, bs, B),
            }
            t = gen[bs, ks].tolist()
            target: Any = t if negative is None or negative[0, steps[0]] < 0 else Contrast(t, negative[bs, ks].tolist())
            row_spans = None if spans is None else spans.expand(B, -1, -1)[bs]
            exp = explain(
                model, rows, method=method, target=target, position=(P - 1 + ks).tolist(), sources=row_spans, **options
            )
            if sources is not None and exp.sources is not None:
                sources[bs, ks] = exp.sources.detach().to(torch.float64).cpu()
            got = torch.nn.functional.pad(exp.scores.detach().to(torch.float64).cpu(), (0, P + K - 1 - width))
            lg = exp.logits.detach().to(torch.float64).cpu()
            # zero after each step's prefix (the causal mask keeps those positions out already)
            got[torch.arange(P + K - 1)[None, :] >= (P + ks)[:, None]] = 0.0
            scores[bs, ks] = got
            _keep_image_fields(exp, seen, bs, ks, B, K)
            picked = lg.gather(1, gen[bs, ks].cpu()[:, None])[:, 0]
            probabilities[bs, ks] = lg.softmax(-1).gather(1, gen[bs, ks].cpu()[:, None])[:, 0]
            if negative is not None and negative[0, steps[0]] >= 0:
                picked = picked - lg.gather(1, negative[bs, ks][:, None])[:, 0]
            logits[bs, ks] = picked
            bar.update(len(steps))
    return scores, logits, sources, probabilities, seen


def _source_spans(sources: Any, B: int) -> Optional[Tensor]:
    """The ``sources=`` option as spans, checked to give one list of spans for all prompts or one per prompt.

    Parameters
    ----------
    sources : Any
        The option's value (see :func:`lrp_core.sources.as_spans`), or ``None``.
    B : int
        The prompts.

    Returns
    -------
    Optional[Tensor]
        (1 or B, S, 2) the spans, or ``None`` without sources.

    Raises
    ------
    InputError
        If the spans are given for another number of prompts.
    """
    from ..sources import as_spans

    spans = None if sources is None else as_spans(sources)
    if spans is not None and spans.shape[0] not in (1, B):
        raise InputError(
            f"sources gives spans for {spans.shape[0]} prompts; there are {B}: give one list of spans "
            "for every prompt, or one per prompt"
        )
    return spans


def _keep_image_fields(exp: Any, seen: dict, bs: Tensor, ks: Tensor, B: int, K: int) -> None:
    """A vision-language model's image fields of one group of steps, written into ``seen``.

    The first group adds ``grid``, ``image_size``, ``image_tokens`` (B, k·h·w) (the same image tokens at
    every step) and, where the method reaches the pixels, ``pixels`` (B, K, H, W); a text model's
    explanation has none and leaves ``seen`` as it is.

    Parameters
    ----------
    exp : Any
        The group's explanation, one row per (step, prompt) pair.
    seen : dict
        The image fields gathered so far (updated in place).
    bs, ks : Tensor
        (N,) each row's prompt and step.
    B, K : int
        The prompts and the steps.
    """
    if exp.image_tokens is not None:  # a vision-language model: the same image tokens at every step
        if "image_tokens" not in seen:
            image_tokens = torch.zeros(B, exp.image_tokens.shape[1], dtype=torch.long)
            seen.update(grid=exp.grid, image_size=exp.image_size, image_tokens=image_tokens)
        seen["image_tokens"][bs] = exp.image_tokens.cpu()
    if exp.pixels is not None:
        if "pixels" not in seen:
            seen["pixels"] = torch.zeros(B, K, *exp.pixels.shape[1:], dtype=torch.float64)
        seen["pixels"][bs, ks] = exp.pixels.detach().to(torch.float64).cpu()


def _steps_written(gen: Tensor, eos: Sequence[int]) -> Tensor:
    """(B,) the tokens each row of a greedy continuation (B, K) wrote: up to its first end-of-text id, included."""
    K = gen.shape[1]
    hit = torch.isin(gen, torch.tensor(list(eos), dtype=torch.long, device=gen.device))
    first = torch.where(hit, torch.arange(K, device=gen.device)[None, :], K).min(1).values
    return torch.where(first < K, first + 1, K).cpu()


__all__ = ["explain_generation", "GenerationExplanation", "greedy_continuation", "end_of_text"]

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

from typing import Any, Optional, Union

import torch
from torch import Tensor, nn

from .api import explain
from .errors import InputError, UnsupportedModelError, raised_at_the_call
from .methods.call import Contrast
from .methods.continuation import greedy_steps, image_rows
from .methods.generation_result import GenerationExplanation
from .methods.options import Method
from .methods.prompts import contrasts, given_continuation, model_prompts
from .runtime.wrappers import unwrap


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


def _language_model(model: nn.Module) -> tuple[Any, int]:
    """(the engine's adapter of a causal LM or a vision-language model, its vocabulary size V = the LM head's
    outputs); others refused."""
    from .adapters import get_adapter

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
    from .methods import registry
    from .methods.options import SHARED_OPTIONS, Shared

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


@raised_at_the_call
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
        (an encoder-decoder: :class:`~lrp_core.seq2seq_generation.Seq2SeqGenerationExplanation`, ``source``
        (B, K, S) and ``prefix`` (B, K, K), the prompts its sources)
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
    method, options = _method_options(method, options, step_batch, stop_at_eos)
    adapter, vocab = _language_model(model)
    _check_method(method, options, contrast, adapter)
    if adapter.is_seq2seq:  # an encoder-decoder: the prompts are its sources; a Seq2SeqGenerationExplanation
        steps = (max_new_tokens, continuation, contrast, stop_at_eos, step_batch)
        return _encoder_decoder(model, tokenizer, prompts, method, steps, options)
    tokenizer, ids, mask, images, per_token = model_prompts(adapter, tokenizer, prompts)
    B, P = ids.shape
    gen, K = _given_steps(tokenizer, continuation, B, max_new_tokens, vocab)
    _check_positions(adapter, P, K)
    adapter.check_inputs({"input_ids": ids, "attention_mask": mask, **images, **per_token})  # ids vs the vocabulary
    negative = contrasts(tokenizer, contrast, B, K, vocab)
    # a rotary table chosen by the length of the call (Phi-3's longrope, dynamic NTK): each step alone, on its prefix
    cut = bool(getattr(getattr(adapter, "text", adapter), "length_dependent", False))
    groups = _step_groups(negative, K, 1 if cut else step_batch)  # checked before the steps are computed
    if gen is None:
        gen, written = greedy_steps(model, adapter, ids, mask, K, stop_at_eos, images, per_token)
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
    negative = None if negative is None else torch.where(active, negative, -1)  # none after a row's end of text
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


def _method_options(method: Union[str, Method], options: dict, step_batch: Any, stop_at_eos: Any) -> tuple[str, dict]:
    """The method's name and the keywords of each step's call (a method object: its fields), the step options
    checked (:func:`_check_step_options`)."""
    _check_step_options(step_batch, stop_at_eos)
    if isinstance(method, Method):
        return method.name, {**method.keywords(), **options}
    return method, options


def _encoder_decoder(model: nn.Module, tokenizer: Any, prompts: Any, method: str, steps: tuple, options: dict) -> Any:
    """An encoder-decoder's generation explained (:mod:`lrp_core.seq2seq_generation`); ``steps``: (max_new_tokens,
    continuation, contrast, stop_at_eos, step_batch) as :func:`explain_generation` takes them."""
    from .seq2seq_generation import explain_seq2seq_generation

    max_new_tokens, continuation, contrast, stop_at_eos, step_batch = steps
    if contrast is not None:
        raise InputError("contrast= is not defined for an encoder-decoder's generation yet: explain each step")
    return explain_seq2seq_generation(
        model, tokenizer, prompts, method, max_new_tokens, continuation, stop_at_eos, step_batch, options
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
        gen = given_continuation(tokenizer, continuation, B, max_new_tokens, vocab)
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
                **image_rows(images, bs, B),
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
    from .sources import as_spans

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


__all__ = ["explain_generation", "GenerationExplanation"]

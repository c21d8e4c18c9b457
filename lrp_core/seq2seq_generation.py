"""Explaining what an encoder-decoder writes: one map per generated token, the source fixed (docs/METHODS.md §2i).

For a source and a continuation ``g_1 … g_K`` (the model's greedy choice, or given), step k explains the logit
of ``g_k`` at the last position of the decoder prefix ``start, g_1 … g_{k−1}`` (teacher forcing): the scores
over the source (``source`` (B, K, S)) and over the prefix (``prefix`` (B, K, K): column j is prefix token j,
``start`` first; zero from column k on). All steps of all sources are explained in one :func:`lrp_core.explain`
call per group of steps: each (source, step) pair is a row with the whole prefix, read at its own position with
its own target — the causal mask keeps later prefix tokens out of every map, so a row equals the explanation of
its prefix alone.

:func:`lrp_core.explain_generation` calls this for an encoder-decoder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import Tensor, nn

from .api import explain
from .errors import InputError
from .methods.continuation import end_of_text
from .methods.prompts import given_continuation, text_prompts
from .runtime.own_forward import own_forward
from .runtime.wrappers import unwrap


@dataclass
class Seq2SeqGenerationExplanation:
    """Relevance maps of an encoder-decoder's continuation, one per step, the source fixed.

    Attributes:
        method: the method used.
        input_ids, attention_mask: (B, S) the source.
        decoder_input_ids: (B, K) the prefix of the last step: the start token, then ``g_1 … g_{K−1}``.
        targets: (B, K) the explained tokens ``g_k``; after a row's end-of-text token the pad id.
        source: (B, K, S) step k's scores over the source (padding 0).
        prefix: (B, K, K) step k's scores over the prefix (columns from k + 1 on, and steps not taken, 0).
        logits: (B, K) the explained logit at each step; probabilities: (B, K) the model's probability of it.
        steps: (B,) the steps each row took (greedy with ``stop_at_eos``: up to its end-of-text token).
        options: the method's options.
    """

    method: str
    input_ids: Tensor
    attention_mask: Tensor
    decoder_input_ids: Tensor
    targets: Tensor
    source: Tensor
    prefix: Tensor
    logits: Tensor
    probabilities: Tensor
    steps: Tensor
    options: dict = field(default_factory=dict)

    @property
    def scores(self) -> Tensor:
        """(B, K, S + K) each step's source scores, then its prefix scores."""
        return torch.cat([self.source, self.prefix], dim=-1)


def explain_seq2seq_generation(
    model: nn.Module,
    tokenizer: Any,
    prompts: Any,
    method: str,
    max_new_tokens: Optional[int],
    continuation: Any,
    stop_at_eos: bool,
    step_batch: int,
    options: dict,
) -> Seq2SeqGenerationExplanation:
    """:func:`lrp_core.explain_generation` for an encoder-decoder: ``prompts`` are the sources (strings with the
    tokenizer, or a tokenizer dict with ``input_ids`` / ``attention_mask``)."""
    inner: Any = unwrap(model)
    ids, mask = _sources(tokenizer, prompts)
    start = getattr(inner.config, "decoder_start_token_id", None)
    if start is None:
        raise InputError(f"{type(inner).__name__}'s config names no decoder_start_token_id to start the prefix")
    vocab = int(inner.get_output_embeddings().out_features)
    if continuation is not None:
        gen = given_continuation(tokenizer, continuation, ids.shape[0], max_new_tokens, vocab)
        steps = torch.full((ids.shape[0],), gen.shape[1], dtype=torch.long)
    else:
        K = 1 if max_new_tokens is None else max_new_tokens
        if isinstance(K, bool) or not isinstance(K, int) or K < 1:
            raise InputError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        gen, steps = greedy(model, ids, mask, int(start), K, stop_at_eos)
    B, K = gen.shape
    dec = torch.cat([torch.full((B, 1), int(start), dtype=torch.long), gen[:, :-1]], dim=1)
    active = torch.arange(K)[None, :] < steps[:, None]  # (B, K) the steps each row took
    source = torch.zeros(B, K, ids.shape[1], dtype=torch.float64)
    prefix = torch.zeros(B, K, K, dtype=torch.float64)
    logits = torch.zeros(B, K, dtype=torch.float64)
    probabilities = torch.zeros(B, K, dtype=torch.float64)
    for first in range(0, K, step_batch):
        pairs = [(k, b) for k in range(first, min(K, first + step_batch)) for b in range(B) if active[b, k]]
        ks, bs = torch.tensor([k for k, _ in pairs]), torch.tensor([b for _, b in pairs])
        rows = {
            "input_ids": ids[bs],
            "attention_mask": mask[bs],
            "decoder_input_ids": dec[bs],
            "decoder_attention_mask": active[bs].long() | (torch.arange(K)[None, :] == 0).long(),
        }
        exp = explain(model, rows, method=method, target=gen[bs, ks].tolist(), position=ks.tolist(), **options)
        source[bs, ks] = exp.source.detach().to(torch.float64).cpu()
        prefix[bs, ks] = exp.prefix.detach().to(torch.float64).cpu()
        lg = exp.logits.detach().to(torch.float64).cpu()
        logits[bs, ks] = lg.gather(1, gen[bs, ks][:, None])[:, 0]
        probabilities[bs, ks] = lg.softmax(-1).gather(1, gen[bs, ks][:, None])[:, 0]
    return Seq2SeqGenerationExplanation(
        method=method,
        input_ids=ids,
        attention_mask=mask,
        decoder_input_ids=dec,
        targets=gen,
        source=source,
        prefix=prefix,
        logits=logits,
        probabilities=probabilities,
        steps=steps,
        options={"continuation_given": continuation is not None, **options},
    )


def _sources(tokenizer: Any, prompts: Any) -> tuple[Tensor, Tensor]:
    """The sources as (ids, mask) (B, S): a tokenizer dict as given, or text through the tokenizer."""
    if isinstance(prompts, dict) or hasattr(prompts, "keys"):
        if "input_ids" not in prompts:
            raise InputError("the sources need input_ids (a tokenizer output)")
        ids = torch.as_tensor(prompts["input_ids"]).long()
        given = prompts.get("attention_mask")
        return ids, (torch.ones_like(ids) if given is None else torch.as_tensor(given).long())
    return text_prompts(tokenizer, prompts)


def greedy(model: nn.Module, ids: Tensor, mask: Tensor, start: int, K: int, stop_at_eos: bool) -> tuple[Tensor, Tensor]:
    """The greedy continuation (B, K') of the sources and the tokens each row wrote (B,), as ``generate``
    writes them without a cache: each step the argmax at the prefix's last token; a row that wrote an
    end-of-text token is padded after it (``stop_at_eos``); K' ≤ K, the longest row."""
    inner: Any = unwrap(model)
    eos, pad = end_of_text(inner) if stop_at_eos else ([], None)
    B = ids.shape[0]
    device = next(inner.parameters()).device
    dec = torch.full((B, 1), start, dtype=torch.long, device=device)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    written = torch.zeros(B, dtype=torch.long)
    with own_forward(inner):
        for _ in range(K):
            logits = inner(input_ids=ids.to(device), attention_mask=mask.to(device), decoder_input_ids=dec).logits
            nxt = logits[:, -1].argmax(-1)
            if pad is not None:
                nxt = torch.where(done, torch.full_like(nxt, pad), nxt)
            written += (~done).long().cpu()
            dec = torch.cat([dec, nxt[:, None]], dim=1)
            done |= torch.isin(nxt, torch.tensor(eos, dtype=torch.long, device=device)) if eos else done
            if bool(done.all()):
                break
    return dec[:, 1:].cpu(), written


__all__ = ["Seq2SeqGenerationExplanation", "explain_seq2seq_generation", "greedy"]

"""The language-model evidence protocol (``docs/METHODS.md`` §3b): does a map point at the words that fix the answer?

On prompts of :func:`lrp_core.data.make_facts` the answer is the value of the
one fact the question asks about; that value is the *evidence*, the other facts
of the same kind are distractors. On the prompts the model answers correctly
(greedy next token = the answer), each method explains the answer's logit at
the last prompt position and is scored over the *context tokens* — the
prompt's real tokens except special tokens (the begin-of-text token):

* ``evidence_hit1``: the highest-scoring context token is an evidence token (0 / 1);
* ``evidence_ap``: average precision of the context tokens' scores for the evidence tokens;
* ``morf_auc`` / ``lerf_auc``: the k = 0 … K highest- (lowest-) scoring context tokens are replaced by one
  fixed filler token (positions unchanged) and the answer's probability recorded; the area under that
  curve over k / K (trapezoid, so in [0, 1]). MoRF: lower is better; LeRF: higher is better.

A seeded ``random`` row (uniform scores) is the reference; per-prompt values feed the paired bootstrap.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from ..data.facts import FactRecord, evidence_tokens
from ..errors import InputError
from ..runtime.utils import progress_bar
from . import batching
from .report import Results, metric_value

#: replaced tokens at the last point of the MoRF / LeRF curves
MAX_REPLACED = 10
LM_METRICS = ("evidence_hit1", "evidence_ap", "morf_auc", "lerf_auc")


def encode(tokenizer: Any, records: Sequence[FactRecord]) -> dict:
    """Tokenize the prompts, left-padded, and locate their context and evidence tokens.

    Parameters
    ----------
    tokenizer : Any
        A fast tokenizer (offsets), padding on the left.
    records : Sequence[FactRecord]
        B prompts with answers and evidence.

    Returns
    -------
    dict
        ``input_ids`` and ``attention_mask`` (B, T); ``context`` and ``evidence``, per prompt the token
        positions; ``answers`` (B,), the first token of each answer.

    Raises
    ------
    InputError
        If a prompt has no evidence token after tokenizing.
    """
    enc = tokenizer(
        [r.prompt for r in records],
        return_tensors="pt",
        padding=True,
        return_offsets_mapping=True,
        return_special_tokens_mask=True,
    )
    context, evidence = [], []
    for b, r in enumerate(records):
        real = (enc["attention_mask"][b] == 1) & (enc["special_tokens_mask"][b] == 0)
        offsets = [tuple(o) if ok else (0, 0) for o, ok in zip(enc["offset_mapping"][b].tolist(), real.tolist())]
        context.append(torch.nonzero(real).flatten())
        evidence.append(torch.tensor(evidence_tokens(r, offsets), dtype=torch.long))
        if len(evidence[-1]) == 0:
            raise InputError(f"prompt {b} has no evidence token after tokenizing: {r.prompt!r}")
    answers = []
    for r in records:
        ids = tokenizer(" " + r.answer, add_special_tokens=False)["input_ids"]
        answers.append(ids[0])
    return {
        "input_ids": enc["input_ids"],
        "attention_mask": enc["attention_mask"],
        "context": context,
        "evidence": evidence,
        "answers": torch.tensor(answers, dtype=torch.long),
    }


def _positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def answer_probabilities(
    model: Any, input_ids: torch.Tensor, mask: torch.Tensor, answers: torch.Tensor
) -> torch.Tensor:
    """p(answer | prompt) read at the last position, with position ids following the mask.

    Parameters
    ----------
    model : Any
        The causal LM.
    input_ids : torch.Tensor
        (B, T) left-padded prompts.
    mask : torch.Tensor
        (B, T) attention mask.
    answers : torch.Tensor
        (B,) answer token ids.

    Returns
    -------
    torch.Tensor
        (B,) probabilities, on the CPU.
    """
    logits = model(input_ids=input_ids, attention_mask=mask, position_ids=_positions(mask)).logits[:, -1]
    return logits.float().softmax(-1).gather(1, answers[:, None].to(logits.device))[:, 0].cpu()


def evidence_scores(scores: np.ndarray, context: np.ndarray, evidence: np.ndarray) -> tuple[float, float]:
    """Hit@1 and average precision of one prompt's token scores, ranked over its context tokens.

    Parameters
    ----------
    scores : np.ndarray
        (T,) the prompt's token scores over its padded row.
    context : np.ndarray
        Positions of the context tokens.
    evidence : np.ndarray
        Positions of the evidence tokens.

    Returns
    -------
    tuple[float, float]
        ``(hit@1, average precision)``.
    """
    s = scores[context]
    is_ev = np.isin(context, evidence)
    order = np.argsort(-s, kind="stable")
    hits = is_ev[order]
    precision = np.cumsum(hits) / np.arange(1, len(hits) + 1)
    return float(hits[0]), float((precision * hits).sum() / max(1, hits.sum()))


def replacement_curve(
    model: Any, ids: torch.Tensor, mask: torch.Tensor, order: torch.Tensor, answer: int, filler: int, K: int
) -> np.ndarray:
    """The answer's probability as the first k tokens of ``order`` are replaced by ``filler``, k = 0 … K.

    Parameters
    ----------
    model : Any
        The causal LM.
    ids : torch.Tensor
        (1, T) the prompt's ``input_ids``.
    mask : torch.Tensor
        (1, T) its attention mask.
    order : torch.Tensor
        Token positions, in the order they are replaced.
    answer : int
        The answer's token id.
    filler : int
        The replacing token id (:func:`filler_token`).
    K : int
        Most tokens replaced (capped at ``len(order)``).

    Returns
    -------
    np.ndarray
        (K + 1,) p(answer) after k = 0 … K replacements.
    """
    K = min(K, len(order))
    variants = ids.repeat(K + 1, 1)
    for k in range(1, K + 1):
        variants[k, order[:k]] = filler
    p = answer_probabilities(model, variants, mask.repeat(K + 1, 1), torch.full((K + 1,), answer))
    return p.numpy()


def curve_auc(curve: np.ndarray) -> float:
    """Area under a curve sampled at k / K, k = 0 … K (trapezoid rule).

    Parameters
    ----------
    curve : np.ndarray
        (K + 1,) the values.

    Returns
    -------
    float
        The area, in [0, 1] for probabilities (the single value when K = 0).
    """
    K = len(curve) - 1
    return float(np.trapezoid(curve, dx=1.0 / K)) if K > 0 else float(curve[0])


def filler_token(tokenizer: Any) -> int:
    """The token that replaces removed context: the unknown token, else the padding token, else end-of-text.

    Parameters
    ----------
    tokenizer : Any
        The LM's tokenizer.

    Returns
    -------
    int
        The token id.

    Raises
    ------
    InputError
        If the tokenizer has none of these tokens.
    """
    for name in ("unk_token_id", "pad_token_id", "eos_token_id"):
        v = getattr(tokenizer, name, None)
        if v is not None:
            return int(v)
    raise InputError("the tokenizer has no unknown, padding or end-of-text token to replace context tokens with")


def prompt_values(model: Any, enc: dict, b: int, scores: np.ndarray, filler: int) -> dict[str, float]:
    """The four metrics of prompt ``b`` for one map (T,) over its padded row."""
    ctx, ev = enc["context"][b].numpy(), enc["evidence"][b].numpy()
    hit, ap = evidence_scores(scores, ctx, ev)
    ranked = torch.as_tensor(ctx[np.argsort(-scores[ctx], kind="stable")])
    ids, mask, ans = enc["input_ids"][b : b + 1], enc["attention_mask"][b : b + 1], int(enc["answers"][b])
    morf = curve_auc(replacement_curve(model, ids, mask, ranked, ans, filler, MAX_REPLACED))
    lerf = curve_auc(replacement_curve(model, ids, mask, ranked.flip(0), ans, filler, MAX_REPLACED))
    return {"evidence_hit1": hit, "evidence_ap": ap, "morf_auc": morf, "lerf_auc": lerf}


def lm_protocol(
    model: Any,
    tokenizer: Any,
    records: Sequence[FactRecord],
    methods: Sequence[str],
    batch_size: int = 16,
    progress: bool = True,
    baseline: bool = True,
    seed: int = 0,
) -> tuple[Results, dict, float, int]:
    """Run every method on the prompts the model answers correctly.

    Parameters
    ----------
    model : Any
        The causal LM.
    tokenizer : Any
        Its tokenizer (fast, left padding).
    records : Sequence[FactRecord]
        The prompts with their answers and evidence.
    methods : Sequence[str]
        Method names.
    batch_size : int, optional
        Prompts per explanation call.
    progress : bool, optional
        Show a progress bar.
    baseline : bool, optional
        Add the row ``random`` (seeded uniform random token maps).
    seed : int, optional
        Seed of the random maps.

    Returns
    -------
    tuple[Results, dict, float, int]
        ``(results, curves, accuracy, n_correct)``: ``results[method][metric]`` the means,
        ``curves[method][metric + "_per_prompt"]`` the values per prompt (for the bootstrap), the share of
        prompts answered correctly and their number.

    Raises
    ------
    InputError
        If a prompt has no evidence token after tokenizing, or the tokenizer has no token to replace context
        with.
    """
    from ..api import explain

    enc = encode(tokenizer, records)
    with torch.no_grad():
        logits = model(
            input_ids=enc["input_ids"],
            attention_mask=enc["attention_mask"],
            position_ids=_positions(enc["attention_mask"]),
        ).logits[:, -1]
    correct = torch.nonzero(logits.argmax(-1).cpu() == enc["answers"]).flatten().tolist()
    accuracy = len(correct) / len(records)
    filler = filler_token(tokenizer)
    names = batching.method_order(methods) + (["random"] if baseline else [])
    rng = np.random.default_rng(seed)
    random_maps = {b: rng.random(enc["input_ids"].shape[1]) for b in correct}
    curves: dict[str, dict[str, list]] = {}
    for method in progress_bar(names, progress, desc="methods"):
        values: dict[str, list] = {m: [] for m in LM_METRICS}
        for start in range(0, len(correct), batch_size):
            rows = correct[start : start + batch_size]
            if method == "random":
                maps = [random_maps[b] for b in rows]
            else:
                exp = explain(
                    model,
                    {"input_ids": enc["input_ids"][rows], "attention_mask": enc["attention_mask"][rows]},
                    method=method,
                    target=enc["answers"][rows].tolist(),
                    progress=False,
                )
                maps = list(exp.scores.detach().double().cpu().numpy())
            for b, m in zip(rows, maps):
                for k, v in prompt_values(model, enc, b, m, filler).items():
                    values[k].append(v)
        curves[method] = {f"{k}_per_prompt": v for k, v in values.items()}
    results = {
        m: {
            k: metric_value(float(np.mean(v)) if v else None)
            for k, v in ((k, curves[m][f"{k}_per_prompt"]) for k in LM_METRICS)
        }
        for m in names
    }
    return results, curves, accuracy, len(correct)


__all__ = [
    "lm_protocol",
    "encode",
    "evidence_scores",
    "replacement_curve",
    "curve_auc",
    "answer_probabilities",
    "filler_token",
    "LM_METRICS",
    "MAX_REPLACED",
]

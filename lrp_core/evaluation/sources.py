"""The sources protocol (``docs/METHODS.md`` §3.7): does a method find the fact that decided the answer?

On prompts of :func:`lrp_core.data.make_facts` every fact sentence is a source (in the generator's random
order); the question and ``"Answer:"`` are not. The deciding source is the fact the question asks about, the
other facts state the same attribute of other people. On the prompts the model answers correctly, each method
explains the answer's logit with ``sources=`` the fact spans and its source scores are scored:

* ``source_hit1``: the top-scoring source is the deciding one (0 / 1); ``source_ap``: average precision of the
  sources ranked by score, the deciding one the positive;
* ``drop_top``: p(answer) with the top source removed (its tokens deleted, later positions following);
  ``keep_top``: p(answer) with only the top source kept;
* ``forward_passes``, ``backward_passes``, ``seconds`` per explanation.

A seeded ``random`` row (uniform source scores) is the reference; per-prompt values feed the paired bootstrap.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np
import torch

from ..data.facts import FactRecord
from ..errors import InputError
from ..runtime.utils import progress_bar
from ..sources import sentences
from .report import Results, metric_value

SOURCE_METRICS = ("source_hit1", "source_ap", "drop_top", "keep_top", "forward_passes", "backward_passes", "seconds")
#: the methods a sources run compares by default: the relevance methods of the LRP line, attention, gradient,
#: token ablation, and the two ablation methods on sources
DEFAULT_METHODS = (
    "attnlrp",
    "cp_lrp",
    "transformer_attribution",
    "input_x_gradient",
    "token_ablation",
    "leave_one_out",
    "context_cite",
)
#: passes per explanation of the methods without a cost of their own in ``Explanation.options``:
#: (forward, backward); an explicit relevance pass counts as one backward pass
_NO_BACKWARD = ("rollout", "raw_attention")


def fact_sources(record: FactRecord, tokenizer: Any) -> tuple[list[tuple[int, int]], int]:
    """The token spans of a prompt's fact sentences, tokenized as the row alone, and which one decides.

    Parameters
    ----------
    record : FactRecord
        The prompt with its facts and evidence.
    tokenizer : Any
        The LM's tokenizer.

    Returns
    -------
    tuple[list[tuple[int, int]], int]
        The S ``(start, stop)`` token spans and the index of the deciding fact.

    Raises
    ------
    InputError
        If the evidence does not lie in exactly one fact sentence.
    """
    text = sentences(record.prompt)
    n_facts = len(record.distractors) + 1
    text.spans, text.labels = text.spans[:n_facts], text.labels[:n_facts]
    ((a, b),) = record.evidence
    deciding = [i for i, (s, e) in enumerate(text.spans) if s <= a and b <= e]
    if len(deciding) != 1:
        raise InputError(f"the evidence of {record.prompt!r} lies in no single fact sentence")
    return text.token_spans(tokenizer), deciding[0]


def passes(method: str, exp: Any, context_tokens: int) -> tuple[float, float]:
    """The forward and backward passes one explanation cost.

    Parameters
    ----------
    method : str
        The method's name.
    exp : Any
        Its :class:`Explanation` (whose options may record ``forward_passes``, ``n_steps`` or ``n_samples``).
    context_tokens : int
        Number of the row's real tokens.

    Returns
    -------
    tuple[float, float]
        ``(forward, backward)``.
    """
    opt = exp.options
    if "forward_passes" in opt:
        return float(opt["forward_passes"]), 0.0
    if method in ("token_ablation", "occlusion"):
        return float(context_tokens), 0.0  # the full row and one removal per context token but the read one
    if method in _NO_BACKWARD:
        return 1.0, 0.0
    if method == "integrated_gradients":
        return float(opt.get("n_steps", 50)), float(opt.get("n_steps", 50))
    if method == "smoothgrad":
        return float(opt.get("n_samples", 16)), float(opt.get("n_samples", 16))
    if method == "kernel_shap":
        return float(opt.get("n_samples", 256)), 0.0
    return 1.0, 1.0


def _probabilities(model: Any, rows: list[torch.Tensor], answers: list[int]) -> np.ndarray:
    """p(answer) after each unpadded id row (left-padded into one batch, positions from the mask)."""
    x = _left_padded(rows)
    with torch.no_grad():
        logits = model(**x, position_ids=(x["attention_mask"].cumsum(-1) - 1).clamp(min=0)).logits
    p = logits[:, -1].float().softmax(-1)
    return p[torch.arange(len(rows)), torch.tensor(answers)].numpy()


def _without(ids: torch.Tensor, drop: Sequence[tuple[int, int]]) -> torch.Tensor:
    keep = torch.ones(len(ids), dtype=torch.bool)
    for a, b in drop:
        keep[a:b] = False
    return ids[keep]


def ablation_table(
    model: Any, ids: list[torch.Tensor], spans: list[list[tuple[int, int]]], answers: list[int]
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """For each prompt, p(answer) with each source removed and with only each source kept.

    Parameters
    ----------
    model : Any
        The causal LM.
    ids : list[torch.Tensor]
        Per prompt, its (T_i,) token ids, unpadded.
    spans : list[list[tuple[int, int]]]
        Per prompt, its S_i sources' ``(start, stop)`` token spans.
    answers : list[int]
        Per prompt, the answer's token id.

    Returns
    -------
    tuple[list[np.ndarray], list[np.ndarray]]
        ``(dropped, kept)``: per prompt, (S_i,) probabilities with source s removed, and with source s alone
        kept.
    """
    rows, owner = [], []
    for i, (r, sp) in enumerate(zip(ids, spans)):
        for s in range(len(sp)):
            rows += [_without(r, [sp[s]]), _without(r, [x for j, x in enumerate(sp) if j != s])]
            owner.append(i)
    p = _probabilities(model, rows, [answers[i] for i in owner for _ in range(2)]) if rows else np.zeros(0)
    drop, keep, k = [], [], 0
    for sp in spans:
        S = len(sp)
        drop.append(p[k : k + 2 * S : 2])
        keep.append(p[k + 1 : k + 2 * S : 2])
        k += 2 * S
    return drop, keep


def source_ranking(scores: np.ndarray, deciding: int) -> tuple[float, float]:
    """Hit@1 and average precision of one prompt's source scores for the deciding source.

    Parameters
    ----------
    scores : np.ndarray
        (S,) the source scores; ties keep the sources' order.
    deciding : int
        Index of the deciding source.

    Returns
    -------
    tuple[float, float]
        ``(hit@1, average precision)``; with one relevant source the precision is 1 / its rank.
    """
    order = np.argsort(-scores, kind="stable")
    rank = int(np.nonzero(order == deciding)[0][0])
    return float(rank == 0), 1.0 / (rank + 1)


def _left_padded(rows: list[torch.Tensor]) -> dict:
    """Unpadded id rows as one left-padded batch (``input_ids``, ``attention_mask``)."""
    T = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, T - len(r) :], mask[i, T - len(r) :] = r, 1
    return {"input_ids": ids, "attention_mask": mask}


def _answered(model: Any, ids: list[torch.Tensor], answers: list[int]) -> list[int]:
    """The prompts whose greedy next token is the answer."""
    x = _left_padded(ids)
    with torch.no_grad():
        pred = model(**x, position_ids=(x["attention_mask"].cumsum(-1) - 1).clamp(min=0)).logits[:, -1].argmax(-1)
    return [i for i in range(len(ids)) if int(pred[i]) == answers[i]]


def _method_scores(
    model: Any,
    method: str,
    ids: list[torch.Tensor],
    answers: list[int],
    found: list,
    groups: dict[int, list[int]],
    batch_size: int,
) -> dict[int, tuple[np.ndarray, float, float, float]]:
    """Per prompt: the method's source scores (S,), forward and backward passes, seconds per explanation."""
    from ..api import explain

    per = {}
    for members in groups.values():
        for start in range(0, len(members), batch_size):
            rows = members[start : start + batch_size]
            t0 = time.perf_counter()
            exp = explain(
                model,
                _left_padded([ids[i] for i in rows]),
                method=method,
                target=[answers[i] for i in rows],
                sources=[found[i][0] for i in rows],
                progress=False,
            )
            seconds = (time.perf_counter() - t0) / len(rows)
            assert exp.sources is not None, "explain(sources=...) fills exp.sources"
            got = exp.sources.detach().double().cpu().numpy()
            for k, i in enumerate(rows):
                per[i] = (got[k], *passes(method, exp, len(ids[i])), seconds)
    return per


def sources_protocol(
    model: Any,
    tokenizer: Any,
    records: Sequence[FactRecord],
    methods: Sequence[str],
    batch_size: int = 16,
    progress: bool = True,
    baseline: bool = True,
    seed: int = 0,
) -> tuple[Results, dict, float, int]:
    """Run every method on the prompts the model answers correctly, scoring the sources.

    Parameters
    ----------
    model : Any
        The causal LM.
    tokenizer : Any
        Its tokenizer.
    records : Sequence[FactRecord]
        The prompts, each with its facts, answer and evidence.
    methods : Sequence[str]
        Method names (relevance or source methods).
    batch_size : int, optional
        Prompts per explanation call.
    progress : bool, optional
        Show a progress bar.
    baseline : bool, optional
        Add the row ``random`` (seeded uniform random source scores).
    seed : int, optional
        Seed of the random scores.

    Returns
    -------
    tuple[Results, dict, float, int]
        ``(results, curves, accuracy, n_correct)``: ``results[method][metric]`` the means,
        ``curves[method][metric + "_per_prompt"]`` the values per prompt (for the bootstrap), the share of
        prompts answered correctly and their number.

    Raises
    ------
    InputError
        If a prompt's evidence does not lie in exactly one fact sentence.
    """
    ids = [torch.tensor(tokenizer(r.prompt)["input_ids"]) for r in records]
    answers = [tokenizer(" " + r.answer, add_special_tokens=False)["input_ids"][0] for r in records]
    found = [fact_sources(r, tokenizer) for r in records]
    p_answer = _probabilities(model, ids, answers)
    correct = _answered(model, ids, answers)
    drop, keep = ablation_table(
        model, [ids[i] for i in correct], [found[i][0] for i in correct], [answers[i] for i in correct]
    )
    drop_of, keep_of = dict(zip(correct, drop)), dict(zip(correct, keep))
    rng = np.random.default_rng(seed)
    random_scores = {i: (rng.random(len(found[i][0])), 0.0, 0.0, 0.0) for i in correct}
    groups: dict[int, list[int]] = {}  # prompts of the same number of sources are explained together
    for i in correct:
        groups.setdefault(len(found[i][0]), []).append(i)
    curves: dict[str, dict[str, list]] = {}
    names = list(methods) + (["random"] if baseline else [])
    for method in progress_bar(names, progress, desc="methods"):
        per = (
            random_scores
            if method == "random"
            else _method_scores(model, method, ids, answers, found, groups, batch_size)
        )
        values: dict[str, list] = {k: [] for k in SOURCE_METRICS}
        for i in correct:  # prompt order, the same for every method (paired)
            scores, fwd, bwd, seconds = per[i]
            hit, ap = source_ranking(scores, found[i][1])
            top = int(np.argsort(-scores, kind="stable")[0])
            for k, v in zip(
                SOURCE_METRICS, (hit, ap, float(drop_of[i][top]), float(keep_of[i][top]), fwd, bwd, seconds)
            ):
                values[k].append(v)
        curves[method] = {f"{k}_per_prompt": v for k, v in values.items()}
        curves[method]["p_answer_per_prompt"] = [float(p_answer[i]) for i in correct]
    results = {
        m: {k: metric_value(float(np.mean(curves[m][f"{k}_per_prompt"])) if correct else None) for k in SOURCE_METRICS}
        for m in names
    }
    return results, curves, len(correct) / max(1, len(records)), len(correct)


__all__ = [
    "sources_protocol",
    "fact_sources",
    "source_ranking",
    "ablation_table",
    "passes",
    "SOURCE_METRICS",
    "DEFAULT_METHODS",
]

"""The text protocol: rationale precision / recall / F1 of each method's top-k words,
and ERASER's comprehensiveness / sufficiency (:func:`faithfulness`).

:func:`text_word_scores` explains documents in batches and pools the
word-piece scores to words (max over the pieces of a word);
:func:`evaluate_text` compares the top-k words with the human rationale at each
k (ERASER's token-level metrics) and at k = the size of each rationale.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import numpy as np
import torch

from .. import metrics as M
from ..data.rationales import RationaleRecord
from ..data.sets import TextSet
from ..errors import InputError, LRPError
from ..runtime.utils import logits_in_batches, model_device, progress_bar
from . import batching
from .report import Results, metric_value
from .shards import Shard, block_spans


def text_metric_names(ks: Sequence[int] = M.TOP_K) -> tuple[str, ...]:
    """The metric names of a text evaluation.

    Parameters
    ----------
    ks : Sequence[int], optional
        The values of k.

    Returns
    -------
    tuple[str, ...]
        ``token_f1@k`` with its precision and recall, for each k.
    """
    names = [f"token_{m}@{k}" for m in ("f1", "precision", "recall") for k in ks]
    return tuple(names) + ("token_f1@gold", "comprehensiveness", "sufficiency", "cdam_sparsity", "tam_correlation")


def _tokenizing(tokenizer: Any, max_len: int) -> Any:
    """texts -> the (B, T) ``input_ids`` / ``attention_mask`` of one padded block."""

    def tokenize(texts: Sequence[str]) -> dict[str, torch.Tensor]:
        enc = tokenizer(list(texts), padding=True, truncation=True, max_length=max_len, return_tensors="pt")
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}

    return tokenize


def _max_length(tokenizer: Any, model: Any) -> int:
    """Longest input the model takes: its position embeddings, capped by the tokenizer.

    ``model_max_length`` is a huge sentinel (~1e30) when a tokenizer sets no limit.
    """
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", 512) or 512
    mml = getattr(tokenizer, "model_max_length", limit) or limit
    return int(min(limit, mml if mml < 1e6 else limit))


def text_word_scores(
    model: Any,
    tokenizer: Any,
    records: Sequence[RationaleRecord],
    method: str,
    target: str = "true",
    batch_size: int = 16,
    progress: bool = False,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """One method's word scores for each document (the maximum over a word's word-pieces).

    Parameters
    ----------
    model : Any
        The text classifier.
    tokenizer : Any
        Its fast tokenizer (offsets).
    records : Sequence[RationaleRecord]
        The documents.
    method : str
        A name of :data:`lrp_core.METHODS`.
    target : str, optional
        ``"true"`` (explain each document's label) or ``"predicted"``.
    batch_size : int, optional
        Documents per explanation call.
    progress : bool, optional
        Show a progress bar.

    Returns
    -------
    tuple[list[np.ndarray], list[np.ndarray]]
        Per document, the (W,) word scores, and the (T_i,) scores of the word-pieces that belong to a word
        (specials and padding left out).

    Raises
    ------
    InputError
        If the tokenizer is not a fast one.
    """
    if not getattr(tokenizer, "is_fast", False):
        raise InputError("the rationale evaluation needs a fast tokenizer (offset mapping)")
    device = model_device(model)
    max_len = _max_length(tokenizer, model)
    words_out, tokens_out = [], []
    for s in progress_bar(range(0, len(records), batch_size), progress, desc=method, leave=False):
        chunk = records[s : s + batch_size]
        enc = tokenizer(
            [r.text for r in chunk],
            padding=True,
            truncation=True,
            max_length=max_len,
            return_offsets_mapping=True,
            return_tensors="pt",
        )
        inputs = {"input_ids": enc["input_ids"].to(device), "attention_mask": enc["attention_mask"].to(device)}
        tgt = torch.tensor([r.label for r in chunk], device=device) if target == "true" else None
        exp = batching.explain_batch(model, inputs, method, tgt)
        sc = exp.scores.detach().float().cpu().numpy()
        for i, r in enumerate(chunk):
            spans = r.offsets if r.offsets is not None else M.word_spans(r.text, r.words)
            wid = M.word_ids_from_offsets(enc["offset_mapping"][i].tolist(), spans)
            words_out.append(M.word_scores(sc[i], wid, len(r.words)))
            tokens_out.append(sc[i][np.array([w is not None for w in wid])])
    return words_out, tokens_out


def random_word_scores(data: TextSet, seed: int = 0) -> list[np.ndarray]:
    """Seeded uniform random word scores per document (the reference row ``random``).

    Parameters
    ----------
    data : TextSet
        The documents.
    seed : int, optional
        Seed of the draw.

    Returns
    -------
    list[np.ndarray]
        One (W,) array per document.
    """
    rng = np.random.default_rng(seed)
    return [rng.random(len(r.words)) for r in data.records]


@torch.no_grad()
def class_probabilities(
    model: Any, tokenizer: Any, texts: Sequence[str], classes: Sequence[int], batch_size: int = 32
) -> np.ndarray:
    """The softmax probability of a given class for each text.

    Parameters
    ----------
    model : Any
        The text classifier.
    tokenizer : Any
        Its tokenizer.
    texts : Sequence[str]
        N texts; an empty text is the special tokens alone.
    classes : Sequence[int]
        (N,) the class read for each text.
    batch_size : int, optional
        Texts per forward pass.

    Returns
    -------
    np.ndarray
        (N,) the probability of ``classes[i]`` for text i.
    """
    tokenize = _tokenizing(tokenizer, _max_length(tokenizer, model))
    out = []
    for block, logits in logits_in_batches(model, list(texts), batch_size, tokenize):
        p = torch.softmax(logits.double(), -1).cpu()
        out.append(p[torch.arange(len(p)), torch.as_tensor(classes[block])].numpy())
    return np.concatenate(out)


def faithfulness(
    model: Any,
    tokenizer: Any,
    records: Sequence[RationaleRecord],
    word_scores: Sequence[np.ndarray],
    classes: Sequence[int],
    fractions: Sequence[float] = M.ERASER_FRACTIONS,
    batch_size: int = 32,
    per_document: bool = False,
) -> dict[str, Any]:
    """ERASER comprehensiveness and sufficiency (AOPC over ``fractions``), averaged over the documents.

    Parameters
    ----------
    model : Any
        The text classifier.
    tokenizer : Any
        Its tokenizer.
    records : Sequence[RationaleRecord]
        D documents.
    word_scores : Sequence[np.ndarray]
        Per document, the (W,) word scores.
    classes : Sequence[int]
        (D,) the class explained in each document.
    fractions : Sequence[float], optional
        The fractions of top-ranked words removed or kept.
    batch_size : int, optional
        Texts per forward pass.
    per_document : bool, optional
        Return the (D,) values of each document (as lists) instead of their means.

    Returns
    -------
    dict[str, Any]
        ``{"comprehensiveness": ..., "sufficiency": ...}``, floats or per-document lists.
    """
    texts: list[str] = []
    full = [" ".join(r.words) for r in records]
    for r, ws in zip(records, word_scores):
        texts.extend(t for pair in M.eraser_texts(r.words, ws, fractions) for t in pair)
    q = len(fractions)
    cls = list(classes)
    p_full = class_probabilities(model, tokenizer, full, cls, batch_size)
    p = class_probabilities(model, tokenizer, texts, [c for c in cls for _ in range(2 * q)], batch_size).reshape(
        len(records), q, 2
    )
    comp = [M.aopc(pf, pi[:, 0]) for pf, pi in zip(p_full, p)]
    suff = [M.aopc(pf, pi[:, 1]) for pf, pi in zip(p_full, p)]
    if per_document:
        return {"comprehensiveness": comp, "sufficiency": suff}
    return {"comprehensiveness": float(np.mean(comp)), "sufficiency": float(np.mean(suff))}


@torch.no_grad()
def text_accuracy(model: Any, tokenizer: Any, data: TextSet, batch_size: int = 32) -> float:
    """Share of the documents whose predicted class is their label.

    Parameters
    ----------
    model : Any
        The text classifier.
    tokenizer : Any
        Its tokenizer.
    data : TextSet
        The labelled documents.
    batch_size : int, optional
        Documents per forward pass.

    Returns
    -------
    float
        The accuracy, in [0, 1].
    """
    return _hits(model, tokenizer, data.records, batch_size) / max(len(data), 1)


@torch.no_grad()
def _hits(model: Any, tokenizer: Any, records: Sequence[RationaleRecord], batch_size: int) -> int:
    """Number of ``records`` whose predicted class is their label."""
    tokenize = _tokenizing(tokenizer, _max_length(tokenizer, model))
    hits = 0
    for block, logits in logits_in_batches(
        model, list(records), batch_size, lambda chunk: tokenize([r.text for r in chunk])
    ):
        hits += int((logits.argmax(-1).cpu() == torch.tensor([r.label for r in records[block]])).sum())
    return hits


def evaluate_text(
    model: Any,
    tokenizer: Any,
    data: TextSet,
    methods: Sequence[str],
    ks: Sequence[int] = M.TOP_K,
    target: str = "true",
    batch_size: int = 16,
    progress: bool = True,
    baseline: bool = False,
    curves: Optional[dict[str, dict[str, list]]] = None,
) -> tuple[Results, list[str]]:
    """Rationale token precision, recall and F1 at each k, for each method.

    Methods the engine cannot apply to the model are skipped. When both apply, ``cdam`` also gets its
    sparsity and its correlation with ``token_ablation``, over the texts' word-pieces without the specials.

    Parameters
    ----------
    model : Any
        The text classifier; ``None`` scores the maps alone (no accuracy, no faithfulness).
    tokenizer : Any
        Its fast tokenizer.
    data : TextSet
        The documents with their rationales.
    methods : Sequence[str]
        Method names.
    ks : Sequence[int], optional
        The values of k.
    target : str, optional
        ``"true"`` (explain each document's label) or ``"predicted"``.
    batch_size : int, optional
        Documents per explanation call.
    progress : bool, optional
        Show progress bars.
    baseline : bool, optional
        Add the row ``random`` (seeded uniform random word scores).
    curves : Optional[dict[str, dict[str, list]]], optional
        When given, filled with ``curves[method]``, the per-document values behind the results, for the paired
        bootstrap: ``f1_gold_per_document`` (``None`` for a document without rationale words; the mean of the
        others is ``token_f1@gold``) and, with a model, ``comprehensiveness_per_document`` and
        ``sufficiency_per_document`` (whose means are the results).

    Returns
    -------
    tuple[Results, list[str]]
        ``results[method][metric]`` and the names of the skipped methods.

    Raises
    ------
    InputError
        If the tokenizer is not a fast one.
    """
    out = text_protocol(model, tokenizer, data, methods, ks, target, batch_size, progress, baseline, curves)
    assert out is not None  # one process holds every block
    return out[0], out[1]


def text_protocol(
    model: Any,
    tokenizer: Any,
    data: TextSet,
    methods: Sequence[str],
    ks: Sequence[int] = M.TOP_K,
    target: str = "true",
    batch_size: int = 16,
    progress: bool = True,
    baseline: bool = False,
    curves: Optional[dict[str, dict[str, list]]] = None,
    shard: Optional[Shard] = None,
) -> Optional[tuple[Results, list[str], Optional[float]]]:
    """:func:`evaluate_text` in blocks of ``batch_size`` documents, spread over the ranks of ``shard``.

    Each model call sees the documents of one block only (:mod:`.shards`).

    Parameters
    ----------
    model : Any
        The text classifier; ``None`` scores the maps alone (no accuracy, no faithfulness).
    tokenizer : Any
        Its fast tokenizer.
    data : TextSet
        The documents with their rationales.
    methods : Sequence[str]
        Method names.
    ks : Sequence[int], optional
        The values of k.
    target : str, optional
        ``"true"`` or ``"predicted"``.
    batch_size : int, optional
        Documents per block (and per explanation call).
    progress : bool, optional
        Show progress bars.
    baseline : bool, optional
        Add the row ``random``.
    curves : Optional[dict[str, dict[str, list]]], optional
        Filled with the per-document values, as in :func:`evaluate_text`.
    shard : Optional[Shard], optional
        The processes and the checkpoint folder; ``None``: one process.

    Returns
    -------
    Optional[tuple[Results, list[str], Optional[float]]]
        On rank 0 the results, the skipped methods and the clean accuracy (``None`` without a model); ``None``
        on the other ranks.
    """
    shard = shard or Shard()
    spans = block_spans(len(data), batch_size)
    rnd = random_word_scores(data) if baseline else None  # one draw for the whole set

    def block(b: int) -> dict[str, Any]:
        s, e = spans[b]
        return _text_block(
            model, tokenizer, data.records[s:e], methods, target, batch_size, None if rnd is None else rnd[s:e]
        )

    blocks = shard.map(len(spans), block, progress, desc="text blocks")
    if blocks is None:
        return None
    results: Results = {}
    skipped: list[str] = []
    gold = [r.rationale for r in data.records]
    names = batching.method_order(methods) + (["random"] if baseline else [])
    for method in names:
        vals = [b["values"][method] for b in blocks]
        why = [v["skipped"] for v in vals if "skipped" in v]
        if why:
            skipped.append(why[0])
            continue
        ws = [w for v in vals for w in v["ws"]]
        res = _rationale_metrics(ws, gold, ks)
        if model is not None:  # scoring alone (stubbed engines in tests) has no model to ask
            res.update(_faithfulness(vals, curves, method))
        _f1_per_document(ws, gold, curves, method)
        if method == "cdam":
            res.update(_cdam_stats(vals, skipped))
        results[method] = {k: metric_value(v) for k, v in res.items()} if method != "random" else res
    order = [*methods, "random"] if baseline else list(methods)
    accuracy = (sum(b["hits"] for b in blocks) / max(len(data), 1)) if model is not None else None
    return {m: results[m] for m in order if m in results}, skipped, accuracy


def _text_block(
    model: Any,
    tokenizer: Any,
    records: Sequence[RationaleRecord],
    methods: Sequence[str],
    target: str,
    batch_size: int,
    rnd: Optional[list[np.ndarray]],
) -> dict[str, Any]:
    """Every model call of one block of documents, and the per-document values they give.

    Returns:
        ``hits`` (documents predicted right; ``None`` without a model) and
        ``values[method]``: ``ws`` (W,) word and ``ts`` (T_i,) word-piece scores
        per document, ``faith`` (per-document comprehensiveness / sufficiency,
        with a model), for ``cdam`` ``tam`` (token ablation's ``ts``) or
        ``tam_skipped``; ``skipped`` instead when the engine rejected the method.
        ``random`` (given ``rnd``, its word scores) gets ``ws`` and ``faith``.
    """
    block = TextSet(list(records))
    classes = _explained_classes(model, tokenizer, block, target) if model is not None else []
    out: dict[str, Any] = {
        "hits": None if model is None else _hits(model, tokenizer, records, batch_size),
        "values": {},
    }
    tokens: dict[str, list[np.ndarray]] = {}  # word-piece scores per method, TAM reused by CDAM
    for method in batching.method_order(methods):
        try:
            ws, ts = text_word_scores(model, tokenizer, records, method, target, batch_size)
        except LRPError as err:
            out["values"][method] = {"skipped": f"{method}: {err}"}
            continue
        tokens[method] = ts
        v: dict[str, Any] = {"ws": ws, "ts": ts}
        if model is not None:
            v["faith"] = faithfulness(model, tokenizer, records, ws, classes, per_document=True)
        if method == "cdam":
            try:
                tam = tokens.get("token_ablation")
                if tam is None:
                    tam = text_word_scores(model, tokenizer, records, "token_ablation", target, batch_size)[1]
                tokens["token_ablation"] = tam
                v["tam"] = tam
            except LRPError as err:
                v["tam_skipped"] = f"tam_correlation: {err}"
        out["values"][method] = v
    if rnd is not None:
        v = {"ws": rnd}
        if model is not None:
            v["faith"] = faithfulness(model, tokenizer, records, rnd, classes, per_document=True)
        out["values"]["random"] = v
    return out


def _faithfulness(
    vals: list[dict[str, Any]], curves: Optional[dict[str, dict[str, list]]], method: str
) -> dict[str, float]:
    """Means of the blocks' per-document :func:`faithfulness`, kept in ``curves`` if given."""
    per = {k: [x for v in vals for x in v["faith"][k]] for k in vals[0]["faith"]}
    if curves is not None:
        curves.setdefault(method, {}).update({f"{k}_per_document": [float(v) for v in xs] for k, xs in per.items()})
    return {k: float(np.mean(xs)) for k, xs in per.items()}


def _f1_per_document(
    ws: list[np.ndarray],
    gold: list[Union[Sequence[bool], np.ndarray]],
    curves: Optional[dict[str, dict[str, list]]],
    method: str,
) -> None:
    """Store the per-document F1 at gold size in ``curves[method]`` (when ``curves`` is given)."""
    if curves is not None:
        per = M.rationale_f1_at_gold_size_per_document(ws, gold)
        curves.setdefault(method, {})["f1_gold_per_document"] = [None if np.isnan(v) else float(v) for v in per]


def _explained_classes(model: Any, tokenizer: Any, data: TextSet, target: str) -> list[int]:
    """The class each document's maps explain: its label, or the model's prediction."""
    if target == "true":
        return [r.label for r in data.records]
    texts = [r.text for r in data.records]
    p = np.stack(
        [class_probabilities(model, tokenizer, texts, [c] * len(texts)) for c in range(_n_classes(model))], axis=1
    )
    return p.argmax(1).tolist()


def _n_classes(model: Any) -> int:
    """Number of classes of a Hugging Face classifier."""
    return int(getattr(getattr(model, "config", None), "num_labels", 2))


def _cdam_stats(vals: list[dict[str, Any]], skipped: list[str]) -> dict[str, Optional[float]]:
    """CDAM's sparsity and correlation with token ablation over all word-piece scores (T_i,).

    When the engine could not apply token ablation the correlation is left out
    and the reason appended to ``skipped``.
    """
    ts = [t for v in vals for t in v["ts"]]
    out: dict[str, Optional[float]] = {"cdam_sparsity": float(np.mean([M.sparsity(t[None]) for t in ts]))}
    why = [v["tam_skipped"] for v in vals if "tam_skipped" in v]
    if why:
        skipped.append(why[0])
        return out
    tam = [t for v in vals for t in v["tam"]]
    out["tam_correlation"] = M.pooled_correlation(
        torch.as_tensor(np.concatenate(ts)), torch.as_tensor(np.concatenate(tam))
    )
    return out


def _rationale_metrics(
    ws: list[np.ndarray],
    gold: list[Union[Sequence[bool], np.ndarray]],
    ks: Sequence[int],
) -> dict[str, Optional[float]]:
    """Token precision / recall / F1 at each k and F1 at gold size of word scores ``ws`` (W,)."""
    res: dict[str, Optional[float]] = {k: None for k in text_metric_names(ks)}
    for k, v in M.rationale_scores(ws, gold, ks).items():
        for m in ("f1", "precision", "recall"):
            res[f"token_{m}@{k}"] = v[m]
    res["token_f1@gold"] = M.rationale_f1_at_gold_size(ws, gold)
    return {k: metric_value(v) for k, v in res.items()}


__all__ = [
    "text_metric_names",
    "text_word_scores",
    "random_word_scores",
    "text_accuracy",
    "class_probabilities",
    "faithfulness",
    "evaluate_text",
    "text_protocol",
]

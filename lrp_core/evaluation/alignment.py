"""The alignment evidence protocol of a translation model (``docs/METHODS.md`` §3.9).

On held-out sentences of :mod:`lrp_core.data.translation` that the model translates exactly (greedy
translation = the target, so every generated word is a gold target word), each method gives a source
map per generated word, ``source_maps(method)`` → (N, K, S); the maps are scored against the gold
word alignment by :mod:`lrp_core.metrics.alignment` (top-1 accuracy, AER of the top-1 links, AER of
the thresholded map). The protocol itself (:func:`alignment_protocol`) only sees that interface, so
it is tested on synthetic maps with known answers; the maps of a run come from
:func:`lrp_core.explain_generation` (``gen.source``, :func:`explained_source_maps`) and, as a
reference computed on the model directly, from :func:`gradient_source_maps` (input × gradient on the
encoder's input embeddings by torch autograd; the row ``AUTOGRAD_ROW``) and :func:`ablation_source_maps`
(the logit drop when one source word becomes ``<unk>``; the row ``ABLATION_ROW``, which shows that the
model's output does depend on the gold source words). A seeded ``random`` row is the chance reference.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from ..data.translation import TranslationRecord
from ..errors import InputError, LRPError
from ..metrics.alignment import aer_from_counts, alignment_scores
from .report import Results, metric_value

#: the per-sentence lists a run keeps for the bootstrap (``<name>_per_sentence``)
ALIGNMENT_METRICS = ("top1_accuracy", "aer_top1_counts", "aer_threshold_counts")
#: the row of the autograd input × gradient reference (computed on the model, not through lrp_core.explain)
AUTOGRAD_ROW = "autograd_input_x_gradient"
#: the row of the leave-one-word-out reference (each source word replaced by <unk>, on the model directly)
ABLATION_ROW = "unk_ablation"
#: the references computed on the model directly, added to every run
REFERENCE_ROWS = (AUTOGRAD_ROW, ABLATION_ROW)
#: a thresholded link: a positive score of at least this share of the word's largest
THRESHOLD = 0.5
SourceMaps = Callable[[str], Tensor]
"""``source_maps(method)`` → (N, K, S) scores of every target word over the source positions."""


@dataclass
class AlignmentData:
    """The tokenized sentences and their gold alignment.

    Attributes:
        records: the sentence pairs (N).
        input_ids, attention_mask: (N, S) the sources, right-padded (each ends with ``</s>``).
        targets: (N, K) the target words' token ids (``</s>`` not included), padded with the pad id.
        gold: (N, K, S) bool, ``gold[n, k, s]``: target word k translates source word s.
        scored: (N, K) bool, target words with at least one gold link.
        candidates: (N, S) bool, the source words (not ``</s>``, not padding).
    """

    records: list[TranslationRecord]
    input_ids: Tensor
    attention_mask: Tensor
    targets: Tensor
    gold: Tensor
    scored: Tensor
    candidates: Tensor


def alignment_data(tokenizer: Any, records: Sequence[TranslationRecord]) -> AlignmentData:
    """Tokenize sentence pairs and lay out their gold alignment (token = word: a word-level tokenizer).

    Raises
    ------
    InputError
        If a sentence does not tokenize to one token per word plus ``</s>``.
    """
    enc = tokenizer([r.source for r in records], return_tensors="pt", padding=True)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    n, s = ids.shape
    k = max(len(r.target_words) for r in records)
    targets = torch.full((n, k), int(tokenizer.pad_token_id), dtype=torch.long)
    gold = torch.zeros(n, k, s, dtype=torch.bool)
    for i, r in enumerate(records):
        if int(mask[i].sum()) != len(r.source_words) + 1:
            raise InputError(f"the tokenizer does not give one token per word and </s> for {r.source!r}")
        tgt = tokenizer.convert_tokens_to_ids(r.target_words)
        targets[i, : len(tgt)] = torch.tensor(tgt)
        for j, links in enumerate(r.alignment):
            gold[i, j, list(links)] = True
    candidates = mask.bool().clone()
    candidates[torch.arange(n), mask.sum(-1) - 1] = False  # </s>
    return AlignmentData(list(records), ids, mask, targets, gold, gold.any(-1), candidates)


def exact_rows(model: Any, tokenizer: Any, records: Sequence[TranslationRecord]) -> list[int]:
    """The sentences whose greedy translation is exactly their target."""
    from ..models.tiny_s2s import translate

    return [
        i
        for i, (t, r) in enumerate(zip(translate(model, tokenizer, [r.source for r in records]), records))
        if t == r.target
    ]


def _length_groups(data: AlignmentData, batch: int) -> list[list[int]]:
    """Rows in blocks of equal target length (at most ``batch`` each), so every continuation is rectangular."""
    lengths = torch.tensor([len(r.target_words) for r in data.records])
    groups: list[list[int]] = []
    for length in sorted(set(lengths.tolist())):
        rows = torch.nonzero(lengths == length).flatten().tolist()
        groups += [rows[i : i + batch] for i in range(0, len(rows), batch)]
    return groups


def explained_source_maps(model: Any, tokenizer: Any, data: AlignmentData, method: str, batch: int = 16) -> Tensor:
    """(N, K, S) ``gen.source`` of :func:`lrp_core.explain_generation` with the gold target as continuation.

    On the sentences the model translates exactly the continuation is its own greedy translation, so each
    step explains the logit of the word it generated, given the source and the words before it.
    """
    from ..generation import explain_generation

    out = torch.zeros(data.gold.shape, dtype=torch.float64)
    for rows in _length_groups(data, batch):
        k = len(data.records[rows[0]].target_words)
        gen = explain_generation(
            model,
            tokenizer,
            {"input_ids": data.input_ids[rows], "attention_mask": data.attention_mask[rows]},
            method=method,
            continuation=data.targets[rows, :k].tolist(),
            progress=False,
        )
        source = getattr(gen, "source", None)
        if source is None:
            raise InputError(f"explain_generation gave no source scores (gen.source) for {type(model).__name__}")
        out[rows, :k, : source.shape[-1]] = source.detach().double().cpu()[:, :k]
    return out


def gradient_source_maps(model: Any, data: AlignmentData, batch: int = 64) -> Tensor:
    """(N, K, S) input × gradient of each target word's logit on the encoder's input embeddings (autograd).

    ``e = embed_tokens(input_ids) · embed_scale`` (what the encoder adds its positions to) is fed as
    ``inputs_embeds``; the decoder reads the gold prefix (teacher forcing, the model's start token first).
    Score of source position s for word k: ``Σ_d e[s, d] · ∂y_k / ∂e[s, d]``, ``y_k`` the logit of word k at
    decoder position k. The model is not changed.
    """
    encoder = model.get_encoder()
    scale = float(getattr(encoder, "embed_scale", 1.0))
    start = int(model.config.decoder_start_token_id)
    out = torch.zeros(data.gold.shape, dtype=torch.float64)
    for i in range(0, len(data.records), batch):
        ids, mask, tgt = data.input_ids[i : i + batch], data.attention_mask[i : i + batch], data.targets[i : i + batch]
        dec = torch.cat([torch.full_like(tgt[:, :1], start), tgt[:, :-1]], dim=1)
        e = (encoder.embed_tokens(ids) * scale).detach().requires_grad_(True)
        logits = model(inputs_embeds=e, attention_mask=mask, decoder_input_ids=dec).logits  # (B, K, V)
        picked = logits.gather(-1, tgt[..., None])[..., 0]  # (B, K)
        for k in range(tgt.shape[1]):
            (grad,) = torch.autograd.grad(picked[:, k].sum(), e, retain_graph=k + 1 < tgt.shape[1])
            out[i : i + batch, k] = (e * grad).sum(-1).detach().double()
    return out * data.attention_mask[:, None, :]


def ablation_source_maps(model: Any, data: AlignmentData, unk_id: int, batch: int = 64) -> Tensor:
    """(N, K, S) the drop of each target word's logit when one source word is replaced by ``unk_id``.

    Teacher forced on the gold prefix; ``M[k, s] = y_k(source) − y_k(source with word s → <unk>)`` for the source
    words (``</s>`` and padding score 0). One forward per source position; a check that the model's output
    depends on the gold source word, independent of any attribution method.
    """
    start = int(model.config.decoder_start_token_id)
    out = torch.zeros(data.gold.shape, dtype=torch.float64)
    for i in range(0, len(data.records), batch):
        ids, mask, tgt = data.input_ids[i : i + batch], data.attention_mask[i : i + batch], data.targets[i : i + batch]
        cand = data.candidates[i : i + batch]
        dec = torch.cat([torch.full_like(tgt[:, :1], start), tgt[:, :-1]], dim=1)
        with torch.no_grad():
            base = model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits.gather(-1, tgt[..., None])
            for s in range(ids.shape[1]):
                hidden = ids.clone()
                hidden[:, s] = torch.where(cand[:, s], torch.full_like(ids[:, s], unk_id), ids[:, s])
                y = model(input_ids=hidden, attention_mask=mask, decoder_input_ids=dec).logits.gather(
                    -1, tgt[..., None]
                )
                out[i : i + batch, :, s] = (base - y)[..., 0].double() * cand[:, None, s]
    return out


def random_source_maps(shape: Sequence[int], seed: int = 0) -> Tensor:
    """(N, K, S) seeded uniform scores (``numpy.random.default_rng(seed)``), the chance reference."""
    return torch.from_numpy(np.random.default_rng(seed).random(tuple(shape)))


def alignment_protocol(
    source_maps: SourceMaps,
    data: AlignmentData,
    methods: Sequence[str],
    baseline: bool = True,
    seed: int = 0,
    rel: float = THRESHOLD,
) -> tuple[Results, dict, list[str]]:
    """Score every method's source maps against the gold alignment.

    Parameters
    ----------
    source_maps : SourceMaps
        ``method`` → (N, K, S) scores on ``data``'s sentences; an :class:`LRPError` it raises skips the method.
    data : AlignmentData
        The sentences and their gold alignment.
    methods : Sequence[str]
        The methods, in table order.
    baseline : bool, optional
        Add the row ``random`` (:func:`random_source_maps` with ``seed``).
    seed : int, optional
        Seed of the random maps.
    rel : float, optional
        The threshold of the thresholded links.

    Returns
    -------
    tuple[Results, dict, list[str]]
        ``results[method]``: ``top1_accuracy`` (mean over sentences), ``aer_top1``, ``aer_threshold`` (pooled)
        and ``seconds``; ``curves[method][metric + "_per_sentence"]`` for the bootstrap; the skipped methods,
        each with its reason.
    """
    results: Results = {}
    curves: dict[str, dict[str, list]] = {}
    skipped: list[str] = []
    for method in list(methods) + (["random"] if baseline else []):
        t0 = time.perf_counter()
        try:
            maps = random_source_maps(data.gold.shape, seed) if method == "random" else source_maps(method)
        except LRPError as err:  # the reason's first 300 characters (a refusal lists every supported model)
            reason = str(err)
            skipped.append(f"{method}: {reason[:300]}{'…' if len(reason) > 300 else ''}")
            continue
        if tuple(maps.shape) != tuple(data.gold.shape):
            raise InputError(f"source_maps({method!r}) gave {tuple(maps.shape)}, expected {tuple(data.gold.shape)}")
        values = alignment_scores(maps, data.gold, data.scored, data.candidates, rel)
        top1 = values["top1_accuracy"]
        results[method] = {
            "top1_accuracy": metric_value(float(np.nanmean(top1)) if len(top1) else None),
            "aer_top1": metric_value(float(aer_from_counts(values["aer_top1_counts"]))),
            "aer_threshold": metric_value(float(aer_from_counts(values["aer_threshold_counts"]))),
            "seconds": round(time.perf_counter() - t0, 2),
        }
        curves[method] = {f"{k}_per_sentence": np.asarray(values[k]).tolist() for k in ALIGNMENT_METRICS}
    return results, curves, skipped


def s2s_run(
    loaded: Any,
    methods: Sequence[str],
    n: int,
    batch_size: int = 16,
    seed: int = 0,
    baseline: bool = True,
    references: bool = True,
    records: Optional[Sequence[TranslationRecord]] = None,
) -> dict[str, Any]:
    """A seq2seq model's run: ``n`` held-out sentences, the exactly translated ones explained by every method.

    The sentences are ``make_translations(n, HELD_OUT_SEED + seed, split="held_out")`` unless ``records`` are
    given; the random row's seed is 0; ``references`` adds the rows :data:`REFERENCE_ROWS`. Returns ``n``,
    ``accuracy`` (exact-match share), ``answered``, ``results``, ``curves``, ``skipped``.
    """
    from ..data.translation import make_translations
    from ..models.tiny_s2s import HELD_OUT_SEED

    if records is None:
        records = make_translations(n, HELD_OUT_SEED + seed, split="held_out")
    model, tok = loaded.model, loaded.tokenizer
    rows = exact_rows(model, tok, records)
    if not rows:
        raise InputError("the model translates none of the sentences exactly; there is nothing to score")
    data = alignment_data(tok, [records[i] for i in rows])

    def maps(method: str) -> Tensor:
        if method == AUTOGRAD_ROW:
            return gradient_source_maps(model, data)
        if method == ABLATION_ROW:
            return ablation_source_maps(model, data, int(tok.unk_token_id))
        return explained_source_maps(model, tok, data, method, batch_size)

    names = list(methods) + [r for r in REFERENCE_ROWS if references and r not in methods]
    results, curves, skipped = alignment_protocol(maps, data, names, baseline=baseline, seed=0)
    return {
        "n": len(records),
        "accuracy": len(rows) / len(records),
        "answered": len(rows),
        "results": results,
        "curves": curves,
        "skipped": skipped,
    }


__all__ = [
    "AlignmentData",
    "alignment_data",
    "alignment_protocol",
    "explained_source_maps",
    "gradient_source_maps",
    "ablation_source_maps",
    "random_source_maps",
    "exact_rows",
    "s2s_run",
    "SourceMaps",
    "ALIGNMENT_METRICS",
    "AUTOGRAD_ROW",
    "ABLATION_ROW",
    "REFERENCE_ROWS",
    "THRESHOLD",
]

"""Word-alignment metrics for source maps of a translation (``docs/METHODS.md`` §3.9).

A *source map* scores, for each target word ``k`` of a sentence, every source position ``s``:
``maps`` (N, K, S). The gold alignment is ``gold`` (N, K, S) bool (``True``: target word ``k``
translates source word ``s``); ``scored`` (N, K) bool marks the target words that are scored (real
words with at least one gold link); ``candidates`` (N, S) bool marks the source positions a link may
point to (the source words: not ``</s>``, not padding).

- :func:`top1_links`: each scored word's highest-scoring candidate (ties: the lowest position);
- :func:`threshold_links`: every candidate with a positive score of at least ``rel`` × the row's largest;
- :func:`alignment_counts`: per sentence ``[|A ∩ G|, |A|, |G|]`` over its scored words;
- :func:`aer_from_counts`: the alignment error rate pooled over sentences (Och & Ney with sure = possible = gold):
  ``AER = 1 − 2 |A ∩ G| / (|A| + |G|)``; it takes a leading resample axis, so the bootstrap can pool;
- :func:`top1_accuracy_per_sentence`: the share of a sentence's scored words whose top-1 link is gold.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ..errors import InputError


def _check(maps: Tensor, gold: Tensor, scored: Tensor, candidates: Tensor) -> None:
    n, k, s = maps.shape
    if gold.shape != (n, k, s) or scored.shape != (n, k) or candidates.shape != (n, s):
        raise InputError(
            f"maps (N, K, S) = {tuple(maps.shape)} need gold (N, K, S), scored (N, K) and candidates (N, S); got "
            f"{tuple(gold.shape)}, {tuple(scored.shape)}, {tuple(candidates.shape)}"
        )
    if bool((gold & ~candidates[:, None, :]).any()):
        raise InputError("a gold link points outside the candidate source positions")


def top1_links(maps: Tensor, candidates: Tensor) -> Tensor:
    """Each target word's highest-scoring candidate source position.

    Parameters
    ----------
    maps : Tensor
        (N, K, S) scores.
    candidates : Tensor
        (N, S) bool, the positions a link may point to.

    Returns
    -------
    Tensor
        (N, K, S) bool, one ``True`` per target word (ties: the lowest position; a row without candidates:
        none).
    """
    m = maps.detach().double().cpu().numpy()
    c = np.broadcast_to(candidates.cpu().numpy()[:, None, :], m.shape)
    masked = np.where(c, m, -np.inf)
    best = masked.argmax(-1)  # numpy: the first maximum, i.e. the lowest position
    links = np.zeros(m.shape, dtype=bool)
    np.put_along_axis(links, best[..., None], True, axis=-1)
    return torch.from_numpy(links & c)


def threshold_links(maps: Tensor, candidates: Tensor, rel: float = 0.5) -> Tensor:
    """Every candidate whose score is positive and at least ``rel`` × the largest score of its target word.

    Parameters
    ----------
    maps : Tensor
        (N, K, S) scores.
    candidates : Tensor
        (N, S) bool.
    rel : float, optional
        The relative threshold, in (0, 1].

    Returns
    -------
    Tensor
        (N, K, S) bool; no link for a target word whose candidates all score ≤ 0.
    """
    if not 0 < rel <= 1:
        raise InputError(f"rel must be in (0, 1], got {rel}")
    m = maps.detach().double().cpu()
    m = torch.where(candidates[:, None, :].cpu(), m, torch.zeros_like(m))
    top = m.amax(-1, keepdim=True)
    return (m > 0) & (m >= rel * top) & candidates[:, None, :].cpu()


def alignment_counts(links: Tensor, gold: Tensor, scored: Tensor) -> np.ndarray:
    """Per sentence ``[|A ∩ G|, |A|, |G|]``, counting the links of its scored target words only.

    Parameters
    ----------
    links : Tensor
        (N, K, S) bool, the predicted links A.
    gold : Tensor
        (N, K, S) bool, the gold links G.
    scored : Tensor
        (N, K) bool.

    Returns
    -------
    np.ndarray
        (N, 3) integers.
    """
    keep = scored.cpu()[..., None]
    a, g = links.cpu() & keep, gold.cpu() & keep
    counts = torch.stack([(a & g).sum((1, 2)), a.sum((1, 2)), g.sum((1, 2))], dim=-1)
    return counts.numpy().astype(np.int64)


def aer_from_counts(counts: np.ndarray) -> np.ndarray:
    """The alignment error rate pooled over the sentences: ``1 − 2 Σ|A ∩ G| / (Σ|A| + Σ|G|)``.

    Parameters
    ----------
    counts : np.ndarray
        (..., N, 3) from :func:`alignment_counts` (a leading axis: bootstrap resamples).

    Returns
    -------
    np.ndarray
        (...) in [0, 1]; 0 means A = G. NaN where there are no links at all.
    """
    total = np.asarray(counts, dtype=np.float64).sum(-2)
    denom = total[..., 1] + total[..., 2]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denom > 0, 1 - 2 * total[..., 0] / denom, np.nan)


def top1_accuracy_per_sentence(maps: Tensor, gold: Tensor, scored: Tensor, candidates: Tensor) -> np.ndarray:
    """Per sentence, the share of its scored target words whose top-1 link (:func:`top1_links`) is a gold link.

    Parameters
    ----------
    maps, gold, scored, candidates : Tensor
        (N, K, S), (N, K, S) bool, (N, K) bool, (N, S) bool.

    Returns
    -------
    np.ndarray
        (N,); NaN for a sentence without scored words.
    """
    _check(maps, gold, scored, candidates)
    hit = (top1_links(maps, candidates) & gold.cpu()).any(-1) & scored.cpu()
    n = scored.cpu().sum(-1).double()
    return torch.where(n > 0, hit.sum(-1) / n.clamp(min=1), torch.full_like(n, float("nan"))).numpy()


def alignment_scores(
    maps: Tensor, gold: Tensor, scored: Tensor, candidates: Tensor, rel: float = 0.5
) -> dict[str, np.ndarray]:
    """Every per-sentence value of the alignment protocol.

    Parameters
    ----------
    maps, gold, scored, candidates : Tensor
        As for :func:`top1_accuracy_per_sentence`.
    rel : float, optional
        The threshold of :func:`threshold_links`.

    Returns
    -------
    dict[str, np.ndarray]
        ``top1_accuracy`` (N,), ``aer_top1_counts`` (N, 3) and ``aer_threshold_counts`` (N, 3).
    """
    _check(maps, gold, scored, candidates)
    return {
        "top1_accuracy": top1_accuracy_per_sentence(maps, gold, scored, candidates),
        "aer_top1_counts": alignment_counts(top1_links(maps, candidates), gold, scored),
        "aer_threshold_counts": alignment_counts(threshold_links(maps, candidates, rel), gold, scored),
    }


def alignment_error_rate(links: Tensor, gold: Tensor, scored: Tensor) -> float:
    """The AER of predicted links against the gold ones, pooled over the sentences.

    Parameters
    ----------
    links, gold : Tensor
        (N, K, S) bool.
    scored : Tensor
        (N, K) bool.

    Returns
    -------
    float
        ``1 − 2 |A ∩ G| / (|A| + |G|)``.
    """
    return float(aer_from_counts(alignment_counts(links, gold, scored)))


__all__ = [
    "top1_links",
    "threshold_links",
    "alignment_counts",
    "aer_from_counts",
    "top1_accuracy_per_sentence",
    "alignment_scores",
    "alignment_error_rate",
]

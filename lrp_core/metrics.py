"""Evaluation metrics for relevance maps (``docs/METHODS.md`` §3).

Every function works on plain tensors / arrays, so it can be checked on tiny
hand-made cases and used on any model:

- :func:`perturbation_curve`, :func:`perturbation_auc` — pixel flipping
  (positive and negative tests).
- :func:`segmentation_scores` — pixel accuracy, background/foreground IoU,
  mIoU and mAP of a relevance map against an object mask.
- :func:`word_scores`, :func:`word_ids_from_offsets`, :func:`rationale_scores`
  — ERASER token-level precision / recall / F1 at top-k words;
  :func:`eraser_texts`, :func:`aopc` — ERASER's comprehensiveness and
  sufficiency (AOPC over removal fractions).
- :func:`class_sensitivity`, :func:`class_map_correlation` — how class-specific
  the maps are on scenes with two objects of different classes.
- :func:`deletion_drops`, :func:`deletion_agreement` (:func:`deletion_cases`,
  :func:`object_mass_shares`) — the deletion check: does the relevance mass on
  each object follow the logit drop when that object is removed from the scene?
- :func:`sparsity`, :func:`pooled_correlation` — the CDAM statistics.

Conventions: maps are (B, H, W) at image size unless said otherwise; higher
score = more relevant. Ties in a ranking are broken by position (row-major
pixel index, word index), lowest first, so every result is deterministic.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .errors import InputError
from .utils import logits_of, model_device, progress_bar

FRACTIONS: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
"""Perturbation levels p of the pixel-flipping test (the x axis, without 0)."""

TOP_K: tuple[int, ...] = (10, 20, 30, 40, 50, 60, 70, 80)
"""The k of the rationale token-F1 (number of top words taken)."""


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------
def _as_tensor(x: Any, name: str, dtype: torch.dtype = torch.float32) -> Tensor:
    if isinstance(x, Tensor):
        return x.detach().to("cpu", dtype)
    try:
        return torch.as_tensor(np.asarray(x), dtype=dtype)
    except (TypeError, ValueError) as err:
        raise InputError(f"{name} must be a tensor or array, got {type(x).__name__}") from err


def upsample_maps(maps: Tensor, size: tuple[int, int]) -> Tensor:
    """Bilinearly resize maps (B, h, w) to (B, *size) (``align_corners=False``)."""
    maps = _as_tensor(maps, "maps")
    if maps.dim() != 3:
        raise InputError(f"maps must be (B, h, w), got shape {tuple(maps.shape)}")
    if tuple(maps.shape[-2:]) == tuple(size):
        return maps
    return F.interpolate(maps.unsqueeze(1), size=tuple(size), mode="bilinear",
                         align_corners=False).squeeze(1)


def minmax_normalise(maps: Tensor) -> Tensor:
    """Scale each map (B, ...) to [0, 1]; a constant map becomes all zeros."""
    flat = maps.reshape(maps.shape[0], -1)
    lo = flat.min(dim=1, keepdim=True).values
    hi = flat.max(dim=1, keepdim=True).values
    span = hi - lo
    out = torch.where(span > 0, (flat - lo) / torch.where(span > 0, span, torch.ones_like(span)),
                      torch.zeros_like(flat))
    return out.reshape(maps.shape)


def _descending_rank(maps: Tensor) -> Tensor:
    """(B, P) -> (B, P) rank of each entry, 0 = highest; ties by index."""
    order = torch.argsort(-maps, dim=1, stable=True)
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(maps.shape[1]).expand_as(order).contiguous())
    return rank


# --------------------------------------------------------------------------
# perturbation (pixel flipping)
# --------------------------------------------------------------------------
def n_removed(fraction: float, n_pixels: int) -> int:
    """Number of pixels zeroed at level ``fraction``: ``floor(fraction * n_pixels)``.

    (The reference uses ``int(p * n)``; a 1e-9 guard keeps 0.3 * 10 at 3.)
    """
    return int(math.floor(fraction * n_pixels + 1e-9))


def perturbation_masks(maps: Tensor, fractions: Sequence[float] = FRACTIONS,
                       negative: bool = False) -> Tensor:
    """Which pixels are zeroed at each level.

    Args:
        maps: (B, H, W) relevance at image size.
        fractions: the levels p (each in [0, 1]).
        negative: zero the *least* relevant pixels (the map is negated).

    Returns:
        (P, B, H, W) bool, ``True`` = zeroed; level i removes the top
        ``n_removed(fractions[i], H*W)`` pixels of the (negated) map.
    """
    maps = _as_tensor(maps, "maps")
    if maps.dim() != 3:
        raise InputError(f"maps must be (B, H, W), got shape {tuple(maps.shape)}")
    if any(not 0.0 <= p <= 1.0 for p in fractions):
        raise InputError(f"fractions must lie in [0, 1], got {list(fractions)}")
    b, h, w = maps.shape
    flat = maps.reshape(b, h * w)
    if negative:
        flat = -flat
    flat = torch.nan_to_num(flat, nan=-math.inf)
    rank = _descending_rank(flat)
    ks = torch.tensor([n_removed(p, h * w) for p in fractions])
    return (rank.unsqueeze(0) < ks.view(-1, 1, 1)).reshape(len(fractions), b, h, w)


@torch.no_grad()
def perturbation_curve(
    model: Callable[[Tensor], Any],
    images: Tensor,
    maps: Tensor,
    labels: Tensor,
    *,
    negative: bool = False,
    fractions: Sequence[float] = FRACTIONS,
    batch_size: int = 64,
    progress: bool = False,
    return_correct: bool = False,
) -> np.ndarray:
    """Top-1 accuracy as the most (or least) relevant pixels are zeroed.

    The zeroing happens in the model's input space (the normalised images), on
    every channel of a chosen pixel.

    Args:
        model: images (B, C, H, W) -> logits (B, K) (or an output with ``.logits``).
        images: (N, C, H, W) model inputs.
        maps: (N, H, W) relevance at image size (see :func:`upsample_maps`).
        labels: (N,) the true classes accuracy is measured against.
        negative: negative test (remove the least relevant pixels first).
        fractions: perturbation levels p.
        batch_size: images per forward pass (each pass holds
            ``batch_size`` perturbed copies).
        progress: show a progress bar.
        return_correct: return the (1 + P, N) bool matrix of correct
            predictions instead of the accuracies.

    Returns:
        (1 + P,) accuracies in [0, 1]: the clean accuracy, then one per level.
    """
    images = _as_tensor(images, "images")
    maps = _as_tensor(maps, "maps")
    labels = _as_tensor(labels, "labels", torch.long).reshape(-1)
    if images.dim() != 4:
        raise InputError(f"images must be (N, C, H, W), got shape {tuple(images.shape)}")
    n, _, h, w = images.shape
    if tuple(maps.shape) != (n, h, w):
        raise InputError(f"maps must be (N, H, W) = {(n, h, w)} to match the images, "
                         f"got {tuple(maps.shape)}; upsample patch maps first")
    if labels.shape[0] != n:
        raise InputError(f"labels must have {n} entries, got {labels.shape[0]}")
    if batch_size < 1:
        raise InputError(f"batch_size must be >= 1, got {batch_size}")
    device = model_device(model)
    n_lv = len(fractions) + 1
    correct = torch.zeros(n_lv, n, dtype=torch.bool)
    # every (level, image) pair is one job; batches mix levels and images
    jobs = [(lv, i) for i in range(n) for lv in range(n_lv)]
    starts = range(0, len(jobs), batch_size)
    for s in progress_bar(starts, progress, desc="perturbation" + (" (neg)" if negative else ""),
                          total=len(starts)):
        chunk = jobs[s:s + batch_size]
        lv = torch.tensor([j[0] for j in chunk])
        idx = torch.tensor([j[1] for j in chunk])
        keep = _keep_masks(maps[idx], lv, fractions, negative)      # (b, H, W)
        x = images[idx] * keep.unsqueeze(1).to(images.dtype)
        pred = logits_of(model, x.to(device)).argmax(dim=1).cpu()
        correct[lv, idx] = pred == labels[idx]
    if return_correct:
        return correct.numpy()
    return correct.float().mean(dim=1).numpy()


def _keep_masks(maps: Tensor, levels: Tensor, fractions: Sequence[float], negative: bool) -> Tensor:
    """(b, H, W) bool: pixels kept for each (map, level) pair; level 0 = clean."""
    b, h, w = maps.shape
    flat = maps.reshape(b, h * w)
    if negative:
        flat = -flat
    rank = _descending_rank(torch.nan_to_num(flat, nan=-math.inf))
    ks = torch.tensor([0] + [n_removed(p, h * w) for p in fractions])[levels]
    return (rank >= ks.unsqueeze(1)).reshape(b, h, w)


def perturbation_auc(accuracy: Sequence[float], fractions: Sequence[float] = FRACTIONS) -> float:
    """Area under the perturbation curve × 100.

    Trapezoid over x = [0, *fractions] of ``accuracy`` (clean accuracy first),
    e.g. with the default levels the maximum is 90 (accuracy 1 throughout).
    """
    acc = np.asarray(accuracy, dtype=np.float64)
    x = np.asarray([0.0, *fractions], dtype=np.float64)
    if acc.shape != x.shape:
        raise InputError(f"accuracy must have {len(x)} values (clean + one per level), "
                         f"got {acc.shape}")
    return float(np.sum((x[1:] - x[:-1]) * (acc[1:] + acc[:-1]) / 2.0) * 100.0)


# --------------------------------------------------------------------------
# segmentation
# --------------------------------------------------------------------------
def segmentation_scores(maps: Tensor, masks: Tensor) -> dict[str, float]:
    """Segmentation quality of relevance maps against object masks.

    Each map is min–max normalised and thresholded at its own mean (pixels
    strictly above the mean are foreground). Pixel accuracy and the IoU of
    background and foreground are accumulated over the whole set (total
    intersection / total union); ``miou`` is their mean. ``map`` is the
    average precision of the soft (normalised) map against the mask, per
    image, averaged over the images whose mask has both classes.

    Args:
        maps: (N, H, W) relevance at image size (see :func:`upsample_maps`).
        masks: (N, H, W) bool, ``True`` = object.

    Returns:
        ``pixel_accuracy``, ``iou_background``, ``iou_foreground``, ``miou``, ``map``.
    """
    return segmentation_summary(segmentation_per_image(maps, masks))


def segmentation_summary(per: dict[str, np.ndarray]) -> dict[str, float]:
    """:func:`segmentation_scores` from the per-image values of :func:`segmentation_per_image`.

    The counts are summed before dividing (pooled IoUs); the mAP averages the defined APs.
    """
    c = per["iou_counts"]
    iou_fg, iou_bg = (float(v) for v in _pooled_ious(c))
    aps = [a for a in per["ap"].tolist() if not math.isnan(a)]
    return {
        "pixel_accuracy": int(c[:, 0].sum() + c[:, 2].sum()) / (len(c) * per["pixels"]),
        "iou_background": iou_bg,
        "iou_foreground": iou_fg,
        "miou": (iou_bg + iou_fg) / 2.0,
        "map": float(np.mean(aps)) if aps else math.nan,
    }


def segmentation_per_image(maps: Tensor, masks: Tensor) -> dict[str, np.ndarray]:
    """The per-image values behind :func:`segmentation_scores` (same maps, threshold, AP).

    Returns:
        ``pixel_accuracy`` (N,): share of each image's pixels classified right
        (all images have H·W pixels, so their mean is the pooled pixel
        accuracy); ``iou_counts`` (N, 4) int: foreground intersection, foreground
        union, background intersection, background union per image (the IoUs
        are pooled: total intersection / total union over the images, so a
        resample of images recomputes them from these sums);
        ``ap`` (N,): average precision per image, NaN where the mask lacks
        a class (the mAP is the mean of the defined values); ``pixels``: H·W.
    """
    maps = _as_tensor(maps, "maps")
    masks = _as_tensor(masks, "masks", torch.bool)
    if maps.dim() != 3 or maps.shape != masks.shape:
        raise InputError(f"maps and masks must both be (N, H, W), got {tuple(maps.shape)} "
                         f"and {tuple(masks.shape)}")
    soft = minmax_normalise(torch.nan_to_num(maps))
    mean = soft.reshape(soft.shape[0], -1).mean(dim=1).view(-1, 1, 1)
    pred = soft > mean

    def per(x: Tensor) -> Tensor:
        return x.reshape(x.shape[0], -1).sum(dim=1)

    counts = torch.stack([per(pred & masks), per(pred | masks), per(~pred & ~masks),
                          per(~pred | ~masks)], dim=1)
    n_pix = masks[0].numel() if len(masks) else 1
    return {"pixel_accuracy": ((counts[:, 0] + counts[:, 2]).double() / n_pix).numpy(),
            "iou_counts": counts.numpy().astype(np.int64),
            "ap": np.array([average_precision(s.reshape(-1), m.reshape(-1))
                            for s, m in zip(soft, masks)], dtype=np.float64),
            "pixels": n_pix}


def pooled_miou(iou_counts: np.ndarray) -> np.ndarray:
    """mIoU of :func:`segmentation_scores` from per-image counts (..., N, 4) -> (...).

    The counts are those of :func:`segmentation_per_image`; the leading axes
    (e.g. bootstrap resamples) are kept. An empty union counts as IoU 1.
    """
    fg, bg = _pooled_ious(iou_counts)
    return (bg + fg) / 2.0


def _pooled_ious(iou_counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Foreground and background IoU, total intersection / total union over the images: (..., N, 4) -> (...)."""
    c = np.asarray(iou_counts, dtype=np.float64).sum(axis=-2)
    with np.errstate(invalid="ignore", divide="ignore"):
        fg = np.where(c[..., 1] > 0, c[..., 0] / c[..., 1], 1.0)
        bg = np.where(c[..., 3] > 0, c[..., 2] / c[..., 3], 1.0)
    return fg, bg


def average_precision(scores: Tensor, truth: Tensor) -> float:
    """Average precision of ``scores`` (P,) for the positives ``truth`` (P,) bool.

    ``AP = Σ_n (R_n − R_{n−1}) P_n`` over the distinct score thresholds (tied
    scores enter together), as ``sklearn.metrics.average_precision_score``.
    NaN when there is no positive.
    """
    s = _as_tensor(scores, "scores", torch.float64).reshape(-1)
    t = _as_tensor(truth, "truth", torch.bool).reshape(-1)
    n_pos = int(t.sum())
    if n_pos == 0:
        return math.nan
    order = torch.argsort(-s, stable=True)
    s, t = s[order], t[order].double()
    tp = torch.cumsum(t, 0)
    # the last index of each group of equal scores is a threshold
    last = torch.ones_like(s, dtype=torch.bool)
    last[:-1] = s[1:] != s[:-1]
    tp = tp[last]
    counted = torch.nonzero(last).reshape(-1).double() + 1.0
    precision = tp / counted
    recall = tp / n_pos
    prev = torch.cat([torch.zeros(1, dtype=recall.dtype), recall[:-1]])
    return float(((recall - prev) * precision).sum())


# --------------------------------------------------------------------------
# rationales (ERASER token level)
# --------------------------------------------------------------------------
def word_spans(text: str, words: Sequence[str]) -> list[tuple[int, int]]:
    """Character span (start, end) of each word, found in order in ``text``."""
    spans, pos = [], 0
    for w in words:
        start = text.find(w, pos)
        if start < 0:
            raise InputError(f"word {w!r} not found in the text after character {pos}")
        spans.append((start, start + len(w)))
        pos = start + len(w)
    return spans


def word_ids_from_offsets(offsets: Sequence[tuple[int, int]],
                          spans: Sequence[tuple[int, int]]) -> list[Optional[int]]:
    """Map word-pieces to words through character offsets.

    Args:
        offsets: (T,) character span of each word-piece, as a fast tokenizer's
            ``offset_mapping``; special tokens and padding have (0, 0).
        spans: (W,) character span of each word (see :func:`word_spans`).

    Returns:
        (T,) the word index of each piece, ``None`` for specials / pieces
        outside every word (e.g. whitespace).
    """
    starts = np.array([s for s, _ in spans])
    ends = np.array([e for _, e in spans])
    out: list[Optional[int]] = []
    for a, b in offsets:
        a, b = int(a), int(b)
        if b <= a:
            out.append(None)
            continue
        hit = np.nonzero((starts < b) & (ends > a))[0]   # overlapping words
        out.append(int(hit[0]) if hit.size else None)
    return out


def word_scores(token_scores: Sequence[float], word_ids: Sequence[Optional[int]],
                n_words: int) -> np.ndarray:
    """Word score = max over its word-pieces.

    Args:
        token_scores: (T,) relevance of each piece.
        word_ids: (T,) word index of each piece or ``None`` (as a HF fast
            tokenizer's ``word_ids()``, or :func:`word_ids_from_offsets`).
        n_words: number of words W.

    Returns:
        (W,) scores; ``-inf`` for a word with no piece (e.g. truncated away),
        so that it ranks last.
    """
    ts = np.asarray(token_scores, dtype=np.float64).reshape(-1)
    if len(word_ids) != ts.shape[0]:
        raise InputError(f"{len(word_ids)} word ids for {ts.shape[0]} token scores")
    out = np.full(n_words, -np.inf)
    for s, wid in zip(ts, word_ids):
        if wid is None:
            continue
        if not 0 <= wid < n_words:
            raise InputError(f"word id {wid} outside 0..{n_words - 1}")
        out[wid] = max(out[wid], s)
    return out


def top_k_words(scores: np.ndarray, k: int) -> np.ndarray:
    """(W,) bool: the ``min(k, W)`` highest-scoring words (ties by position)."""
    scores = np.asarray(scores, dtype=np.float64)
    order = np.argsort(-scores, kind="stable")
    pick = np.zeros(scores.shape[0], dtype=bool)
    pick[order[:min(k, scores.shape[0])]] = True
    return pick


def rationale_scores(scores: Sequence[np.ndarray], rationales: Sequence[Sequence[bool]],
                     ks: Sequence[int] = TOP_K) -> dict[int, dict[str, float]]:
    """Token-level precision / recall / F1 of the top-k words, per document, averaged.

    For each document and k, the top ``min(k, W)`` words are the predicted
    rationale (ERASER: a shorter document contributes all its words).
    F1 = 2PR / (P + R), 0 when P + R = 0.

    Args:
        scores: per document, (W,) word scores.
        rationales: per document, (W,) bool human rationale.
        ks: the k values.

    Returns:
        ``{k: {"precision", "recall", "f1"}}`` (means over documents).
    """
    if len(scores) != len(rationales):
        raise InputError(f"{len(scores)} score vectors for {len(rationales)} rationales")
    if not scores:
        raise InputError("no documents to score")
    out: dict[int, dict[str, float]] = {}
    for k in ks:
        if k < 1:
            raise InputError(f"k must be >= 1, got {k}")
        p_all, r_all, f_all = [], [], []
        for s, gold in zip(scores, rationales):
            gold = np.asarray(gold, dtype=bool)
            s = np.asarray(s)
            if s.shape != gold.shape:
                raise InputError(f"scores {s.shape} and rationale {gold.shape} differ in length")
            pred = top_k_words(s, k)
            hit = int((pred & gold).sum())
            p = hit / pred.sum() if pred.sum() else 0.0
            r = hit / gold.sum() if gold.sum() else 0.0
            f = 2 * p * r / (p + r) if p + r > 0 else 0.0
            p_all.append(p), r_all.append(r), f_all.append(f)
        out[k] = {"precision": float(np.mean(p_all)), "recall": float(np.mean(r_all)),
                  "f1": float(np.mean(f_all))}
    return out


def rationale_f1_at_gold_size(scores: Sequence[np.ndarray],
                              rationales: Sequence[Sequence[bool]]) -> float:
    """Token F1 with k = the size of each document's human rationale, averaged.

    At that k precision, recall and F1 are equal (the share of the top-|gold|
    words that are rationale words: R-precision). Unlike a fixed k it stays
    informative on short texts, where k >= the number of words takes every
    word. Documents without rationale words are left out.
    """
    per = rationale_f1_at_gold_size_per_document(scores, rationales)
    vals = per[~np.isnan(per)]
    return float(np.mean(vals)) if len(vals) else math.nan


def rationale_f1_at_gold_size_per_document(scores: Sequence[np.ndarray],
                                           rationales: Sequence[Sequence[bool]]) -> np.ndarray:
    """(D,) the per-document values of :func:`rationale_f1_at_gold_size`; NaN without rationale."""
    if len(scores) != len(rationales):
        raise InputError(f"{len(scores)} score vectors for {len(rationales)} rationales")
    vals = []
    for s, gold in zip(scores, rationales):
        gold = np.asarray(gold, dtype=bool)
        if np.asarray(s).shape != gold.shape:
            raise InputError(f"scores {np.shape(s)} and rationale {gold.shape} differ in length")
        k = int(gold.sum())
        vals.append(int((top_k_words(s, k) & gold).sum()) / k if k else math.nan)
    return np.asarray(vals, dtype=np.float64)


ERASER_FRACTIONS: tuple[float, ...] = (0.01, 0.05, 0.1, 0.2, 0.5)
"""Removal fractions q of ERASER's comprehensiveness and sufficiency (AOPC bins)."""


def eraser_texts(words: Sequence[str], scores: np.ndarray,
                 fractions: Sequence[float] = ERASER_FRACTIONS) -> list[tuple[str, str]]:
    """The inputs of ERASER's faithfulness metrics, one pair per fraction q.

    The top ``ceil(q · W)`` words (:func:`top_k_words`, ties by position; at
    least one) are the rationale; the pair is (the text *without* them, for
    comprehensiveness; the text of *only* them, for sufficiency), the kept words
    in their original order joined by single spaces.

    Args:
        words: (W,) the document's words; scores: (W,) their scores.
    """
    out = []
    for q in fractions:
        if not 0.0 < q <= 1.0:
            raise InputError(f"fractions must lie in (0, 1], got {q}")
        k = max(1, math.ceil(q * len(words) - 1e-9))
        top = top_k_words(np.asarray(scores, dtype=np.float64), k)
        out.append((" ".join(w for w, t in zip(words, top) if not t),
                    " ".join(w for w, t in zip(words, top) if t)))
    return out


def aopc(p_full: float, p_perturbed: Sequence[float]) -> float:
    """Area over the perturbation curve: mean over the bins of ``p_full − p_q``.

    Comprehensiveness passes the class probability of the texts without the
    rationale (higher = more faithful); sufficiency of the texts of the
    rationale alone (lower = more faithful).
    """
    p = np.asarray(p_perturbed, dtype=np.float64)
    if p.size == 0:
        raise InputError("aopc needs at least one perturbed probability")
    return float(np.mean(float(p_full) - p))


# --------------------------------------------------------------------------
# class sensitivity (two-object scenes)
# --------------------------------------------------------------------------
def own_mask_share(maps: Tensor, masks: Tensor) -> np.ndarray:
    """Share of each map's positive relevance inside its mask.

    Args:
        maps: (N, H, W) relevance at image size.
        masks: (N, H, W) bool.

    Returns:
        (N,) ``Σ max(m, 0)·mask / Σ max(m, 0)``; NaN where a map has no
        positive relevance.
    """
    maps = _as_tensor(maps, "maps")
    masks = _as_tensor(masks, "masks", torch.bool)
    if maps.dim() != 3 or maps.shape != masks.shape:
        raise InputError(f"maps and masks must both be (N, H, W), got {tuple(maps.shape)} "
                         f"and {tuple(masks.shape)}")
    pos = torch.nan_to_num(maps).clamp(min=0).double()
    total = pos.sum(dim=(1, 2))
    inside = (pos * masks).sum(dim=(1, 2))
    share = torch.where(total > 0, inside / torch.where(total > 0, total, torch.ones_like(total)),
                        torch.full_like(total, math.nan))
    return share.numpy()


def class_sensitivity(maps_a: Tensor, maps_b: Tensor, masks_a: Tensor, masks_b: Tensor) -> float:
    """How much of each class's positive relevance lies on that class's own object.

    On scenes with two objects of different classes a and b: the share of the
    map for target a inside a's mask and the share of the map for target b
    inside b's mask, averaged over both targets and all scenes (NaN shares of
    maps without positive relevance are left out). A class-agnostic method
    gives the same map for both targets, so its shares add up to at most 1
    (≈ 0.5 when both objects get equal relevance); 1 means every target's
    relevance lies exactly on its own object.

    Args:
        maps_a, maps_b: (N, H, W) maps explaining class a / class b.
        masks_a, masks_b: (N, H, W) bool masks of object a / object b.
    """
    shares = np.concatenate([own_mask_share(maps_a, masks_a), own_mask_share(maps_b, masks_b)])
    shares = shares[~np.isnan(shares)]
    return float(shares.mean()) if shares.size else math.nan


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation of two equal-length vectors.

    Returns 1.0 when both are constant and equal, NaN when one is constant
    otherwise (correlation undefined).
    """
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    if x.shape != y.shape:
        raise InputError(f"vectors of different lengths: {x.shape} and {y.shape}")
    if x.size < 2:
        raise InputError("correlation needs at least two values")
    dx, dy = x - x.mean(), y - y.mean()
    sx, sy = math.sqrt(float(dx @ dx)), math.sqrt(float(dy @ dy))
    if sx == 0 or sy == 0:
        return 1.0 if np.array_equal(x, y) else math.nan
    return float(np.clip((dx @ dy) / (sx * sy), -1.0, 1.0))


def class_map_correlation(maps_a: Tensor, maps_b: Tensor) -> float:
    """Mean per-image Pearson correlation between the maps of the two targets.

    1 for a class-agnostic method (identical maps); lower = more class-specific.

    Args:
        maps_a, maps_b: (N, ...) maps of the same images for two targets.
    """
    a = _as_tensor(maps_a, "maps_a").reshape(len(maps_a), -1).numpy()
    b = _as_tensor(maps_b, "maps_b").reshape(len(maps_b), -1).numpy()
    if a.shape != b.shape:
        raise InputError(f"maps of different shapes: {a.shape} and {b.shape}")
    r = np.array([pearson(x, y) for x, y in zip(a, b)])
    r = r[~np.isnan(r)]
    return float(r.mean()) if r.size else math.nan


# --------------------------------------------------------------------------
# deletion check (ground-truth faithfulness on two-object scenes)
# --------------------------------------------------------------------------
@torch.no_grad()
def deletion_drops(model: Callable[[Tensor], Any], images: Tensor, removed: Tensor,
                   classes: Tensor, batch_size: int = 64) -> Tensor:
    """Logit drops ``Δ[i, c, k] = y_c(scene i) − y_c(scene i without object k)``.

    Args:
        model: images -> logits (B, K) (or an output with ``.logits``).
        images: (N, C, H, W) the scenes.
        removed: (N, K, C, H, W) the same scenes, each with object k left out
            (:func:`lrp_core.data.make_scenes` with ``drop=k``).
        classes: (N, J) the classes c whose drops are wanted (e.g. the labels).

    Returns:
        (N, J, K) float64: one drop per scene, class and removed object.
    """
    images, removed = _as_tensor(images, "images"), _as_tensor(removed, "removed")
    classes = _as_tensor(classes, "classes", torch.long)
    n, k = removed.shape[:2]
    if removed.dim() != 5 or removed.shape[0] != images.shape[0] or \
            removed.shape[2:] != images.shape[1:]:
        raise InputError(f"removed must be (N, K, C, H, W) matching images {tuple(images.shape)}, "
                         f"got {tuple(removed.shape)}")
    device = model_device(model)
    stack = torch.cat([images.unsqueeze(1), removed], dim=1).reshape(n * (k + 1), *images.shape[1:])
    logits = torch.cat([logits_of(model, stack[s:s + batch_size].to(device)).double().cpu()
                        for s in range(0, len(stack), batch_size)]).reshape(n, k + 1, -1)
    y = torch.gather(logits, 2, classes.unsqueeze(1).expand(n, k + 1, classes.shape[1]))  # (N, K+1, J)
    return (y[:, :1] - y[:, 1:]).transpose(1, 2).contiguous()


def object_mass_shares(maps: Tensor, masks: Tensor) -> np.ndarray:
    """Share of each map's positive relevance inside each object's mask.

    Args:
        maps: (M, H, W) relevance at image size.
        masks: (M, K, H, W) bool object masks.

    Returns:
        (M, K) ``Σ max(m, 0)·mask_k / Σ max(m, 0)``; NaN rows for maps without
        positive relevance.
    """
    maps = _as_tensor(maps, "maps")
    masks = _as_tensor(masks, "masks", torch.bool)
    if maps.dim() != 3 or masks.dim() != 4 or masks.shape[0] != maps.shape[0] \
            or masks.shape[2:] != maps.shape[1:]:
        raise InputError(f"maps must be (M, H, W) and masks (M, K, H, W), got "
                         f"{tuple(maps.shape)} and {tuple(masks.shape)}")
    pos = torch.nan_to_num(maps).clamp(min=0).double()
    total = pos.sum(dim=(1, 2))
    inside = (pos.unsqueeze(1) * masks).sum(dim=(2, 3))
    share = inside / torch.where(total > 0, total, torch.ones_like(total)).unsqueeze(1)
    share[total <= 0] = math.nan
    return share.numpy()


def deletion_cases(maps: Tensor, masks: Tensor, drops: Tensor, own: Tensor) -> dict[str, np.ndarray]:
    """Per-map results of the deletion check.

    Each case is one map explaining a class c on a scene with K objects, the
    logit drops of c when each object is removed, and the index of c's own object.

    Args:
        maps: (M, H, W) relevance maps; masks: (M, K, H, W) bool object masks;
        drops: (M, K) logit drop of the explained class per removed object;
        own: (M,) index of the object whose class the map explains.

    Returns:
        ``shares`` (M, K) positive-mass shares; ``order`` (M,) 1 when the object
        with the largest drop has the largest mass, 0 when another has it, 0.5
        for a tie of the top masses (NaN when the drops tie or the map has no
        positive relevance); ``distraction`` (M,) the share on the objects
        other than ``own``.
    """
    shares = object_mass_shares(maps, masks)
    d = _as_tensor(drops, "drops", torch.float64).numpy()
    own_idx = _as_tensor(own, "own", torch.long).numpy()
    if d.shape != shares.shape or own_idx.shape != (shares.shape[0],):
        raise InputError(f"drops must be (M, K) = {shares.shape} and own (M,), got {d.shape} "
                         f"and {own_idx.shape}")
    order = np.full(len(d), math.nan)
    for i, (s, dd) in enumerate(zip(shares, d)):
        top_drop = np.flatnonzero(dd == dd.max())
        if len(top_drop) != 1 or np.isnan(s).any():
            continue
        top_mass = np.flatnonzero(s == s.max())
        order[i] = (top_drop[0] in top_mass) / len(top_mass)
    others = np.ones_like(shares, dtype=bool)
    others[np.arange(len(d)), own_idx] = False
    distraction = np.where(np.isnan(shares).any(1), math.nan,
                           np.where(others, shares, 0.0).sum(1))
    return {"shares": shares, "order": order, "distraction": distraction}


def deletion_agreement(maps: Tensor, masks: Tensor, drops: Tensor, own: Tensor) -> dict[str, float]:
    """Does the relevance mass on each object follow what removing it does to the logit?

    Args: as :func:`deletion_cases`.

    Returns:
        ``deletion_order``: the rate at which the object with the larger drop
        also holds the larger relevance mass (0.5 = chance for two objects);
        ``deletion_correlation``: Pearson correlation of mass share and drop
        over all (map, object) pairs; ``deletion_distraction``: mean share of
        the positive relevance on the other class's object (lower is better).
        Cases with a NaN entry are left out of each.
    """
    c = deletion_cases(maps, masks, drops, own)
    d = _as_tensor(drops, "drops", torch.float64).numpy()
    ok = ~np.isnan(c["shares"]).any(1)
    corr = pearson(c["shares"][ok].reshape(-1), d[ok].reshape(-1)) if ok.sum() >= 1 else math.nan
    return {"deletion_order": _nanmean(c["order"]), "deletion_correlation": corr,
            "deletion_distraction": _nanmean(c["distraction"])}


def _nanmean(x: np.ndarray) -> float:
    x = x[~np.isnan(x)]
    return float(x.mean()) if x.size else math.nan


# --------------------------------------------------------------------------
# CDAM statistics
# --------------------------------------------------------------------------
def sparsity(scores: Tensor, rel_threshold: float = 0.05) -> float:
    """Mean fraction of tokens with ``|score| < rel_threshold · max |score|`` of their map.

    Args:
        scores: (N, T) token scores (one map per row).
        rel_threshold: the fraction of the map's largest magnitude.

    Returns:
        mean over maps; an all-zero map counts as fully sparse (1.0).
    """
    s = _as_tensor(scores, "scores", torch.float64)
    if s.dim() < 2:
        raise InputError(f"scores must be (N, T), got shape {tuple(s.shape)}")
    s = s.reshape(s.shape[0], -1).abs()
    peak = s.max(dim=1, keepdim=True).values
    small = torch.where(peak > 0, s < rel_threshold * peak, torch.ones_like(s, dtype=torch.bool))
    return float(small.double().mean(dim=1).mean())


def pooled_correlation(scores_a: Tensor, scores_b: Tensor) -> float:
    """Pearson correlation of two sets of maps (N, T), all tokens of all images pooled."""
    a = _as_tensor(scores_a, "scores_a", torch.float64)
    b = _as_tensor(scores_b, "scores_b", torch.float64)
    if a.shape != b.shape:
        raise InputError(f"maps of different shapes: {tuple(a.shape)} and {tuple(b.shape)}")
    return pearson(a.numpy(), b.numpy())


__all__ = [
    "FRACTIONS", "TOP_K", "average_precision", "class_map_correlation", "class_sensitivity",
    "deletion_agreement", "deletion_cases", "deletion_drops", "object_mass_shares",
    "ERASER_FRACTIONS", "aopc", "eraser_texts",
    "minmax_normalise", "n_removed", "own_mask_share", "pearson", "perturbation_auc",
    "perturbation_curve", "perturbation_masks", "pooled_correlation", "pooled_miou",
    "rationale_f1_at_gold_size", "rationale_f1_at_gold_size_per_document",
    "segmentation_per_image", "segmentation_summary",
    "rationale_scores",
    "segmentation_scores", "sparsity", "top_k_words", "upsample_maps", "word_ids_from_offsets",
    "word_scores", "word_spans",
]

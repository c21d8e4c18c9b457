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
- :func:`alignment_scores`, :func:`top1_links`, :func:`threshold_links`, :func:`alignment_counts`,
  :func:`aer_from_counts`, :func:`alignment_error_rate`, :func:`top1_accuracy_per_sentence` — source maps of
  a translation against its gold word alignment (top-1 accuracy, AER).

Conventions: maps are (B, H, W) at image size unless said otherwise; higher
score = more relevant. Ties in a ranking are broken by position (row-major
pixel index, word index), lowest first, so every result is deterministic.

The functions live in topic modules (``perturbation``, ``segmentation``,
``text``, ``scenes``, ``statistics``, ``alignment``); every public name is re-exported here,
so ``lrp_core.metrics.X`` is the stable spelling.
"""

from __future__ import annotations

from ._common import minmax_normalise, upsample_maps
from .alignment import (
    aer_from_counts,
    alignment_counts,
    alignment_error_rate,
    alignment_scores,
    threshold_links,
    top1_accuracy_per_sentence,
    top1_links,
)
from .perturbation import FRACTIONS, n_removed, perturbation_auc, perturbation_curve, perturbation_masks
from .scenes import (
    class_map_correlation,
    class_sensitivity,
    deletion_agreement,
    deletion_cases,
    deletion_drops,
    object_mass_shares,
    own_mask_share,
)
from .segmentation import (
    average_precision,
    pooled_miou,
    segmentation_per_image,
    segmentation_scores,
    segmentation_summary,
)
from .statistics import pearson, pooled_correlation, sparsity
from .text import (
    ERASER_FRACTIONS,
    TOP_K,
    aopc,
    eraser_texts,
    rationale_f1_at_gold_size,
    rationale_f1_at_gold_size_per_document,
    rationale_scores,
    top_k_words,
    word_ids_from_offsets,
    word_scores,
    word_spans,
)

__all__ = [
    "aer_from_counts",
    "alignment_counts",
    "alignment_error_rate",
    "alignment_scores",
    "threshold_links",
    "top1_accuracy_per_sentence",
    "top1_links",
    "FRACTIONS",
    "TOP_K",
    "average_precision",
    "class_map_correlation",
    "class_sensitivity",
    "deletion_agreement",
    "deletion_cases",
    "deletion_drops",
    "object_mass_shares",
    "ERASER_FRACTIONS",
    "aopc",
    "eraser_texts",
    "minmax_normalise",
    "n_removed",
    "own_mask_share",
    "pearson",
    "perturbation_auc",
    "perturbation_curve",
    "perturbation_masks",
    "pooled_correlation",
    "pooled_miou",
    "rationale_f1_at_gold_size",
    "rationale_f1_at_gold_size_per_document",
    "segmentation_per_image",
    "segmentation_summary",
    "rationale_scores",
    "segmentation_scores",
    "sparsity",
    "top_k_words",
    "upsample_maps",
    "word_ids_from_offsets",
    "word_scores",
    "word_spans",
]

"""Paired bootstrap intervals for the paper's comparisons, from a run's meta file.

    python -m lrp_core.evaluation.bootstrap docs/results/dinov2-scenes.meta.json
    python -m lrp_core.evaluation.bootstrap docs/results/minilm-sentiment.meta.json

The mode follows the meta's ``kind``. For the reference method
(``transformer_attribution``) against each other method: the mean per-case
difference and its 95 % interval from 2,000 paired resamples
(``numpy.random.default_rng(0)``) of the cases.

Image runs (:data:`IMAGE_COLUMNS`): the perturbation AUCs (per image; positive
and negative, predicted and true class), the segmentation pixel accuracy and AP
(per image; their means are the results' ``pixel_accuracy`` and ``map``), the
mIoU (pooled over the images: each resample recomputes it from the images'
intersection / union counts, :func:`lrp_core.metrics.pooled_miou`), and the
deletion check's per-case order hits and distraction shares (per map).
Translation runs (:data:`ALIGNMENT_COLUMNS`): per sentence, the top-1 accuracy, and the AERs pooled
over the resampled sentences. Text runs (:data:`TEXT_COLUMNS`): per document, F1 at gold size and ERASER
comprehensiveness and sufficiency. Cases undefined for either method are left out.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Callable, Optional, Sequence

import numpy as np

from ..metrics import pooled_miou
from ..metrics.alignment import aer_from_counts

PAPER_BASELINES = (
    "rollout",
    "raw_attention",
    "lrp",
    "partial_lrp",
    "attention_gradcam",
    "generic_attention",
    "attnlrp",
    "cp_lrp",
)
"""The rows that come first, in this order (the paper's comparisons); every other method of the run follows in
the run's order, then ``random``. (Before, only these were compared: methods added later — token_ablation, cdam,
pa_lrp, the Captum baselines — had no interval row.)"""
IMAGE_COLUMNS = {
    "pos AUC pred ↓": "positive_predicted_auc_per_image",
    "neg AUC pred ↑": "negative_predicted_auc_per_image",
    "pos AUC target ↓": "positive_target_auc_per_image",
    "neg AUC target ↑": "negative_target_auc_per_image",
    "pixel acc ↑": "segmentation_pixel_accuracy_per_image",
    "mIoU ↑": "segmentation_iou_counts_per_image",
    "mAP ↑": "segmentation_ap_per_image",
    "deletion order ↑": "deletion_order_per_case",
    "distraction ↓": "deletion_distraction_per_case",
}
"""Column name -> per-case list in ``curves[method]`` of an image run."""
TEXT_COLUMNS = {
    "F1@gold ↑": "f1_gold_per_document",
    "comprehensiveness ↑": "comprehensiveness_per_document",
    "sufficiency ↓": "sufficiency_per_document",
}
"""Column name -> per-document list in ``curves[method]`` of a text run."""
LM_COLUMNS = {
    "evidence hit@1 ↑": "evidence_hit1_per_prompt",
    "evidence AP ↑": "evidence_ap_per_prompt",
    "MoRF AUC ↓": "morf_auc_per_prompt",
    "LeRF AUC ↑": "lerf_auc_per_prompt",
}
"""Column name -> per-prompt list in ``curves[method]`` of a language-model run (docs/METHODS.md §3b)."""
SOURCE_COLUMNS = {
    "source hit@1 ↑": "source_hit1_per_prompt",
    "source AP ↑": "source_ap_per_prompt",
    "drop top ↓": "drop_top_per_prompt",
    "keep top ↑": "keep_top_per_prompt",
}
"""Column name -> per-prompt list in ``curves[method]`` of a sources run (docs/METHODS.md §3.7)."""
VLM_COLUMNS = {
    "pointing ↑": "pointing_per_question",
    "mask share ↑": "mask_share_per_question",
    "text rank ↓": "text_rank_per_question",
    "MoRF AUC ↓": "morf_auc_per_question",
    "LeRF AUC ↑": "lerf_auc_per_question",
}
"""Column name -> per-question list in ``curves[method]`` of a vision-language run (docs/METHODS.md §3c)."""
ALIGNMENT_COLUMNS = {
    "top-1 ↑": "top1_accuracy_per_sentence",
    "AER top-1 ↓": "aer_top1_counts_per_sentence",
    "AER threshold ↓": "aer_threshold_counts_per_sentence",
}
"""Column name -> per-sentence list in ``curves[method]`` of a translation run (docs/METHODS.md §3.9); the AERs
are pooled over the resampled sentences from their ``[|A ∩ G|, |A|, |G|]`` counts."""
PER_CASE = IMAGE_COLUMNS
"""The image columns (former name)."""
POOLED: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "segmentation_iou_counts_per_image": pooled_miou,
    "aer_top1_counts_per_sentence": aer_from_counts,
    "aer_threshold_counts_per_sentence": aer_from_counts,
}
"""Per-case keys whose statistic is pooled: resampled cases (R, N, ...) -> (R,)."""
TWO_DIGITS = {
    "positive_predicted_auc_per_image",
    "negative_predicted_auc_per_image",
    "positive_target_auc_per_image",
    "negative_target_auc_per_image",
}
"""Keys printed with two decimals (AUCs in %); the others get three."""


def paired_interval(
    a: Sequence[Any], b: Sequence[Any], resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """The mean of ``a − b`` over the cases where both are defined, with its 95 % paired-bootstrap interval.

    Parameters
    ----------
    a : Sequence[Any]
        (N,) values of one method per case; ``None`` or NaN mark an undefined value.
    b : Sequence[Any]
        (N,) values of the other method on the same cases.
    resamples : int, optional
        Number of bootstrap resamples.
    seed : int, optional
        Seed of the resampling.

    Returns
    -------
    tuple[float, float, float]
        ``(mean, low, high)``.
    """
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    d = (x - y)[~(np.isnan(x) | np.isnan(y))]
    idx = np.random.default_rng(seed).integers(0, len(d), size=(resamples, len(d)))
    lo, hi = np.percentile(d[idx].mean(axis=1), [2.5, 97.5])
    return float(d.mean()), float(lo), float(hi)


def paired_statistic_interval(
    a: Any,
    b: Any,
    statistic: Callable[[np.ndarray], np.ndarray],
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """``statistic(a) − statistic(b)`` with its 95 % paired-bootstrap interval, for the pooled metrics.

    Parameters
    ----------
    a : Any
        (N, ...) values of one method per case, all defined.
    b : Any
        (N, ...) values of the other method on the same cases.
    statistic : Callable[[np.ndarray], np.ndarray]
        Resampled cases (R, N, ...) to one value per resample (R,).
    resamples : int, optional
        Number of bootstrap resamples R.
    seed : int, optional
        Seed of the resampling.

    Returns
    -------
    tuple[float, float, float]
        ``(difference, low, high)``.
    """
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    idx = np.random.default_rng(seed).integers(0, len(x), size=(resamples, len(x)))
    lo, hi = np.percentile(statistic(x[idx]) - statistic(y[idx]), [2.5, 97.5])
    return float(statistic(x[None])[0] - statistic(y[None])[0]), float(lo), float(hi)


def comparison_table(
    curves: dict[str, dict[str, list]],
    reference: str = "transformer_attribution",
    kind: str = "image",
    columns: Optional[dict[str, str]] = None,
) -> str:
    """A Markdown table with one row per compared method: ``reference − method`` [interval] in each column.

    Parameters
    ----------
    curves : dict[str, dict[str, list]]
        A run's ``curves[method]``: the per-case lists.
    reference : str, optional
        The method the others are compared with.
    kind : str, optional
        The run's kind, ``"image"``, ``"text"``, ``"lm"``, ``"vlm"`` or ``"seq2seq"``; it picks
        :data:`IMAGE_COLUMNS`, :data:`TEXT_COLUMNS`, :data:`LM_COLUMNS`, :data:`VLM_COLUMNS` or
        :data:`ALIGNMENT_COLUMNS` when ``columns`` is not given.
    columns : Optional[dict[str, str]], optional
        Column name to per-case key; columns the reference lacks are left out.

    Returns
    -------
    str
        The table; ``—`` where a method lacks a column.
    """
    by_kind = {"text": TEXT_COLUMNS, "lm": LM_COLUMNS, "vlm": VLM_COLUMNS, "seq2seq": ALIGNMENT_COLUMNS}
    spec = columns if columns is not None else by_kind.get(kind, IMAGE_COLUMNS)
    cols = [c for c, key in spec.items() if key in curves[reference]]
    lines = [f"| {reference} − method | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for m in compared(curves, reference):
        cells = []
        for c in cols:
            key = spec[c]
            if key not in curves[m]:
                cells.append("—")
                continue
            if key in POOLED:
                mean, lo, hi = paired_statistic_interval(curves[reference][key], curves[m][key], POOLED[key])
            else:
                mean, lo, hi = paired_interval(_floats(curves[reference][key]), _floats(curves[m][key]))
            d = 2 if key in TWO_DIGITS else 3
            cells.append(f"{mean:+.{d}f} [{lo:+.{d}f}, {hi:+.{d}f}]")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def compared(curves: dict, reference: str) -> list[str]:
    """The methods of a run the reference is compared with, in table order.

    Parameters
    ----------
    curves : dict
        A run's ``curves[method]``.
    reference : str
        The reference method, left out.

    Returns
    -------
    list[str]
        The paper's baselines first (:data:`PAPER_BASELINES`), then the run's other methods in its order,
        ``random`` last.
    """
    others = [m for m in curves if m not in (reference, "random")]
    first = [m for m in PAPER_BASELINES if m in others]
    return first + [m for m in others if m not in first] + [m for m in ("random",) if m in curves]


def _floats(v: Sequence[Any]) -> list[float]:
    return [np.nan if x is None else float(x) for x in v]


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Print the comparison table of a run's meta file (the command line).

    Parameters
    ----------
    argv : Optional[Sequence[str]], optional
        The arguments: the meta file and ``--reference`` (default ``attnlrp`` for a sources run and a
        translation run that has it — else its first row —, otherwise ``transformer_attribution``); ``None``
        reads ``sys.argv``.
    """
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("meta")
    p.add_argument("--reference", default=None, help="default: attnlrp for a sources run, else transformer_attribution")
    a = p.parse_args(argv)
    with open(a.meta, encoding="utf-8") as f:
        meta = json.load(f)
    if meta.get("protocol") == "sources":
        print(comparison_table(meta["curves"], a.reference or "attnlrp", columns=SOURCE_COLUMNS))
    elif meta.get("kind") == "seq2seq":  # attnlrp when the run has it, else its first row
        reference = a.reference or ("attnlrp" if "attnlrp" in meta["curves"] else next(iter(meta["curves"])))
        print(comparison_table(meta["curves"], reference, kind="seq2seq"))
    else:
        print(
            comparison_table(meta["curves"], a.reference or "transformer_attribution", kind=meta.get("kind", "image"))
        )


if __name__ == "__main__":  # pragma: no cover
    main()

"""Paired bootstrap intervals for the paper's comparisons, from an image run's meta file.

    python -m lrp_core.evaluation.bootstrap docs/results/dinov2-scenes.meta.json

For the reference method (``transformer_attribution``) against each other
method: the mean per-case difference and its 95 % interval from 2,000 paired
resamples (``numpy.random.default_rng(0)``) of the perturbation AUCs (per image,
predicted class) and of the deletion check's per-case order hits and
distraction shares (per map; cases undefined for either method left out).
"""
from __future__ import annotations

import argparse
import json
from typing import Any, Sequence

import numpy as np

PAPER_BASELINES = ("rollout", "raw_attention", "lrp", "partial_lrp", "attention_gradcam",
                   "generic_attention", "attnlrp", "cp_lrp")
"""Methods the reference is compared with (those present in a run)."""
PER_CASE = {"pos AUC ↓": "positive_predicted_auc_per_image",
            "neg AUC ↑": "negative_predicted_auc_per_image",
            "deletion order ↑": "deletion_order_per_case",
            "distraction ↓": "deletion_distraction_per_case"}
"""Column name -> per-case list in ``curves[method]``."""


def paired_interval(a: Sequence[Any], b: Sequence[Any], resamples: int = 2000,
                    seed: int = 0) -> tuple[float, float, float]:
    """Mean of ``a − b`` over cases (both defined) and its 95 % paired-bootstrap interval.

    Args:
        a, b: (N,) per-case values of two methods on the same cases; ``None`` / NaN = undefined.
    """
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    d = (x - y)[~(np.isnan(x) | np.isnan(y))]
    idx = np.random.default_rng(seed).integers(0, len(d), size=(resamples, len(d)))
    lo, hi = np.percentile(d[idx].mean(axis=1), [2.5, 97.5])
    return float(d.mean()), float(lo), float(hi)


def comparison_table(curves: dict[str, dict[str, list]], reference: str = "transformer_attribution",
                     ) -> str:
    """Markdown table: one row per baseline, ``reference − baseline`` [interval] per column."""
    cols = [c for c, key in PER_CASE.items() if key in curves[reference]]
    lines = [f"| {reference} − method | " + " | ".join(cols) + " |",
             "|---|" + "---|" * len(cols)]
    for m in [m for m in PAPER_BASELINES if m in curves and m != reference] + \
            [m for m in ("random",) if m in curves]:
        cells = []
        for c in cols:
            mean, lo, hi = paired_interval(_floats(curves[reference][PER_CASE[c]]),
                                           _floats(curves[m][PER_CASE[c]]))
            cells.append(f"{mean:+.3f} [{lo:+.3f}, {hi:+.3f}]" if "deletion" in PER_CASE[c]
                         or "distraction" in c else f"{mean:+.2f} [{lo:+.2f}, {hi:+.2f}]")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _floats(v: Sequence[Any]) -> list[float]:
    return [np.nan if x is None else float(x) for x in v]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("meta")
    p.add_argument("--reference", default="transformer_attribution")
    a = p.parse_args()
    print(comparison_table(json.load(open(a.meta))["curves"], a.reference))


if __name__ == "__main__":  # pragma: no cover
    main()

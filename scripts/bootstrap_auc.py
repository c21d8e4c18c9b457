"""Paired bootstrap of perturbation AUCs from an evaluation's meta file.

    python scripts/bootstrap_auc.py docs/results/toy-vit.meta.json [--reference transformer_attribution]

Prints, per method, the mean AUC ± standard error over images, and the 95 %
interval of (reference − method) from 2000 paired resamples of the images
(numpy.random.default_rng(0)), for the positive and negative tests with the
predicted class as target, as a Markdown table.
"""

from __future__ import annotations

import argparse
import json

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("meta", help="the <out>.meta.json written by python -m lrp_core.evaluation")
    p.add_argument("--reference", default="transformer_attribution")
    p.add_argument("--resamples", type=int, default=2000)
    a = p.parse_args()
    curves = json.load(open(a.meta))["curves"]
    ref = {t: np.asarray(curves[a.reference][f"{t}_predicted_auc_per_image"]) for t in ("positive", "negative")}
    n = len(ref["positive"])
    idx = np.random.default_rng(0).integers(0, n, size=(a.resamples, n))

    def cell(values: np.ndarray) -> str:
        return f"{values.mean():.2f} ± {values.std(ddof=1) / np.sqrt(len(values)):.2f}"

    print(
        f"| method | pos AUC | {a.reference} − method (pos; < 0: reference better) "
        f"| neg AUC | {a.reference} − method (neg; > 0: reference better) |"
    )
    print("|---|---:|---|---:|---|")
    for method, c in curves.items():
        row = [method]
        for t in ("positive", "negative"):
            v = np.asarray(c[f"{t}_predicted_auc_per_image"])
            row.append(cell(v))
            if method == a.reference:
                row.append("")
                continue
            diff = ref[t] - v
            boot = diff[idx].mean(axis=1)
            lo, hi = np.percentile(boot, [2.5, 97.5])
            row.append(f"{diff.mean():+.2f} [{lo:+.2f}, {hi:+.2f}]")
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()

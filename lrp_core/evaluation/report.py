"""What an evaluation run shows and writes: metric values, tables, curve plots, JSON files."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional, Sequence

from .. import metrics as M
from ..runtime.extras import require

Results = dict[str, dict[str, Optional[float]]]
"""``results[method][metric]``: a value, or ``None`` where the metric does not apply."""

SHORT = {
    "perturbation_positive_auc_predicted": "pos↓ pred",
    "perturbation_negative_auc_predicted": "neg↑ pred",
    "perturbation_positive_auc_target": "pos↓ true",
    "perturbation_negative_auc_target": "neg↑ true",
    "pixel_accuracy": "pix acc",
    "miou": "mIoU",
    "map": "mAP",
    "class_sensitivity": "class sens",
    "class_map_correlation": "class corr",
    "cdam_sparsity": "sparsity",
    "tam_correlation": "r(TAM)",
    **{f"token_f1@{k}": f"F1@{k}" for k in M.TOP_K},
    "token_f1@gold": "F1@gold",
}
"""Column headers of :func:`format_table`."""

CURVE_TESTS = ("positive_predicted", "negative_predicted", "positive_target", "negative_target")
"""The perturbation tests of an image run, in plot order."""


def metric_value(v: Any) -> Optional[float]:
    """A metric as it is stored in the results.

    Parameters
    ----------
    v : Any
        The computed value: anything ``float()`` accepts, or ``None``.

    Returns
    -------
    Optional[float]
        The float, or ``None`` for NaN or a metric that does not apply.
    """
    if v is None:
        return None
    v = float(v)
    return None if math.isnan(v) else v


def format_table(results: Results, markdown: bool = False, columns: Optional[Sequence[str]] = None) -> str:
    """A method × metric table, in plain text or Markdown; ``—`` stands for ``None``.

    Parameters
    ----------
    results : Results
        ``results[method][metric]``.
    markdown : bool, optional
        Write a Markdown table instead of aligned plain text.
    columns : Optional[Sequence[str]], optional
        The metrics shown, in order; default those of the first method.

    Returns
    -------
    str
        The table (``"(no results)"`` when ``results`` is empty).
    """
    if not results:
        return "(no results)"
    cols = list(columns or next(iter(results.values())).keys())
    head = ["method"] + [SHORT.get(c, c) for c in cols]
    rows = [[m] + ["—" if (v := r.get(c)) is None else _fmt(c, v) for c in cols] for m, r in results.items()]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * len(cols)) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    width = [max(len(str(x)) for x in col) for col in zip(head, *rows)]

    def fmt(r: Sequence[Any]) -> str:
        return "  ".join(str(x).ljust(w) if i == 0 else str(x).rjust(w) for i, (x, w) in enumerate(zip(r, width)))

    return "\n".join([fmt(head), "  ".join("-" * w for w in width)] + [fmt(r) for r in rows])


def _fmt(metric: str, v: float) -> str:
    """AUCs are × 100 (two decimals say enough); everything else lies in [-1, 1]."""
    return f"{v:.2f}" if metric.startswith("perturbation") else f"{v:.3f}"


def plot_curves(curves: dict[str, dict[str, list]], path: str | Path, title: str = "") -> Path:
    """Save the perturbation curves, accuracy against the fraction removed, one panel per test.

    Parameters
    ----------
    curves : dict[str, dict[str, list]]
        ``curves[method][test]``: the accuracies (1 + P,) at x = 0 and :data:`M.FRACTIONS`.
    path : str | Path
        The image file written.
    title : str, optional
        The figure's title.

    Returns
    -------
    Path
        The written file.
    """
    matplotlib = require("matplotlib", extra="viz", what="plot_curves")  # late: only runs that write a plot need it
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    tests = [t for t in CURVE_TESTS if any(t in c for c in curves.values())]
    x = [0.0, *M.FRACTIONS]
    cols = 2 if len(tests) > 1 else 1
    rows = (len(tests) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.0 * cols + 2.2, 3.6 * rows), squeeze=False, sharey=True)
    for ax, test in zip(axes.flat, tests):
        for method, c in curves.items():
            if test in c:
                style = dict(ls="--", color="0.35", marker=None) if method == "random" else {}
                ax.plot(x, c[test], **{"marker": "o", "ms": 3, "label": method, **style})
        sign, which = test.split("_")
        ax.set_title(f"{sign} test, {'predicted' if which == 'predicted' else 'true'} class")
        ax.set_xlabel("fraction of pixels removed")
        ax.set_ylabel("top-1 accuracy")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(tests) :]:
        ax.set_visible(False)
    handles, names = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="center right", fontsize=8, frameon=False)
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 1 - 2.0 / (5.0 * cols + 2.2), 1))
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_run(run: dict[str, Any], path: str | Path, command: str) -> list[Path]:
    """Write a run of :func:`lrp_core.evaluation.evaluate` to ``path`` and beside it.

    ``path`` receives ``run["results"]``, ``<stem>.meta.json`` the run's other facts with ``command``, and an
    image run also ``perturbation_<model>.png``.

    Parameters
    ----------
    run : dict[str, Any]
        What :func:`lrp_core.evaluation.evaluate` returned.
    path : str | Path
        The results' JSON file.
    command : str
        The command line that made the run, recorded in the facts.

    Returns
    -------
    list[Path]
        The written files, in the order above.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(run["results"], indent=2) + "\n", encoding="utf-8")
    meta = {k: v for k, v in run.items() if k != "results"}
    meta["command"] = command
    meta_path = path.with_name(path.stem + ".meta.json")
    meta_path.write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    written = [path, meta_path]
    if run.get("curves") and run.get("kind", "image") == "image":
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in run["model"])
        written.append(
            plot_curves(run["curves"], path.parent / f"perturbation_{safe}.png", title=f"{run['model']}, n={run['n']}")
        )
    return written


__all__ = ["Results", "SHORT", "CURVE_TESTS", "metric_value", "format_table", "plot_curves", "write_run"]

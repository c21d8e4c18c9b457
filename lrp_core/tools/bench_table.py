"""The benchmark's rows and tables (:mod:`lrp_core.tools.bench`): one row per (case, method), as a line of the
plain-text table, a Markdown table for the README, or JSON.

A row holds the case (model, dtype, batch × tokens), the method and what was measured: ms per sample, the ratio
to the forward + backward baseline, the peak RSS, the part of it above the loaded model, and the ratio of the
peaks.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Any, Optional, Sequence

import torch

from .bench_models import is_text

#: The baseline every method is compared with (a row of its own in the table).
BASELINE = "forward+backward"
#: token_ablation is timed only where batch × tokens is at most this (it costs one forward per token and sample).
ABLATION_MAX = 256
#: Seconds: a call slower than this gets fewer timed runs (see the module docstring).
BUDGET_S = 20.0
SOURCE_BATCH_SIZE = 1  # ablated sequences per forward: the peak of one long forward, not of 33 at once
N_ABLATIONS = 64


@dataclass(frozen=True)
class Case:
    """One model at one input size: ``batch`` samples of ``tokens`` tokens.

    ``tokens`` is the sequence length the Transformer sees: patches + class
    token for a ViT (197 at 224² with 16² patches), the text length for BERT.
    """

    model: str
    batch: int
    tokens: int
    dtype: str = "float32"  # the dtype the model's weights are built in

    @property
    def text(self) -> bool:
        return is_text(self.model)

    @property
    def size(self) -> str:
        return f"{self.batch} × {self.tokens}"


@dataclass(frozen=True)
class Settings:
    """How each (case, method) is measured."""

    repeat: int = 3
    budget: float = BUDGET_S
    threads: int = 0  # torch threads in the measuring process; 0: torch's default
    seed: int = 0
    ablation_max: int = ABLATION_MAX
    sources: int = 0  # explain with this many equal sources (``--sources``); 0: no sources
    check_cost: bool = True  # time every method a second time without the check of the replay (``unverified``)


def make_row(case: Case, method: str, result: Optional[dict], base: Optional[dict], note: str = "") -> dict:
    """One table row.

    ``ratio`` = method time / baseline time; ``peak_mb`` = the process's peak RSS; ``call_mb`` = that peak
    minus the RSS right before the first call (what the call itself costs above the loaded model and
    inputs); ``peak_ratio`` = peak / the baseline's peak; ``runs`` = how many timed runs the time is the best of;
    ``ratio_unchecked`` = the same call's time without the check of the replay (``unverified=True``) / baseline time
    (the check's cost is the difference: one forward without gradients).

    Parameters
    ----------
    case : Case
        The model and input size.
    method : str
        The method name, or :data:`BASELINE`.
    result : dict or None
        What :func:`measure` returned for the method; ``None``: not measured (the numbers stay ``None``).
    base : dict or None
        What it returned for the baseline; ``None``: no ratios.
    note : str
        Why a cell is empty, or an error.

    Returns
    -------
    dict
        The row: the case, the method, the numbers above, ``ms_per_sample``, ``seconds``, ``threads`` and ``note``.
    """
    row: dict[str, Any] = {
        "model": case.model,
        "dtype": case.dtype,
        "batch": case.batch,
        "tokens": case.tokens,
        "method": method,
        "ms_per_sample": None,
        "ratio": None,
        "ratio_unchecked": None,
        "peak_mb": None,
        "call_mb": None,
        "peak_ratio": None,
        "runs": None,
        "seconds": None,
        "threads": None,
        "note": note,
    }
    if result is not None and "forward_passes" in result:  # a --sources row
        row["forward_passes"], row["backward_passes"] = result["forward_passes"], result["backward_passes"]
    if result is None:
        return row
    row["ms_per_sample"] = 1000 * result["seconds"] / case.batch
    row["runs"], row["seconds"], row["threads"] = result["runs"], result["seconds"], result.get("threads")
    if base is not None:
        row["ratio"] = result["seconds"] / base["seconds"]
        if result.get("seconds_unchecked") is not None:
            row["ratio_unchecked"] = result["seconds_unchecked"] / base["seconds"]
    if result.get("peak_rss_kb") is not None:
        row["peak_mb"] = result["peak_rss_kb"] / 1024
        row["call_mb"] = (result["peak_rss_kb"] - result["rss_before_kb"]) / 1024
        if base is not None and base.get("peak_rss_kb"):
            row["peak_ratio"] = result["peak_rss_kb"] / base["peak_rss_kb"]
    return row


def _fmt(value: Optional[float], spec: str) -> str:
    return "—" if value is None else format(value, spec)


HEADER = (
    f"{'model':<24}{'batch × tok':>12}  {'method':<24}{'ms/sample':>10}{'×fwd+bwd':>9}{'no check':>9}"
    f"{'peak MB':>9}{'call MB':>9}{'peak×fb':>8}"
)


def format_row(row: dict) -> str:
    """One row as a line of the plain-text table (under :data:`HEADER`).

    Parameters
    ----------
    row : dict
        A row of :func:`make_row`.

    Returns
    -------
    str
        The line, with the row's note in parentheses.
    """
    size = f"{row['batch']} × {row['tokens']}"
    line = (
        f"{_model_label(row):<24}{size:>12}  {row['method']:<24}{_fmt(row['ms_per_sample'], '.1f'):>10}"
        f"{_fmt(row['ratio'], '.2f'):>9}{_fmt(row.get('ratio_unchecked'), '.2f'):>9}"
        f"{_fmt(row['peak_mb'], '.0f'):>9}{_fmt(row['call_mb'], '.0f'):>9}"
        f"{_fmt(row['peak_ratio'], '.2f'):>8}"
    )
    if "forward_passes" in row:
        line += f"  passes {_passes(row)}"
    return line + (f"  ({row['note']})" if row["note"] else "")


def _model_label(row: dict) -> str:
    """The model's name, with its dtype where that is not float32 (e.g. ``bert-base (bfloat16)``)."""
    dtype = row.get("dtype", "float32")
    return row["model"] if dtype == "float32" else f"{row['model']} ({dtype})"


def _passes(row: dict) -> str:
    """``"forward / backward"`` passes of a ``--sources`` row (``—`` where it was not measured)."""
    if row.get("forward_passes") is None:
        return "—"
    return f"{row['forward_passes']:g} / {row['backward_passes']:g}"


def markdown(rows: Sequence[dict], settings: Optional[Settings] = None, isolated: bool = True) -> str:
    """The rows as a Markdown table for the README, with footnotes for the cells shown as "—".

    Parameters
    ----------
    rows : Sequence of dict
        Rows of :func:`make_row`.
    settings : Settings or None
        Adds a line saying how the rows were measured; ``None``: no such line.
    isolated : bool
        Whether the peaks were measured (one process per cell).

    Returns
    -------
    str
        The table and its footnotes, ending with a newline.
    """
    passes = any("forward_passes" in r for r in rows)  # --sources rows: with the passes per explanation
    lines = [
        "| model | batch × tokens | method | ms/sample | × fwd+bwd | × fwd+bwd without the check | peak MB "
        "| above model MB | peak ÷ fwd+bwd peak |" + (" forward / backward passes |" if passes else ""),
        "|---|---:|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if passes else ""),
    ]
    skipped = errors = too_big = False
    for r in rows:
        ms = _fmt(r["ms_per_sample"], ".1f")
        if r["ms_per_sample"] is None and r["note"].startswith("not run"):
            too_big, ms = True, "—³"
        elif r["ms_per_sample"] is None:
            skipped |= r["method"] == "token_ablation"
            errors |= r["method"] != "token_ablation"
            ms = "—¹" if r["method"] == "token_ablation" else "error²"
        method = r["method"] if r["method"] == BASELINE else f"`{r['method']}`"
        lines.append(
            f"| {_model_label(r)} | {r['batch']} × {r['tokens']} | {method} | {ms} "
            f"| {_fmt(r['ratio'], '.2f')} | {_fmt(r.get('ratio_unchecked'), '.2f')} "
            f"| {_fmt(r['peak_mb'], '.0f')} | {_fmt(r['call_mb'], '.0f')} | {_fmt(r['peak_ratio'], '.2f')} |"
            + (f" {_passes(r)} |" if passes else "")
        )
    lines.append("")
    if skipped:
        limit = settings.ablation_max if settings else ABLATION_MAX
        lines.append(
            f"¹ `token_ablation` runs one forward pass per token and sample; it is timed only where "
            f"batch × tokens ≤ {limit} (`--ablation-max`)."
        )
    if errors:
        lines.append("² the measuring subprocess failed; see the run's output.")
    if too_big:
        lines.append("³ not run: the estimated peak (`lrp_core.runtime.memory.estimate`) exceeds the available memory.")
    if settings is not None:
        threads = settings.threads or torch.get_num_threads()
        memory = "peak = peak RSS of a fresh process per cell" if isolated else "in one process, no memory"
        lines.append(
            f"torch {torch.__version__}, {threads} thread(s), best of up to {settings.repeat} timed run(s) "
            f"(fewer for calls over {settings.budget:g} s), {memory}."
        )
        if settings.sources:
            lines.append(
                f"{settings.sources} equal sources covering the context before the last token; "
                f"context_cite with {N_ABLATIONS} ablations; the ablations replayed "
                f"{SOURCE_BATCH_SIZE} sequence(s) per forward."
            )
    return "\n".join(lines).rstrip() + "\n"


def save_json(path: str, rows: Sequence[dict], settings: Settings) -> None:
    """Save the rows, the settings and torch's version as JSON (``{"torch", "settings", "rows"}``).

    Parameters
    ----------
    path : str
        The file; its folder is made when missing.
    rows : Sequence of dict
        Rows of :func:`make_row`.
    settings : Settings
        How the rows were measured.
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"torch": torch.__version__, "settings": asdict(settings), "rows": list(rows)}, f, indent=1)

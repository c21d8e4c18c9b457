"""What the explorers write around the map: its title and the info line under it.

Pure functions of the controls' state, so they can be read (and tested)
without a widget; :class:`widgets._layered.LayerExplorer` calls them on every
redraw. The map itself is drawn by each explorer's ``_render``.
"""

from __future__ import annotations

import html
from typing import Any, Optional, Sequence

import numpy as np
import torch

from lrp_core.models import logits_to_probabilities

from . import views

_WHERE = {
    "output": "",
    "accumulated": " blocks {s}..{b}",
    "block": " block {b}",
    "residual": " residual stream, block {b}",
}


def view_title(target_name: str, method: str, view: str, block: int, start: int, head: Optional[int]) -> str:
    """``"<target> | <method> | <which blocks>[, head h]"`` (the head only for per-head views)."""
    head_part = "" if head is None or view not in ("block", "accumulated") else f", head {head}"
    where = _WHERE[view].format(s=start, b=block)
    return f"{target_name} | {method} |{where}{head_part}"


def info_html(
    logits: torch.Tensor,
    target: int,
    names: Sequence[str],
    target_name: str,
    view: str,
    shown: np.ndarray,
    explanation: Any,
    block: int,
    probabilities: str = "softmax",
) -> str:
    """The info line: target and predicted class with probabilities, the shown map's sum and peak,
    the residual-stream totals per block (where the method has them) and any absorbed-relevance note.

    Args:
        logits: (C,) the sample's logits; shown: the values drawn (after the sign toggle).
        probabilities: ``"softmax"`` or ``"sigmoid"``, as the model was trained (``ResolvedModel.probabilities``).
    """
    probs = logits_to_probabilities(logits, probabilities)
    pred = int(probs.argmax())
    lines = [
        f"explaining <b>{html.escape(target_name)}</b> (p = {probs[target]:.1%}); "
        f"predicted: {html.escape(names[pred])} ({probs[pred]:.1%})",
        f"view: {views.VIEW_LABELS[view]}; \u03a3 shown = {shown.sum():.4g}, max |value| = {np.abs(shown).max():.4g}",
    ]
    totals = views.block_totals(explanation)
    if totals is not None:
        seq = ", ".join(f"{t:.3g}" for t in totals)
        lines.append(
            f"relevance in the residual stream at block {block}: "
            f"\u03a3 R = <b>{totals[block]:.4g}</b> (every block: {seq}; "
            f"{views.conservation_note(totals)})"
        )
    absorbed = views.absorbed_note(explanation)
    if absorbed is not None:
        lines.append(absorbed)
    return "<br>".join(lines)


__all__ = ["view_title", "info_html"]

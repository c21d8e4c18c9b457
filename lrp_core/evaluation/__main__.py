"""The command line: ``python -m lrp_core.evaluate`` (or ``python -m lrp_core.evaluation``)."""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

import torch

from ..data import folders
from ..data.sets import SCENE_SEED
from ..errors import LRPError
from .report import format_table, write_run
from .run import evaluate
from .text import text_metric_names

PROG = "python -m lrp_core.evaluate"
"""The documented command (kept as the name in ``--help`` and in the written ``command``)."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; its epilog is the ``--data`` layouts of :mod:`lrp_core.data.folders`."""
    doc = folders.__doc__
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Evaluate explanation methods (perturbation, segmentation, class "
                    "sensitivity, CDAM statistics; rationale token-F1 for text models).",
        epilog=("--data PATH" + doc.split("``--data PATH``", 1)[-1]) if doc else None,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="toy-vit", help="a name lrp_core.models.load accepts")
    p.add_argument("--methods", default="all", help="'all' or a comma list")
    p.add_argument("--n", type=int, default=500, help="number of images / documents")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=SCENE_SEED, help="scene seed (toy-vit)")
    p.add_argument("--data", default=None, help="your own data folder (layouts above)")
    p.add_argument("--split", default="val", help="ERASER split file in --data")
    p.add_argument("--text-target", choices=("true", "predicted"), default="true",
                   help="class explained in the rationale evaluation")
    p.add_argument("--out", default=None, help="JSON file to write (plot goes next to it)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    p.add_argument("--no-baseline", action="store_true",
                   help="leave out the reference row 'random' (seeded random maps)")
    p.add_argument("--device", default="cpu", help="torch device of the model (e.g. cuda)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (1 is fastest on a busy machine)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; 0 on success, 2 when the engine rejects the input."""
    p = build_parser()
    a = p.parse_args(argv)
    if a.threads is not None:
        if a.threads < 1:
            p.error("--threads must be >= 1")
        torch.set_num_threads(a.threads)
    try:
        run = evaluate(a.model, a.methods, a.n, a.batch_size, a.seed, a.data, a.split,
                       a.text_target, progress=not a.quiet, baseline=not a.no_baseline,
                       device=a.device)
    except LRPError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    extra = f", clean accuracy {run['accuracy']:.3f}" if "accuracy" in run else ""
    print(f"{run['model']} ({run['kind']}), n={run['n']}{extra}, {run['seconds']:.0f} s")
    print(format_table(run["results"], markdown=a.markdown, columns=_columns(run["kind"])))
    for s in run.get("skipped", []):
        print(f"skipped {s}")
    if a.out:
        command = f"{PROG} " + " ".join(sys.argv[1:] if argv is None else list(argv))
        for path in write_run(run, a.out, command):
            print(f"wrote {path}")
    return 0


def _columns(kind: str) -> Optional[list[str]]:
    """Printed columns: all, except the text runs' precision / recall (they stay in the JSON)."""
    if kind != "text":
        return None
    return [c for c in text_metric_names() if not c.startswith(("token_precision", "token_recall"))]


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

"""The command line: ``python -m lrp_core.evaluation`` (or ``python -m lrp_core.evaluation``).

Under ``torchrun --nproc_per_node N -m lrp_core.evaluation ...`` the processes
share the samples (:mod:`.shards`); rank 0 prints and writes the same files as
a one-process run would (only ``seconds`` and ``processes`` of the meta differ).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

import torch

from ..data import folders
from ..data.sets import SCENE_SEED
from ..errors import LRPError
from . import shards
from .report import format_table, write_run
from .run import VLM_CURVE_QUESTIONS, evaluate
from .text import text_metric_names

#: the built-in VLMs, whose default --n is VLM_DEFAULT_N (each question costs every method an explanation)
VLM_NAMES = ("tiny-vlm",)
VLM_DEFAULT_N = 200
#: the built-in translation models, whose default --n is S2S_DEFAULT_N (every word of a sentence is explained)
S2S_NAMES = ("tiny-s2s",)
S2S_DEFAULT_N = 200
PROG = "python -m lrp_core.evaluation"
"""The documented command (kept as the name in ``--help`` and in the written ``command``)."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; its epilog is the ``--data`` layouts of :mod:`lrp_core.data.folders`."""
    doc = folders.__doc__
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Evaluate explanation methods (perturbation, segmentation, class "
        "sensitivity, CDAM statistics; rationale token-F1 for text models).",
        epilog=("--data PATH" + doc.split("``--data PATH``", 1)[-1]) if doc else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_data_arguments(p)
    _add_output_arguments(p)
    _add_process_arguments(p)
    return p


def _add_data_arguments(p: argparse.ArgumentParser) -> None:
    """Add what is evaluated: the model, the methods, the protocol and the samples.

    Parameters
    ----------
    p : argparse.ArgumentParser
        The parser, changed in place.
    """
    p.add_argument("--model", default="toy-vit", help="a name lrp_core.models.load accepts")
    p.add_argument("--methods", default="all", help="'all' or a comma list")
    p.add_argument(
        "--protocol",
        choices=("evidence", "sources"),
        default="evidence",
        help="causal LMs: 'evidence' (evidence tokens, METHODS §3.6) or 'sources' (which fact decided "
        "the answer, §3.7; also takes the methods leave_one_out and context_cite)",
    )
    # --samples / -n: under torchrun, whose parser reads --n as an abbreviation of its own options
    p.add_argument(
        "--n",
        "--samples",
        "-n",
        dest="n",
        type=int,
        default=None,
        help="number of images / documents / questions (default 500; a VLM: 200 scenes, one question "
        "each; tiny-s2s: 200 sentences; under torchrun: --samples or -n)",
    )
    p.add_argument(
        "--curve-questions",
        type=int,
        default=VLM_CURVE_QUESTIONS,
        help="a VLM: the answered questions whose patch MoRF / LeRF curves are computed (0: all)",
    )
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=SCENE_SEED, help="scene seed (toy-vit)")
    p.add_argument("--data", default=None, help="your own data folder (layouts above)")
    p.add_argument("--split", default="val", help="ERASER split file in --data")
    p.add_argument(
        "--text-target",
        choices=("true", "predicted"),
        default="true",
        help="class explained in the rationale evaluation",
    )


def _add_output_arguments(p: argparse.ArgumentParser) -> None:
    """Add what is printed and written: ``--out``, ``--quiet``, ``--markdown``, ``--no-baseline``.

    Parameters
    ----------
    p : argparse.ArgumentParser
        The parser, changed in place.
    """
    p.add_argument("--out", default=None, help="JSON file to write (plot goes next to it)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    p.add_argument(
        "--no-baseline", action="store_true", help="leave out the reference row 'random' (seeded random maps)"
    )


def _add_process_arguments(p: argparse.ArgumentParser) -> None:
    """Add where and how the run executes: device, threads, resuming, the torchrun backend.

    Parameters
    ----------
    p : argparse.ArgumentParser
        The parser, changed in place.
    """
    p.add_argument("--device", default="cpu", help="torch device of the model (e.g. cuda)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (1 is fastest on a busy machine)")
    p.add_argument(
        "--resume", action="store_true", help="continue an interrupted run from the finished blocks in <out>.partial/"
    )
    p.add_argument(
        "--backend",
        choices=("auto", "gloo", "nccl"),
        default="auto",
        help="torch.distributed backend under torchrun (auto: nccl on CUDA, else gloo)",
    )
    # developer option (tests of --resume): each process stops after K new blocks, exit status 3
    p.add_argument("--stop-after-blocks", type=int, default=None, help=argparse.SUPPRESS)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the evaluation's command line.

    Parameters
    ----------
    argv : Optional[Sequence[str]], optional
        The arguments (``--help`` lists them); ``None`` reads ``sys.argv``.

    Returns
    -------
    int
        The exit status: 0 on success, 2 when the engine rejects the input.
    """
    p = build_parser()
    a = p.parse_args(argv)
    if a.threads is not None:
        if a.threads < 1:
            p.error("--threads must be >= 1")
        torch.set_num_threads(a.threads)
    if a.resume and not a.out:
        p.error("--resume needs --out (the finished blocks are kept in <out>.partial/)")
    try:
        shard, device = shards.from_environment(a.device, a.backend)
        shard.folder = Path(str(a.out) + ".partial") if a.out else None
        shard.resume, shard.stop_after = a.resume, a.stop_after_blocks
        n = a.n if a.n is not None else (VLM_DEFAULT_N if a.model in VLM_NAMES + S2S_NAMES else 500)
        run = evaluate(
            a.model,
            a.methods,
            n,
            a.batch_size,
            a.seed,
            a.data,
            a.split,
            a.text_target,
            progress=not a.quiet and shard.rank == 0,
            baseline=not a.no_baseline,
            device=device,
            shard=shard,
            protocol=a.protocol,
            curve_questions=a.curve_questions or None,
        )
        if run is not None:  # rank 0 (or alone) writes the results; the other ranks are done
            _report(run, a, argv, shard)
    except LRPError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        shards.leave()  # on every path: a group left to interpreter shutdown can abort the process
    return 0


def _report(run: dict, a: argparse.Namespace, argv: Optional[Sequence[str]], shard: shards.Shard) -> None:
    """Print the table of a finished run and, with ``--out``, write its files."""
    run["device"] = a.device  # as asked (rank 0 of a torchrun holds cuda:0 of "cuda")
    extra = f", clean accuracy {run['accuracy']:.3f}" if "accuracy" in run else ""
    procs = f", {shard.world} processes" if shard.world > 1 else ""
    print(f"{run['model']} ({run['kind']}), n={run['n']}{extra}, {run['seconds']:.0f} s{procs}")
    kind = "lm-sources" if run.get("protocol") == "sources" else run["kind"]
    print(format_table(run["results"], markdown=a.markdown, columns=_columns(kind)))
    for s in run.get("skipped", []):
        print(f"skipped {s}")
    if a.out:
        command = f"{PROG} " + " ".join(sys.argv[1:] if argv is None else list(argv))
        for path in write_run(run, a.out, command):
            print(f"wrote {path}")
        shard.finish()


def _columns(kind: str) -> Optional[list[str]]:
    """Printed columns: all, except the text runs' precision / recall (they stay in the JSON)."""
    if kind == "lm-sources":
        return ["source_hit1", "source_ap", "drop_top", "keep_top", "forward_passes", "backward_passes", "seconds"]
    if kind != "text":
        return None
    return [c for c in text_metric_names() if not c.startswith(("token_precision", "token_recall"))]


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

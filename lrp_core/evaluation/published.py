"""The published evaluation tables of the embedded models, shipped with the package.

``docs/results/<name>.json`` (and its ``.meta.json``) are what ``python -m lrp_core.evaluation`` wrote for the
tables of ``docs/RESULTS.md``; the course shows them from any folder, a learner's copy of ``notebooks/`` included,
so each table is also a package file, ``lrp_core/assets/results/<name>.json``: the table and the run's facts
(``n``, ``accuracy``, ``seed``, ``command``), without the per-sample curves. After a new run::

    python -m lrp_core.evaluation.published docs/results

copies the tables over (``tests/evaluation/test_published.py`` checks that the two agree).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..errors import UnknownNameError

#: the runs whose tables the course shows
PUBLISHED: tuple[str, ...] = ("toy-vit", "dinov2-scenes", "dinov2-scenes-avg", "minilm-sentiment")
#: the facts of a run's meta file that travel with its table
FACTS: tuple[str, ...] = ("n", "accuracy", "seed", "command")
ASSETS = Path(__file__).resolve().parents[1] / "assets" / "results"


@dataclass(frozen=True)
class PublishedRun:
    """One published run: ``results`` {method: {metric: value or None}} and the facts of the run."""

    name: str
    results: dict
    n: Optional[int]
    accuracy: Optional[float]
    seed: Optional[int]
    command: Optional[str]


def published(name: str) -> PublishedRun:
    """The published table of ``name`` (one of :data:`PUBLISHED`), read from the package."""
    if name not in PUBLISHED:
        raise UnknownNameError(f"no published table {name!r}; published: {', '.join(PUBLISHED)}")
    data = json.loads((ASSETS / f"{name}.json").read_text(encoding="utf-8"))
    return PublishedRun(name=name, results=data["results"], **{k: data.get(k) for k in FACTS})


def bundle(results_dir: Path, name: str) -> dict[str, Any]:
    """What the package file of ``name`` holds, built from ``results_dir/<name>.json`` and its meta file."""
    results = json.loads((results_dir / f"{name}.json").read_text(encoding="utf-8"))
    meta_path = results_dir / f"{name}.meta.json"
    meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.is_file() else {}
    return {"results": results, **{k: meta.get(k) for k in FACTS}}


def write(results_dir: Path, out_dir: Path = ASSETS) -> list[Path]:
    """Write the package file of every published run from ``results_dir``; returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name in PUBLISHED:
        path = out_dir / f"{name}.json"
        path.write_text(json.dumps(bundle(results_dir, name), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        written.append(path)
    return written


def main(argv: Optional[list[str]] = None) -> None:
    """``python -m lrp_core.evaluation.published RESULTS_DIR``: copy the published tables into the package."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results_dir", type=Path, help="the folder python -m lrp_core.evaluation wrote (docs/results)")
    for path in write(parser.parse_args(argv).results_dir):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()


__all__ = ["PUBLISHED", "PublishedRun", "published", "bundle", "write"]

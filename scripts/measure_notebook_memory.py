"""Measure the kernel memory of every course notebook: peak and what a kernel left open keeps.

    python scripts/measure_notebook_memory.py [notebooks/06_explaining_a_vit.ipynb ...] [--json out.json]

Each notebook runs top to bottom in its own fresh ``python3`` kernel (nbclient, as nbconvert and nbval
run them), from ``notebooks/`` so that ``from solutions import ...`` works. Before the kernel is shut down
its ``/proc/<pid>/status`` is read: ``VmHWM``, the peak resident set size of the whole run, and
``VmRSS``, what the kernel still holds when the last cell has run (a kernel left open keeps about that
much). Linux only (``/proc``). The printed table is the one of docs/TEACHING.md ("Memory").
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _status_mb(pid: int) -> dict[str, float]:
    """``VmHWM`` and ``VmRSS`` of process ``pid`` in MB (10^6 bytes)."""
    out = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("VmHWM", "VmRSS"):
                out[key] = int(line.split()[1]) * 1024 / 1e6
    return out


def measure(path: Path) -> dict[str, float]:
    """Run one notebook in a fresh kernel; its peak and final resident set size (MB) and wall time (s)."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}})
    t0 = time.perf_counter()
    result: dict[str, float] = {}
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
        pid = client.km.provisioner.process.pid
        result = _status_mb(pid)
    result["seconds"] = time.perf_counter() - t0
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("notebooks", nargs="*", type=Path, help="default: every notebook of notebooks/")
    p.add_argument("--json", type=Path, help="also write the results as JSON")
    args = p.parse_args(argv)
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    rows = {}
    print("| notebook | kernel peak (MB) | kept while open (MB) | run (s) |\n|---|---:|---:|---:|", flush=True)
    for path in paths:
        r = measure(path.resolve())
        rows[path.name] = r
        print(f"| {path.name} | {r['VmHWM']:.0f} | {r['VmRSS']:.0f} | {r['seconds']:.0f} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

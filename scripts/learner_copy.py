"""Write the learner's copy of the course: the notebooks and checkers, without the solutions in plain text.

The teacher's copy (``notebooks/``) keeps everything: ``exN_k.solution()`` prints the reference code. The
learner's copy (``learner/notebooks/`` by default) holds

* the notebooks as stored (their outputs show no solution: ``tests/course`` checks it),
* ``solutions/exercise.py`` and ``solutions/__init__.py`` (the checker machinery, no solution in them), with
  ``SOLUTIONS_SHOWN = False``: ``solution()`` prints no code, only the discussion once ``check`` said ✓,
* one module per notebook, ``solutions/nbNN.py``, whose source (reference computations, typical mistakes)
  travels zlib-compressed and base64-encoded: the checkers still run the reference computations, on the
  learner's own notebook objects, but no solution can be read in the file browser or by opening a file.

This keeps the solutions out of sight, not out of reach: someone who decodes the modules finds them.
docs/ANSWERS.md stays with the teacher.

Usage (from the repository root)::

    python scripts/learner_copy.py                     # -> learner/notebooks/
    python scripts/learner_copy.py --out /tmp/room     # -> /tmp/room/notebooks/
    python scripts/learner_copy.py --notebooks 3 8     # only notebooks 3 and 8 (and every checker)
"""

from __future__ import annotations

import argparse
import base64
import re
import shutil
import sys
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
SOLUTIONS = NOTEBOOKS / "solutions"
#: The checker machinery, copied as it is (it holds no solution).
PLAIN_FILES = ("__init__.py", "exercise.py")
SHOWN = "SOLUTIONS_SHOWN = True"

PACKED_MODULE = '''"""Exercises of notebook {n} — learner's copy.

The checkers run the reference computations, which travel compressed below so that no solution is in
plain text; ``exN_k.solution()`` prints the discussion once ``exN_k.check(...)`` has said ✓. The reference
solutions are in the teacher's copy of the course.
"""
import base64 as _b64
import zlib as _zlib

exec(compile(_zlib.decompress(_b64.b64decode(_PACKED)).decode("utf-8"), "<{name}: teacher's copy only>",
             "exec"), globals())
'''


def pack(source: str) -> str:
    """``source`` zlib-compressed and base64-encoded, wrapped in lines of 100 characters."""
    blob = base64.b64encode(zlib.compress(source.encode("utf-8"), 9)).decode("ascii")
    return "\n".join(blob[i : i + 100] for i in range(0, len(blob), 100))


def packed_module(path: Path) -> str:
    """The learner's version of ``solutions/nbNN.py``: its source packed, executed at import."""
    n = int(re.fullmatch(r"nb(\d+)", path.stem).group(1))
    blob = pack(path.read_text(encoding="utf-8"))
    head, tail = PACKED_MODULE.split("import zlib as _zlib\n")
    return (
        head
        + 'import zlib as _zlib\n\n_PACKED = """\n'
        + blob
        + '\n""".replace("\\n", "")\n'
        + tail.format(name=f"solutions.{path.stem}")
    ).replace("{n}", str(n))


def write_copy(out: Path, notebooks: list[int] | None = None) -> Path:
    """Write the learner's copy into ``out/notebooks`` (replaced if it exists) and return that folder.

    Parameters
    ----------
    out : Path
        Folder of the copy; ``out/notebooks`` is created (an existing one is removed first).
    notebooks : list of int, optional
        Numbers of the notebooks to copy (default: all); the checkers of every notebook are written.

    Returns
    -------
    Path
        ``out/notebooks``.
    """
    dest = out / "notebooks"
    if dest.exists():
        shutil.rmtree(dest)
    (dest / "solutions").mkdir(parents=True)
    for nb in sorted(NOTEBOOKS.glob("*.ipynb")):
        if notebooks is None or int(nb.name[:2]) in notebooks:
            shutil.copy2(nb, dest / nb.name)
    for extra in NOTEBOOKS.glob("*.cfg"):  # nbval's sanitiser, so the copy can be validated as it is
        shutil.copy2(extra, dest / extra.name)
    for name in PLAIN_FILES:
        text = (SOLUTIONS / name).read_text(encoding="utf-8")
        if name == "exercise.py":
            if text.count(SHOWN) != 1:
                raise RuntimeError(f"expected one line {SHOWN!r} in {SOLUTIONS / name}")
            text = text.replace(SHOWN, "SOLUTIONS_SHOWN = False")
        (dest / "solutions" / name).write_text(text, encoding="utf-8")
    for module in sorted(SOLUTIONS.glob("nb*.py")):
        (dest / "solutions" / module.name).write_text(packed_module(module), encoding="utf-8")
    return dest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "learner", help="folder of the copy (default: learner/)")
    p.add_argument("--notebooks", type=int, nargs="*", help="numbers of the notebooks to copy (default: all)")
    a = p.parse_args(argv)
    dest = write_copy(a.out, a.notebooks)
    n = len(list(dest.glob("*.ipynb")))
    print(f"learner's copy: {n} notebooks and their checkers in {dest} (no solution in plain text)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

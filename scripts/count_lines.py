"""Lines of the package as a reader counts them: per subpackage (and the top-level modules), all lines (docstrings
and comments included) and the non-blank ones, the number of files, and the modules over the style limit.

    python scripts/count_lines.py            # lrp_core/ of this checkout
    python scripts/count_lines.py path/to/lrp_core --limit 600
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "lrp_core"


def count(path: Path) -> tuple[int, int]:
    """(all lines, non-blank lines) of one file."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return len(lines), sum(1 for line in lines if line.strip())


def group_of(path: Path, root: Path) -> str:
    """The subpackage a module belongs to (``adapters``, nested folders included), or ``(top level)``."""
    parts = path.relative_to(root).parts
    return parts[0] if len(parts) > 1 else "(top level)"


def table(root: Path, limit: int) -> str:
    """The report: one row per group, a total, then every module over ``limit`` lines, longest first."""
    groups: dict[str, list[int]] = {}
    long: list[tuple[int, str]] = []
    for path in sorted(root.rglob("*.py")):
        total, filled = count(path)
        row = groups.setdefault(group_of(path, root), [0, 0, 0])
        row[0] += 1
        row[1] += total
        row[2] += filled
        if total > limit:
            long.append((total, str(path.relative_to(root.parent))))
    out = [f"{'package':<22}{'files':>6}{'lines':>8}{'non-blank':>11}"]
    for name, (files, total, filled) in sorted(groups.items()):
        out.append(f"{name:<22}{files:>6}{total:>8}{filled:>11}")
    sums = [sum(row[i] for row in groups.values()) for i in range(3)]
    out.append(f"{'total':<22}{sums[0]:>6}{sums[1]:>8}{sums[2]:>11}")
    out.append(f"\nmodules over {limit} lines: {len(long)}")
    out += [f"  {total:>5}  {name}" for total, name in sorted(long, reverse=True)]
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root", nargs="?", type=Path, default=ROOT, help="the package folder (default: lrp_core/)")
    p.add_argument("--limit", type=int, default=600, help="the style limit on a module's lines")
    args = p.parse_args()
    print(table(args.root.resolve(), args.limit))
    return 0


if __name__ == "__main__":
    sys.exit(main())

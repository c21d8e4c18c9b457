"""Write the docs' method × family tables and counts from the registry and the ADAPTERS table.

Each generated part sits between two marker comments in a page, ``<!-- tables:NAME -->`` and
``<!-- /tables:NAME -->`` (inline for a count, on their own lines for a table). ``python scripts/make_tables.py``
rewrites them; ``--check`` exits 1 and names the pages whose parts differ (tests/scripts/test_make_tables.py runs
the check).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Callable, Mapping

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: the pages that hold generated parts
PAGES = ("README.md", "docs/CONTRACTS.md", "docs/guide/models.md")
MARKED = re.compile(r"<!-- tables:(?P<name>[\w-]+) -->(?P<body>.*?)<!-- /tables:(?P=name) -->", re.S)


def _refusals() -> dict[str, Mapping[str, str]]:
    """Kind of model -> {method: why it is refused}, as the adapters of that kind declare them."""
    from lrp_core.adapters.base import Adapter
    from lrp_core.adapters.swin import REFUSED_METHODS as SWIN
    from lrp_core.adapters.vlm import VLM_REFUSED_METHODS
    from lrp_core.methods import registry

    off_decoders = {m: "not for decoders" for m in registry.METHOD_NAMES if m not in registry.DECODER_METHODS}
    return {
        "image and text encoders": Adapter.refused_methods,
        "decoder LMs": off_decoders,
        "vision-language models": VLM_REFUSED_METHODS,
        "Swin (timm, Hugging Face)": SWIN,
    }


def methods_by_kind() -> str:
    """A Markdown table: one row per method, one column per kind of model, ✓ or refused."""
    from lrp_core.methods import registry

    kinds = _refusals()
    lines = ["| method | " + " | ".join(kinds) + " |", "|---|" + "---|" * len(kinds)]
    for m in registry.METHOD_NAMES:
        cells = ["refused" if m in refused else "✓" for refused in kinds.values()]
        lines.append(f"| `{m}` | " + " | ".join(cells) + " |")
    return "\n" + "\n".join(lines) + "\n"


def method_count() -> str:
    from lrp_core.methods import registry

    return str(len(registry.METHOD_NAMES))


def adapter_count() -> str:
    from lrp_core.adapters import ADAPTERS

    return str(len(ADAPTERS))


def refused_count() -> str:
    from lrp_core.adapters import REFUSED

    return str(len(REFUSED))


#: marker name -> what it holds
PARTS: dict[str, Callable[[], str]] = {
    "methods-by-kind": methods_by_kind,
    "method-count": method_count,
    "adapter-count": adapter_count,
    "refused-count": refused_count,
}


def render(text: str) -> str:
    """``text`` with every marked part replaced by its generated content (an unknown name is an error)."""

    def part(m: re.Match) -> str:
        name = m.group("name")
        if name not in PARTS:
            raise KeyError(f"unknown table {name!r}; known: {', '.join(PARTS)}")
        return f"<!-- tables:{name} -->{PARTS[name]()}<!-- /tables:{name} -->"

    return MARKED.sub(part, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a page's tables differ from the generated")
    args = parser.parse_args(argv)
    stale = []
    for rel in PAGES:
        path = ROOT / rel
        text = path.read_text(encoding="utf-8")
        new = render(text)
        if new != text:
            stale.append(rel)
            if not args.check:
                path.write_text(new, encoding="utf-8")
    if stale:
        print(("stale: " if args.check else "rewritten: ") + ", ".join(stale))
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())

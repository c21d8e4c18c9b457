"""The text a stored notebook shows: what the course tests scan for leaked solutions."""

from __future__ import annotations


def stored_output_text(nb: dict) -> str:
    """Every stored text output of a notebook (streams and text/* display data), joined by newlines."""
    parts = []
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            parts.append("".join(out.get("text", "")))
            for kind, data in out.get("data", {}).items():
                if kind.startswith("text/"):
                    parts.append("".join(data))
    return "\n".join(parts)

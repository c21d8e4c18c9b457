"""The numbers a notebook's prose quotes are the numbers its cells printed.

A quoted number carries a marker right after it, an HTML comment that renders as nothing:

    transformer attribution puts 0.92<!-- out 96db4ee1 "transformer_attribution" 2 --> on the square

``out`` names where the number comes from — the id of a code cell of the same notebook (its stored
text, stream and Markdown outputs) or a repository file such as ``docs/RESULTS.md`` — then one or more
quoted anchors, each searched after the previous one, and optionally ``N``: the number is the N-th
number on the line of the last anchor, counted after that anchor (without ``N``: any number there).
The quoted number and the one found must be equal as numbers (``0.40`` = ``0.4``; ``−`` = ``-``).

A Markdown table never holds a marker: a ``|`` inside a row's comment splits the row's cells when JupyterLab
renders it. A table quoted from a file instead follows a marker of its own, on the line before it:

    <!-- rows docs/RESULTS.md "## toy-vit" cols 1 2 6 8 -->

Each row of the table that follows is looked up by its first cell (the first line after the anchors that starts
with ``| name |``), and the row's numbers, cell by cell, must be the numbers ``cols`` of that line (counted
after the name, from 1).

In the notebooks of ``STRICT`` every decimal number of the prose (outside formulas and code) must carry
a marker, except the notebook's exercise numbers (``6.1`` in notebook 6) and those listed in ``UNMARKED``
with the reason they are not an output.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NB_DIR = ROOT / "notebooks"

NUMBER = r"[−+-]?\d+(?:\.\d+)?"
#: a quoted number, optional Markdown emphasis or a percent sign, then the marker
QUOTE = re.compile(rf"({NUMBER})(?:\s*%)?(?:\*{{1,2}})?<!--\s*out\s+(\S+)((?:\s+\"[^\"]*\")+)(?:\s+(\d+))?\s*-->")
MARKER = re.compile(r"<!--\s*out\s")
ANCHOR = re.compile(r"\"([^\"]*)\"")
DECIMAL = re.compile(r"(?<![\w.])\d+\.\d+(?![\w.]*\d)")
#: a quoted table: its source, anchors and the source columns of its numeric cells
ROWS = re.compile(r"<!--\s*rows\s+(\S+)((?:\s+\"[^\"]*\")+)\s+cols((?:\s+\d+)+)\s*-->")

#: notebooks whose every decimal number in the prose is marked
STRICT = [
    "00_welcome.ipynb",
    "01_relevance_and_conservation.ipynb",
    "02_signed_activations.ipynb",
    "04_inside_one_block.ipynb",
    "05_from_blocks_to_a_map.ipynb",
    "06_explaining_a_vit.ipynb",
    "07_cdam.ipynb",
    "08_explaining_bert.ipynb",
    "09_is_an_explanation_right.ipynb",
    "10_explore.ipynb",
    "11_attnlrp_and_cp_lrp.ipynb",
    "12_your_own_model.ipynb",
    "13_explaining_a_language_model.ipynb",
    "14_explaining_a_vlm.ipynb",
    "15_explaining_a_translation.ipynb",
]
#: (notebook, decimal) quoted in prose that is not a cell output, and why
UNMARKED: dict[tuple[str, str], str] = {
    ("09_is_an_explanation_right.ipynb", "0.0156"): "1/64 written out, a hand computation",
    ("11_attnlrp_and_cp_lrp.ipynb", "0.5"): "the chance level of an agreement rate, a definition",
    ("11_attnlrp_and_cp_lrp.ipynb", "1.14"): "a section number of docs/METHODS.md",
    ("15_explaining_a_translation.ipynb", "3.9"): "a section number of docs/METHODS.md",
    ("05_from_blocks_to_a_map.ipynb", "0.06"): "the object's area (about 6 %) as the share an even spread gives",
}


def _as_float(text: str) -> float:
    return float(text.replace("−", "-"))


def cell_output_text(cell: dict) -> str:
    """Every stored text output of one code cell (streams, text/plain, text/markdown), joined."""
    parts = []
    for out in cell.get("outputs", []):
        parts.append("".join(out.get("text", "")))
        data = out.get("data", {})
        for kind in ("text/markdown", "text/plain"):
            if kind in data:
                parts.append("".join(data[kind]))
                break
    return "\n".join(parts)


def resolve(source: str, anchors: list[str], index: int | None) -> list[float]:
    """The numbers a marker may stand for: after the anchors, on the last anchor's line (the ``index``-th only)."""
    pos = 0
    for anchor in anchors:
        found = source.find(anchor, pos)
        if found < 0:
            raise LookupError(f"anchor {anchor!r} not found (after offset {pos})")
        pos = found + len(anchor)
    end = source.find("\n", pos)
    rest = source[pos : end if end >= 0 else None]
    numbers = [_as_float(n) for n in re.findall(rf"{NUMBER}|nan", rest)]  # nan: an empty cell of a table
    if index is None:
        return numbers
    if not 1 <= index <= len(numbers):
        raise LookupError(f"the line after {anchors[-1]!r} has {len(numbers)} numbers, not {index}: {rest!r}")
    return [numbers[index - 1]]


def quotes(nb: dict) -> list[tuple[str, str, list[str], int | None]]:
    """(quoted number, source, anchors, N) for every marker in the notebook's Markdown cells."""
    found = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        text = "".join(cell["source"])
        matches = list(QUOTE.finditer(text))
        assert len(matches) == len(MARKER.findall(text)), (
            f"a marker in cell {cell.get('id')} is not right after a number or is malformed: {text[:200]!r}"
        )
        for m in matches:
            found.append((m.group(1), m.group(2), ANCHOR.findall(m.group(3)), int(m.group(4)) if m.group(4) else None))
    return found


def _cells(row: str) -> list[str]:
    """The cells of one Markdown table row ``| a | b |``, stripped."""
    return [c.strip() for c in row.strip().strip("|").split("|")]


def _table_after(text: str, end: int) -> list[str]:
    """The body rows (no header, no separator) of the Markdown table that follows offset ``end``."""
    rows = []
    for line in text[end:].split("\n")[1:]:
        if not line.strip():
            if rows:
                break
            continue
        if not line.lstrip().startswith("|"):
            break
        rows.append(line)
    return [r for r in rows[1:] if not set(r.replace("|", "").strip()) <= set("-: ")]


def table_quotes(nb: dict) -> list[tuple[str, str, list[str], list[int]]]:
    """(source, first-cell key, anchors, cols, the row) for every row of every quoted table."""
    found = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        text = "".join(cell["source"])
        for m in ROWS.finditer(text):
            cols = [int(c) for c in m.group(3).split()]
            for row in _table_after(text, m.end()):
                found.append((m.group(1), ANCHOR.findall(m.group(2)), cols, row))
    return found


def check_tables(nb: dict, outputs: dict) -> list[str]:
    """Every quoted table row whose numbers differ from (or cannot be found in) its source's row."""
    problems = []
    for src, anchors, cols, row in table_quotes(nb):
        text = outputs.get(src) or ((ROOT / src).read_text(encoding="utf-8") if (ROOT / src).is_file() else None)
        cells = _cells(row)
        if text is None:
            problems.append(f"table row {cells[0]!r}: no code cell or file {src!r}")
            continue
        values = [_as_float(v) for c in cells[1:] for v in re.findall(NUMBER, c.replace("*", ""))]
        if len(values) != len(cols):
            problems.append(f"table row {cells[0]!r} has {len(values)} numbers for {len(cols)} cols {cols}")
            continue
        try:
            numbers = resolve(text, [*anchors, f"| {cells[0]} |"], None)
        except LookupError as err:
            problems.append(f"table row {cells[0]!r} -> {src}: {err}")
            continue
        for value, col in zip(values, cols):
            if not 1 <= col <= len(numbers) or numbers[col - 1] != value:
                shown = numbers[col - 1] if 1 <= col <= len(numbers) else None
                problems.append(f"table row {cells[0]!r}: prose says {value}, {src} column {col} shows {shown}")
    return problems


def markers_in_table_rows(nb: dict) -> list[str]:
    """Table rows of the Markdown cells that hold an HTML comment (it may split the row's cells)."""
    return [
        f"cell {cell.get('id')}: {line[:80]!r}"
        for cell in nb["cells"]
        if cell["cell_type"] == "markdown"
        for line in "".join(cell["source"]).split("\n")
        if line.lstrip().startswith("|") and "<!--" in line
    ]


def check_notebook(nb: dict) -> list[str]:
    """Every marker of ``nb`` whose number differs from (or cannot be found in) what it points at."""
    outputs = {c.get("id"): cell_output_text(c) for c in nb["cells"] if c["cell_type"] == "code"}
    problems = []
    for value, src, anchors, index in quotes(nb):
        if src in outputs:
            text = outputs[src]
        elif (ROOT / src).is_file():
            text = (ROOT / src).read_text(encoding="utf-8")
        else:
            problems.append(f"{value}: no code cell or file {src!r}")
            continue
        try:
            candidates = resolve(text, anchors, index)
        except LookupError as err:
            problems.append(f"{value} -> {src}: {err}")
            continue
        if _as_float(value) not in candidates:
            problems.append(f"prose says {value}, {src} {anchors} {index or ''} shows {candidates}")
    return problems + check_tables(nb, outputs)


def unmarked_decimals(name: str, nb: dict) -> list[str]:
    """Decimal numbers in the prose of ``nb`` that carry no marker (formulas, code and links left out)."""
    missing = []
    exercise = re.compile(rf"{int(name[:2])}\.\d") if name[:2].isdigit() else None  # "6.1": exercise 6.1
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        text = "".join(cell["source"])
        text = QUOTE.sub("", text)  # the marked numbers
        for m in ROWS.finditer(text):  # a quoted table's rows
            for row in _table_after(text, m.end()):
                text = text.replace(row, "")
        text = re.sub(r"\$[^$]*\$|`[^`]*`|\]\([^)]*\)", "", text)  # formulas, code, link targets
        for m in DECIMAL.finditer(text):
            if (name, m.group(0)) not in UNMARKED and not (exercise and exercise.fullmatch(m.group(0))):
                missing.append(
                    f"{m.group(0)} in cell {cell.get('id')}: …{text[max(0, m.start() - 60) : m.end() + 20]!r}"
                )
    return missing


def _load(name: str) -> dict:
    return json.loads((NB_DIR / name).read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", sorted(p.name for p in NB_DIR.glob("*.ipynb")))
def test_quoted_numbers_match_the_outputs(name: str):
    problems = check_notebook(_load(name))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", sorted(p.name for p in NB_DIR.glob("*.ipynb")))
def test_no_table_row_holds_a_marker(name: str):
    rows = markers_in_table_rows(_load(name))
    assert not rows, "quote a table with a rows marker before it, not markers in its rows:\n" + "\n".join(rows)


@pytest.mark.parametrize("name", STRICT)
def test_every_decimal_in_the_prose_is_quoted(name: str):
    nb = _load(name)
    if name not in (
        "00_welcome.ipynb",
        "04_inside_one_block.ipynb",
        "12_your_own_model.ipynb",
        "13_explaining_a_language_model.ipynb",
    ):  # no decimal there
        assert quotes(nb), "the notebook quotes no output"
    missing = unmarked_decimals(name, nb)
    assert not missing, 'decimal numbers without a marker (<!-- out CELL "anchor" N -->):\n' + "\n".join(missing)


def _notebook(markdown: str, output: str) -> dict:
    return {
        "cells": [
            {
                "cell_type": "code",
                "id": "c1",
                "source": [],
                "outputs": [{"output_type": "stream", "name": "stdout", "text": [output]}],
            },
            {"cell_type": "markdown", "id": "m1", "source": [markdown]},
        ]
    }


def test_a_drifted_number_is_caught():
    out = "method | on a | on b\n transformer_attribution | 0.47 | 0.92\n rollout | 0.05 | 0.24\n"
    good = 'puts 0.92<!-- out c1 "transformer_attribution" 2 --> on b'
    assert check_notebook(_notebook(good, out)) == []
    assert check_notebook(_notebook('**0.40**<!-- out c1 "rollout" -->', out.replace("0.24", "0.4"))) == []
    drifted = check_notebook(_notebook(good.replace("0.92", "0.91"), out))
    assert len(drifted) == 1 and "0.91" in drifted[0]
    wrong_column = check_notebook(_notebook('0.92<!-- out c1 "transformer_attribution" 1 -->', out))
    assert len(wrong_column) == 1
    assert "not found" in check_notebook(_notebook('0.92<!-- out c1 "cdam" 1 -->', out))[0]
    with pytest.raises(AssertionError, match="not right after a number"):
        quotes(_notebook('the value <!-- out c1 "rollout" 1 --> here', out))
    assert unmarked_decimals("x", _notebook("an unmarked 0.92 and $0.5$ and `1.5`", out)) != []
    assert len(unmarked_decimals("x", _notebook("an unmarked 0.92 and $0.5$ and `1.5`", out))) == 1


def test_a_quoted_table_is_checked_row_by_row():
    out = (
        "## scores\n| method | a | b | c |\n|---|---|---|---|\n| ta | 1.5 | 2.5 | 0.25 |\n| lrp | 3.0 | 4.0 | 0.75 |\n"
    )
    table = '<!-- rows c1 "## scores" cols 1 3 -->\n\n| method | a | c |\n|---|---:|---:|\n| ta | 1.5 | **0.25** |\n'
    nb = _notebook(table + "| lrp | 3.0 | 0.75 |\n", out)
    assert check_notebook(nb) == [] and markers_in_table_rows(nb) == []
    assert unmarked_decimals("x", nb) == []
    drifted = check_notebook(_notebook(table + "| lrp | 3.0 | 0.7 |\n", out))
    assert len(drifted) == 1 and "0.7" in drifted[0] and "column 3" in drifted[0]
    assert "not found" in check_notebook(_notebook(table + "| cdam | 3.0 | 0.75 |\n", out))[0]
    garbled = _notebook('| ta | 1.5<!-- out c1 "| ta |" 1 --> |\n', out)
    assert markers_in_table_rows(garbled) != []

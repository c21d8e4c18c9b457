"""scripts/make_answer_key.py: docs/ANSWERS.md is what the script generates now, and its code is the solution."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from by_path import registered_module

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "make_answer_key.py"


@pytest.fixture(scope="module")
def script():
    with registered_module("make_answer_key", SCRIPT) as mod:
        yield mod


@pytest.fixture(scope="module")
def key(script) -> str:
    return script.answer_key()


def test_committed_answer_key_is_up_to_date(key):
    committed = (ROOT / "docs" / "ANSWERS.md").read_text(encoding="utf-8")
    assert committed == key, "docs/ANSWERS.md is out of date: run `python scripts/make_answer_key.py`"


def test_every_exercise_has_its_section_task_cell_and_reference(script, key):
    exs = script.exercises()
    assert len(exs) >= 29
    headings = re.findall(r"^### (\d+\.\d+) · ", key, flags=re.M)
    assert headings == [n[2:].replace("_", ".") for n in exs]  # one each, in course order
    for name, ex in exs.items():
        body = key.split(f"### {name[2:].replace('_', '.')} · {ex.title}\n", 1)[1].split("\n### ", 1)[0]
        assert f"{name}.check(" in body  # the learner's cell
        assert f"def {ex.reference.__name__}(" in body  # the reference's source
        for h in ex.hints:
            assert h in body
        for mk in ex.mistakes:
            assert mk.message in body


def _code_block_after(body: str, marker: str) -> str:
    return body.split(marker, 1)[1].split("```python\n", 1)[1].split("\n```", 1)[0]


@pytest.mark.parametrize("name", ["ex1_1", "ex1_2", "ex1_3", "ex2_3", "ex3_2", "ex3_3"])
def test_the_keys_code_passes_the_checker(script, key, name):
    """Run the solution code as printed in the key, in its module, and hand its result to the checker."""
    exs = script.exercises()
    ex = exs[name]
    body = key.split(f"### {name[2:].replace('_', '.')} · {ex.title}\n", 1)[1].split("\n### ", 1)[0]
    code = _code_block_after(body, "**Reference solution**")
    namespace = dict(vars(sys.modules[ex.reference.__module__]))
    exec(compile(code, f"<ANSWERS.md {name}>", "exec"), namespace)
    fn = namespace[ex.reference.__name__]
    answer = fn if ex.cases is not None else fn()
    ok, message = ex.verdict(answer)
    assert ok, message
    # and the checker is not a pushover: a scaled answer is rejected
    if ex.cases is None:
        assert not ex.verdict(answer * 3)[0]


def test_check_mode_reports_a_stale_file(script, tmp_path, key):
    stale = tmp_path / "ANSWERS.md"
    stale.write_text(key.replace("Reference solution", "Reference answer", 1), encoding="utf-8")
    assert script.main(["--check", "--out", str(stale)]) == 1
    stale.write_text(key, encoding="utf-8")
    assert script.main(["--check", "--out", str(stale)]) == 0

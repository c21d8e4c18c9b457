"""The course's exercise checkers, run both ways.

For every exercise of ``notebooks/solutions``: the reference answer passes,
a placeholder is "not attempted yet", and typical wrong answers fail with the
message the checker is meant to give. The notebooks' own objects (models,
scenes) come from each module's ``context()``, built once per module.
"""
from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from notebook_text import stored_output_text

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "notebooks"))

import solutions  # noqa: E402
from solutions import exercise as exmod  # noqa: E402
from solutions import nb01, nb02  # noqa: E402

EXERCISES = solutions.all_exercises()
NEEDS_MODELS = {name for name, ex in EXERCISES.items() if ex.needs}

_CONTEXTS: dict[str, dict] = {}


def context_for(name: str) -> dict:
    ex = EXERCISES[name]
    if not ex.needs:
        return {}
    mod = sys.modules[ex.reference.__module__]
    key = mod.__name__
    if key not in _CONTEXTS:
        if hasattr(mod, "context"):
            _CONTEXTS[key] = mod.context()
        else:  # notebook 0: the toy model only
            from lrp_core.models import load
            _CONTEXTS[key] = {"toy": load("toy-vit")}
    return {k: _CONTEXTS[key][k] for k in ex.needs}


def verdict(name: str, answer):
    ex = EXERCISES[name]
    ctx = context_for(name)
    with contextlib.redirect_stdout(io.StringIO()):
        return ex.verdict(answer, **ctx)


def reference_answer(name: str):
    ex = EXERCISES[name]
    if ex.cases is not None:
        return ex.reference
    if name == "ex2_1":
        return (torch.tensor([1.0, -0.5]), torch.tensor([-1.0, 2.0]))
    with contextlib.redirect_stdout(io.StringIO()):
        return ex.reference(**context_for(name))


# ---------------------------------------------------------------- metadata
def test_the_course_has_exercises():
    assert len(EXERCISES) >= 20
    assert {n.split("_")[0] for n in EXERCISES} >= {f"ex{i}" for i in range(13)}


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_metadata(name):
    ex = EXERCISES[name]
    assert ex.name == name
    assert ex.difficulty in (1, 2, 3)
    assert 1 <= ex.minutes <= 60
    assert ex.title and ex.answer and ex.hints
    assert ex.discussion, "say what the result means"


# ---------------------------------------------------------------- both ways
@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_placeholder_is_not_attempted(name):
    for placeholder in (..., None):
        ok, msg = EXERCISES[name].verdict(placeholder)     # no context needed for a placeholder
        assert not ok and exmod.NOT_ATTEMPTED in msg
        assert "Error" not in msg and "Traceback" not in msg


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_reference_answer_passes(name):
    ok, msg = verdict(name, reference_answer(name))
    assert ok, msg
    assert msg.startswith("✓")


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_known_mistakes_are_recognised(name):
    ex = EXERCISES[name]
    for mk in ex.mistakes:
        if ex.cases is not None:
            answer = mk.compute
        else:
            with contextlib.redirect_stdout(io.StringIO()):
                answer = mk.compute(**context_for(name))
        ok, msg = verdict(name, answer)
        assert not ok, f"{name}: the mistake '{mk.message}' passes"
        assert mk.message in msg


def _ref(name):
    return reference_answer(name)


#: typical wrong answers beyond the exercises' own mistakes, with the message they must produce
WRONG = {
    "ex0_1": [(lambda: (4, 4), "wrong shape"),
              (lambda: (4, 4, 65), "includes the [CLS] token")],
    "ex1_1": [(lambda: -_ref("ex1_1"), "sign error"),
              (lambda: _ref("ex1_1").T, None),                 # (4, 1) holds the same numbers: passes
              (lambda: _ref("ex1_1").reshape(2, 2), "wrong shape"),
              (lambda: _ref("ex1_1").sum(), "single number"),
              (lambda: 2 * _ref("ex1_1"), "twice the expected value — a missing ÷2"),
              (lambda: torch.zeros(1, 4), "all zeros"),
              (lambda: "R_x", "should be a number or a tensor")],
    "ex1_2": [(lambda: _ref("ex1_2") + torch.tensor([0.1, 0.0, 0.0]), "conservation violated"),
              (lambda: _ref("ex1_2") + torch.tensor([0.1, 0.0, 0.0]), "off by 0.1"),
              (lambda: _ref("ex1_2")[:, :2], "wrong shape")],
    "ex1_3": [(lambda: (lambda Ws, x: nb01.explain_output0(Ws, x) / 2), "half the expected value"),
              (lambda: (lambda Ws, x: None), "not attempted yet"),
              (lambda: (lambda Ws, x: x @ Ws[0]), "raised"),
              (lambda: _ref("ex1_1"), "expects a function")],
    "ex2_1": [(lambda: ([1.0, 0.5], [1.0, -2.0]), "is ≥ 0, so the kept set is not empty"),
              (lambda: ([1.0, -0.5, 2.0], [-1.0, 2.0]), "one weight per input"),
              (lambda: 3.0, "hand in a pair (x, W)")],
    "ex2_2": [(lambda: _ref("ex2_2")[:100], "wrong shape"),
              (lambda: _ref("ex2_2") - 1, "differs from the reference")],
    "ex2_3": [(lambda: (lambda x, W, R: -nb02.zplus(x, W, R)), "sign error"),
              (lambda: (lambda x, W, R: nb02.zplus(x, W, R).T), "transposed"),
              (lambda: (lambda x, W, R: 2 * nb02.zplus(x, W, R)), "a missing ÷2")],
    "ex3_1": [(lambda: torch.stack(_ref("ex3_1")), "should be a tuple of 2 items"),
              (lambda: (_ref("ex3_1")[0].sum(), _ref("ex3_1")[1].sum()), "single number")],
    "ex3_2": [(lambda: tuple(-v for v in _ref("ex3_2")), "sign error")],
    "ex3_3": [(lambda: tuple(v / 2 for v in _ref("ex3_3")), "half the expected value"),
              (lambda: sum(_ref("ex3_3")), "single number"),
              (lambda: (_ref("ex3_3")[0], 5.0), "differs from the reference")],
    "ex4_1": [(lambda: _ref("ex4_1")[:10], "wrong shape")],
    "ex4_2": [(lambda: _ref("ex4_2") * 2, "a missing ÷2")],
    "ex4_3": [(lambda: -_ref("ex4_3"), "sign error")],
    "ex5_1": [(lambda: _ref("ex5_1").reshape(8, 8), None)],   # the 8 × 8 grid is the same map: passes
    "ex5_2": [(lambda: {k: v for k, v in _ref("ex5_2").items() if k != "full"}, "lacks the key(s) ['full']"),
              (lambda: list(_ref("ex5_2").values()), "should be a dict")],
    "ex6_1": [(lambda: {s: v for s, v in _ref("ex6_1").items() if s != 3}, "lacks the key(s) [3]")],
    "ex6_2": [(lambda: _ref("ex6_2")[:32], "wrong shape")],
    "ex7_1": [(lambda: -_ref("ex7_1"), "sign error")],
    "ex7_2": [(lambda: -_ref("ex7_2"), "sign error")],
    "ex8_1": [(lambda: _ref("ex8_1")[:5], "has 5 items, expected 9"),
              (lambda: _ref("ex8_1")[1::-1] + _ref("ex8_1")[2:], "right items in the wrong order")],
    "ex8_2": [(lambda: torch.cat([_ref("ex8_2"), torch.full((6,), 0.1)]), "relevance on padding"),
              (lambda: torch.cat([_ref("ex8_2"), torch.zeros(6)]), None)],   # zeros on the padding: right
    "ex9_1": [(lambda: {"rollout": 1.0}, "lacks the key(s) ['transformer_attribution']")],
    "ex9_2": [(lambda: {**_ref("ex9_2"), "miou": 0.1}, "your answer['miou']")],
    "ex10_1": [(lambda: {"rollout"}, "is missing ['raw_attention']"),
               (lambda: {"rollout", "raw_attention", "cdam"}, "should not contain ['cdam']")],
    "ex10_2": [(lambda: {k: v[::-1] for k, v in _ref("ex10_2").items()}, "differs from the reference")],
    "ex11_1": [(lambda: 2 * _ref("ex11_1"), "a missing ÷2"),
               (lambda: _ref("ex11_1") + torch.tensor([0.5, 0.0, 0.0, 0.0], dtype=torch.float64),
                "conservation violated"),
               (lambda: _ref("ex11_1").sum(), "single number")],
    "ex11_2": [(lambda: (_ref("ex11_2")[0], 0.25), "differs from the reference"),
               (lambda: (2, _ref("ex11_2")[1]), "differs from the reference")],
    "ex12_1": [(lambda: _ref("ex12_1")[:32], "wrong shape"),
               (lambda: _ref("ex12_1").reshape(8, 8), None)],          # the 8 × 8 grid is the same map: passes
    "ex12_2": [(lambda: -_ref("ex12_2"), "sign error"),
               (lambda: _ref("ex12_2").reshape(4, 4), None)],
    "ex13_1": [(lambda: _ref("ex13_1") - 1, "ranks counted from 0"),
               (lambda: float(_ref("ex13_1")), None)],
    "ex13_2": [(lambda: -_ref("ex13_2"), "other way round"),
               (lambda: 2 * _ref("ex13_2"), "twice the expected value")],
}


def test_every_exercise_has_typical_wrong_answers():
    assert set(WRONG) == set(EXERCISES)


@pytest.mark.parametrize("name", sorted(WRONG))
def test_typical_wrong_answers(name):
    for make, expected in WRONG[name]:
        ok, msg = verdict(name, make())
        if expected is None:
            assert ok, msg
        else:
            assert not ok and expected in msg, f"{name}: expected {expected!r} in {msg!r}"
            assert f"{name}.hint()" in msg or exmod.NOT_ATTEMPTED in msg


def test_check_prints_and_returns_a_bool():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert EXERCISES["ex1_1"].check(_ref("ex1_1")) is True
        assert EXERCISES["ex1_1"].check(-_ref("ex1_1")) is False
        assert EXERCISES["ex1_1"].check(...) is False
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("✓") and lines[1].startswith("✗") and exmod.NOT_ATTEMPTED in lines[-1]


def test_a_missing_context_is_a_message_not_an_error():
    ex = EXERCISES["ex9_2"]
    saved, ex._ctx = ex._ctx, {}
    try:
        ok, msg = ex.verdict({"miou": 1.0})
    finally:
        ex._ctx = saved
    assert not ok and "pass toy=toy, one=one" in msg


def test_hints_cycle_and_solution_prints_code_and_result():
    ex = EXERCISES["ex1_1"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        ex._hint_pos = 0
        for _ in range(len(ex.hints) + 1):
            ex.hint()
        ex.solution()
    text = out.getvalue()
    assert f"Hint 1/{len(ex.hints)}" in text and text.count("Hint 1/") == 2
    assert "def one_hot_start" in text and "0.6667" in text and "add up to 1" in text


def test_reveal_is_the_solution():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        solutions.reveal("ex3_2")
    assert "def operand_totals" in out.getvalue()


# ---------------------------------------------------------------- nothing leaks into the stored notebooks
def _stored_outputs() -> str:
    import json
    return "\n".join(stored_output_text(json.loads(p.read_text(encoding="utf-8")))
                     for p in sorted((ROOT / "notebooks").glob("*.ipynb")))


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_no_solution_output_in_stored_notebooks(name):
    """What ``solution()`` prints (code and results) appears in no stored output of any notebook."""
    ex = EXERCISES[name]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        ex.solution(**context_for(name))
    printed = out.getvalue()
    assert "--- returns ---" in printed
    lines = {ln.strip() for ln in printed.splitlines()}
    lines = {ln for ln in lines if len(ln) >= 12 and not ln.startswith(("---", "Solution to"))
             and not set(ln) <= set("()[]{}, ")}
    stored = {ln.strip() for ln in _stored_outputs().splitlines()}
    leaked = sorted(lines & stored)
    assert not leaked, f"stored notebook outputs show the solution of {name}: {leaked[:3]}"


# ---------------------------------------------------------------- the texts can be followed literally
#: notebooks whose exercise texts are checked for undefined names (every notebook with exercises)
TEXT_CHECKED = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _names_defined(code: list[str]) -> set[str]:
    """Names that the code cells import, assign or define (IPython magics left out)."""
    import ast
    names: set[str] = set()
    for src in code:
        src = "\n".join(ln for ln in src.splitlines() if not ln.lstrip().startswith(("%", "!")))
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names |= {(a.asname or a.name).split(".")[0] for a in node.names}
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.arg):       # a function the learner writes: its signature's names
                names.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return names


def _names_called(markdown: str) -> set[str]:
    """Names read by the code spans of an exercise text that call something, minus those the text assigns."""
    import ast
    import re
    read, assigned = set(), set()
    for span in re.findall(r"`([^`]+)`", markdown):
        try:
            tree = ast.parse(span.strip())
        except SyntaxError:
            continue                          # prose in backticks, shapes, `...`
        nodes = list(ast.walk(tree))
        if not any(isinstance(n, ast.Call) for n in nodes):
            continue                          # a bare name or module path is a reference, not code to run
        read |= {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        assigned |= {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return read - assigned


@pytest.mark.parametrize("path", TEXT_CHECKED, ids=lambda p: p.name)
def test_exercise_texts_use_names_their_notebook_defines(path):
    """Code an exercise text tells the learner to run uses only names defined before its check cell."""
    import builtins
    import json
    import re
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    checked = 0
    for i, cell in enumerate(cells):
        text = "".join(cell["source"])
        name = re.search(r"\b(ex\d+_\d+)\.hint\(\)", text)
        if cell["cell_type"] != "markdown" or not name or not re.search(r"\*\*\d+\.\d+ ·", text):
            continue
        end = next(k for k in range(i, len(cells)) if f"{name.group(1)}.check(" in "".join(cells[k]["source"]))
        code = ["".join(c["source"]) for c in cells[:end + 1] if c["cell_type"] == "code"]
        undefined = _names_called(text) - _names_defined(code) - set(dir(builtins))
        assert not undefined, f"{path.name} {name.group(1)}: the text uses {sorted(undefined)}, never defined there"
        checked += 1
    assert checked >= 1, f"{path.name}: found {checked} exercise texts"


def test_the_name_check_finds_an_undefined_name():
    """The check above fails on the text of exercise 10.2 as it was (explain, x, exp, lrp_core, mask undefined)."""
    old = ("`explain(toy.model, x, method=..., target=...)` ... "
           "`lrp_core.metrics.own_mask_share(exp.upsample(), mask)` (the masks are `scenes.masks[:1, j]`)")
    code = ["import torch\nfrom lrp_core.models import load\ntoy = load('toy-vit')\nscenes = None\n%config X"]
    assert _names_called(old) - _names_defined(code) == {"explain", "x", "exp", "lrp_core", "mask"}


def test_ex10_2_done_as_its_text_says_passes():
    """Exercise 10.2 followed literally: a list of own_mask_share(...) results (one-element arrays) per method."""
    from lrp_core import explain
    from lrp_core.metrics import own_mask_share
    ctx = context_for("ex10_2")
    toy, scenes = ctx["toy"], ctx["scenes"]
    x = scenes.images[:1]
    classes = [int(c) for c in scenes.labels[0]]
    answer = {m: [own_mask_share(explain(toy.model, x, method=m, target=c).upsample(), scenes.masks[:1, j])
                  for j, c in enumerate(classes)]
              for m in ["transformer_attribution", "rollout", "attention_gradcam", "cdam"]}
    ok, msg = verdict("ex10_2", answer)
    assert ok, msg
    swapped = {m: v[::-1] for m, v in answer.items()}
    assert not verdict("ex10_2", swapped)[0]


def test_one_element_arrays_count_as_numbers_in_a_list():
    tol = exmod.Tolerance()
    exmod.compare([np.array([0.3]), torch.tensor([0.2])], [0.3, 0.2], tol)     # passes: no exception
    with pytest.raises(exmod.Mismatch):
        exmod.compare([np.array([0.3]), torch.tensor([0.25])], [0.3, 0.2], tol)
    with pytest.raises(exmod.Mismatch, match="should be a number or a tensor"):
        exmod.compare([np.array([0.3, 0.1]), 0.2], [0.3, 0.2], tol)           # two numbers are not one


def test_readme_and_teaching_give_the_number_of_exercises():
    """The exercise count the README and the teacher's guide state is the number of exercises there are."""
    import re
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    teaching = (ROOT / "docs" / "TEACHING.md").read_text(encoding="utf-8")
    stated = [int(n) for n in re.findall(r"Every exercise \((\d+) in all\)", readme)]
    stated += [int(n) for n in re.findall(r"\*\*all\*\*.*?\| (\d+) exercises \|", teaching)]
    assert stated == [len(EXERCISES)] * 2, f"stated {stated}, there are {len(EXERCISES)}"


def test_teaching_places_each_named_function_where_its_notebook_uses_it():
    """A reference "`name` (notebook N, section S)" in the teacher's guide points at a section of notebook N
    whose cells (its Markdown heading to the next) use ``name``."""
    import json
    import re
    teaching = (ROOT / "docs" / "TEACHING.md").read_text(encoding="utf-8")
    refs = re.findall(r"`(\w+)`\s+\(notebook (\d+), section (\d+)\)", teaching)
    assert refs, "expected at least one reference of that form"
    for name, nb, sec in refs:
        path, = (ROOT / "notebooks").glob(f"{int(nb):02d}_*.ipynb")
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        section, inside = [], False
        for c in cells:
            text = "".join(c["source"])
            if c["cell_type"] == "markdown" and text.startswith("## "):
                inside = text.startswith(f"## {sec}.")
            if inside:
                section.append(text)
        assert section, f"{path.name} has no section {sec}"
        assert any(name in t for t in section), f"`{name}` does not appear in {path.name} section {sec}"
